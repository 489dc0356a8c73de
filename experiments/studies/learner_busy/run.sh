#!/usr/bin/env bash
# The learner_busy study's current figures: the shipped async CartPole config with a
# [256, 256] network (a learner slower than its actors), seeds 0 to 9 one after another,
# then one line per run from its summary.json.
#
#   experiments/studies/learner_busy/run.sh [key=value ...]   # overrides for every run
#
# Environment: SEEDS (default "0 1 2 3 4 5 6 7 8 9"), RUNS (the runs' parent directory,
# default runs/learner_busy_<date>_<time>).
set -euo pipefail
cd "$(dirname "$0")/../../.."
SEEDS=${SEEDS:-0 1 2 3 4 5 6 7 8 9}
RUNS=${RUNS:-runs/learner_busy_$(date +%Y%m%d_%H%M%S)}
for seed in $SEEDS; do
  .venv/bin/tianjax train configs/ppo_cartpole_async.yaml "network.hidden=[256,256]" "seed=$seed" \
    "run_dir=$RUNS/seed$seed" "$@" > /dev/null
done
.venv/bin/python - "$RUNS" $SEEDS <<'PY'
import json
import sys

runs, seeds = sys.argv[1], sys.argv[2:]
print(f"{'seed':>4} {'busy':>6} {'pace':>8} {'credit wait':>12} {'tau':>6} {'475 after s':>12} {'final':>7}")
for seed in seeds:
    with open(f"{runs}/seed{seed}/summary.json") as f:
        s = json.load(f)
    conv = s.get("convergence_time_s")
    print(f"{seed:>4} {s['learner_busy_fraction']:>6.3f} {str(s.get('pace_set_by')):>8} "
          f"{s.get('actor_credit_wait_fraction') or 0:>12.2f} {s.get('staleness_mean') or 0:>6.2f} "
          f"{'-' if conv is None else format(conv, '.1f'):>12} {s['final_return']:>7.1f}")
PY

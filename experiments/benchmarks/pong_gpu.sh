#!/usr/bin/env bash
# Trains PPO on Atari Pong (envpool Pong-v5) to a 100-game mean score of 18 on one machine
# with an NVIDIA GPU, unchanged:
#
#   experiments/benchmarks/pong_gpu.sh [key=value ...]
#
# 1. sets up .venv as ./quickstart.sh does (tianjax with the envpool extra);
# 2. adds JAX's CUDA 12 build to it (jax[cuda12], the version already installed, so that
#    flax, optax and orbax stay matched), once;
# 3. checks that JAX sees the GPU, then trains configs/ppo_pong_gpu.yaml (10M env steps),
#    printing a progress line every few seconds and the run's summary at the end; the run
#    directory (metrics.jsonl, summary.json, checkpoints) is under runs/.
#
# Extra key=value arguments go to `tianjax train` as overrides, e.g. `seed=1`,
# `run_dir=runs/pong_gpu`, or `resume=RUN_DIR` to continue a stopped run.
# Environment: PYTHON (the interpreter quickstart.sh builds .venv with), JAX_CUDA (the JAX
# extra, default cuda12; cuda13 for CUDA 13 drivers), SKIP_SETUP=1 (use .venv as it is:
# offline machines), JAX_PLATFORMS=cpu (no CUDA install, no GPU check: a smoke run on a CPU,
# e.g. `JAX_PLATFORMS=cpu experiments/benchmarks/pong_gpu.sh total_env_steps=2048`).
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=configs/ppo_pong_gpu.yaml
JAX_CUDA=${JAX_CUDA:-cuda12}

if [ "${SKIP_SETUP:-0}" != 1 ] || [ ! -x .venv/bin/tianjax ]; then
  # quickstart.sh's own set-up (venv, `pip install -e .[envpool]` unless already there)
  ./quickstart.sh setup envpool
fi

on_cpu=0
[ "${JAX_PLATFORMS:-}" = cpu ] && on_cpu=1
gpu_seen() { .venv/bin/python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null; }

if [ "$on_cpu" = 0 ] && ! gpu_seen; then
  if [ "${SKIP_SETUP:-0}" != 1 ]; then
    version=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
    echo "pong_gpu: installing jax[$JAX_CUDA]==$version into .venv ..." >&2
    .venv/bin/python -m pip install --quiet -U "jax[$JAX_CUDA]==$version"
  fi
  if ! gpu_seen; then
    echo "pong_gpu: JAX sees no GPU (backend: $(.venv/bin/python -c 'import jax; print(jax.default_backend())' \
      2>&1 | tail -n 1)); check nvidia-smi and the CUDA driver, or set JAX_CUDA=cuda13 for CUDA 13" >&2
    exit 1
  fi
fi
.venv/bin/python -c 'import jax; print("pong_gpu: JAX", jax.__version__, "on", jax.devices()[0].device_kind)' >&2

exec .venv/bin/tianjax train "$CONFIG" "$@"

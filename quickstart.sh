#!/usr/bin/env bash
# Sets up a local virtual environment (.venv) and runs one job:
#   ./quickstart.sh train [CONFIG] [key=value ...]   train (default: configs/ppo_cartpole.yaml)
#   ./quickstart.sh test [pytest args ...]           run the test suite (2 workers)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "quickstart: Python >= 3.11 is needed (found $("$PY" --version 2>&1))" >&2; exit 1; }
  "$PY" -m venv .venv
fi
stamp=.venv/.tianjax-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "quickstart: installing tianjax and its dependencies into .venv ..." >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test]"
  touch "$stamp"
fi
job=${1:-train}
shift || true
case "$job" in
  train)
    config=configs/ppo_cartpole.yaml
    if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then config=$1; shift; fi
    exec .venv/bin/tianjax train "$config" "$@" ;;
  test)
    # two pytest workers (TIANJAX_TEST_WORKERS; 0 runs in one process): most tests compile
    # or train in a single thread, so two halve the suite on a 2-core machine
    exec .venv/bin/python -m pytest -n "${TIANJAX_TEST_WORKERS:-2}" "$@" ;;
  *)
    echo "usage: ./quickstart.sh train [CONFIG] [key=value ...] | ./quickstart.sh test [pytest args]" >&2
    exit 2 ;;
esac

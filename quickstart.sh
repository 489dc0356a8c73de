#!/usr/bin/env bash
# Sets up a local virtual environment (.venv) and runs one job:
#   ./quickstart.sh train [CONFIG] [key=value ...]   train (default: ppo_cartpole); installs the
#                                                    light core and only the extras CONFIG needs
#   ./quickstart.sh test [pytest args ...]           run the test suite (2 workers); installs
#                                                    .[test,all]: every backend the tests cover
#   ./quickstart.sh setup [EXTRAS]                   only install (e.g. `setup envpool,tensorboard`)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "quickstart: Python >= 3.11 is needed (found $("$PY" --version 2>&1))" >&2; exit 1; }
  "$PY" -m venv .venv
fi

# The stamp holds the extras installed (one line, comma-separated; empty: the core only). It
# is void when pyproject.toml is newer (the dependencies changed): then everything it listed
# is installed again, with whatever is asked for now.
stamp=.venv/.tianjax-installed
ensure() {  # ensure EXTRAS (comma-separated, may be empty)
  local have="" want
  if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
    have=$(cat "$stamp")
    # nothing to do when every extra asked for is installed already
    local missing=0 e
    for e in ${1//,/ }; do
      [[ ",$have," == *",$e,"* ]] || missing=1
    done
    [ "$missing" = 0 ] && return 0
  elif [ -f "$stamp" ]; then
    have=$(cat "$stamp")
  fi
  want=$(printf '%s\n' ${have//,/ } ${1//,/ } | sort -u | paste -sd, -)
  echo "quickstart: installing tianjax${want:+ with .[$want]} into .venv ..." >&2
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".${want:+[$want]}"
  echo "$want" > "$stamp"
}

job=${1:-train}
shift || true
case "$job" in
  train)
    config=ppo_cartpole
    if [ $# -gt 0 ] && [[ "$1" != *=* ]] && [[ "$1" != -* ]]; then config=$1; shift; fi
    ensure ""
    # the extras this config needs (its env backend, its loggers), from the config itself
    extras=$(.venv/bin/python -m tianjax.runtime.runners.preflight "$config" "$@") || exit 2
    ensure "$extras"
    exec .venv/bin/tianjax train "$config" "$@" ;;
  setup)
    ensure "${1:-}" ;;
  test)
    ensure "test,all"
    # tests/cluster makes hosts out of network namespaces with iproute2 (ip, tc); where it
    # is missing it is installed if this is root with apt, else those tests skip
    if ! command -v ip >/dev/null 2>&1; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "quickstart: installing iproute2 (for tests/cluster) ..." >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2; } \
          >/dev/null 2>&1 || echo "quickstart: could not install iproute2: tests/cluster will skip" >&2
      else
        echo "quickstart: iproute2's ip is not on PATH (tests/cluster will skip; as root: apt-get install iproute2)" >&2
      fi
    fi
    # two pytest workers (TIANJAX_TEST_WORKERS; 0 runs in one process): most tests compile
    # or train in a single thread, so two halve the suite on a 2-core machine
    exec .venv/bin/python -m pytest -n "${TIANJAX_TEST_WORKERS:-2}" "$@" ;;
  *)
    echo "usage: ./quickstart.sh train [CONFIG] [key=value ...] | test [pytest args] | setup [EXTRAS]" >&2
    exit 2 ;;
esac

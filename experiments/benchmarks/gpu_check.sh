#!/usr/bin/env bash
# The GPU check of evaluation and devices (experiments/benchmarks/gpu_check.py) on a machine
# with one NVIDIA GPU, in under ten minutes:
#
#   experiments/benchmarks/gpu_check.sh [--atari-steps N]
#
# Sets up .venv as pong_gpu.sh does (tianjax with the envpool extra, JAX's CUDA build of
# the version installed), checks that JAX sees the GPU, then runs the three parts: fused PPO
# against the reference PPO on the same GPU, an async Atari run with actors and learner on
# the GPU, and each process's peak memory. SKIP_SETUP=1 uses .venv as it is;
# JAX_PLATFORMS=cpu runs the parts tiny on a CPU (--smoke), to check the script.
set -euo pipefail
cd "$(dirname "$0")/../.."
JAX_CUDA=${JAX_CUDA:-cuda12}
if [ "${SKIP_SETUP:-0}" != 1 ] || [ ! -x .venv/bin/tianjax ]; then
  ./quickstart.sh setup envpool
fi
if [ "${JAX_PLATFORMS:-}" = cpu ]; then
  exec .venv/bin/python experiments/benchmarks/gpu_check.py --smoke "$@"
fi
gpu_seen() { .venv/bin/python -c 'import jax, sys; sys.exit(jax.default_backend() != "gpu")' 2>/dev/null; }
if ! gpu_seen && [ "${SKIP_SETUP:-0}" != 1 ]; then
  version=$(.venv/bin/python -c 'import jax; print(jax.__version__)')
  .venv/bin/python -m pip install --quiet -U "jax[$JAX_CUDA]==$version" psutil
fi
gpu_seen || { echo "gpu_check: JAX sees no GPU; check nvidia-smi and the CUDA driver" >&2; exit 1; }
exec .venv/bin/python experiments/benchmarks/gpu_check.py "$@"

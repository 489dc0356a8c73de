"""An actor process loads only what it uses: the actor's modules and a latency env's source,
built and compiled in a fresh interpreter, import no other env backend, no checkpointing,
plotting or TensorBoard writer (each costs memory in every one of N actor processes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
NOT_IN_AN_ACTOR = (
    "envpool",
    "brax",
    "jaxmarl",
    "gymnax",
    "orbax",
    "matplotlib",
    "tensorboardX",
    "tensorboard",
    "mujoco",
    "torch",
    "tensorflow",
)

PROGRAM = """
import json, sys
import jax
from tianjax.config import load_config
from tianjax.runtime.actor.actor import Actor  # noqa: F401 (what the role imports)
from tianjax.runtime.actor.sources import make_source
config = load_config("configs/ppo_latency_async.yaml", ["num_actors=1", "num_envs=2", "rollout_len=4",
                                                        "env_options.step_ms=0"])
source = make_source(config, seed=7919)
params = jax.jit(source.algo.init)(jax.random.key(0)).params
source(params, 0, 0)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_a_latency_actor_imports_no_backend_or_module_it_does_not_use():
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert {"jax", "flax", "gymnasium", "zmq"} <= loaded  # what it does use
    assert not loaded & set(NOT_IN_AN_ACTOR), sorted(loaded & set(NOT_IN_AN_ACTOR))

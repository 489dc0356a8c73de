"""An actor process's JAX (tianjax/launch/role.py): its entry point turns XLA:CPU's
asynchronous dispatch off before anything starts the backend, so a jitted call returns
its result computed; the learner's process keeps JAX's default."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# the actor's entry point, up to a config that cannot load (it exits STARTUP_FAILED without
# needing a learner), then a computation long enough that an asynchronous dispatch would
# return before it ends
PROGRAM = """
import json, sys
from tianjax.launch import role
code = role.main(["actor", "--actor-id", "0", "--config-json", json.dumps({"algo": "no-such-algo"}),
                  "--endpoints-json", "{}"])
import jax, jax.numpy as jnp
from jax._src import xla_bridge
x = jnp.ones((1024, 1024))
y = jax.jit(lambda a: (a @ a) @ a)(x)
print(json.dumps({"code": code, "async": xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value, "ready": y.is_ready()}))
"""


def _run(program: str) -> dict:
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    out = subprocess.run(
        [sys.executable, "-c", program],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_actor_process_dispatches_synchronously():
    from tianjax.launch.role import STARTUP_FAILED

    r = _run(PROGRAM)
    assert r["code"] == STARTUP_FAILED  # it went through the actor's start-up
    assert r["async"] is False
    assert r["ready"] is True  # computed inline: nothing left to wait for


def test_the_setting_is_the_actors_alone():
    r = _run(
        "import json, jax\nfrom jax._src import xla_bridge\nimport tianjax.launch.role\n"
        "print(json.dumps({'async': xla_bridge._CPU_ENABLE_ASYNC_DISPATCH.value}))"
    )
    assert r["async"] is True  # importing tianjax (or the role module) changes nothing

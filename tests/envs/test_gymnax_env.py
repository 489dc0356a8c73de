import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.config import ConfigError
from tianjax.envs.gymnax_env import JaxEnv, make_gymnax


def test_gymnax_by_name_and_by_object():
    env = make_gymnax("CartPole-v1")
    assert env.obs_shape == (4,) and env.action_spec.discrete and env.action_spec.num_actions == 2
    raw, params = gymnax.make("Pendulum-v1")
    env2 = make_gymnax(raw, params)
    assert (
        env2.obs_shape == (3,) and not env2.action_spec.discrete and env2.action_spec.shape == (1,)
    )


def test_unknown_gymnax_env_names_the_key():
    with pytest.raises(ConfigError, match="'env'"):
        make_gymnax("CartPole-v9")


def test_truncation_keeps_final_obs_and_auto_resets():
    raw, params = gymnax.make("CartPole-v1")
    env = JaxEnv(raw, params.replace(max_steps_in_episode=3))
    key = jax.random.key(0)
    obs, state = env.reset(key)
    step = jax.jit(env.step)
    for t in range(3):
        out = step(jax.random.key(t + 1), state, jnp.int32(t % 2))
        state = out.state
        if t < 2:
            assert not bool(out.truncated) and not bool(out.terminated)
            np.testing.assert_array_equal(out.obs, out.final_obs)
    assert bool(out.truncated) and not bool(out.terminated)
    assert not np.allclose(out.obs, out.final_obs)  # obs is the reset one
    assert int(out.state.time) == 0


def test_termination_is_not_truncation():
    env = make_gymnax("CartPole-v1")
    obs, state = env.reset(jax.random.key(0))
    step = jax.jit(env.step)
    for t in range(200):  # always push right: the pole falls within a few dozen steps
        out = step(jax.random.key(t), state, jnp.int32(1))
        state = out.state
        if bool(out.terminated):
            break
    assert bool(out.terminated) and not bool(out.truncated)
    assert abs(float(out.final_obs[2])) > 0.2 or abs(float(out.final_obs[0])) > 2.4


@pytest.mark.parametrize(
    "backend, env_id, other",
    [
        ("gymnax", "Pong-v5", "envpool"),
        ("envpool", "Breakout-MinAtar", "gymnax"),
        ("gymnasium", "SpaceInvaders-MinAtar", "gymnax"),
        ("envpool", "inverted_pendulum", "brax"),
    ],
)
def test_an_env_id_of_another_backend_says_which_backend(backend, env_id, other):
    from tianjax.config import load_config
    from tianjax.envs.factory import env_spec

    mode = "fused" if backend == "gymnax" else "sync"
    config = load_config(
        "configs/ppo_cartpole.yaml", [f"env_backend={backend}", f"mode={mode}", f"env={env_id}"]
    )
    with pytest.raises(ConfigError) as e:
        env_spec(config)
    msg = str(e.value)
    assert (
        msg.startswith(f"config key 'env': '{env_id}' is not")
        and f"set env_backend: {other}" in msg
    )
    assert "\n" not in msg


def test_unsupported_gymnax_spaces_are_one_line_naming_env():
    from gymnax.environments import spaces

    from tianjax.envs.spaces import action_spec

    with pytest.raises(
        ConfigError, match="config key 'env': a Tuple action space is not supported"
    ):
        action_spec(spaces.Tuple([spaces.Discrete(2), spaces.Discrete(3)]))


DEFERRED_RENDERERS = """
import json, sys
from tianjax.envs.gymnax_env import make_gymnax
make_gymnax("CartPole-v1")
heavy = ("seaborn.palettes", "scipy.stats", "pandas", "matplotlib.figure")
out = {"after_make": sorted(m for m in heavy if m in sys.modules)}
pong = sys.modules["gymnax.environments.misc.pong"]
out["palette"] = len(pong.sns.color_palette("cubehelix", 3))  # gymnax's renderer's call
import seaborn
import seaborn.palettes
out["real"] = type(seaborn) is not type(pong.sns) and seaborn.palettes.color_palette is not None
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out["figure"] = type(plt.figure()).__name__
catch = sys.modules["gymnax.environments.bsuite.catch"]  # its renderer's name for pyplot
out["same_pyplot"] = catch.plt.subplots is plt.subplots is matplotlib.pyplot.subplots
print(json.dumps(out))
"""


def test_a_gymnax_env_is_made_without_seaborn_or_pyplot_which_load_where_they_are_read():
    # a fresh interpreter: this one has imported gymnax (and seaborn) already
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", DEFERRED_RENDERERS], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {
        "after_make": [],
        "palette": 3,
        "real": True,
        "figure": "Figure",
        "same_pyplot": True,
    }, out

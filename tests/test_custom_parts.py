"""Your own env, network and algorithm: the registry, `module:EnvId`, `imports`, train(env=,
network=), experiments/examples/custom_parts.py, and actors that cannot start."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianjax
from tianjax import algos
from tianjax.config import ConfigError, load_config
from tianjax.errors import ActorFailure

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "experiments", "examples")


@pytest.fixture
def custom_parts(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    import custom_parts

    yield custom_parts


# ----------------------------------------------------------------------------- registry
def test_registry_names_and_refusals():
    def make_a(config, obs_shape, action_spec, *, correct_staleness=True):
        return algos.factory("ppo")(
            config, obs_shape, action_spec, correct_staleness=correct_staleness
        )

    def make_b(config, obs_shape, action_spec, *, correct_staleness=True):
        raise AssertionError

    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo=w11_algo"])
    assert "config key 'algo': unknown algorithm 'w11_algo'" in str(e.value) and "register" in str(
        e.value
    )
    try:
        algos.register("w11_algo", make_a)
        algos.register("w11_algo", make_a)  # the same function again: a re-run cell
        assert (
            algos.registered()[:3] == ("ppo", "impala", "dqn") and "w11_algo" in algos.registered()
        )
        with pytest.raises(ValueError, match="already registered"):
            algos.register("w11_algo", make_b)
        with pytest.raises(ValueError, match="built-in"):
            algos.register("ppo", make_a)
        config = load_config("configs/ppo_cartpole.yaml", ["algo=w11_algo"])
        algo = algos.make_algorithm(config, (4,), tianjax.networks.ActionSpec(True, 2))
        assert algo.name == "ppo"  # what make_a built
    finally:
        algos.unregister("w11_algo")
    with pytest.raises(ConfigError, match="'algo'"):
        load_config(None, ["algo=w11_algo"])


def test_bad_imports_name_the_key(tmp_path):
    with pytest.raises(
        ConfigError, match="config key 'imports': cannot import 'no_such_module_w11'"
    ):
        load_config(None, ["imports=[no_such_module_w11]"])
    bad = tmp_path / "broken_w11.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="RuntimeError: boom"):
        load_config(None, [f"imports=[{bad}]"])


# ----------------------------------------------------------------------------- the example's A2C
def test_a2c_loss_is_the_closed_form_and_fresh_weights_are_one(custom_parts):
    """L = mean w (-log pi A + c_v/2 (V - G)^2 - c_e H); its gradient against jax.grad of the
    closed form written out here, and, with fresh samples, the corrected update equals the plain."""
    net = custom_parts.CatchNet(3)
    obs = jax.random.uniform(jax.random.key(0), (4, 2, 10, 5))
    params = net.init(jax.random.key(1), obs[0])
    batch = custom_parts.A2CBatch(
        obs,
        jnp.array([[0, 1], [2, 0], [1, 1], [0, 2]]),
        jnp.array([[1.0, -1.0], [0.5, 0.0], [2.0, 1.0], [-0.5, 0.3]]),
        jnp.linspace(-1, 1, 8).reshape(4, 2),
        jnp.full((4, 2), 1.0).at[0, 0].set(0.5),
    )

    def closed_form(p):
        logits, v = net.apply(p, batch.obs)
        logp = jax.nn.log_softmax(logits)
        lp_a = jnp.take_along_axis(logp, batch.action[..., None], -1)[..., 0]
        ent = -jnp.sum(jnp.exp(logp) * logp, -1)
        w = batch.weight
        return jnp.mean(
            w
            * (
                -lp_a * batch.advantage
                + custom_parts.VF_COEF * 0.5 * (v - batch.target) ** 2
                - custom_parts.ENT_COEF * ent
            )
        )

    loss_fn = custom_parts.a2c_loss(net.apply)
    loss, _ = loss_fn(params, batch)
    np.testing.assert_allclose(loss, closed_form(params), rtol=1e-5)
    g1 = jax.grad(lambda p: loss_fn(p, batch)[0])(params)
    g2 = jax.grad(closed_form)(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), g1, g2)

    from tianjax.envs.gymnax_env import make_gymnax

    config = load_config(custom_parts.config("fused", 4096))
    env = make_gymnax(custom_parts.Catch())
    with tianjax.networks.use_network(net):
        corrected = custom_parts.make_a2c(
            config, env.obs_shape, env.action_spec, correct_staleness=True
        )
        plain = custom_parts.make_a2c(
            config, env.obs_shape, env.action_spec, correct_staleness=False
        )
    state = plain.init(jax.random.key(2))
    out = plain.act(state.params, obs[0], jax.random.key(3))
    T, B = 4, 2
    traj = tianjax.core.types.Trajectory(
        obs=obs,
        action=jnp.broadcast_to(out.action, (T, B)),
        reward=jnp.ones((T, B)),
        done=jnp.zeros((T, B), bool),
        bootstrap_value=jnp.zeros((T, B)),
        behaviour_log_prob=jnp.broadcast_to(out.log_prob, (T, B)),
        behaviour_value=jnp.broadcast_to(out.value, (T, B)),
        version=jnp.zeros((T, B), jnp.int32),
        last_obs=obs[-1],
        trunc_obs=jnp.zeros_like(obs[-1]),
        trunc_t=jnp.full((B,), -1, jnp.int32),
    )
    traj = traj._replace(
        behaviour_log_prob=jax.vmap(
            lambda o, a: tianjax.core.distributions.log_prob(net.apply(state.params, o)[0], a)
        )(traj.obs, traj.action)
    )
    s1, m1 = corrected.update(state, traj)
    s2, _ = plain.update(state, traj)
    assert float(m1["weight_min"]) == pytest.approx(1.0) and float(
        m1["weight_max"]
    ) == pytest.approx(1.0)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), s1.params, s2.params
    )


def test_catch_learns_fused_with_objects_given_to_train(custom_parts, tmp_path):
    """A random policy scores about -0.6 on Catch; a learner that works gets past 0.5."""
    result = tianjax.train(
        custom_parts.config("fused", 40_960, str(tmp_path / "fused")),
        env=custom_parts.Catch(),
        network=custom_parts.CatchNet(3),
        verbose=False,
        progress=False,
    )
    assert result.summary["env"] == "Catch" and result.summary["algo"] == "a2c"
    assert result.summary["final_return"] >= 0.5
    assert (
        "CatchNet_0" not in result.params and "params" in result.params
    )  # the user's module: no wrapper
    assert set(result.params["params"]) == {"Dense_0", "Dense_1", "Dense_2"}
    # the result remembers its env and network: evaluation needs nothing more
    assert tianjax.evaluate(result, episodes=20).returns.mean() >= 0.5
    loaded = tianjax.load(
        result.run_dir, env=custom_parts.Catch(), network=custom_parts.CatchNet(3)
    )
    assert (
        loaded.obs_shape == (10, 5) and tianjax.evaluate(loaded, episodes=20).returns.mean() >= 0.5
    )


def test_objects_cannot_go_to_actor_processes(custom_parts):
    with pytest.raises(ConfigError, match="config key 'env': an object given to train"):
        tianjax.train(
            custom_parts.config("async", 4096) | {"env": "CartPole-v1", "network": {}},
            env=custom_parts.Catch(),
            verbose=False,
            progress=False,
        )


def test_custom_parts_script_runs_fused_and_async(tmp_path):
    """The example as a user runs it: a script; async actors import it by name."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(EXAMPLES, "custom_parts.py"),
            "--steps",
            "4096",
            "--run-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if "a2c Catch" in ln]
    assert [ln.split()[0] for ln in lines] == ["fused", "async"]
    import json

    summary = json.load(open(tmp_path / "async" / "summary.json"))
    assert summary["env"] == "custom_parts:Catch" and summary["num_actors"] == 2
    assert (
        summary["env_steps"] >= 4096 and summary["actor_restarts"] == 0
    )  # async: actors may run one rollout ahead


# ----------------------------------------------------------------------------- module:EnvId, gymnasium
TINY_ENV = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class Corridor(gym.Env):
        """Walk right (action 1) to the end of a 4-cell corridor: reward 1, 3 steps at best."""
        observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
            super().reset(seed=seed)
            self.pos, self.t = 0, 0
            return self._obs(), {}

        def _obs(self):
            o = np.zeros(4, np.float32)
            o[self.pos] = 1.0
            return o

        def step(self, action):
            self.t += 1
            self.pos = min(max(self.pos + (1 if int(action) == 1 else -1), 0), 3)
            done = self.pos == 3
            return self._obs(), float(done), done, self.t >= 20, {}

    gym.register("{name}", entry_point=Corridor)
''')


def _write_env_module(tmp_path, module: str, env_id: str):
    (tmp_path / f"{module}.py").write_text(TINY_ENV.replace("{name}", env_id))


def _host_config(env_id: str, run_dir, mode: str = "sync") -> dict:
    return {
        "algo": "ppo",
        "env": env_id,
        "env_backend": "gymnasium",
        "mode": mode,
        "num_actors": 1,
        "num_envs": 2,
        "rollout_len": 16,
        "total_env_steps": 128,
        "log_every": 1,
        "target_return": None,
        "eval": {"episodes": 0},
        "network": {"hidden": [8]},
        "ppo": {"num_minibatches": 2},
        "run_dir": str(run_dir),
    }


def test_module_env_id_works_in_actor_processes(tmp_path, monkeypatch):
    """gymnasium's own `module:EnvId`: the check imports the module, and so do the actors
    (the module's directory reaches them through this process's sys.path)."""
    _write_env_module(tmp_path, "w11_corridor", "W11Corridor-v0")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = tianjax.train(
        _host_config("w11_corridor:W11Corridor-v0", tmp_path / "run"), verbose=False, progress=False
    )
    assert result.summary["env_steps"] == 128 and result.summary["actor_restarts"] == 0
    assert result.summary["episodes"] > 0


def test_an_actor_that_cannot_start_ends_the_run_with_its_own_line(tmp_path, monkeypatch):
    """An id registered in this process only: the actors cannot make it, and would fail
    the same way after every restart. The run ends at once with the actor's line."""
    _write_env_module(tmp_path, "w11_corridor2", "W11ParentOnly-v0")
    monkeypatch.syspath_prepend(str(tmp_path))
    import w11_corridor2  # noqa: F401  registers W11ParentOnly-v0 here, not in the actors

    config = _host_config("W11ParentOnly-v0", tmp_path / "run", mode="async")
    with pytest.raises(ActorFailure) as e:
        tianjax.train(config, verbose=False, progress=False)
    msg = str(e.value)
    assert msg.startswith(
        "actor 0 cannot start: config key 'env': 'W11ParentOnly-v0' is not a registered "
        "gymnasium env id"
    ), msg
    log = (tmp_path / "run" / "actors" / "actor-0.log").read_text()
    assert log.count("cannot start") == 1  # started once, never restarted

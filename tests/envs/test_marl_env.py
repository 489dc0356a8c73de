"""The JaxMARL adapter: agent stacking, global state, masks, auto-reset and truncation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.config import ConfigError
from tianjax.envs.marl import make_jaxmarl


@pytest.fixture(scope="module")
def spread():
    return make_jaxmarl("MPE_simple_spread_v3")


@pytest.fixture(scope="module")
def smax():
    return make_jaxmarl("SMAX_3m")


def test_agents_stacked_in_order_with_global_state(spread):
    assert spread.num_agents == 3 and spread.obs_shape == ((3, 18), (54,), (3, 5))
    assert spread.action_spec.discrete and spread.action_spec.num_actions == 5
    key = jax.random.key(3)
    obs, state = spread.reset(key)
    raw, _ = spread.env.reset(key)
    for i, agent in enumerate(spread.env.agents):
        np.testing.assert_array_equal(obs.obs[i], raw[agent])
    # MPE has no world state: the global state is every agent's observation, in agent order
    np.testing.assert_array_equal(obs.state, np.concatenate([raw[a] for a in spread.env.agents]))
    assert obs.avail.dtype == bool and bool(jnp.all(obs.avail))


def test_mpe_truncates_at_its_time_limit_and_auto_resets(spread):
    obs, state = spread.reset(jax.random.key(0))
    step = jax.jit(spread.step)
    action = jnp.array([1, 2, 3], jnp.int32)
    # JaxMARL's MPE ends an episode after max_steps + 1 steps (it tests the step count
    # before incrementing it); the adapter keeps the env's own episode length
    for t in range(spread.max_steps + 1):
        key = jax.random.key(100 + t)
        out = step(key, state, action)
        if t < spread.max_steps:
            assert not bool(out.truncated) and not bool(out.terminated)
            np.testing.assert_array_equal(out.obs.obs, out.final_obs.obs)
            state = out.state
    assert bool(out.truncated) and not bool(out.terminated) and out.won is None  # MPE has no wins
    # final_obs is what the un-reset step saw; obs is the next episode's first observation
    k_step, k_reset = jax.random.split(key)
    raw_obs, *_ = spread.env.step_env(
        k_step, state, {a: action[i] for i, a in enumerate(spread.agents)}
    )
    np.testing.assert_allclose(
        out.final_obs.obs, np.stack([raw_obs[a] for a in spread.agents]), rtol=1e-6
    )
    reset_obs, _ = spread.reset(k_reset)
    np.testing.assert_array_equal(out.obs.obs, reset_obs.obs)
    assert int(out.state.step) == 0
    assert out.reward.shape == (3,)


def test_smax_masks_match_the_env(smax):
    obs, state = smax.reset(jax.random.key(1))
    assert smax.obs_shape.obs == (3, 75) and smax.obs_shape.avail == (3, 8)
    masks = smax.env.get_avail_actions(state)
    np.testing.assert_array_equal(obs.avail, np.stack([masks[a] for a in smax.agents]).astype(bool))
    # at the start the armies are out of range: move and stop only, no attack
    assert obs.avail[:, :5].all() and not obs.avail[:, 5:].any()
    # the world state, with unit positions (features 1 and 2 of 10 per unit) over the 32 x 32 map
    # and weapon cooldowns (feature 3) floored at 0
    inner = state.state
    state = state.replace(
        state=inner.replace(
            unit_weapon_cooldowns=inner.unit_weapon_cooldowns.at[0].set(-7.0).at[1].set(0.5)
        )
    )
    obs = smax._observe(
        dict(smax.env.get_obs(state), world_state=smax.env.get_world_state(state)), state
    )
    raw = np.asarray(smax.env.get_world_state(state))
    assert obs.state.shape == raw.shape == (72,)
    pos = np.zeros(72, bool)
    for u in range(6):
        pos[u * 10 + 1 : u * 10 + 3] = True
    np.testing.assert_allclose(obs.state[pos], raw[pos] / 32.0, rtol=1e-6)
    assert 0.0 < float(obs.state[pos].min()) and float(obs.state[pos].max()) < 1.0
    assert raw[3] == -7.0 and obs.state[3] == 0.0 and obs.state[13] == 0.5
    rest = ~pos
    rest[3] = False
    np.testing.assert_array_equal(obs.state[rest], raw[rest])


def test_smax_win_terminates_and_time_limit_truncates(smax):
    obs, state = smax.reset(jax.random.key(2))
    step = jax.jit(smax.step)
    stop = jnp.full((3,), 4, jnp.int32)
    inner = state.state
    # every enemy dead: a decisive end, won, no bootstrap
    won_state = state.replace(
        state=inner.replace(
            unit_health=inner.unit_health.at[3:].set(0.0),
            unit_alive=inner.unit_alive.at[3:].set(False),
        )
    )
    out = step(jax.random.key(3), won_state, stop)
    assert bool(out.terminated) and not bool(out.truncated) and bool(out.won)
    # every ally dead: terminated, lost
    lost_state = state.replace(
        state=inner.replace(
            unit_health=inner.unit_health.at[:3].set(0.0),
            unit_alive=inner.unit_alive.at[:3].set(False),
        )
    )
    out = step(jax.random.key(3), lost_state, stop)
    assert bool(out.terminated) and not bool(out.won)
    # the time limit with both armies standing: truncated (it bootstraps)
    # (SMAX, like MPE, ends after the step taken at step count max_steps)
    late = state.replace(state=inner.replace(step=jnp.asarray(smax.max_steps)))
    out = step(jax.random.key(4), late, stop)
    assert bool(out.truncated) and not bool(out.terminated) and not bool(out.won)
    assert int(out.state.state.step) == 0  # auto-reset


def test_continuous_mpe_and_heterogeneous_agents_are_padded():
    env = make_jaxmarl("MPE_simple_spread_v3_continuous")
    assert not env.action_spec.discrete and env.action_spec.shape == (5,)
    out = jax.jit(env.step)(
        jax.random.key(0), env.reset(jax.random.key(0))[1], jnp.full((3, 5), 0.5)
    )
    assert out.reward.shape == (3,)
    adv = make_jaxmarl("MPE_simple_adversary_v3")  # observations of 8 and 10 floats
    obs, _ = adv.reset(jax.random.key(0))
    assert adv.obs_shape.obs == (3, 10)
    np.testing.assert_array_equal(obs.obs[0, 8:], 0.0)


def test_unknown_env_names_the_key():
    with pytest.raises(ConfigError, match="'env'"):
        make_jaxmarl("MPE_simple_sprad_v3")
    with pytest.raises(ConfigError, match="'env'"):
        make_jaxmarl("SMAX_99q")


def test_evaluator_counts_each_envs_first_battle_only():
    """make_evaluator(wins=True): won is each env's first battle's outcome. A toy env (one
    function under test, so a stand-in env): its reset draws a kind, 0 (lost at once), 1
    (won at once) or 2 (lost after 3 steps). Envs whose first battle ended play on
    (auto-reset) until the long ones end, and may win later battles: those must not count."""
    from types import SimpleNamespace

    from tianjax.core.evaluation import make_evaluator
    from tianjax.core.types import ActionSpec, JaxStep

    def reset(key):
        kind = jax.random.randint(key, (), 0, 3)
        return kind[None].astype(jnp.float32), (kind, jnp.zeros((), jnp.int32))

    def step(key, state, action):
        kind, t = state
        done = (kind < 2) | (t >= 2)
        won = done & (kind == 1) & (action == 1)
        new_obs, new_state = reset(key)
        obs = kind[None].astype(jnp.float32)
        nxt_state = (jnp.where(done, new_state[0], kind), jnp.where(done, 0, t + 1))
        return JaxStep(
            jnp.where(done, new_obs, obs),
            nxt_state,
            won.astype(jnp.float32),
            done,
            jnp.zeros((), bool),
            obs,
            won,
        )

    env = SimpleNamespace(
        reset=reset,
        step=step,
        reports_wins=True,
        name="toy",
        action_spec=ActionSpec(discrete=True, num_actions=2),
    )
    algo = SimpleNamespace(
        init_carry=None, greedy=lambda params, obs: jnp.ones(obs.shape[:1], jnp.int32)
    )
    key = jax.random.key(0)
    returns, won = make_evaluator(env, algo, 64, wins=True)(None, key)
    first = np.asarray(
        jax.vmap(lambda k: reset(k)[1][0])(jax.random.split(jax.random.split(key)[1], 64))
    )
    assert set(first.tolist()) == {0, 1, 2}  # every kind drawn: later wins were possible
    np.testing.assert_array_equal(np.asarray(won), first == 1)
    np.testing.assert_array_equal(np.asarray(returns), (first == 1).astype(np.float32))
    with pytest.raises(ValueError, match="does not report wins"):
        make_evaluator(SimpleNamespace(name="CartPole-v1"), algo, 4, wins=True)

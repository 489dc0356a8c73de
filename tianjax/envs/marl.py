"""Multi-agent JAX environments: JaxMARL (SMAX, MPE, ...) behind tianjax's JAX env protocol.

JaxMARL envs speak in dicts keyed by agent name. The adapter stacks them on an agent axis
N (in `env.agents` order) and exposes the same stateless protocol as `JaxEnv`:

    reset(key) -> (obs: MAObs, state)
    step(key, state, action [N] or [N, D]) -> JaxStep(obs: MAObs, state, reward [N],
                                                      terminated [], truncated [], final_obs: MAObs,
                                                      won [])

where `MAObs` carries what multi-agent learners need:

    obs    [N, D]  each agent's own observation (zero-padded to the widest agent)
    state  [S]     the global state for centralised critics and mixers (JaxMARL's
                   `world_state` where the env gives one, as SMAX does, with SMAX's unit
                   positions divided by the map size and weapon cooldowns floored at 0:
                   raw, they run to 32 and to -30 and swamp a hypernetwork mixer; else
                   all agents' observations concatenated, as
                   JaxMARL's MPE baselines build it)
    avail  [N, A]  available-action mask (SMAX); all true where the env has none, and
                   false on the padding of agents with fewer actions. Continuous action
                   spaces get a [N, 1] all-true mask.

Auto-reset and truncation follow the other JAX envs: the adapter steps the env without
JaxMARL's own auto-reset (`step_env`) so that `final_obs` is the observation the episode
ended on; `obs` is already the next episode's first one. An episode cut by the env's
time limit (`max_steps`) with no decisive end is truncated (it bootstraps); SMAX
battles won or lost (one side entirely dead) terminate. `won` is true where an episode
ended with every enemy dead and an ally alive (SMAX's win); None for envs without wins.

Env ids: any `jaxmarl.registered_envs` name (e.g. `MPE_simple_spread_v3`), and
`SMAX_<map>` (e.g. `SMAX_3m`) for a SMAX map against JaxMARL's heuristic enemy, the
setting of JaxMARL's SMAX baselines. `MPE_..._continuous` selects MPE's continuous actions.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.config import ConfigError
from tianjax.core.types import ActionSpec, JaxStep, MAObs
from tianjax.envs.spaces import action_spec


def _inner(state):
    """The innermost JaxMARL state (wrappers such as HeuristicEnemySMAX nest it in `.state`)."""
    while hasattr(state, "state") and not hasattr(state, "step"):
        state = state.state
    return state


class MultiAgentEnv:
    """A JaxMARL env stacked on an agent axis (stateless, jittable, one env; vmap it)."""

    multi_agent = True

    def __init__(self, env, name: str | None = None):
        self.env = env
        self.name = name or getattr(env, "name", type(env).__name__)
        self.agents = list(env.agents)
        self.num_agents = len(self.agents)
        obs_spaces = [env.observation_space(a) for a in self.agents]
        self._obs_dims = [int(np.prod(s.shape)) for s in obs_spaces]
        self.obs_dim = max(self._obs_dims)
        specs = [action_spec(env.action_space(a), self.name) for a in self.agents]
        if len({s.discrete for s in specs}) != 1:
            raise ConfigError(f"config key 'env': {self.name} mixes discrete and continuous agents")
        self.discrete = specs[0].discrete
        if self.discrete:
            self._num_actions = [s.num_actions for s in specs]
            self.action_spec = ActionSpec(discrete=True, num_actions=max(self._num_actions))
        else:
            self._action_dims = [int(np.prod(s.shape)) for s in specs]
            dim = max(self._action_dims)
            low = np.full(dim, min(float(np.min(s.low)) for s in specs), np.float32)
            high = np.full(dim, max(float(np.max(s.high)) for s in specs), np.float32)
            self.action_spec = ActionSpec(discrete=False, shape=(dim,), low=low, high=high)
        self._has_masks = _has_avail_actions(env)
        self.max_steps = getattr(env, "max_steps", None)
        self._num_allies = getattr(env, "num_allies", None)
        self.reports_wins = self._num_allies is not None  # SMAX battles are won or lost
        self._state_scale, self._state_floor = _smax_state_transform(env)
        obs0 = jax.eval_shape(self.reset, jax.random.key(0))[0]
        # the shapes of one env's observation, as an MAObs: ((N, D), (S,), (N, A))
        self.obs_shape = MAObs(
            tuple(obs0.obs.shape), tuple(obs0.state.shape), tuple(obs0.avail.shape)
        )

    # ------------------------------------------------------------------ observation
    def _observe(self, obs_dict, state) -> MAObs:
        rows = [jnp.ravel(obs_dict[a]).astype(jnp.float32) for a in self.agents]
        obs = jnp.stack([jnp.pad(r, (0, self.obs_dim - r.shape[0])) for r in rows])
        if "world_state" in obs_dict:
            global_state = jnp.ravel(obs_dict["world_state"]).astype(jnp.float32)
            if self._state_scale is not None:
                global_state = jnp.maximum(global_state * self._state_scale, self._state_floor)
        else:
            global_state = jnp.concatenate(rows)
        return MAObs(obs, global_state, self._avail(state))

    def _avail(self, state) -> jax.Array:
        n = self.num_agents
        if not self.discrete:
            return jnp.ones((n, 1), bool)
        a = self.action_spec.num_actions
        pad = jnp.arange(a)[None, :] < jnp.asarray(self._num_actions)[:, None]
        if not self._has_masks:
            return pad
        masks = self.env.get_avail_actions(state)
        rows = [
            jnp.pad(jnp.asarray(masks[ag]).astype(bool), (0, a - k))
            for ag, k in zip(self.agents, self._num_actions)
        ]
        return jnp.stack(rows) & pad

    # ------------------------------------------------------------------ protocol
    def reset(self, key) -> tuple[MAObs, Any]:
        obs, state = self.env.reset(key)
        return self._observe(obs, state), state

    def _actions(self, action) -> dict:
        if self.discrete:
            action = action.astype(jnp.int32)
            return {a: action[i] for i, a in enumerate(self.agents)}
        return {a: action[i, :d] for i, (a, d) in enumerate(zip(self.agents, self._action_dims))}

    def step(self, key, state, action) -> JaxStep:
        """One step of all agents: `action` [N] (discrete) or [N, D] (continuous)."""
        k_step, k_reset = jax.random.split(key)
        obs_d, next_state, reward_d, done_d, _ = self.env.step_env(
            k_step, state, self._actions(action)
        )
        final_obs = self._observe(obs_d, next_state)
        done = jnp.asarray(done_d["__all__"]).astype(bool)
        won, decisive = self._outcome(next_state)
        timed_out = (
            jnp.asarray(_inner(next_state).step) >= self.max_steps
            if self.max_steps is not None
            else jnp.zeros((), bool)
        )
        truncated = done & timed_out & ~decisive
        terminated = done & ~truncated
        reset_obs, reset_state = self.reset(k_reset)
        pick = lambda new, old: jax.tree.map(lambda x, y: jnp.where(done, x, y), new, old)  # noqa: E731
        reward = jnp.stack([jnp.asarray(reward_d[a], jnp.float32) for a in self.agents])
        return JaxStep(
            pick(reset_obs, final_obs),
            pick(reset_state, next_state),
            reward,
            terminated,
            truncated,
            final_obs,
            done & won if self.reports_wins else None,
        )

    def _outcome(self, state) -> tuple[jax.Array, jax.Array]:
        """(won, decisive): SMAX-style battles end decisively when one side is all dead."""
        inner = _inner(state)
        if self._num_allies is None or not hasattr(inner, "unit_alive"):
            return jnp.zeros((), bool), jnp.zeros((), bool)
        alive = inner.unit_alive
        allies_dead = ~jnp.any(alive[: self._num_allies])
        enemies_dead = ~jnp.any(alive[self._num_allies :])
        return enemies_dead & ~allies_dead, allies_dead | enemies_dead


def _smax_state_transform(env) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(scale, floor) per feature of SMAX's world state (units' features, then teams and
    types): unit positions over the map size, into [0, 1], and weapon cooldowns floored at
    0 (SMAX lets a ready weapon's cooldown run negative, to -30 and beyond in a long
    battle). (None, None) for other envs."""
    feats = getattr(env, "own_features", None)
    if feats is None or not hasattr(env, "map_width"):
        return None, None
    n_units = env.num_allies + env.num_enemies
    scale = np.ones(len(feats), np.float32)
    scale[feats.index("position_x")] = 1.0 / env.map_width
    scale[feats.index("position_y")] = 1.0 / env.map_height
    floor = np.full(len(feats), -np.inf, np.float32)
    floor[feats.index("weapon_cooldown")] = 0.0
    rest = 2 * n_units
    return (
        np.concatenate([np.tile(scale, n_units), np.ones(rest, np.float32)]),
        np.concatenate([np.tile(floor, n_units), np.full(rest, -np.inf, np.float32)]),
    )


def _has_avail_actions(env) -> bool:
    try:
        jax.eval_shape(lambda k: env.get_avail_actions(env.reset(k)[1]), jax.random.key(0))
        return True
    except NotImplementedError:
        return False


def make_jaxmarl(name: str) -> MultiAgentEnv:
    """A MultiAgentEnv from an env id (see the module docstring)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # jaxmarl prints on import
        import jaxmarl
        from jaxmarl.environments.smax import map_name_to_scenario

    if name.startswith("SMAX_"):
        map_name = name[len("SMAX_") :]
        try:
            scenario = map_name_to_scenario(map_name)
        except (KeyError, ValueError):
            scenario = None
        if scenario is None:
            raise ConfigError(
                f"config key 'env': '{map_name}' is not a SMAX map (e.g. SMAX_3m, SMAX_2s3z)"
            )
        return MultiAgentEnv(jaxmarl.make("HeuristicEnemySMAX", scenario=scenario), name=name)
    kwargs = {}
    base = name
    if name.startswith("MPE_") and name.endswith("_continuous"):
        base, kwargs = name[: -len("_continuous")], {"action_type": "Continuous"}
    if base not in jaxmarl.registered_envs:
        mpe = sorted(e for e in jaxmarl.registered_envs if e.startswith("MPE_"))
        raise ConfigError(
            f"config key 'env': '{name}' is not a JaxMARL environment (e.g. SMAX_3m, "
            f"{', '.join(mpe[:4])}, ...)"
        )
    return MultiAgentEnv(jaxmarl.make(base, **kwargs), name=name)


__all__ = ["MAObs", "MultiAgentEnv", "make_jaxmarl"]

"""`make_train(config) -> (init, train_fn)`: a whole fused run as two pure functions, with
the numeric hyperparameters as inputs, so that a sweep is one `jax.vmap` and one program.

    init, train_fn = tianjax.make_train(config)
    out = jax.jit(train_fn)(init(jax.random.key(0)), {"ppo.lr": 1e-3})   # (config.algo: ppo)
    lrs = jnp.array([1e-3, 3e-3])
    outs = jax.jit(jax.vmap(train_fn, in_axes=(None, 0)))(init(key), {"ppo.lr": lrs})

`train_fn(state, hparams)` runs every update of the config's budget
(total_env_steps // (num_envs * rollout_len) of them) and returns a FusedRun: the final
FusedState, the per-update metrics as arrays [num_updates] (losses, the learning rate used,
the finished episodes' return sum and count), and the returns of the last 100 finished
episodes (`final_returns`, NaN where fewer finished), from which `final_return` is their mean,
as `tianjax.train()`'s summary reports it.

`hparams` is keyed by the config's dotted names; a key left out takes the config's value,
and every sweepable key is an input either way (one program whatever the dict holds). The
sweepable keys are the algorithm's numeric hyperparameters that shape no array
(`sweepable(config)`): for PPO the learning rate, entropy and value coefficients, clip
range, gamma, GAE lambda and the gradient-norm clip. Sizes (num_envs, rollout_len, network
widths, minibatches) change the program: they are config keys, grouped by `tianjax sweep`.
An unknown or non-sweepable key raises ConfigError naming it. The staleness schedule's
parameters are refused in fused mode: there every sample is fresh (tau = 0, weight 1), so
they could not change the run. Under a forced lag (`staleness.forced_lag: C > 0`, whose
ring holds C + 1 versions) `staleness.forced_lag` is an input too: any lag K in [0, C],
so that a lag sweep is one program, vmapped as seeds are:

    init, train_fn = tianjax.make_train(config)            # staleness.forced_lag: 64
    lags = jnp.array([0, 4, 16, 64])
    runs = jax.jit(jax.vmap(train_fn, in_axes=(None, 0)))(init(key), {"staleness.forced_lag": lags})

How the values become inputs: the algorithm is built inside train_fn from a copy of the
config whose sweepable fields hold the traced values (`bind`). The config's checks ran on
its own concrete values when it was loaded; concrete values given to train_fn are checked
the same way before tracing (a bad `ppo.lr=-1` is a ConfigError, not a NaN run). Traced
values (under vmap) cannot be checked in Python: check them before stacking (`check`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config, ConfigError, Sections
from tianjax.core.fused_loop import FusedState, corrects_staleness, lag_capacity, make_fused

WINDOW = 100  # finished episodes behind final_return, as the run recorder's trackers
LAG_KEY = "staleness.forced_lag"  # an input under a forced lag: the lag of the run


class FusedRun(NamedTuple):
    state: FusedState  # the final state (learner params, optimizer, envs, counters)
    metrics: dict  # name -> [num_updates] array (update metrics, episode_return_sum, episodes)
    final_returns: jax.Array  # [100] the last finished episodes' returns (NaN: not that many)


def sweepable(config: Config) -> tuple[str, ...]:
    """The dotted keys `train_fn` takes as inputs for this config's algorithm (its spec's
    `sweepable`: numeric hyperparameters it reads only in arithmetic, never for a shape or
    a Python branch, so that they can be traced)."""
    return tuple(config.spec.sweepable)


def _get(config: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(config, section), name)


def _unknown(config: Config, key: str) -> ConfigError:
    keys = sweepable(config)
    known = ", ".join(keys) if keys else "none for this algorithm"
    if key == LAG_KEY:
        why = (
            "needs a ring: set staleness.forced_lag in the config to the largest lag the "
            "program serves (0 there: every sample is fresh)"
        )
    elif key.startswith("staleness."):
        why = "has no effect in fused mode (every sample is fresh: tau = 0, weight 1)"
    elif "." in key and hasattr(getattr(config, key.split(".")[0], None), key.split(".", 1)[1]):
        why = (
            "is not a numeric input of train_fn (a size, a switch or another algorithm's key: "
            "set it in the config; tianjax sweep runs such grids in groups)"
        )
    else:
        why = "unknown key"
    return ConfigError(f"make_train hyperparameter '{key}': {why} (inputs: {known})")


def inputs(config: Config) -> tuple[str, ...]:
    """Every key train_fn takes: the sweepable ones, and the lag under a forced lag."""
    return sweepable(config) + ((LAG_KEY,) if lag_capacity(config) else ())


def _check_lag(config: Config, value) -> None:
    if isinstance(value, jax.core.Tracer):
        return
    a = np.asarray(value).reshape(-1)
    most = config.staleness.forced_lag
    ok = np.all(a == np.round(a)) and np.all(a >= 0) and np.all(a <= most)
    if not ok:
        raise ConfigError(
            f"config key '{LAG_KEY}': must be whole numbers in [0, {most}] (the ring holds "
            f"the config's staleness.forced_lag + 1 versions), got {a.tolist()}"
        )


def check(config: Config, hparams: Mapping[str, Any]) -> None:
    """Validates concrete hyperparameter values with the config's own checks (each value, or
    each entry of an array of values); ConfigError naming the key."""
    for key in hparams:
        if key not in inputs(config):
            raise _unknown(config, key)
    if LAG_KEY in hparams:
        _check_lag(config, hparams[LAG_KEY])
    hparams = {k: v for k, v in hparams.items() if k != LAG_KEY}
    concrete = {k: v for k, v in hparams.items() if not isinstance(v, jax.core.Tracer)}
    if not concrete:
        return
    arrays = {k: np.asarray(v, np.float64).reshape(-1) for k, v in concrete.items()}
    for k, a in arrays.items():
        if not np.all(np.isfinite(a)):
            raise ConfigError(f"config key '{k}': must be finite, got {a.tolist()}")
    n = max(a.size for a in arrays.values())
    for i in range(n):
        sections: dict[str, dict] = {}
        for k, a in arrays.items():
            section, name = k.split(".")
            sections.setdefault(section, {})[name] = float(a[i % a.size])
        for section, values in sections.items():
            dataclasses.replace(getattr(config, section), **values)  # runs the section's checks


def bind(config: Config, values: Mapping[str, Any]) -> Config:
    """A copy of `config` whose fields named in `values` hold those values (arrays, possibly
    traced), without running the checks, which a traced value cannot pass through Python.
    Only for building the algorithm inside a trace."""
    sections: dict[str, Any] = {}
    for key, v in values.items():
        section, name = key.split(".")
        if section not in sections:
            sections[section] = copy.copy(getattr(config, section))
        object.__setattr__(sections[section], name, v)
    out = copy.copy(config)
    algo_sections = dict(config.algo_sections)
    for section, obj in sections.items():
        if section in algo_sections:
            algo_sections[section] = obj
        else:
            object.__setattr__(out, section, obj)
    object.__setattr__(out, "algo_sections", Sections(algo_sections))
    return out


def _window_push(window: jax.Array, count: jax.Array, done: jax.Array, returns: jax.Array):
    """Pushes the returns of the episodes finished in one rollout (done, returns [T, B], in
    time order) into the ring of the last WINDOW; `count` is how many were pushed so far."""
    d = done.reshape(-1)
    r = returns.reshape(-1).astype(jnp.float32)
    rank = jnp.cumsum(d.astype(jnp.int32)) - 1  # this rollout's order of the finished ones
    n = jnp.sum(d.astype(jnp.int32))
    keep = d & (rank >= n - WINDOW)  # more than WINDOW in one rollout: the last WINDOW
    slot = jnp.where(keep, (count + rank) % WINDOW, WINDOW)  # WINDOW: out of range, dropped
    return window.at[slot].set(r, mode="drop"), count + n


def make_train(config: Config, env=None):
    """Returns (init(key) -> FusedState, train_fn(state, hparams) -> FusedRun) for a fused
    config (`env`: a JaxEnv to use instead of the config's). Both are pure: jit and vmap them."""
    from tianjax.envs.factory import make_jax_env

    if config.mode != "fused":
        raise ConfigError(
            f"config key 'mode': make_train builds fused runs, got mode '{config.mode}'"
        )
    env = (
        env if env is not None else make_jax_env(config.env_backend, config.env, config.env_options)
    )
    obs_dtype = getattr(env, "obs_dtype", None)
    correct = corrects_staleness(config)
    algo = make_algorithm(
        config, env.obs_shape, env.action_spec, correct_staleness=correct, obs_dtype=obs_dtype
    )
    init, _ = make_fused(config, env, algo)
    num_updates = config.total_env_steps // (config.num_envs * config.rollout_len)
    keys = sweepable(config)

    def train_fn(state: FusedState, hparams: Mapping[str, Any] | None = None) -> FusedRun:
        hparams = dict(hparams or {})
        check(config, hparams)
        values = {
            k: jnp.asarray(hparams[k] if k in hparams else _get(config, k), jnp.float32)
            for k in keys
        }
        bound = bind(config, values)
        algo_b = make_algorithm(
            bound, env.obs_shape, env.action_spec, correct_staleness=correct, obs_dtype=obs_dtype
        )
        _, run = make_fused(bound, env, algo_b)
        if LAG_KEY in hparams:
            lag = jnp.asarray(hparams[LAG_KEY], jnp.int32)
            state = state._replace(lag=state.lag._replace(lag=lag))
        opt = state.learner.opt_state
        if hasattr(opt, "hyperparams"):  # optax.inject_hyperparams: the optimizer reads its state
            section = config.spec.section
            hp = dict(opt.hyperparams)
            for name, key in (
                ("learning_rate", f"{section}.lr"),
                ("max_grad_norm", f"{section}.max_grad_norm"),
            ):
                if name in hp and key in values:
                    hp[name] = values[key]
            state = state._replace(
                learner=state.learner._replace(opt_state=opt._replace(hyperparams=hp))
            )

        def body(carry, _):
            s, window, count = carry
            s, (metrics, episodes) = run(s, 1)
            metrics = jax.tree.map(lambda x: x[0], metrics)
            done, rets = episodes.done[0], episodes.returns[0]
            window, count = _window_push(window, count, done, rets)
            metrics["episode_return_sum"] = jnp.sum(jnp.where(done, rets, 0.0))
            metrics["episodes"] = jnp.sum(done.astype(jnp.int32))
            return (s, window, count), metrics

        window0 = jnp.full((WINDOW,), jnp.nan, jnp.float32)
        (state, window, count), metrics = jax.lax.scan(
            body, (state, window0, jnp.zeros((), jnp.int32)), None, length=num_updates
        )
        return FusedRun(state, metrics, window)

    return init, train_fn


def final_return(run: FusedRun) -> np.ndarray:
    """The mean of the last 100 finished episodes' returns (NaN if none finished), per
    leading (vmapped) axis."""
    w = np.asarray(run.final_returns, np.float64)
    n = np.sum(~np.isnan(w), axis=-1)
    total = np.sum(np.where(np.isnan(w), 0.0, w), axis=-1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


__all__ = [
    "FusedRun",
    "LAG_KEY",
    "WINDOW",
    "bind",
    "check",
    "final_return",
    "inputs",
    "make_train",
    "sweepable",
]

"""tianjax: fast, distributed reinforcement-learning training in JAX.

Implements TianJi's relaxed assignment dependencies (He et al., "Highly Parallelized
Reinforcement Learning Training with Relaxed Assignment Dependencies", arXiv 2502.20190)
with versioned parameters and a staleness-weighted loss.

    import tianjax
    config = tianjax.load_config("configs/ppo_cartpole.yaml", ["total_env_steps=100000"])
    result = tianjax.train(config)
    print(tianjax.evaluate(result, episodes=20).line())
    run = tianjax.load(result.run_dir)  # config, params, policy (later, from the run directory)
    print(tianjax.replay_run(async_run_dir).line())  # an async run redone, bit for bit

    init, train_fn = tianjax.make_train(config)  # a fused run as pure functions: jit, vmap
    out = jax.vmap(train_fn, in_axes=(None, 0))(init(key), {"ppo.lr": jnp.array([1e-3, 3e-3])})
"""

from tianjax import algos  # the algorithm registry, whose check every Config runs
from tianjax._version import __version__
from tianjax.config import Config, ConfigError, load_config
from tianjax.train import TrainResult, train

_LAZY = {
    "load": "tianjax.runs",
    "evaluate": "tianjax.runs",
    "LoadedRun": "tianjax.runs",
    "make_train": "tianjax.runtime.runners.train_fn",
    "final_return": "tianjax.runtime.runners.train_fn",
    "replay_run": "tianjax.runtime.runners.rerun",
    "ReplayOutcome": "tianjax.runtime.runners.rerun",
}


def __getattr__(name):
    # load / evaluate pull in orbax: imported on first use, so `import tianjax` stays quick
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tianjax' has no attribute {name!r}")


__all__ = [
    "Config",
    "ConfigError",
    "LoadedRun",
    "ReplayOutcome",
    "TrainResult",
    "algos",
    "evaluate",
    "final_return",
    "load",
    "load_config",
    "make_train",
    "replay_run",
    "train",
    "__version__",
]

"""tianjax: fast, distributed reinforcement-learning training in JAX.

Implements TianJi's relaxed assignment dependencies (He et al., "Highly Parallelized
Reinforcement Learning Training with Relaxed Assignment Dependencies", arXiv 2502.20190)
with versioned parameters and a staleness-weighted loss.

    import tianjax
    config = tianjax.load_config("configs/ppo_cartpole.yaml", ["total_env_steps=100000"])
    result = tianjax.train(config)
    print(tianjax.evaluate(result, episodes=20).line())
    run = tianjax.load(result.run_dir)  # config, params, policy (later, from the run directory)
"""

from tianjax._version import __version__
from tianjax.config import Config, ConfigError, load_config
from tianjax.train import TrainResult, train

_LAZY = {"load": "tianjax.runs", "evaluate": "tianjax.runs", "LoadedRun": "tianjax.runs"}


def __getattr__(name):
    # load / evaluate pull in orbax: imported on first use, so `import tianjax` stays quick
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "algos":  # tianjax.algos.register(name, make)
        import importlib

        return importlib.import_module("tianjax.algos")
    raise AttributeError(f"module 'tianjax' has no attribute {name!r}")


__all__ = ["Config", "ConfigError", "LoadedRun", "TrainResult", "algos", "evaluate", "load", "load_config",
           "train", "__version__"]

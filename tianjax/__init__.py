"""tianjax: fast, distributed reinforcement-learning training in JAX.

Implements TianJi's relaxed assignment dependencies (He et al., "Highly Parallelized
Reinforcement Learning Training with Relaxed Assignment Dependencies", arXiv 2502.20190)
with versioned parameters and a staleness-weighted loss.

    import tianjax
    config = tianjax.load_config("configs/ppo_cartpole.yaml", ["total_env_steps=100000"])
    result = tianjax.train(config)
"""

from tianjax.config import Config, ConfigError, load_config
from tianjax.train import TrainResult, train

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "TrainResult", "load_config", "train", "__version__"]

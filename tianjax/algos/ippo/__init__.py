"""IPPO / MAPPO (PPO's loss over agent columns, PPO's section): its config section (config.py),
its loss, acting and update
(loss.py), and its AlgorithmSpec (spec.py), which the registry reads."""

from tianjax.algos.ippo.spec import SPEC

__all__ = ["SPEC"]

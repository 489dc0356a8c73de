"""QMIX (recurrent agents, a monotonic mixer, replay of sequences): its config section
(config.py), its loss, acting and update
(loss.py), and its AlgorithmSpec (spec.py), which the registry reads."""

from tianjax.algos.qmix.spec import SPEC

__all__ = ["SPEC"]

"""IMPALA (V-trace): its config section (config.py), its loss, acting and update
(loss.py), and its AlgorithmSpec (spec.py), which the registry reads."""

from tianjax.algos.impala.spec import SPEC

__all__ = ["SPEC"]

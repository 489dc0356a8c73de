"""Learner groups (TianJi's group mode, arXiv 2502.20190, with DiLoCo's outer optimiser):
`groups.count` learners, each with its own actors, pool, balance controller and version
counter, and an averager process that combines their parameter changes every few updates
(tianjax.core.outer_step has the rule). No barrier anywhere: a slow group costs its own
share, a lost one is left out of rounds and rejoins when it sends again.

- `averager`: the averager's event loop (deltas in, averages out, checkpoints);
- `sync`: GroupSync, the learner's hook at its update boundary (sends deltas without
  waiting, merges averages);
- `shares`: what each group gets of a run (actors, budget, directory, ports).

The runner that starts them on one machine is tianjax.runtime.runners.groups; across
hosts, `tianjax launch --role averager | learner --group i | actor` (docs/multihost.md).
"""

"""The functional core: pure JAX, no sockets, threads, files or clocks.

A sample's way through it: `rollout` (the actor step and the lax.scan rollout, with
`episodes` bookkeeping) produces `types.Trajectory`; `staleness` and `returns` turn it into
weights and targets inside an algorithm's loss; `update` applies one guarded optimizer
step; `replay` holds off-policy samples; `fused` runs it all in one jitted loop and
`evaluation` plays the greedy policy.
"""

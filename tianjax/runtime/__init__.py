"""The runtime shell: loops that call the pure core and do the I/O around it.

By stage: `actor` (sources of rollouts, the actor process), `learner` (the learner
process, from ingress and pool to the update over the mesh and the publisher), `balance`
(measures, limits and the set-point controller), `modes` (how sync and async differ, one
strategy object), `runners` (fused, in-process, local, multi-host: one Runner shape),
`record` (episodes, records, checkpoints, results, saved runs), `process` (shutdown,
resources, the compile cache).
"""

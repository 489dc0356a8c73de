"""The runtime shell: loops that call the pure core and do the I/O around it.

By stage: `actor` (sources of rollouts, the actor process), `learner` (the learner
process, from ingress to the update over the mesh and the publisher), `balance` (limits
and the set-point controller), `runners` (fused, host, eval, the recorder they share),
`process` (shutdown, resources, the compile cache).
"""

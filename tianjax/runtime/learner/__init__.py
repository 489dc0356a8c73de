"""The learner process, by responsibility: `learner` (the loop), `io` (its sockets), `receiver`,
`ingress` and `lost` (trajectories in, credits, control), `batches` (on-policy and replay),
`sharded_update` (the update over the mesh), `inflight` and `publisher` (parameters out),
`pool`, `stats`, `watchdog`."""

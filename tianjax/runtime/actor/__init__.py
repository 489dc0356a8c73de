"""The actor: rollouts from JAX or host envs (`sources`) and the actor process around them (`actor`)."""

"""Checkpoints of the whole learner state (orbax): save, digest-checked restore with
fallback (`store`), and orbax's failures turned into one line (`errors`)."""

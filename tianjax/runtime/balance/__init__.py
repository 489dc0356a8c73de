"""Balancing production against consumption: counts and hard limits (`limits`) and the pure set-point controller (`controller`)."""

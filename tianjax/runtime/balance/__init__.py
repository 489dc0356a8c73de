"""Balancing production against consumption: what is measured (`measures`), the hard limits
set-point controller (`controller`)."""

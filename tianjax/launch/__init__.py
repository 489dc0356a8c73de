"""Launchers: local (learner + actor processes on this machine) and multi-host roles."""

"""Replay: a ring buffer of items with their behaviour versions (`ring`), one that stores
each observation once (`frames`), and the set-up every off-policy loop shares (`setup`)."""

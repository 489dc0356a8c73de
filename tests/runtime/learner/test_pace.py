"""Which side set a run's pace (runtime/learner/stats.py `pace`), on hand-made shares."""

import pytest

from tianjax.runtime.learner.stats import pace


def test_actors_held_for_credits_longer_than_the_learner_idled_means_the_learner_set_the_pace():
    # actors waited 40 of their 100 s for credits; the learner idled 15% of its time
    out = pace(0.85, {"wall": 100.0, "waiting_credit": 40.0, "acting": 55.0})
    assert out["pace_set_by"] == "learner"
    assert out["actor_credit_wait_fraction"] == pytest.approx(0.4)
    assert out["learner_idle_fraction"] == pytest.approx(0.15)


def test_a_learner_idle_more_than_the_actors_waited_means_the_actors_set_the_pace():
    out = pace(0.30, {"wall": 100.0, "waiting_credit": 5.0, "acting": 95.0})
    assert out["pace_set_by"] == "actors" and out["learner_idle_fraction"] == pytest.approx(0.7)


def test_no_actor_time_reported_says_nothing():
    assert pace(0.5, {"wall": 0.0, "waiting_credit": 0.0})["pace_set_by"] is None

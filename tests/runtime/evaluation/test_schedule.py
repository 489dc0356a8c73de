"""When evaluations are due, by hand: every_updates at the first version at or past each
multiple (an evaluator that takes the newest version may skip some), every_s by the clock,
neither: never during training."""

from tianjax.config.eval_section import EvalConfig
from tianjax.runtime.evaluation.schedule import EvalSchedule


def test_every_updates_is_due_at_the_first_version_past_each_multiple():
    s = EvalSchedule(EvalConfig(episodes=1, every_updates=10))
    seen = []
    for v in [1, 4, 9, 10, 11, 19, 23, 25, 31, 40]:  # the versions an evaluator held
        if s.due(v, 0.0):
            s.done(v, 0.0)
            seen.append(v)
    assert seen == [10, 23, 31, 40]
    assert s.updates_to_next(40) == 10 and s.updates_to_next(43) == 7


def test_every_s_is_due_that_long_after_the_last_one_and_never_twice_for_a_version():
    s = EvalSchedule(EvalConfig(episodes=1, every_s=5.0), version=0, now=100.0)
    assert not s.due(3, 104.9)
    assert s.due(3, 105.0)
    s.done(3, 105.0)
    assert not s.due(3, 200.0)  # a version is evaluated once
    assert not s.due(4, 109.0) and s.due(4, 110.0)
    assert s.updates_to_next(4) is None


def test_without_every_nothing_is_due_during_training_and_a_resumed_version_is_not_again():
    assert not EvalSchedule(EvalConfig(episodes=3)).due(1000, 1e9)
    s = EvalSchedule(EvalConfig(episodes=1, every_updates=5), version=20)
    assert not s.due(20, 0.0) and not s.due(24, 0.0) and s.due(25, 0.0)

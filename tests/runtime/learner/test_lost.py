"""Which trajectories an actor said it sent count as lost (runtime/lost.py's
lost_trajectories), on hand-made timelines of heartbeats and arrivals. The case it was
written for: a heartbeat overtakes the trajectory sent just before it (another socket) and
the trajectory comes seconds later; it must not be taken as lost, or the actor gets a slot
too many and makes more than the budget."""

from tianjax.runtime.learner.lost import lost_trajectories

GRACE = 10.0


def _beats(timeline, backlog_empty=True):
    """timeline: [(now, sent, accounted)]; returns the lost counts, one per heartbeat."""
    claim, out = None, []
    for now, sent, accounted in timeline:
        lost, claim = lost_trajectories(claim, sent, accounted, now, GRACE, backlog_empty)
        out.append(lost)
    return out, claim


def test_a_trajectory_that_lags_its_heartbeat_is_late_not_lost():
    # sent 1 at t=0, its heartbeat read at once; the trajectory arrives 9 s later; an idle actor
    # goes on reporting sent=1 for a minute
    timeline = [(0.0, 1, 0), (1.0, 1, 0), (8.9, 1, 0)] + [(t, 1, 1) for t in range(9, 70)]
    lost, claim = _beats(timeline)
    assert sum(lost) == 0 and claim is None


def test_an_actor_that_keeps_sending_is_never_written_off():
    # every heartbeat comes right after a send, with the newest trajectory still on its way
    timeline = [(float(t), t + 1, t) for t in range(100)]
    assert sum(_beats(timeline)[0]) == 0


def test_a_stopped_actors_missing_trajectories_are_lost_after_the_grace():
    # 3 sent, 1 came; the actor is out of slots and waits, reporting sent=3 each second
    timeline = [(float(t), 3, 1) for t in range(0, 15)]
    lost, claim = _beats(timeline)
    assert lost[:10] == [0] * 10  # t = 0..9: within the grace
    assert lost[10] == 2 and sum(lost) == 2  # at t = 10, once; then written off (accounted below)


def test_written_off_trajectories_count_as_accounted():
    claim, lost = None, []
    accounted = 1
    for t in range(0, 40):
        n, claim = lost_trajectories(claim, 3, accounted, float(t), GRACE, True)
        accounted += n  # the ingress adds its write-offs to what is accounted for
        lost.append(n)
    assert sum(lost) == 2 and lost.index(2) == 10


def test_nothing_is_lost_while_the_learner_has_unread_trajectories():
    timeline = [(float(t), 2, 0) for t in range(30)]
    assert sum(_beats(timeline, backlog_empty=False)[0]) == 0
    claim = _beats(timeline, backlog_empty=False)[1]
    # once the backlog is read and still nothing came: lost
    assert lost_trajectories(claim, 2, 0, 31.0, GRACE, True)[0] == 2


def test_a_claim_is_dated_from_when_it_was_first_made():
    # sent rises from 1 to 2 while the first is missing: the old claim (t=0, 1) keeps its age
    claim = None
    _, claim = lost_trajectories(claim, 1, 0, 0.0, GRACE, True)
    _, claim = lost_trajectories(claim, 2, 0, 5.0, GRACE, True)
    assert claim == (0.0, 1)
    lost, claim = lost_trajectories(claim, 2, 0, 10.0, GRACE, True)
    assert lost == 1  # the first; the second was claimed at t=10 and has its own grace
    assert claim == (10.0, 2)
    assert lost_trajectories(claim, 2, 1, 19.0, GRACE, True)[0] == 0
    assert lost_trajectories(claim, 2, 1, 20.0, GRACE, True)[0] == 1


def test_malformed_counts_change_nothing():
    for bad in (None, True, -1, 1.5, "3", [3]):
        assert lost_trajectories((0.0, 2), bad, 0, 100.0, GRACE, True) == (0, (0.0, 2))

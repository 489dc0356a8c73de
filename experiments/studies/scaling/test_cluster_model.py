"""cluster_model.py (beside this file), the discrete-event model of actors, transport and learner:
its processor-sharing CPU and its runs against closed forms.

- The CPU: short bursts first come, first served; long computations share the cores the
  bursts leave, each at most at its parallelism (finishing times worked out by hand).
- A fixed-delay simulator with free CPU: one sync actor makes a trajectory of T steps of d
  seconds, then waits for the update (u) and the publication (p): 512 samples every
  T d + u + p. One async actor with two credits never waits for a short update: 512
  samples every T d. N sync actors with fixed delays: N x 512 every T d + u(N) + p.
"""

from __future__ import annotations

import math

import cluster_model as cm  # beside this file: pytest puts its folder on sys.path
import pytest

from tianjax.envs import Latency


def finish_times(cores, jobs):
    """Runs `jobs` [(start, core-seconds, parallelism, priority)] on one host; their end times."""
    eng = cm.Engine()
    host = cm.Host(eng, cores)
    ends = {}

    def job(i, start, work, par, priority):
        yield cm.Sleep(start)
        yield cm.Cpu(host, work, par, priority)
        ends[i] = eng.now

    for i, spec in enumerate(jobs):
        eng.start(job(i, *spec))
    eng.run(lambda: False)
    return [ends[i] for i in range(len(jobs))]


def test_bursts_first_come_first_served():
    # two bursts of 1 core-second on 1 core: one after the other
    assert finish_times(1, [(0, 1, 1, 0), (0, 1, 1, 0)]) == pytest.approx([1, 2])
    # three on 2 cores: the third waits for the first core free
    assert finish_times(2, [(0, 1, 1, 0), (0, 2, 1, 0), (0, 1, 1, 0)]) == pytest.approx([1, 2, 2])
    # every job a core of its own
    assert finish_times(math.inf, [(0, 1, 1, 0)] * 5) == pytest.approx([1] * 5)


def test_long_jobs_share_what_bursts_leave():
    # a 2-thread computation alone on 2 cores: 2 core-seconds in 1 s
    assert finish_times(2, [(0, 2, 2, 1)]) == pytest.approx([1])
    # a burst of 1 core-second beside it: 3 runnable threads on 2 cores, 2/3 of a core each
    # (the computation's floor, 2 x 2/3, leaves the burst 2/3): both end at 1.5 s
    assert finish_times(2, [(0, 2, 2, 1), (0, 1, 1, 0)]) == pytest.approx([1.5, 1.5])
    # with 4 cores the burst takes a core the computation does not need
    assert finish_times(4, [(0, 2, 2, 1), (0, 1, 1, 0)]) == pytest.approx([1, 1])
    # two single-threaded computations on 1 core: half speed each
    assert finish_times(1, [(0, 1, 1, 1), (0, 1, 1, 1)]) == pytest.approx([2, 2])
    # a burst arriving at 0.5 s on the only core: each at half speed (one runnable thread
    # each), the burst's 0.25 core-seconds in 0.5 s, then the computation alone again
    assert finish_times(1, [(0, 1, 1, 1), (0.5, 0.25, 1, 0)]) == pytest.approx([1.25, 1.0])
    # three bursts queued on 2 cores beside a 1-thread computation: it keeps 2 x 1/4 of a
    # core (its fair share of 4 runnable threads); the bursts get 1.5 cores, first come first
    # served: the first on a whole core, the second on half of one, the third waits
    ends = finish_times(2, [(0, 10, 1, 1), (0, 1, 1, 0), (0, 1, 1, 0), (0, 1, 1, 0)])
    assert ends[1] == pytest.approx(1.0)


def free_costs(update_ms: float, publish_ms: float = 0.0) -> cm.Costs:
    return cm.Costs(
        act_cpu_ms_per_step=0.0,
        traj_send_cpu_ms=0.0,
        traj_recv_cpu_ms=0.0,
        traj_bytes=0.0,
        wire_s_per_byte=0.0,
        update_wall_ms={1: update_ms, 2: update_ms, 4: update_ms},
        update_cpu_over_wall=1.0,
        publish_fit_a_ms=publish_ms,
        publish_fit_b_ms_per_sub=0.0,
    )


FIXED = Latency(step_ms=16.0)


def test_one_sync_actor_waits_for_every_update():
    u, p = 30.0, 2.0
    out = cm.simulate(cm.Setup("sync", 1, FIXED, free_costs(u, p), samples=512 * 20))
    assert out["fresh"] == pytest.approx(512 / (32 * 0.016 + (u + p) / 1e3), rel=1e-9)
    assert out["tau"] == 0
    assert out["busy"] == pytest.approx(u / (32 * 16 + u + p), rel=1e-9)


def test_one_async_actor_never_waits_for_a_short_update():
    out = cm.simulate(cm.Setup("async", 1, FIXED, free_costs(30.0, 2.0), samples=512 * 20))
    assert out["fresh"] == pytest.approx(512 / (32 * 0.016), rel=1e-9)
    assert out["wait"] == pytest.approx(0.0, abs=1e-12)
    # it acts each trajectory with the parameters of the update before the last: the one
    # being learned from was acted while the previous trajectory's update ran
    assert out["tau"] == pytest.approx(1.0)


def test_sync_actors_with_fixed_delays_move_in_lockstep():
    u = 10.0
    out = cm.simulate(
        cm.Setup("sync", 4, FIXED, free_costs(u), samples=4 * 512 * 10, cores=math.inf)
    )
    assert out["fresh"] == pytest.approx(4 * 512 / (32 * 0.016 + u / 1e3), rel=1e-9)


def test_shared_cpu_slows_actors_down():
    # 4 actors on 1 core, each vector step 10 ms of CPU and no delay: the core is the
    # bottleneck, 1 vector step (16 samples) per 10 ms whatever the mode
    costs = free_costs(0.001)
    costs.act_cpu_ms_per_step = 10.0
    out = cm.simulate(
        cm.Setup("async", 4, Latency(step_ms=0.0), costs, samples=512 * 40, cores=1.0)
    )
    assert out["fresh"] == pytest.approx(16 / 0.010, rel=0.02)

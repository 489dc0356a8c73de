"""The evaluator process of an async run, with real processes: it takes versions from the
parameter channel as an actor does and evaluates each pinned version it takes; its records
carry the version and env steps it evaluated; the learner evaluates its final parameters;
an evaluator that is killed is started again, and the run says so and goes on.
"""

from __future__ import annotations

import json
import signal

from .conftest import ASYNC_CFG, actor_processes, read_summary, records, wait_for


def test_the_evaluator_evaluates_pinned_versions_and_is_restarted_when_killed(procs, tmp_path):
    run_dir = tmp_path / "run"
    launcher = procs.start(
        [
            "-m",
            "tianjax.cli",
            "train",
            ASYNC_CFG,
            f"run_dir={run_dir}",
            "total_env_steps=400000",
            "eval.episodes=2",
            "eval.every_updates=20",
            "runtime.max_reuse=0",
            "--no-progress",
        ],
        name="launcher",
    )
    evaluations = lambda: [r for r in records(run_dir) if "eval_return" in r]  # noqa: E731
    first = wait_for(
        lambda: evaluations() or launcher.poll() is not None, 300, what="a first evaluation"
    )
    assert launcher.poll() is None, procs.stderr(launcher)[-3000:]
    assert first[0]["updates"] >= 20
    (evaluator,) = actor_processes(launcher.pid, role="evaluator")
    evaluator.send_signal(signal.SIGKILL)
    assert procs.wait(launcher, 600) == 0, procs.stderr(launcher)[-3000:]
    err = procs.stderr(launcher)
    assert "tianjax: warning: evaluator (killed by SIGKILL) restarted" in err

    s = read_summary(run_dir)
    assert s["evaluator_restarts"] == 1 and s["evaluator_lost"] is False
    assert s["evaluations_rejected"] == 0
    evals = evaluations()
    during, final = evals[:-1], evals[-1]
    assert len(during) >= 1  # (the one before the kill at least; a loaded machine may end the
    # run before the restarted evaluator has compiled)
    # each of a version the learner published: past a multiple of 20, at most once each,
    # with the env steps the learner had admitted when it sent that version (at least those
    # of the record of an older version; a few trajectories more may have come in between
    # that version's update and its sending)
    versions = [e["updates"] for e in during]
    assert all(v >= 20 for v in versions) and len(set(v // 20 for v in versions)) == len(versions)
    train = [r for r in records(run_dir) if "eval_return" not in r]
    for e in during:
        before = [r for r in train if r["updates"] <= e["updates"]]
        assert before[-1]["env_steps"] <= e["env_steps"] <= train[-1]["env_steps"]
    # the final evaluation is the learner's, of its final parameters
    assert final["updates"] == s["updates"] == s["eval_version"]
    assert s["eval_return"] == final["eval_return"]
    best = max(evals, key=lambda e: e["eval_return"])
    assert (s["eval_best_return"], s["eval_best_version"]) == (best["eval_return"], best["updates"])
    log = (run_dir / "actors" / "evaluator-0.log").read_text()
    assert "Traceback" not in log, log[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["evaluations"] == len(evals)

import json
import math

import numpy as np

from tianjax.config import load_config
from tianjax.metrics import EpisodeTracker, RunLogger, format_summary


def test_convergence_is_first_time_the_full_window_average_reaches_target():
    t = EpisodeTracker(target_return=10.0, window=4)
    t.add([10, 10, 10], [1, 2, 3], wall_time_s=1.0)  # window not full yet
    assert not t.converged and t.moving_average == 10
    t.add([6], [4], wall_time_s=2.0)  # mean 9
    assert not t.converged
    t.add([14, 0], [5, 6], wall_time_s=3.0)  # after 14: (10+10+6+14)/4 = 10 -> converged at step 5
    assert t.convergence_time_s == 3.0 and t.convergence_env_steps == 5
    t.add([100], 7, wall_time_s=4.0)
    assert t.convergence_time_s == 3.0  # first time only
    assert t.moving_average == (6 + 14 + 0 + 100) / 4 and t.episodes == 7


def test_non_finite_returns_are_ignored_and_no_target_never_converges():
    t = EpisodeTracker(target_return=None, window=2)
    t.add([float("nan"), 1.0, 3.0], 0, 1.0)
    assert t.episodes == 2 and t.moving_average == 2.0 and not t.converged
    assert math.isnan(EpisodeTracker(1.0).moving_average)


def test_run_logger_writes_jsonl_and_atomic_summary(tmp_path):
    cfg = load_config(None)
    log = RunLogger(cfg, str(tmp_path / "r"))
    log.log({"env_steps": np.int64(5), "return_mean_100": float("nan"), "x": np.float32(0.5)})
    s = log.write_summary(
        {"final_return": np.float32(2.5), "convergence_time_s": None, "mode": "fused"}
    )
    log.close()
    assert json.loads((tmp_path / "r" / "metrics.jsonl").read_text()) == {
        "env_steps": 5,
        "return_mean_100": None,
        "x": 0.5,
    }
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == s
    assert not (tmp_path / "r" / "summary.json.tmp").exists()
    assert load_config(tmp_path / "r" / "config.yaml") == cfg  # the resolved config reloads
    text = format_summary({**s, "target_return": 3.0})
    assert "target 3 not reached" in text and "final_return" in text


def test_finished_episodes_are_ordered_with_the_env_step_they_ended_at():
    from tianjax.metrics.tracker import finished_episodes

    # K=2 chunks x T=2 steps x B=3 envs, base 100: step (k, t) ends at 100 + (2k + t + 1) * 3
    done = np.zeros((2, 2, 3), bool)
    rets = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    done[0, 1, 2] = done[1, 0, 0] = done[1, 1, 1] = True
    r, s = finished_episodes(done, rets, 100)
    np.testing.assert_array_equal(r, [5, 6, 10])
    np.testing.assert_array_equal(s, [106, 109, 112])

"""Evaluation videos: one episode as an mp4 (and its GIF preview) from gymnasium's
rgb_array render, envpool's screen, and MinAtar's grid; an env that cannot render says so
in one line when the maker is built (the start of a run), and the run goes on without."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tianjax.config import load_config
from tianjax.runtime.evaluation import recording as V

iio = pytest.importorskip("imageio.v3", reason="the video extra")
pytest.importorskip("imageio_ffmpeg", reason="the video extra")


def _video(tmp_path, config, **kw):
    maker = V.video_maker(config, str(tmp_path), **kw)
    assert maker is not None
    from tianjax.algos import make_algorithm

    algo = make_algorithm(
        config,
        maker.env.obs_shape,
        maker.action_spec,
        obs_dtype=getattr(maker.env, "obs_dtype", None),
    )
    params = algo.init(jax.random.key(0)).params
    name = maker(params, 7, jax.random.key(1))
    maker.close()
    assert name == "videos/eval-v00000007.mp4"
    frames = iio.imread(tmp_path / name, index=None)
    gif = iio.imread(tmp_path / "videos" / "eval-v00000007.gif", index=None)
    return frames, gif


def test_a_gymnasium_cartpole_episode_as_an_mp4(tmp_path):
    config = load_config(
        "ppo_cartpole_gymnasium", ["eval.episodes=1", "eval.video=true", "num_actors=0"]
    )
    frames, gif = _video(tmp_path, config)
    assert frames.shape[1:] == (400, 600, 3)  # gymnasium's CartPole screen
    assert 8 <= len(frames) <= 500 and frames.std() > 0
    assert gif.shape[1:3] == (200, 300)  # the preview: at most 320 wide


def test_a_breakout_minatar_episode_as_an_mp4(tmp_path):
    config = load_config("ppo_breakout_minatar", ["eval.episodes=1", "eval.video=true"])
    frames, _ = _video(tmp_path, config)
    assert frames.shape[1:] == (160, 160, 3)  # 10 x 10 cells of 16 pixels
    assert len(frames) >= 2 and len(np.unique(frames.reshape(-1, 3), axis=0)) >= 3


def test_an_envpool_atari_screen_as_an_mp4(tmp_path, monkeypatch):
    pytest.importorskip("envpool")
    monkeypatch.setattr(V, "MAX_FRAMES", 12)  # the first steps of a game are enough here
    config = load_config("ppo_breakout_async", ["eval.episodes=1", "eval.video=true"])
    frames, _ = _video(tmp_path, config)
    assert frames.shape == (13, 210, 160, 3)  # Atari's screen, the first frame and 12 steps


def test_an_env_that_cannot_render_says_so_in_one_line_at_the_start(tmp_path, capsys):
    config = load_config("ppo_cartpole", ["env=Catch-bsuite", "eval.episodes=1", "eval.video=true"])
    assert V.video_maker(config, str(tmp_path)) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("tianjax: warning: eval.video: Catch-bsuite cannot render (")
    assert err[0].endswith("evaluations go on without videos")

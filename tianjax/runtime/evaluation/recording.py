"""One evaluation episode as a video (`eval.video`): the policy of the version evaluated
plays one episode of the config's env, on the host, a frame rendered per step
(tianjax.envs.render), written as RUN_DIR/videos/eval-v<version>.mp4 with a GIF preview for
TensorBoard beside it (tianjax.metrics.video).

`VideoMaker(config, run_dir)` builds its env and renderer at once, so an env that cannot
render is known at the start of the run: it raises CannotRender (the caller says so in
one line and evaluates without videos). An episode longer than MAX_FRAMES steps is cut
there.
"""

from __future__ import annotations

import os

import jax
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.core.rollout import clip_action
from tianjax.envs.render import CannotRender, host_frame, jax_renderer
from tianjax.metrics.video import gif_of, write_gif, write_mp4

VIDEO_DIR = "videos"
MAX_FRAMES = 5000
JAX_BACKENDS = ("gymnax", "jaxmarl", "brax")


def video_name(version: int) -> str:
    """The video of an evaluation of `version`, relative to the run directory."""
    return f"{VIDEO_DIR}/eval-v{version:08d}.mp4"


class VideoMaker:
    """Plays and writes one episode per call. `env`: the JAX env object a fused run trains
    on (default: the config's env)."""

    def __init__(self, config: Config, run_dir: str, env=None, gif: bool = True):
        # pygame (gymnasium's classic-control renderer) draws off screen and plays no sound
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        self.config, self.run_dir, self.gif = config, run_dir, gif
        self.greedy = config.eval.greedy
        self.jax = config.env_backend in JAX_BACKENDS
        if self.jax:
            from tianjax.envs.factory import make_jax_env

            self.env = env or make_jax_env(config.env_backend, config.env, config.env_options)
            self.render = jax_renderer(self.env)
            self.fps = 50.0 if not str(self.env.name).endswith("-MinAtar") else 10.0
            self._reset = jax.jit(self.env.reset)
            self._step = jax.jit(self.env.step)
            obs, state = self._reset(jax.random.key(0))
            self.render(state, obs)  # one frame now: an env that cannot render says so at start
            obs_shape, obs_dtype = self.env.obs_shape, getattr(self.env, "obs_dtype", None)
            action_spec = self.env.action_spec
        else:
            from tianjax.envs.factory import make_host_env

            try:
                self.env = make_host_env(
                    config.env_backend,
                    config.env,
                    1,
                    config.seed + 2,
                    render=True,
                    **config.env_options,
                )
            except CannotRender:
                raise
            except Exception as e:  # noqa: BLE001 (a backend that takes no render mode)
                raise CannotRender(f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
            self.env.reset(config.seed + 2)
            host_frame(self.env)
            meta = getattr(getattr(self.env, "_env", None), "metadata", {}) or {}
            self.fps = float(meta.get("render_fps") or 30.0)
            obs_shape, obs_dtype = self.env.obs_shape, self.env.obs_dtype
            action_spec = self.env.action_spec
        self.action_spec = action_spec
        algo = make_algorithm(
            config, obs_shape, action_spec, correct_staleness=False, obs_dtype=obs_dtype
        )
        if self.greedy:
            self._act = jax.jit(algo.greedy)
        else:
            big = np.iinfo(np.int32).max
            self._act = jax.jit(lambda p, o, k: algo.act(p, o, k, big).action)

    def _action(self, params, obs, key):
        return self._act(params, obs) if self.greedy else self._act(params, obs, key)

    def frames(self, params, key) -> list[np.ndarray]:
        """One episode's frames, the first before the first step."""
        if self.jax:
            return self._jax_frames(params, key)
        return self._host_frames(params, key)

    def _jax_frames(self, params, key) -> list[np.ndarray]:
        key, sub = jax.random.split(key)
        obs, state = self._reset(sub)
        frames = [self.render(state, obs)]
        for _ in range(MAX_FRAMES):
            key, k_act, k_env = jax.random.split(key, 3)
            action = self._action(params, obs[None], k_act)[0]
            step = self._step(k_env, state, clip_action(action, self.action_spec))
            if bool(step.terminated) or bool(step.truncated):
                break  # (the state is the next episode's first: auto-reset)
            obs, state = step.obs, step.state
            frames.append(self.render(state, obs))
        return frames

    def _host_frames(self, params, key) -> list[np.ndarray]:
        obs = self.env.reset()
        frames = [host_frame(self.env)]
        for _ in range(MAX_FRAMES):
            key, sub = jax.random.split(key)
            action = np.asarray(self._action(params, obs, sub))
            step = self.env.step(action)
            if bool(np.asarray(step.report_done)[0]):
                break  # (the envs reset at once: the frame now is the next episode's)
            obs = step.obs
            frames.append(host_frame(self.env))
        return frames

    def __call__(self, params, version: int, key) -> str:
        """Plays one episode with `params` and writes it; returns the mp4's path relative
        to the run directory."""
        name = video_name(version)
        path = os.path.join(self.run_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        frames = self.frames(params, key)
        write_mp4(path, frames, self.fps)
        if self.gif:
            write_gif(gif_of(path), frames, self.fps)
        return name

    def close(self) -> None:
        close = getattr(self.render if self.jax else self.env, "close", None)
        if close is not None:
            close()


def video_maker(config: Config, run_dir: str, env=None, gif: bool = True) -> VideoMaker | None:
    """A VideoMaker for `eval.video`, or None: off, or the env cannot render (said in one
    line on stderr, at the start of the run)."""
    if not (config.eval.on and config.eval.video):
        return None
    try:
        return VideoMaker(config, run_dir, env=env, gif=gif)
    except CannotRender as e:
        import sys

        print(
            f"tianjax: warning: eval.video: {config.env} cannot render ({e}); "
            "evaluations go on without videos",
            file=sys.stderr,
            flush=True,
        )
        return None


__all__ = ["MAX_FRAMES", "VIDEO_DIR", "VideoMaker", "video_maker", "video_name"]

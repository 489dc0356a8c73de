"""Frames of an env, for evaluation videos: one RGB image [H, W, 3] uint8 per step.

Where they come from:

- gymnasium and envpool (host envs): the env's own `rgb_array` render, through the
  adapter's `frame()` (an adapter built with `render=True`; envpool renders Atari's screen,
  gymnasium whatever its env draws, classic control with pygame);
- gymnax classic control (CartPole-v1, Acrobot-v1, Pendulum-v1, MountainCar-v0,
  MountainCarContinuous-v0): gymnax's own render, which draws the state with gymnasium's
  renderer (gymnax.visualize.vis_gym; one gymnasium env is kept and its state set per frame);
- gymnax MinAtar (*-MinAtar): the observation grid [10, 10, C] itself, one colour per
  channel on black, each cell 16 x 16 pixels.

Any other env cannot render: `renderer` raises CannotRender with the reason, which a run
says in one line at its start (tianjax.runtime.evaluation.recording).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

CELL = 16  # pixels per MinAtar cell
# MinAtar channels' colours (black is the empty cell); cycled for envs with more channels
PALETTE = np.array(
    [
        [230, 159, 0],
        [86, 180, 233],
        [0, 158, 115],
        [240, 228, 66],
        [0, 114, 178],
        [213, 94, 0],
        [204, 121, 167],
        [255, 255, 255],
        [150, 150, 150],
        [120, 60, 200],
    ],
    np.uint8,
)


class CannotRender(Exception):
    """This env has no frames to make a video of (the message says why)."""


def minatar_frame(obs) -> np.ndarray:
    """A MinAtar observation [H, W, C] (0/1) as an RGB image [H * CELL, W * CELL, 3]: a
    cell takes the colour of its highest set channel, black where none is set."""
    grid = np.asarray(obs) > 0
    channels = grid.shape[-1]
    colours = np.concatenate([np.zeros((1, 3), np.uint8), PALETTE[np.arange(channels) % 10]])
    top = np.where(grid.any(-1), channels - np.argmax(grid[..., ::-1], -1), 0)
    image = colours[top]
    return np.repeat(np.repeat(image, CELL, 0), CELL, 1)


class _GymnaxClassic:
    """gymnax's own render of a classic-control state: gymnasium's renderer, its state set."""

    def __init__(self, env):
        try:
            import gymnasium as gym
            from gymnax.visualize import vis_gym
        except ImportError as e:
            raise CannotRender(f"gymnax's render needs gymnasium ({e})") from None
        self._vis = vis_gym
        self._name = env.name
        self._gym = gym.make(env.name, render_mode="rgb_array")
        self._gym.reset(seed=0)
        vis_gym.set_gym_params(self._gym.unwrapped, env.name, env.params)

    def __call__(self, state, obs) -> np.ndarray:
        inner = self._gym.unwrapped
        inner.state = self._vis.get_gym_state(state, self._name)
        if self._name == "Pendulum-v1":
            inner.last_u = np.asarray(state.last_u, np.float64)
        return np.asarray(self._gym.render(), np.uint8)

    def close(self) -> None:
        self._gym.close()


def jax_renderer(env) -> Callable:
    """frame(state, obs) -> [H, W, 3] uint8 for one (unbatched) step of a JAX env; raises
    CannotRender."""
    name = getattr(env, "name", type(env).__name__)
    if str(name).endswith("-MinAtar"):
        return lambda state, obs: minatar_frame(obs)
    inner = getattr(env, "env", None)
    if inner is not None and hasattr(env, "params"):
        from gymnax.visualize.vis_gym import SUPPORTED_GYM_ENVS

        if name in SUPPORTED_GYM_ENVS:
            try:
                return _GymnaxClassic(env)
            except CannotRender:
                raise
            except Exception as e:  # noqa: BLE001 (pygame missing, a display error, ...)
                raise CannotRender(_line(e)) from None
    raise CannotRender(
        f"'{name}' has no frames (tianjax renders gymnax's classic control and MinAtar envs, "
        "and gymnasium and envpool envs)"
    )


def host_frame(env) -> np.ndarray:
    """The current frame of env 0 of a host env built with render=True; raises CannotRender."""
    frame = getattr(env, "frame", None)
    if frame is None:
        raise CannotRender(f"the '{env.name}' adapter has no frames")
    try:
        image = frame()
    except Exception as e:  # noqa: BLE001 (a backend's own error: pygame missing, no render mode)
        raise CannotRender(_line(e)) from None
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] not in (3, 4):
        raise CannotRender(f"its render gave an array of shape {image.shape}, not an RGB image")
    return image[..., :3].astype(np.uint8, copy=False)


def _line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


__all__ = ["CELL", "PALETTE", "CannotRender", "host_frame", "jax_renderer", "minatar_frame"]

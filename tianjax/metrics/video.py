"""Evaluation videos as files: an mp4 (H.264, through imageio and its ffmpeg plugin, the
`video` extra) and, for TensorBoard, a small animated GIF beside it.

TensorBoard shows an animated GIF in its Images tab (what its own video summaries are), so
the GIF is a preview: at most GIF_WIDTH pixels wide and GIF_FRAMES frames (every k-th frame
of a longer episode). W&B takes the mp4 itself.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

GIF_WIDTH = 320
GIF_FRAMES = 300
EXTRA = "video"  # the extra that installs the encoder


def _even(frame: np.ndarray) -> np.ndarray:
    """H.264 (yuv420p) wants even sides: pads one black row or column where needed."""
    h, w = frame.shape[:2]
    if h % 2 or w % 2:
        frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))
    return frame


def write_mp4(path: str, frames, fps: float) -> str:
    """Writes frames ([H, W, 3] uint8 each) as an H.264 mp4; returns the path."""
    import imageio.v2 as imageio

    tmp = path + ".tmp.mp4"
    # NOTE: the encoder is an ffmpeg process started by fork and exec at once (nothing of
    # this process runs in the child), which JAX warns about as if it were a bare fork
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called")
        # macro_block_size 1: keep the frame's size (imageio would otherwise resize it to 16s)
        with imageio.get_writer(
            tmp, fps=fps, codec="libx264", macro_block_size=1, ffmpeg_log_level="error"
        ) as w:
            for frame in frames:
                w.append_data(_even(np.asarray(frame, np.uint8)))
    os.replace(tmp, path)
    return path


def write_gif(path: str, frames, fps: float) -> str:
    """A small animated GIF of the frames (see GIF_WIDTH, GIF_FRAMES); returns the path."""
    import imageio.v3 as iio

    frames = list(frames)
    step = max(1, -(-len(frames) // GIF_FRAMES))
    frames = frames[::step]
    scale = max(1, -(-frames[0].shape[1] // GIF_WIDTH))
    small = [np.asarray(f, np.uint8)[::scale, ::scale] for f in frames]
    tmp = path + ".tmp.gif"
    iio.imwrite(tmp, np.stack(small), extension=".gif", duration=1000.0 * step / fps, loop=0)
    os.replace(tmp, path)
    return path


def gif_of(mp4_path: str) -> str:
    """Where the GIF preview of an mp4 is written."""
    return os.path.splitext(mp4_path)[0] + ".gif"


__all__ = ["EXTRA", "GIF_FRAMES", "GIF_WIDTH", "gif_of", "write_gif", "write_mp4"]

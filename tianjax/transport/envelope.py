"""A multipart message packed into one frame, and unpacked as views of it.

Parameters travel to actors over a SUB socket with ZMQ_CONFLATE: its I/O thread reads
every message off the connection as it arrives and keeps only the newest, so an actor that
reads once per rollout finds the newest version, never a backlog of old ones left in the
kernel's socket buffers (which a small RCVHWM leaves there, to be handed out later). ZeroMQ
conflates single-frame messages only; this packs the codec's frames (tag, header, leaves)
into one:

    [topic]                            (optional: ALIGN bytes, zero-padded)
    [u32 count] [u64 length] * count   (zero-padded to a multiple of ALIGN)
    frame_0, frame_1, ...              (each zero-padded to a multiple of ALIGN)

A topic is what a SUB subscribes to: ZeroMQ's PUB sends a message only to the subscribers
whose subscription is a prefix of it (the learner groups' averages go to one group each).

Padding keeps every leaf ALIGN-aligned within the frame, so `np.frombuffer` over a view is
as good as over a frame of its own. Packing costs one copy on the sender (the learner's
publisher thread); unpacking is views only. A malformed envelope raises
`CodecError("truncated")` (or "size" for a table that claims too many frames) before
anything is read out of it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from tianjax.transport.codec import CodecError

ALIGN = 64
MAX_FRAMES = 1 << 16  # far above any params tree's leaves; a bigger table is refused unread
_COUNT = struct.Struct("<I")


def _pad(n: int) -> int:
    return -n % ALIGN


def overhead(n_frames: int) -> int:
    """The most bytes packing adds to `n_frames` frames (table and padding)."""
    table = _COUNT.size + 8 * n_frames
    return table + _pad(table) + (ALIGN - 1) * n_frames


def pack(frames: Sequence, topic: bytes = b"") -> bytearray:
    """One buffer holding `frames` (bytes-like objects) after `topic` (at most ALIGN
    bytes; none by default), see the module docstring."""
    if len(topic) > ALIGN:
        raise ValueError(f"a topic is at most {ALIGN} bytes")
    views = [memoryview(f).cast("B") for f in frames]
    table = _COUNT.pack(len(views)) + struct.pack(f"<{len(views)}Q", *(v.nbytes for v in views))
    out = bytearray(topic.ljust(ALIGN, b"\0") if topic else b"")
    out += table
    out += bytes(_pad(len(out)))
    for v in views:
        out += v
        out += bytes(_pad(v.nbytes))
    return out


def unpack(buf, topic: bool = False) -> list[memoryview]:
    """The frames packed into `buf` (after a topic, with `topic`), as views of it (they keep
    `buf` alive)."""
    view = memoryview(buf).cast("B")
    if topic:
        if view.nbytes < ALIGN:
            raise CodecError("truncated", f"an envelope of {view.nbytes} bytes")
        view = view[ALIGN:]
    total = view.nbytes
    if total < _COUNT.size:
        raise CodecError("truncated", f"an envelope of {total} bytes")
    (count,) = _COUNT.unpack_from(view, 0)
    if count > MAX_FRAMES:
        raise CodecError("size", f"an envelope of {count} frames")
    table = _COUNT.size + 8 * count
    if table > total:
        raise CodecError("truncated", f"{count} frames listed in {total} bytes")
    lengths = struct.unpack_from(f"<{count}Q", view, _COUNT.size)
    at = table + _pad(table)
    frames = []
    for n in lengths:
        if n > total - at:
            raise CodecError("truncated", f"a frame of {n} bytes past the envelope's end")
        frames.append(view[at : at + n])
        at += n + _pad(n)
    return frames


__all__ = ["ALIGN", "MAX_FRAMES", "overhead", "pack", "unpack"]

"""The one-frame envelope that parameter messages travel in (tianjax/transport/envelope.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tianjax.transport import envelope
from tianjax.transport.codec import CodecError


def test_frames_come_back_as_aligned_views_of_the_one_buffer():
    frames = [b"t" * 16, b'{"h": 1}', np.arange(5, dtype=np.float32).tobytes(), b"", b"x" * 65]
    buf = envelope.pack(frames)
    out = envelope.unpack(buf)
    assert [bytes(f) for f in out] == frames
    base = np.frombuffer(buf, np.uint8).ctypes.data
    for f in out:  # views, not copies, each starting on an ALIGN boundary of the buffer
        addr = np.frombuffer(f, np.uint8).ctypes.data if f.nbytes else None
        assert addr is None or (addr - base) % envelope.ALIGN == 0
    # the table: 4 + 8 * 5 = 44 bytes, padded to 64; then 16, 8, 20, 0 and 65 bytes, each padded
    assert len(buf) == 64 + 64 + 64 + 64 + 0 + 128
    assert len(buf) - sum(len(f) for f in frames) <= envelope.overhead(len(frames))


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", "truncated"),
        (b"\x01\x00", "truncated"),  # shorter than its count
        (struct.pack("<I", 3) + struct.pack("<Q", 1), "truncated"),  # 3 lengths listed, 1 present
        (struct.pack("<I", 1) + struct.pack("<Q", 10**9) + bytes(100), "truncated"),  # past the end
        (struct.pack("<I", envelope.MAX_FRAMES + 1) + bytes(64), "size"),
    ],
)
def test_a_malformed_envelope_is_refused_by_reason(raw, reason):
    with pytest.raises(CodecError) as e:
        envelope.unpack(raw)
    assert e.value.reason == reason


def test_the_last_frame_may_end_without_its_padding():
    buf = envelope.pack([b"abc", b"defg"])
    assert [bytes(f) for f in envelope.unpack(bytes(buf[: 64 + 64 + 4]))] == [b"abc", b"defg"]

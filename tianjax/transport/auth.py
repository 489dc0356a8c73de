"""Per-run message authentication for the TianJi transport (arXiv 2502.20190, section 3).

Every message between the learner and its actors carries a 16-byte tag computed with a
secret key made fresh for each run, so that nothing from outside the run is accepted: a
stray process on the host, an old run still sending to a reused port, or anyone on the
network when the learner binds beyond loopback.

Construction (all of it from the `cryptography` package and the standard library):

    K_m   = HMAC-SHA256(run_key, "tianjax.mac.v1" || header)          32 bytes, per message
    t_ij  = AES-256-GCM(K_m, nonce = u32(i) || u64(j), plaintext = "",
                        associated data = chunk j of frame i)           16 bytes each (GMAC)
    tag   = HMAC-SHA256(K_m, header || u64(n) || for each frame i: u64(len_i) || t_i0 || ...)[:16]

Why not HMAC-SHA256 over the whole message: it runs at ~0.7-2 GB/s, slower than ZeroMQ
moves bytes over loopback, and would halve ingest. GMAC (GCM with an empty plaintext) runs
at memory speed (10-30 GB/s with AES-NI and carry-less multiply). GMAC is only safe if a
(key, nonce) pair is never used for two different inputs, so each message gets its own key
K_m, derived from its header; the header holds the sender, a strictly increasing sequence
number and 16 random bytes, so no two messages share K_m, and within a message every
(frame, chunk) has its own nonce. Frames are cut into chunks because the library takes at
most 2**31 - 1 bytes of associated data per call. The outer HMAC binds the header, the
number of frames, their lengths and the order of the GMAC tags; its input is small. A
forgery needs either the run key (HMAC) or a GMAC forgery under an unknown one-time key
(probability about len/2**128). Tags are compared in constant time.

Keys never appear in logs: `RunKey` hides its bytes in repr, and refuses to be pickled.
Pass a key to another process through the environment (`KEY_ENV`, hex) or a key file.
A key is exactly 32 random bytes, written as 64 hex digits; nothing else is taken (a
passphrase is not a key). `load_key` refuses a key file that its group or others may read,
and removes the variable from the environment once read, so that nothing the process
starts afterwards (an env's subprocess) inherits it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_ENV = "TIANJAX_RUN_KEY"
KEY_BYTES = 32
TAG_BYTES = 16

_LABEL = b"tianjax.mac.v1"
_CHUNK = 1 << 30  # below the 2**31 - 1 bytes that AESGCM accepts as associated data
_U64 = struct.Struct("<Q")
_NONCE = struct.Struct("<IQ")  # (frame index, chunk index): 12 bytes, GCM's native nonce size
_NONCES = [_NONCE.pack(i, 0) for i in range(256)]


def _nonce(i: int, j: int) -> bytes:
    return _NONCES[i] if j == 0 and i < len(_NONCES) else _NONCE.pack(i, j)


class RunKey:
    """A run's secret key. Its repr shows only a fingerprint, never the key."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes):
        key = bytes(key)
        if len(key) != KEY_BYTES:
            raise ValueError(f"a run key is {KEY_BYTES} bytes, got {len(key)}")
        self._key = key

    @property
    def fingerprint(self) -> str:
        """8 hex chars that identify the key (to check two processes agree) and reveal nothing."""
        return hmac.new(self._key, b"tianjax.fingerprint", hashlib.sha256).hexdigest()[:8]

    def hex(self) -> str:
        """The key as hex, to hand to a child process through `KEY_ENV`. Never log it."""
        return self._key.hex()

    def __bytes__(self) -> bytes:
        return self._key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunKey):
            return NotImplemented
        return hmac.compare_digest(self._key, other._key)

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"RunKey(fingerprint={self.fingerprint})"

    __str__ = __repr__

    def __reduce__(self):
        # A pickled key would land in whatever the pickle lands in (queues, logs, files).
        raise TypeError(
            "RunKey is not picklable: pass it via the environment (KEY_ENV, hex) or a key file"
        )


def new_run_key() -> RunKey:
    """A fresh random 32-byte key for one run."""
    return RunKey(os.urandom(KEY_BYTES))


def _parse_key_bytes(raw: bytes, where: str) -> RunKey:
    text = raw.strip()
    try:
        key = bytes.fromhex(text.decode("ascii")) if len(text) == 2 * KEY_BYTES else b""
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        # (the message never shows what was found: it may be a secret of some other kind)
        raise ValueError(
            f"the run key in {where} is not {2 * KEY_BYTES} hex digits ({KEY_BYTES} random "
            "bytes; write one with tianjax.transport.write_key_file)"
        )
    return RunKey(key)


def load_key(source: str | os.PathLike | None = None) -> RunKey:
    """Reads a run key.

    `source` is None (read the environment variable `KEY_ENV`), "env:NAME" (read variable
    NAME, then remove it from the environment), or a path to a file holding the key as 64
    hex digits, readable by its owner only. Errors name where the key was looked for,
    never the key.
    """
    if source is None or (isinstance(source, str) and source.startswith("env:")):
        name = KEY_ENV if source is None else source[4:]
        value = os.environ.pop(name, None)
        if not value:
            raise KeyError(f"no run key: environment variable {name} is not set")
        return _parse_key_bytes(value.encode(), f"${name}")
    with open(source, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if mode & 0o077:
            raise PermissionError(
                f"the run key file {os.fspath(source)} may be read by its group or others "
                f"(mode {mode & 0o777:o}): make it readable by its owner only "
                f"(chmod 600 {os.fspath(source)})"
            )
        return _parse_key_bytes(f.read(), os.fspath(source))


def write_key_file(path: str | os.PathLike, key: RunKey) -> None:
    """Writes `key` as hex to a new file readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")


Buffer = Any  # bytes, memoryview, numpy array: anything with the buffer protocol


@runtime_checkable
class Authenticator(Protocol):
    """What the codec needs: a tag for (header, frames), and its check."""

    def tag(self, header: Buffer, frames: Sequence[Buffer]) -> bytes: ...

    def verify(self, tag: Buffer, header: Buffer, frames: Sequence[Buffer]) -> bool: ...


class MessageAuth:
    """The construction in the module docstring, keyed with one run key."""

    __slots__ = ("_key",)

    def __init__(self, key: RunKey | bytes):
        self._key = bytes(key if isinstance(key, RunKey) else RunKey(key))

    def __repr__(self) -> str:
        return f"MessageAuth({RunKey(self._key)!r})"

    def __reduce__(self):
        raise TypeError("MessageAuth holds a run key and is not picklable")

    def tag(self, header: Buffer, frames: Sequence[Buffer]) -> bytes:
        header = bytes(header)
        k_m = hmac.digest(self._key, _LABEL + header, "sha256")
        gcm = AESGCM(k_m)
        # the outer HMAC input is small (24 bytes a frame): gather it, then hash it once
        parts = [header, _U64.pack(len(frames))]
        for i, frame in enumerate(frames):
            view = memoryview(frame)
            n = view.nbytes
            parts.append(_U64.pack(n))
            if n <= _CHUNK:
                parts.append(gcm.encrypt(_nonce(i, 0), b"", view))
                continue
            view = view.cast("B")
            for j, start in enumerate(range(0, n, _CHUNK)):
                parts.append(gcm.encrypt(_nonce(i, j), b"", view[start : start + _CHUNK]))
        return hmac.digest(k_m, b"".join(parts), "sha256")[:TAG_BYTES]

    def verify(self, tag: Buffer, header: Buffer, frames: Sequence[Buffer]) -> bool:
        tag = bytes(tag)
        if len(tag) != TAG_BYTES:
            return False
        return hmac.compare_digest(tag, self.tag(header, frames))


class InsecureNoAuth:
    """Accepts anything tagged with zeros. For measuring the cost of MessageAuth only:
    never use it in a run (it lets any process that reaches the socket inject data)."""

    def tag(self, header: Buffer, frames: Sequence[Buffer]) -> bytes:
        return bytes(TAG_BYTES)

    def verify(self, tag: Buffer, header: Buffer, frames: Sequence[Buffer]) -> bool:
        return bytes(tag) == bytes(TAG_BYTES)


def as_authenticator(key: RunKey | bytes | Authenticator) -> Authenticator:
    """Channels take a run key (or raw key bytes) or a ready authenticator."""
    if isinstance(key, (RunKey, bytes, bytearray)):
        return MessageAuth(key)
    if isinstance(key, Authenticator):
        return key
    raise TypeError(f"expected a RunKey, key bytes or an Authenticator, got {type(key).__name__}")


__all__ = [
    "KEY_BYTES",
    "KEY_ENV",
    "TAG_BYTES",
    "Authenticator",
    "Buffer",
    "InsecureNoAuth",
    "MessageAuth",
    "RunKey",
    "as_authenticator",
    "load_key",
    "new_run_key",
    "write_key_file",
]

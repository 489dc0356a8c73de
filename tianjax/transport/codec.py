"""Pytrees of arrays to and from ZeroMQ multipart frames, without pickle and without copies.

TianJi (arXiv 2502.20190) moves parameters from the learner to actors and trajectories
back on every step of a run; the transport must cost little next to raw ZeroMQ. A message
is

    [tag (16 bytes), header (JSON), leaf_0, leaf_1, ...]

where each leaf frame is the raw bytes of one C-contiguous array, handed to
`send_multipart(copy=False)` as a view (no copy on the sender), and rebuilt on the
receiver with `np.frombuffer` over the received `zmq.Frame` (no copy either). The header
holds a magic string and protocol number, the kind ("params", "traj", the control
directions "ctrl.up", actor to learner, and "ctrl.down", learner to actor, and the learner
groups' "delta", group to averager, and "average", averager to groups), a schema hash,
the run version, the sender, the sender's incarnation, the recipient, a sequence number,
a random nonce, each leaf's dtype and shape, the total payload bytes and, where the sender
gives one, a small JSON body (a control message's whole content; beside a tree, what
describes it). The tag is `auth.MessageAuth` over header and leaves.

Binding. A message is good for one recipient, one direction and one incarnation of its
sender, so a recorded one cannot be spent anywhere else:

- `inc`: a random id each process draws when it starts (`sockets.process_incarnation`).
  Sequence numbers count from 0 per (sender, incarnation), with no clock involved.
- `to`: the recipient, "name@incarnation" ("learner-0@9f..", "actor-3@1c..") or "*" for
  the parameter broadcast. An actor addresses the learner incarnation whose parameters it
  follows (it registers with it), so nothing sent to a learner before its restart is
  taken by the restarted one, nor by another learner of a multi-host run.
- the kind names the direction, so a learner's message to an actor reflected back to the
  learner is refused as the wrong kind.

The receiver never trusts the message for structure: it rebuilds the tree from its own
`TreeSpec` (treedef, dtypes and shapes from an example tree), and only checks the header
against it. Every failed check raises `CodecError(reason)` with one of `REASONS`, in this
order: size (summed frame lengths, before anything is read), auth (the tag, before the
header is parsed), header (JSON, magic, field types), kind, recipient (`to`: "recipient",
or "old_incarnation" for an earlier incarnation of this recipient), truncated (fewer leaf frames
than the header lists), schema / dtype / shape (the header's leaves against the
template), truncated / size (each leaf frame's length), schema (the structure hash).
Replays (and messages of a superseded incarnation: "incarnation") are caught by a
`ReplayGuard` after everything else has passed, so a bad message cannot advance it. A rejection
names the problem, never echoes the message at length.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from jax import tree_util

from tianjax.transport.auth import TAG_BYTES, Authenticator

MAGIC = "tianjax"
PROTOCOL = 2
KINDS = ("params", "traj", "ctrl.up", "ctrl.down", "delta", "average")
BROADCAST = "*"  # the recipient of parameter messages: every actor of the run
REASONS = frozenset(
    {
        "auth",
        "truncated",
        "schema",
        "dtype",
        "shape",
        "size",
        "replay",
        "header",
        "kind",
        "recipient",
        "old_incarnation",
        "incarnation",
    }
)
MAX_HEADER_BYTES = 1 << 20  # JSON for ~10k leaves; bigger headers are refused unparsed


class CodecError(Exception):
    """A message failed a check. `reason` is one of REASONS, for counting."""

    def __init__(self, reason: str, detail: str = ""):
        assert reason in REASONS, reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Message(NamedTuple):
    """A decoded, authenticated message. `tree` is None for control messages; `body` is
    None for array messages sent without one. Arrays in `tree` share memory with the
    received frames."""

    kind: str
    sender: str
    seq: int
    version: int
    tree: Any
    body: dict | None
    nbytes: int  # payload bytes (leaf frames)
    inc: str = ""  # the sender's incarnation
    to: str = ""  # the recipient it was addressed to

    @property
    def source(self) -> str:
        """The sender's address: "name@incarnation"."""
        return f"{self.sender}@{self.inc}"


class LeafSpec(NamedTuple):
    path: str  # jax.tree_util.keystr of the leaf, e.g. "[0].obs"
    dtype: np.dtype
    shape: tuple[int, ...]


_names: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    # np.dtype.name is computed in Python on every access; this runs per leaf per message
    name = _names.get(dtype)
    if name is None:
        name = _names[dtype] = dtype.name
    return name


def _schema_hash(
    paths: Sequence[str], dtypes: Sequence[str], tails: Sequence[tuple], batch_dims: int
) -> str:
    desc = json.dumps(
        [batch_dims, [[p, d, list(s)] for p, d, s in zip(paths, dtypes, tails)]],
        separators=(",", ":"),
    )
    return hashlib.sha256(desc.encode()).hexdigest()[:16]


class TreeSpec:
    """The receiver's template: structure, dtypes and shapes it will accept.

    Built from an example tree of arrays or `jax.ShapeDtypeStruct`s. The first `batch_dims`
    dims of every leaf may differ from the example, per message, but must agree across
    leaves (one batch); the rest of each shape, the dtypes and the structure are fixed.
    """

    def __init__(self, example: Any, *, batch_dims: int = 0):
        with_path, self.treedef = tree_util.tree_flatten_with_path(example)
        self.batch_dims = batch_dims
        leaves = []
        for path, leaf in with_path:
            shape = tuple(int(d) for d in np.shape(leaf))
            if len(shape) < batch_dims:
                raise ValueError(
                    f"leaf {tree_util.keystr(path)} has rank {len(shape)} < batch_dims={batch_dims}"
                )
            dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
            leaves.append(LeafSpec(tree_util.keystr(path), _native(np.dtype(dtype)), shape))
        self.leaves = tuple(leaves)
        self.schema = _schema_hash(
            [spec.path for spec in leaves],
            [spec.dtype.name for spec in leaves],
            [spec.shape[batch_dims:] for spec in leaves],
            batch_dims,
        )
        self.nbytes = sum(math.prod(spec.shape) * spec.dtype.itemsize for spec in leaves)
        # the header's leaf list as an exact-shape message carries it: one comparison
        # accepts the common case; the per-leaf checks only run to name a mismatch
        self.header_leaves = [[spec.dtype.name, list(spec.shape)] for spec in leaves]
        self.leaf_nbytes = [math.prod(spec.shape) * spec.dtype.itemsize for spec in leaves]

    def __repr__(self) -> str:
        return f"TreeSpec({len(self.leaves)} leaves, {self.nbytes} B, schema={self.schema})"


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype


# ------------------------------------------------------------------------------ encoding
# treedef -> paths, and (treedef, dtypes, shapes) -> (schema, leaves JSON): a sender sends
# the same structure over and over, so the JSON and hashing are done once per structure
_path_cache: dict[Any, tuple[str, ...]] = {}
_layout_cache: dict[tuple, tuple[str, str]] = {}


def _leaf_paths(tree: Any) -> tuple[list, Any, tuple[str, ...]]:
    leaves, treedef = tree_util.tree_flatten(tree)
    paths = _path_cache.get(treedef)
    if paths is None:
        if len(_path_cache) > 256:  # trees of many shapes: keep the cache small
            _path_cache.clear()
        paths = tuple(tree_util.keystr(p) for p, _ in tree_util.tree_flatten_with_path(tree)[0])
        _path_cache[treedef] = paths
    return leaves, treedef, paths


def _layout(treedef, paths, names, shapes, batch_dims) -> tuple[str, str]:
    key = (treedef, names, shapes, batch_dims)
    out = _layout_cache.get(key)
    if out is None:
        if len(_layout_cache) > 256:
            _layout_cache.clear()
        schema = _schema_hash(paths, names, [s[batch_dims:] for s in shapes], batch_dims)
        leaves_json = json.dumps(
            [[n, list(s)] for n, s in zip(names, shapes)], separators=(",", ":")
        )
        out = _layout_cache[key] = (schema, leaves_json)
    return out


def _header(
    kind: str,
    schema: str,
    version: int,
    sender: str,
    inc: str,
    to: str,
    seq: int,
    leaves_json: str,
    nbytes: int,
    body: dict | None = None,
) -> bytes:
    # json.dumps for every string that comes from a caller, so nothing can break the quoting
    text = (
        f'{{"m":"{MAGIC}","p":{PROTOCOL},"kind":{json.dumps(kind)},"schema":{json.dumps(schema)},'
        f'"version":{int(version)},"sender":{json.dumps(str(sender))},"inc":{json.dumps(str(inc))},'
        f'"to":{json.dumps(str(to))},"seq":{int(seq)},'
        f'"nonce":"{os.urandom(16).hex()}","leaves":{leaves_json},"nbytes":{int(nbytes)}'
    )
    if body is not None:
        text += ',"body":' + json.dumps(body, separators=(",", ":"))
    return (text + "}").encode()


def encode(
    tree: Any,
    *,
    auth: Authenticator,
    kind: str,
    version: int,
    sender: str,
    seq: int,
    inc: str = "",
    to: str = "",
    batch_dims: int = 0,
    body: dict | None = None,
) -> list:
    """Frames for `tree` (numpy or jax arrays, any pytree), from `sender` (incarnation
    `inc`) to `to`, with `body` (a small JSON object describing it) in the header. Leaf
    frames are views of the arrays: the caller must not write to them in place until
    ZeroMQ has sent them."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    leaves, treedef, paths = _leaf_paths(tree)
    views, names, shapes = [], [], []
    for leaf in leaves:
        a = np.asarray(leaf)  # a jax CPU array gives a view; a device array is copied to host
        if not a.dtype.isnative:
            a = a.astype(_native(a.dtype))
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            a = a.copy(order="C")
        # uint8 view: every dtype (bfloat16, bool) exports as plain bytes, 0-d and 0-size too
        views.append(a.reshape(-1).view(np.uint8))
        names.append(_dtype_name(a.dtype))
        shapes.append(a.shape)
    schema, leaves_json = _layout(treedef, paths, tuple(names), tuple(shapes), batch_dims)
    header = _header(
        kind,
        schema,
        version,
        sender,
        inc,
        to,
        seq,
        leaves_json,
        sum(v.nbytes for v in views),
        body=body,
    )
    return [auth.tag(header, views), header, *views]


def encode_json(
    body: dict,
    *,
    auth: Authenticator,
    kind: str,
    sender: str,
    seq: int,
    inc: str = "",
    to: str = "",
    version: int = 0,
) -> list:
    """Frames for a small JSON-able dict (control messages): it rides in the header."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    header = _header(kind, "", version, sender, inc, to, seq, "[]", 0, body=body)
    return [auth.tag(header, []), header]


# ------------------------------------------------------------------------------ decoding
def _is_int(x: Any) -> bool:
    return type(x) is int  # not bool, not float


def _parse_header(buf) -> dict:
    try:
        h = json.loads(bytes(buf))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CodecError("header", f"not JSON ({type(e).__name__})") from None
    if type(h) is not dict or h.get("m") != MAGIC or h.get("p") != PROTOCOL:
        raise CodecError("header", "bad magic or protocol")
    if not (
        type(h.get("kind")) is str
        and type(h.get("schema")) is str
        and _is_int(h.get("version"))
        and type(h.get("sender")) is str
        and type(h.get("inc")) is str
        and type(h.get("to")) is str
        and _is_int(h.get("seq"))
        and _is_int(h.get("nbytes"))
        and type(h.get("leaves")) is list
    ):
        raise CodecError("header", "missing or mistyped field")
    return h


def _check_leaves(leaves: list) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for entry in leaves:
        if not (
            type(entry) is list
            and len(entry) == 2
            and type(entry[0]) is str
            and type(entry[1]) is list
            and all(_is_int(d) and d >= 0 for d in entry[1])
        ):
            raise CodecError("header", "mistyped leaf entry")
        out.append((entry[0], tuple(entry[1])))
    return out


def _buf(frame):
    # zmq.Frame exposes .buffer (a memoryview of the message, no copy); bytes/arrays are buffers
    return getattr(frame, "buffer", frame)


def _authenticate(
    frames: Sequence, auth: Authenticator, max_bytes: int, kind: str, to: str | None
) -> tuple[dict, list]:
    if len(frames) < 2:
        raise CodecError("truncated", f"{len(frames)} frames")
    bufs = [_buf(f) for f in frames]
    lens = [memoryview(b).nbytes for b in bufs]
    if sum(lens) > max_bytes:
        raise CodecError("size", f"message over {max_bytes} bytes")
    if lens[1] > MAX_HEADER_BYTES:
        raise CodecError("size", "header too large")
    if lens[0] != TAG_BYTES or not auth.verify(bufs[0], bufs[1], bufs[2:]):
        raise CodecError("auth")
    h = _parse_header(bufs[1])
    if h["kind"] != kind:
        raise CodecError("kind", f"expected {kind}, got {h['kind'][:16]}")
    if to is not None and h["to"] != to:
        # for an earlier incarnation of this very recipient (sent before it restarted, or
        # replayed since): told apart from a message for someone else
        earlier = h["to"].rpartition("@")[0] == to.rpartition("@")[0]
        raise CodecError(
            "old_incarnation" if earlier else "recipient", f"addressed to {h['to'][:64]}"
        )
    if len(frames) - 2 != len(h["leaves"]):
        raise CodecError(
            "truncated", f"{len(frames) - 2} leaf frames for {len(h['leaves'])} leaves"
        )
    return h, bufs


def decode(
    frames: Sequence,
    *,
    auth: Authenticator,
    spec: TreeSpec,
    kind: str,
    max_bytes: int,
    to: str | None = None,
) -> Message:
    """Checks and rebuilds a tree message. Frames are `zmq.Frame`s (recv copy=False) or
    buffers. `to`: the recipient this receiver is (None: not checked, for tests of the
    codec alone; every channel gives it). Raises CodecError; the replay check is the
    caller's (see ReplayGuard)."""
    h, bufs = _authenticate(frames, auth, max_bytes, kind, to)
    leaf_bufs = bufs[2:]
    if spec.batch_dims == 0 and h["leaves"] == spec.header_leaves:
        # fast path: exactly the template's dtypes and shapes (the spec's own ints are used)
        shapes = [leaf.shape for leaf in spec.leaves]
        needs = spec.leaf_nbytes
    else:
        shapes = _check_against(spec, _check_leaves(h["leaves"]))
        needs = [math.prod(s) * leaf.dtype.itemsize for s, leaf in zip(shapes, spec.leaves)]
    arrays = []
    for buf, need, shape, leaf in zip(leaf_bufs, needs, shapes, spec.leaves):
        got = memoryview(buf).nbytes
        if got != need:
            raise CodecError(
                "truncated" if got < need else "size", f"{leaf.path}: {got} bytes, expected {need}"
            )
        arrays.append(np.frombuffer(buf, dtype=leaf.dtype).reshape(shape))
    if h["schema"] != spec.schema:
        raise CodecError("schema", "tree structure differs")
    nbytes = sum(needs)
    if h["nbytes"] != nbytes:
        raise CodecError("header", "nbytes disagrees with the leaves")
    body = h.get("body")
    if body is not None and type(body) is not dict:
        raise CodecError("header", "a body must be a JSON object")
    return Message(
        h["kind"],
        h["sender"],
        h["seq"],
        h["version"],
        tree_util.tree_unflatten(spec.treedef, arrays),
        body,
        nbytes,
        h["inc"],
        h["to"],
    )


def _check_against(spec: TreeSpec, leaves: list) -> list[tuple[int, ...]]:
    """Names the first difference between the header's leaves and the template."""
    if len(leaves) != len(spec.leaves):
        raise CodecError("schema", f"{len(leaves)} leaves, expected {len(spec.leaves)}")
    k = spec.batch_dims
    batch = None
    shapes = []
    for (name, shape), leaf in zip(leaves, spec.leaves):
        if name != _dtype_name(leaf.dtype):
            raise CodecError("dtype", f"{leaf.path}: {name[:16]}, expected {leaf.dtype.name}")
        if len(shape) != len(leaf.shape) or shape[k:] != leaf.shape[k:]:
            raise CodecError("shape", f"{leaf.path}: {shape}, expected {leaf.shape}")
        if k:
            if batch is None:
                batch = shape[:k]
            elif shape[:k] != batch:
                raise CodecError("shape", f"{leaf.path}: batch dims {shape[:k]} != {batch}")
        shapes.append(shape)
    return shapes


def decode_json(
    frames: Sequence, *, auth: Authenticator, kind: str, max_bytes: int, to: str | None = None
) -> Message:
    """Checks a control message; its body must be a JSON object with a string "type"."""
    h, _ = _authenticate(frames, auth, max_bytes, kind, to)
    body = h.get("body")
    if h["leaves"] or type(body) is not dict or type(body.get("type")) is not str:
        raise CodecError("header", "control body must be an object with a string 'type'")
    return Message(h["kind"], h["sender"], h["seq"], h["version"], None, body, 0, h["inc"], h["to"])


class ReplayGuard:
    """Per sender, one live incarnation whose sequence numbers must strictly increase
    (senders count from 0 in each incarnation; no clock). The first message of a new
    incarnation of a sender (a restarted process) retires the one before: its messages
    are refused from then on ("incarnation"), however they are numbered.

    NOTE: only messages that passed every other check reach the guard (authenticated, and
    addressed to this receiver), so its entries are the real peers that sent to it: one
    per sender name, plus one retired id per restart.
    """

    def __init__(self):
        self._live: dict[str, tuple[str, int]] = {}  # sender -> (incarnation, newest seq)
        self._retired: set[tuple[str, str]] = set()

    def check(self, msg: Message) -> None:
        """Raises CodecError("replay" or "incarnation"), or records msg.seq as the newest
        of the sender's incarnation."""
        live = self._live.get(msg.sender)
        if live is not None and live[0] == msg.inc:
            if msg.seq <= live[1]:
                raise CodecError("replay", f"{msg.sender[:32]} seq {msg.seq} <= {live[1]}")
        elif (msg.sender, msg.inc) in self._retired:
            raise CodecError("incarnation", f"{msg.sender[:32]}: a superseded incarnation")
        elif live is not None:
            self._retired.add((msg.sender, live[0]))
        if msg.seq < 0:
            raise CodecError("replay", f"{msg.sender[:32]} seq {msg.seq} < 0")
        self._live[msg.sender] = (msg.inc, msg.seq)


__all__ = [
    "BROADCAST",
    "KINDS",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "PROTOCOL",
    "REASONS",
    "CodecError",
    "LeafSpec",
    "Message",
    "ReplayGuard",
    "TreeSpec",
    "decode",
    "decode_json",
    "encode",
    "encode_json",
]

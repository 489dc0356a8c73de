"""Codec and auth: round trips as properties, and every malformed message refused with its
reason (decode called on frames directly; tests/transport/test_channels.py sends them over sockets)."""

from __future__ import annotations

import os
import pickle
from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tianjax.transport import auth as auth_mod
from tianjax.transport.auth import (
    KEY_ENV,
    InsecureNoAuth,
    MessageAuth,
    RunKey,
    load_key,
    new_run_key,
    write_key_file,
)
from tianjax.transport.codec import (
    CodecError,
    ReplayGuard,
    TreeSpec,
    decode,
    decode_json,
    encode,
    encode_json,
)

AUTH = MessageAuth(RunKey(bytes(range(32))))
BIG = 1 << 30

DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
]


class Pair(NamedTuple):
    left: object
    right: object


def _array(dtype):
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
    if dtype == "bfloat16":  # hypothesis has no bfloat16: draw float32 and round
        return hnp.arrays(np.float32, shapes, elements=st.floats(-1e3, 1e3, width=32)).map(
            lambda a: a.astype(ml_dtypes.bfloat16)
        )
    return hnp.arrays(dtype, shapes)


arrays = st.sampled_from(DTYPES + ["bfloat16"]).flatmap(_array)
trees = st.recursive(
    arrays,
    lambda kids: st.one_of(
        st.dictionaries(st.text("abcxyz_", min_size=1, max_size=4), kids, min_size=1, max_size=3),
        st.lists(kids, min_size=1, max_size=3),
        st.tuples(kids, kids),
        st.builds(Pair, kids, kids),
    ),
    max_leaves=6,
)


def _leaves(tree):
    from jax import tree_util

    return tree_util.tree_leaves(tree)


def _same(a, b) -> bool:
    # bitwise, so NaNs and -0.0 count as equal to themselves
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _roundtrip(tree, **kw):
    frames = encode(tree, auth=AUTH, kind="traj", version=3, sender="a", seq=9, **kw)
    return decode(frames, auth=AUTH, spec=TreeSpec(tree, **kw), kind="traj", max_bytes=BIG)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees)
def test_roundtrip_property(tree):
    msg = _roundtrip(tree)
    assert (msg.version, msg.sender, msg.seq, msg.kind) == (3, "a", 9, "traj")
    got, want = _leaves(msg.tree), _leaves(tree)
    assert len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    from jax import tree_util

    assert tree_util.tree_structure(msg.tree) == tree_util.tree_structure(tree)


def test_a_tree_message_carries_its_body_and_a_body_that_is_not_an_object_is_refused():
    tree = {"w": np.arange(4, dtype=np.float32)}
    spec = TreeSpec(tree)
    body = {"round": 3, "settled": {"0": ["9f", 2, "merged"]}}
    frames = encode(tree, auth=AUTH, kind="average", version=3, sender="a", seq=0, body=body)
    msg = decode(frames, auth=AUTH, spec=spec, kind="average", max_bytes=BIG)
    assert msg.body == body and msg.version == 3
    assert _roundtrip(tree).body is None  # none given, none received
    frames = encode(tree, auth=AUTH, kind="delta", version=0, sender="a", seq=1, body=[1, 2])
    with pytest.raises(CodecError) as e:
        decode(frames, auth=AUTH, spec=spec, kind="delta", max_bytes=BIG)
    assert e.value.reason == "header"


def test_roundtrip_edge_leaves():
    tree = {
        "scalar": np.float32(2.5),
        "zero_d": np.array(7, np.int64),
        "empty": np.zeros((0, 3), np.float32),
        "bf16": np.linspace(-1, 1, 5).astype(ml_dtypes.bfloat16),
        "flags": np.array([True, False]),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big_endian": np.arange(4, dtype=">i4"),
    }
    msg = _roundtrip(tree)
    assert msg.tree["zero_d"].shape == () and msg.tree["empty"].shape == (0, 3)
    np.testing.assert_array_equal(msg.tree["fortran"], tree["fortran"])
    np.testing.assert_array_equal(msg.tree["big_endian"], tree["big_endian"])


def test_roundtrip_large_and_zero_copy():
    big = np.random.default_rng(0).standard_normal(2 * 2**20).astype(np.float32)  # 8 MiB
    frames = encode({"w": big}, auth=AUTH, kind="params", version=1, sender="l", seq=1)
    assert np.shares_memory(frames[2], big)  # the leaf frame is a view, not a copy
    msg = decode(frames, auth=AUTH, spec=TreeSpec({"w": big}), kind="params", max_bytes=BIG)
    assert np.shares_memory(msg.tree["w"], big)  # and decode is a view of the frame
    np.testing.assert_array_equal(msg.tree["w"], big)


def test_jax_leaves_and_shape_dtype_templates():
    import jax
    import jax.numpy as jnp

    tree = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2, jnp.bfloat16)}
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    frames = encode(tree, auth=AUTH, kind="params", version=1, sender="l", seq=1)
    msg = decode(frames, auth=AUTH, spec=TreeSpec(template), kind="params", max_bytes=BIG)
    assert msg.tree["b"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(msg.tree["w"], np.ones((3, 2), np.float32))


def test_free_batch_dims():
    example = {"obs": np.zeros((4, 2, 3), np.float32), "r": np.zeros((4, 2), np.float32)}
    spec = TreeSpec(example, batch_dims=1)
    longer = {"obs": np.ones((9, 2, 3), np.float32), "r": np.ones((9, 2), np.float32)}
    frames = encode(longer, auth=AUTH, kind="traj", version=0, sender="a", seq=1, batch_dims=1)
    assert decode(frames, auth=AUTH, spec=spec, kind="traj", max_bytes=BIG).tree["obs"].shape == (
        9,
        2,
        3,
    )
    ragged = {"obs": np.ones((9, 2, 3), np.float32), "r": np.ones((8, 2), np.float32)}
    frames = encode(ragged, auth=AUTH, kind="traj", version=0, sender="a", seq=2, batch_dims=1)
    with pytest.raises(CodecError) as e:
        decode(frames, auth=AUTH, spec=spec, kind="traj", max_bytes=BIG)
    assert e.value.reason == "shape"


# ------------------------------------------------------------------------------ rejections
TREE = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "act": np.arange(3, dtype=np.int32)}
SPEC = TreeSpec(TREE)


def _reason(frames, *, kind="traj", max_bytes=BIG, auth=AUTH) -> str:
    with pytest.raises(CodecError) as e:
        decode(frames, auth=auth, spec=SPEC, kind=kind, max_bytes=max_bytes)
    return e.value.reason


def _good(**kw):
    args = dict(auth=AUTH, kind="traj", version=1, sender="a", seq=1) | kw
    return encode(TREE, **args)


def _resign(frames):
    """Re-tags tampered frames with the right key: a buggy sender, not an outsider."""
    return [AUTH.tag(frames[1], frames[2:]), *frames[1:]]


def _reheader(frames, **changes):
    import json

    h = json.loads(bytes(frames[1])) | changes
    header = json.dumps(h).encode()
    return [AUTH.tag(header, frames[2:]), header, *frames[2:]]


class Boom:
    """Unpickling this would record it: proves no header is ever unpickled."""

    unpickled = []

    def __reduce__(self):
        return (Boom.unpickled.append, (1,))


def test_rejections_with_reasons():
    good = _good()
    assert decode(good, auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG).version == 1
    other_key = MessageAuth(new_run_key())
    assert _reason(_good(auth=other_key)) == "auth"
    assert _reason(good[1:]) == "auth"  # no signature
    assert _reason(good[:-1]) == "auth"  # an outsider dropping a leaf breaks the tag
    assert _reason(_resign(good[:-1])) == "truncated"  # a signed message missing a leaf
    assert _reason(_resign([*good[:3], bytes(good[3])[:-1]])) == "truncated"  # short leaf
    assert _reason(_resign([*good[:3], bytes(good[3]) + b"xxxx"])) == "size"  # long leaf
    assert _reason(good[:1]) == "truncated"
    assert _reason(good, max_bytes=100) == "size"
    assert _reason(good, kind="params") == "kind"
    renamed = encode(
        {"observation": TREE["obs"], "act": TREE["act"]},
        auth=AUTH,
        kind="traj",
        version=1,
        sender="a",
        seq=1,
    )
    assert _reason(renamed) == "schema"
    assert (
        _reason(encode({"obs": TREE["obs"]}, auth=AUTH, kind="traj", version=1, sender="a", seq=1))
        == "schema"
    )
    as_f64 = {"obs": TREE["obs"].astype(np.float64), "act": TREE["act"]}
    assert _reason(encode(as_f64, auth=AUTH, kind="traj", version=1, sender="a", seq=1)) == "dtype"
    reshaped = {"obs": TREE["obs"].reshape(4, 3), "act": TREE["act"]}
    assert (
        _reason(encode(reshaped, auth=AUTH, kind="traj", version=1, sender="a", seq=1)) == "shape"
    )
    assert _reason(_reheader(good, nbytes=1)) == "header"
    assert _reason(_reheader(good, m="other")) == "header"
    assert _reason(_reheader(good, seq="1")) == "header"
    payload = pickle.dumps(Boom())
    assert _reason([good[0], payload, *good[2:]]) == "auth"
    assert _reason([AUTH.tag(payload, good[2:]), payload, *good[2:]]) == "header"
    assert not Boom.unpickled
    rng = np.random.default_rng(1)
    assert _reason([rng.bytes(16), rng.bytes(200), rng.bytes(48), rng.bytes(12)]) == "auth"
    assert _reason([rng.bytes(300)]) == "truncated"


def test_tamper_any_byte_breaks_tag():
    big = np.random.default_rng(0).integers(0, 255, 3 * 2**20, dtype=np.uint8)
    frames = encode({"w": big}, auth=AUTH, kind="params", version=1, sender="l", seq=1)
    spec = TreeSpec({"w": big})
    flipped = big.copy()
    flipped[2**20 + 12345] ^= 1
    with pytest.raises(CodecError, match="auth"):
        decode([*frames[:2], flipped], auth=AUTH, spec=spec, kind="params", max_bytes=BIG)
    header = bytearray(frames[1])
    header[header.index(b'"version":1') + 10] = ord("2")
    with pytest.raises(CodecError, match="auth"):
        decode([frames[0], bytes(header), big], auth=AUTH, spec=spec, kind="params", max_bytes=BIG)


def test_mac_chunks(monkeypatch):
    # frames larger than one GMAC call are cut into chunks; check the cut with small chunks
    monkeypatch.setattr(auth_mod, "_CHUNK", 1000)
    data = np.arange(10_000, dtype=np.uint8)
    tag = AUTH.tag(b"h", [data, b""])
    assert AUTH.verify(tag, b"h", [data, b""])
    moved = [data[:5000], data[5000:]]  # same bytes, other frame boundaries
    assert not AUTH.verify(tag, b"h", moved)
    assert not AUTH.verify(tag, b"h", [data])


def test_replay_guard():
    guard = ReplayGuard()
    msg = decode(_good(seq=5), auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG)
    guard.check(msg)
    with pytest.raises(CodecError, match="replay"):
        guard.check(msg)
    guard.check(decode(_good(seq=5, sender="b"), auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG))
    guard.check(decode(_good(seq=6), auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG))


def _msg(**kw):
    return decode(_good(**kw), auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG)


def test_replay_guard_counts_per_incarnation_and_retires_the_one_before():
    """Sequence numbers count from 0 in each incarnation (no clock): a restarted sender
    starts again at 0, and from its first message on its predecessor's are refused, even
    ones numbered above anything seen."""
    guard = ReplayGuard()
    guard.check(_msg(seq=0, inc="old"))
    guard.check(_msg(seq=7, inc="old"))
    guard.check(_msg(seq=0, inc="new"))  # a restart: counting from 0 again is not a replay
    with pytest.raises(CodecError) as e:
        guard.check(_msg(seq=8, inc="old"))
    assert e.value.reason == "incarnation"
    with pytest.raises(CodecError) as e:
        guard.check(_msg(seq=0, inc="new"))
    assert e.value.reason == "replay"
    guard.check(_msg(seq=1, inc="new"))
    guard.check(_msg(seq=0, inc="newer"))
    for inc in ("old", "new"):  # every predecessor stays retired
        with pytest.raises(CodecError, match="incarnation"):
            guard.check(_msg(seq=100, inc=inc))
    with pytest.raises(CodecError, match="replay"):
        guard.check(_msg(seq=-1, sender="fresh", inc="x"))


def test_recipient_and_direction_are_bound():
    frames = _good(inc="i1", to="learner-0@abc")
    msg = decode(frames, auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG, to="learner-0@abc")
    assert (msg.inc, msg.to, msg.source) == ("i1", "learner-0@abc", "a@i1")
    for other, reason in (
        ("learner-0@abd", "old_incarnation"),
        ("learner-1@abc", "recipient"),
        ("", "recipient"),
    ):
        with pytest.raises(CodecError) as e:  # a restarted learner, another one
            decode(frames, auth=AUTH, spec=SPEC, kind="traj", max_bytes=BIG, to=other)
        assert e.value.reason == reason
    down = encode_json(
        {"type": "credit", "n": 1},
        auth=AUTH,
        kind="ctrl.down",
        sender="learner-0",
        seq=0,
        inc="L",
        to="actor-0@A",
    )
    with pytest.raises(CodecError) as e:  # reflected back to the learner: the wrong direction
        decode_json(down, auth=AUTH, kind="ctrl.up", max_bytes=1 << 16, to="actor-0@A")
    assert e.value.reason == "kind"
    import json

    readdressed = json.dumps(json.loads(bytes(down[1])) | {"to": "actor-1@B"}).encode()
    with pytest.raises(CodecError) as e:  # readdressing without the key breaks the tag
        decode_json(
            [down[0], readdressed], auth=AUTH, kind="ctrl.down", max_bytes=1 << 16, to="actor-1@B"
        )
    assert e.value.reason == "auth"


def test_control_json():
    frames = encode_json(
        {"type": "heartbeat", "n": 3}, auth=AUTH, kind="ctrl.up", sender="a", seq=1
    )
    assert decode_json(frames, auth=AUTH, kind="ctrl.up", max_bytes=1 << 16).body == {
        "type": "heartbeat",
        "n": 3,
    }
    bad = encode_json({"n": 3}, auth=AUTH, kind="ctrl.up", sender="a", seq=1)
    with pytest.raises(CodecError, match="header"):
        decode_json(bad, auth=AUTH, kind="ctrl.up", max_bytes=1 << 16)
    with pytest.raises(CodecError, match="size"):
        decode_json(frames, auth=AUTH, kind="ctrl.up", max_bytes=50)


def test_insecure_no_auth_is_only_itself():
    frames = encode(TREE, auth=InsecureNoAuth(), kind="traj", version=1, sender="a", seq=1)
    assert _reason(frames) == "auth"  # a real receiver refuses untagged messages
    assert decode(frames, auth=InsecureNoAuth(), spec=SPEC, kind="traj", max_bytes=BIG).version == 1


# ------------------------------------------------------------------------------ keys
def test_key_is_never_shown_or_pickled():
    key = new_run_key()
    assert len(bytes(key)) == 32 and key.hex() not in repr(key) and key.hex() not in str(key)
    assert key.hex() not in repr(MessageAuth(key))
    with pytest.raises(TypeError):
        pickle.dumps(key)
    with pytest.raises(TypeError):
        pickle.dumps(MessageAuth(key))
    assert RunKey(bytes(key)) == key and new_run_key() != key
    with pytest.raises(ValueError):
        RunKey(b"short")


def test_load_key(tmp_path, monkeypatch):
    key = new_run_key()
    write_key_file(tmp_path / "hex.key", key)
    assert load_key(tmp_path / "hex.key") == key
    monkeypatch.setenv(KEY_ENV, key.hex())
    assert load_key() == key
    assert KEY_ENV not in os.environ  # read once: nothing started afterwards inherits it
    monkeypatch.setenv("OTHER", key.hex())
    assert load_key("env:OTHER") == key and "OTHER" not in os.environ
    with pytest.raises(KeyError) as e:
        load_key()
    assert KEY_ENV in str(e.value)


@pytest.mark.parametrize(
    "content",
    [
        b"abcd",
        b"correct horse battery staple, a passphrase",
        b"ab" * 31,
        b"ab" * 33,
        b"zz" * 32,
        bytes(range(32)),
    ],
)
def test_only_a_key_of_64_hex_digits_is_taken(tmp_path, content):
    """A key is 32 random bytes as 64 hex digits: a passphrase, a short or long key, or
    the raw bytes are refused, and the message never shows what the file held."""
    path = tmp_path / "bad.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(ValueError) as e:
        load_key(path)
    assert "64 hex digits" in str(e.value) and content.decode(errors="replace")[:8] not in str(
        e.value
    )
    with pytest.raises(ValueError):
        RunKey(content[:16])


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_key_file_others_may_read_is_refused(tmp_path, mode):
    path = tmp_path / "run.key"
    write_key_file(path, new_run_key())
    os.chmod(path, mode)
    with pytest.raises(PermissionError, match="chmod 600"):
        load_key(path)
    os.chmod(path, 0o600)
    assert load_key(path) is not None

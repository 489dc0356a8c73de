"""Checkpoints of the whole training state with orbax, and resuming from them.

A checkpoint is one orbax step directory under `<run_dir>/checkpoints/` holding two items:

- `state`: the array pytree (the learner state: params, optimizer state with its schedule
  counts, version, PRNG key, skipped-update count, DQN target params; in fused mode also
  the actors' env states and the replay buffer; in the distributed runtime the replay
  buffer when `checkpoint.replay` is set);
- `meta`: JSON with the host-side counters (env steps, updates, wall-clock time so far,
  the episode tracker, ...) and a SHA-256 digest of every array in `state` and of the
  meta's own counters (a changed count fails the check as a changed array does).

Orbax writes each step to a temporary directory and renames it when complete, so a run
that crashes mid-save leaves no step that looks whole. On top of that, restore checks the
digest: a latest checkpoint that was truncated or corrupted afterwards is skipped with a
warning, and the one before it is used. A learner resuming (`move_aside`) also renames
such a step out of the way (`<step>.unreadable-<n>`, kept for a look), so that when the run
reaches that step again its save writes it, instead of taking it for done. Typed PRNG keys are
stored as their raw key data
and rewrapped on restore. Nothing here is jitted or pure: this is the runtime shell.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from tianjax.checkpoint.failures import HeldStderr, quiet_loggers, resource_errno

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """No usable checkpoint (none written, all unreadable, or not for this config)."""


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _unkey(tree):
    """Typed PRNG keys -> their uint32 key data (orbax stores plain arrays)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _rekey(tree, template):
    return jax.tree.map(
        lambda x, t: jax.random.wrap_key_data(x, impl=jax.random.key_impl(t)) if _is_key(t) else x,
        tree,
        template,
    )


def _host_leaf(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = x.addressable_data(0)  # replicated over processes: any local copy
    return np.asarray(x)


def _path_name(path) -> str:
    """A tree path as plain names ('learner/params/Dense_0/bias'), the same whether the
    tree holds NamedTuples (as written) or the dicts orbax reads back without a template."""
    parts = []
    for k in path:
        for attr in ("name", "key", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return "/".join(parts)


DIGEST_COVERS = "state+meta"  # what a checkpoint's digest covers (older ones: the state only)


def _meta_bytes(meta: dict) -> bytes:
    """The meta as canonical JSON, its digest fields left out (the same before it is
    written and after it is read back: JSON keys are strings, tuples are lists)."""
    plain = json.loads(
        json.dumps({k: v for k, v in meta.items() if k not in ("digest", "digest_covers")})
    )
    return json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()


def digest(tree, meta: dict | None = None) -> str:
    """SHA-256 over every leaf's path, dtype, shape and bytes, in path order, then over
    `meta` (its counters) if given."""
    h = hashlib.sha256()
    leaves = jax.tree_util.tree_flatten_with_path(_unkey(tree))[0]
    for name, leaf in sorted(((_path_name(p), x) for p, x in leaves), key=lambda t: t[0]):
        a = np.ascontiguousarray(_host_leaf(leaf))
        h.update(f"{name}:{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    if meta is not None:
        h.update(b"meta:" + _meta_bytes(meta))
    return h.hexdigest()


def checkpoint_dir(run_dir: str) -> str:
    return os.path.join(os.path.abspath(run_dir), CHECKPOINT_DIR)


class Checkpointer:
    """Saves every `every` steps (0: only when told) and keeps the newest `keep`.

    `step` is the number of updates applied. Saving is synchronous: the learner's next
    update donates the state buffers, so they must be written before it runs.
    """

    def __init__(self, run_dir: str, keep: int = 3, every: int = 0, start: int = 0):
        self.directory = checkpoint_dir(run_dir)
        self.every = every
        self._last = start  # the step of the newest checkpoint (or where a resumed run began)
        self._mgr = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                enable_async_checkpointing=False,
                cleanup_tmp_directories=True,
            ),
            item_names=("state", "meta"),
        )

    def due(self, step: int) -> bool:
        """Whether `step` updates crossed a multiple of `every` since the last checkpoint."""
        return self.every > 0 and step // self.every > self._last // self.every

    def save(self, step: int, state, meta: dict) -> None:
        if step in self._mgr.all_steps():
            return  # already saved (a final save right after a periodic one)
        meta = dict(meta, step=int(step), digest_covers=DIGEST_COVERS)
        meta["digest"] = digest(state, meta)
        try:
            with (
                quiet_loggers(("absl", "asyncio")),
                HeldStderr(),
            ):  # orbax's threads log each failure with a traceback
                self._mgr.save(
                    int(step),
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(_unkey(state)), meta=ocp.args.JsonSave(meta)
                    ),
                    force=True,
                )
                self._mgr.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            failed = resource_errno(e)
            if failed is None:
                raise
            # the half-written step frees its space; the steps before it are whole
            for name in os.listdir(self.directory):
                if "orbax-checkpoint-tmp" in name:
                    shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
            raise OSError(failed, os.strerror(failed), self.directory) from None
        self._last = step

    @property
    def steps(self) -> list[int]:
        return sorted(self._mgr.all_steps())

    def close(self) -> None:
        self._mgr.close()


# Config keys a checkpoint's arrays depend on: resuming with any of them changed is refused.
SHAPE_KEYS = (
    "algo",
    "env",
    "env_backend",
    "mode",
    "num_seeds",
    "num_envs",
    "rollout_len",
    "network",
    "num_actors",
)


def shape_keys(config) -> tuple[str, ...]:
    """The config keys (dotted for sections' keys) that a checkpoint of this run depends on:
    SHAPE_KEYS, the keys the algorithm's spec says shape its parameters, and those that shape
    its replay buffer where the checkpoint holds it (fused runs always; the others where
    checkpoint.replay asks)."""
    spec = config.spec
    keys = SHAPE_KEYS + tuple(spec.shape_keys)
    if config.mode == "fused" or config.checkpoint.replay:
        keys += tuple(spec.replay_shape_keys)
    return keys


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def run_meta(config) -> dict:
    """What a checkpoint records about the config that made it."""
    d = config.to_dict()
    return {"config": {k: _lookup(d, k) for k in shape_keys(config)}}


def check_compatible(meta: dict, config, run_dir: str) -> None:
    """Raises CheckpointError naming the first config key that differs from the run's
    (a key the checkpoint did not record, e.g. one written before the key was checked, is
    not compared)."""
    saved = meta.get("config", {})
    now = run_meta(config)["config"]
    for k, value in now.items():
        if k in saved and saved[k] != value:
            raise CheckpointError(
                f"resume: config key '{k}' is {value!r} but the run in '{run_dir}' "
                f"was trained with {saved[k]!r}"
            )


def _open(run_dir: str) -> ocp.CheckpointManager:
    directory = checkpoint_dir(run_dir)
    if not os.path.isdir(directory):
        raise CheckpointError(
            f"resume: '{run_dir}' has no checkpoints (no {CHECKPOINT_DIR}/ directory)"
        )
    return ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(create=False),
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "meta": ocp.JsonCheckpointHandler(),
        },
    )


def _local_target(mgr: ocp.CheckpointManager, step: int):
    """An abstract tree placing every saved array whole on this process's first device:
    reads a checkpoint written by any topology (e.g. several learner processes)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    saved = mgr.item_metadata(step).state
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)


def has_checkpoint(run_dir: str) -> bool:
    """Whether run_dir holds at least one complete checkpoint step."""
    if not os.path.isdir(checkpoint_dir(run_dir)):
        return False
    mgr = _open(run_dir)
    try:
        return bool(mgr.all_steps())
    finally:
        mgr.close()


def read_meta(run_dir: str, step: int | None = None) -> dict:
    """The meta of a checkpoint (default: the latest) without reading its arrays."""
    mgr = _open(run_dir)
    try:
        step = mgr.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"resume: '{run_dir}' has no complete checkpoint")
        return mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
    finally:
        mgr.close()


def restore_step(run_dir: str, step: int, template=None) -> tuple[int, Any, dict]:
    """Like restore_latest, for one named step (no fallback)."""
    return restore_latest(run_dir, template, only=step)


def _saved_fields(mgr, step: int) -> set | None:
    """The top-level names of a step's saved state (None: not readable here)."""
    import ast
    import json

    path = os.path.join(str(mgr.directory), str(step), "state", "_METADATA")
    try:
        with open(path) as f:
            keys = json.load(f)["tree_metadata"]
        return {ast.literal_eval(k)[0] for k in keys}
    except (OSError, ValueError, KeyError, SyntaxError, IndexError, TypeError):
        return None


def _fit_absent(target, saved: set | None):
    """A state that gained an optional field (None when unused, e.g. the fused loop's
    forced-lag ring) still restores a checkpoint written before it: such a field, None in
    the target and absent from the checkpoint, is left out of the restore and put back as
    None. Returns (the target to restore, rebuild(restored) -> the template's type)."""
    fields = getattr(target, "_fields", None)
    if target is None or saved is None or fields is None:
        return target, lambda tree: tree
    absent = [f for f in fields if getattr(target, f) is None and f not in saved]
    if not absent:
        return target, lambda tree: tree
    kept = {f: getattr(target, f) for f in fields if f not in absent}

    def rebuild(tree):
        values = dict(tree) if isinstance(tree, dict) else tree._asdict()
        return type(target)(**{f: values.get(f) for f in fields})

    return kept, rebuild


def restore_latest(
    run_dir: str, template=None, only: int | None = None, move_aside: bool = False
) -> tuple[int, Any, dict]:
    """(step, state, meta) of the newest checkpoint under run_dir that reads back whole.

    `template` is a state pytree of the right structure, shapes, dtypes and shardings
    (e.g. a freshly initialised state); the restored arrays take its shardings and its
    PRNG keys are rewrapped. Without one, the state comes back as nested dicts of arrays
    as saved (keys as raw key data): enough to read the parameters. A step that fails to
    read, or whose arrays (or counters) do not match their recorded digest, is skipped
    with a warning and the previous one tried; with `move_aside` (a learner that will
    write here again) it is renamed `<step>.unreadable-<n>`, so that a later save of that
    step writes it.
    """
    mgr = _open(run_dir)
    unreadable = []
    try:
        steps = sorted(mgr.all_steps(), reverse=True)
        if only is not None:
            if only not in steps:
                raise CheckpointError(
                    f"no checkpoint step {only} in '{run_dir}' (steps: {sorted(steps)})"
                )
            steps = [only]
        if not steps:
            raise CheckpointError(f"resume: '{run_dir}' has no complete checkpoint")
        target = (
            None
            if template is None
            else jax.tree.map(ocp.utils.to_shape_dtype_struct, _unkey(template))
        )
        problems = []
        for step in steps:
            try:
                fitted, rebuild = _fit_absent(target, _saved_fields(mgr, step))
                restore = ocp.args.StandardRestore(
                    fitted if fitted is not None else _local_target(mgr, step)
                )
                got = mgr.restore(
                    step, args=ocp.args.Composite(state=restore, meta=ocp.args.JsonRestore())
                )
                state, meta = rebuild(got.state), dict(got.meta)
                if template is not None:
                    state = _rekey(state, template)
                covers_meta = meta.get("digest_covers") == DIGEST_COVERS
                if meta.get("digest") != digest(state, meta if covers_meta else None):
                    raise CheckpointError(
                        "its arrays or counters do not match the digest recorded when it "
                        "was written"
                    )
            except Exception as e:  # noqa: BLE001 - any unreadable step: fall back to the previous
                reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                problems.append(f"step {step}: {reason}")
                unreadable.append(step)
                if step != steps[-1]:
                    warnings.warn(
                        f"checkpoint step {step} in {mgr.directory} is unreadable ({reason}); "
                        "falling back to the previous one",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                continue
            return step, state, meta
        raise CheckpointError(
            f"resume: no checkpoint in '{run_dir}' could be read ({'; '.join(problems)})"
        )
    finally:
        mgr.close()
        if move_aside:
            for step in unreadable:
                _move_aside(checkpoint_dir(run_dir), step)


def _move_aside(directory: str, step: int) -> None:
    path = os.path.join(directory, str(step))
    if not os.path.isdir(path):
        return
    n = 0
    while os.path.exists(f"{path}.unreadable-{n}"):
        n += 1
    os.rename(path, f"{path}.unreadable-{n}")
    warnings.warn(
        f"checkpoint step {step} moved aside to {path}.unreadable-{n}: a save of that step "
        "writes it again",
        RuntimeWarning,
        stacklevel=3,
    )


__all__ = [
    "CheckpointError",
    "Checkpointer",
    "checkpoint_dir",
    "digest",
    "has_checkpoint",
    "read_meta",
    "restore_latest",
    "restore_step",
]

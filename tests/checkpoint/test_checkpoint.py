"""Checkpoints: round trip, fallback past a damaged latest step, and resumed training.

A fused run stopped after N updates and resumed to 2N must end with exactly the
parameters of an uninterrupted 2N-update run (same seed), with its version and env-step
counters continuing and its metrics appended to the same run directory.
"""

from __future__ import annotations

import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianjax
from tianjax.checkpoint import store as ckpt
from tianjax.cli import main as cli_main
from tianjax.config import load_config

CFG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "ppo_cartpole.yaml")
PER_UPDATE = 4 * 128  # num_envs x rollout_len of the default config


def _state(shift: float = 0.0):
    return {
        "w": jnp.arange(6.0).reshape(2, 3) + shift,
        "key": jax.random.key(3),
        "version": jnp.int32(7),
        "nested": (jnp.ones(4, jnp.uint8), jnp.zeros((3, 2), jnp.bfloat16)),
    }


def _equal(a, b) -> bool:
    a, b = ckpt._unkey(a), ckpt._unkey(b)
    same = jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)
    return all(jax.tree.leaves(same))


def _save_steps(run_dir, steps, keep=3):
    saver = ckpt.Checkpointer(str(run_dir), keep=keep)
    for s in steps:
        saver.save(s, _state(shift=s), {"env_steps": 100 * s})
    saver.close()


def _data_files(run_dir, step):
    root = os.path.join(ckpt.checkpoint_dir(str(run_dir)), str(step), "state")
    files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
    return [f for f in files if os.sep + "d" + os.sep in f]  # the array chunks


# ----------------------------------------------------------------------------- unit
def test_round_trip_keeps_keys_and_meta(tmp_path):
    _save_steps(tmp_path, [5, 10])
    step, state, meta = ckpt.restore_latest(str(tmp_path), _state())
    assert step == 10 and meta["env_steps"] == 1000 and meta["step"] == 10
    assert _equal(state, _state(shift=10))
    assert jax.dtypes.issubdtype(state["key"].dtype, jax.dtypes.prng_key)
    # without a template (as `tianjax eval` reads): the same arrays, digest checked
    step, plain, _ = ckpt.restore_latest(str(tmp_path))
    assert step == 10 and np.array_equal(plain["w"], _state(shift=10)["w"])
    assert np.array_equal(plain["key"], jax.random.key_data(jax.random.key(3)))


def test_keeps_only_the_newest(tmp_path):
    _save_steps(tmp_path, [1, 2, 3, 4, 5], keep=2)
    assert ckpt.Checkpointer(str(tmp_path)).steps == [4, 5]


def test_due_at_each_multiple_of_every():
    saver_steps = []
    saver = ckpt.Checkpointer.__new__(ckpt.Checkpointer)  # due() needs no directory
    saver.every, saver._last = 8, 0
    for step in range(0, 40, 3):  # chunk boundaries every 3 updates
        if saver.due(step):
            saver_steps.append(step)
            saver._last = step
    assert saver_steps == [9, 18, 24, 33]  # the first boundary at or after 8, 16, 24, 32
    saver.every, saver._last = 8, 20  # resumed at 20: the next one is at or after 24
    assert not saver.due(23) and saver.due(24)
    saver.every = 0
    assert not saver.due(10_000)


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "delete"])
def test_damaged_latest_falls_back_to_previous(tmp_path, damage):
    _save_steps(tmp_path, [5, 10])
    files = _data_files(tmp_path, 10)
    assert files
    for f in files:
        if damage == "truncate":
            with open(f, "r+b") as fh:
                fh.truncate(os.path.getsize(f) // 2)
        elif damage == "corrupt":
            with open(f, "r+b") as fh:
                data = bytearray(fh.read())
                for i in range(0, len(data), 7):
                    data[i] ^= 0xFF
                fh.seek(0)
                fh.write(data)
        else:
            os.remove(f)
    with pytest.warns(RuntimeWarning, match="step 10 .* unreadable"):
        step, state, meta = ckpt.restore_latest(str(tmp_path), _state())
    assert step == 5 and meta["env_steps"] == 500
    assert _equal(state, _state(shift=5))


def _meta_file(run_dir, step):
    root = os.path.join(ckpt.checkpoint_dir(str(run_dir)), str(step), "meta")
    return next(
        os.path.join(d, f)
        for d, _, fs in os.walk(root)
        for f in fs
        if f.endswith(".json") or "meta" in f
    )


def test_the_digest_covers_the_counters(tmp_path):
    """A changed count in the meta fails the check as a changed array does."""
    _save_steps(tmp_path, [5, 10])
    path = _meta_file(tmp_path, 10)
    with open(path) as f:
        meta = json.load(f)
    assert meta["env_steps"] == 1000 and meta["digest_covers"] == "state+meta"
    meta["env_steps"] = 999  # the arrays untouched
    with open(path, "w") as f:
        json.dump(meta, f)
    with pytest.warns(RuntimeWarning, match="step 10 .* do not match the digest"):
        step, _, meta = ckpt.restore_latest(str(tmp_path), _state())
    assert step == 5 and meta["env_steps"] == 500


def test_an_unreadable_step_is_moved_aside_and_written_again(tmp_path):
    """Resuming past a damaged newest step moves it aside, so that the run's save of that
    step (here: the final one) writes it, instead of skipping it as already saved."""
    _save_steps(tmp_path, [5, 10])
    for f in _data_files(tmp_path, 10):
        os.remove(f)
    with pytest.warns(RuntimeWarning, match="step 10 moved aside"):
        step, _, _ = ckpt.restore_latest(str(tmp_path), _state(), move_aside=True)
    assert step == 5
    directory = ckpt.checkpoint_dir(str(tmp_path))
    assert sorted(os.listdir(directory)) == ["10.unreadable-0", "5"]
    saver = ckpt.Checkpointer(str(tmp_path), start=5)
    saver.save(10, _state(shift=42), {"env_steps": 4200})
    saver.close()
    step, state, meta = ckpt.restore_latest(str(tmp_path), _state())
    assert step == 10 and meta["env_steps"] == 4200 and _equal(state, _state(shift=42))
    # a read that will not write (no move_aside) leaves a damaged step where it is
    for f in _data_files(tmp_path, 10):
        os.remove(f)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert ckpt.restore_latest(str(tmp_path), _state())[0] == 5
    assert "10" in os.listdir(directory)


def test_unfinished_save_is_ignored(tmp_path):
    _save_steps(tmp_path, [5])
    # what a crash mid-save leaves: orbax's temporary directory, never renamed into place
    partial = os.path.join(
        ckpt.checkpoint_dir(str(tmp_path)), "10.orbax-checkpoint-tmp-1234", "state"
    )
    os.makedirs(partial)
    with open(os.path.join(partial, "half-written"), "wb") as f:
        f.write(b"\0" * 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback needed: the half step is not a step
        step, state, _ = ckpt.restore_latest(str(tmp_path), _state())
    assert step == 5 and _equal(state, _state(shift=5))


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="has no checkpoints"):
        ckpt.restore_latest(str(tmp_path), _state())
    _save_steps(tmp_path, [5])
    for f in _data_files(tmp_path, 5):
        os.remove(f)
    with pytest.raises(ckpt.CheckpointError, match="could be read"):
        ckpt.restore_latest(str(tmp_path), _state())


def test_incompatible_config_names_the_key():
    a = load_config(CFG)
    meta = ckpt.run_meta(a)
    ckpt.check_compatible(meta, load_config(CFG, ["total_env_steps=1024", "ppo.lr=1e-3"]), "r")
    with pytest.raises(ckpt.CheckpointError, match="config key 'num_envs'"):
        ckpt.check_compatible(meta, load_config(CFG, ["num_envs=8"]), "r")


def test_section_keys_that_shape_the_arrays_are_named():
    dqn = os.path.join(os.path.dirname(CFG), "dqn_cartpole.yaml")
    fused = load_config(dqn)
    meta = ckpt.run_meta(fused)
    # fused runs keep their replay buffer: its layout is part of the checkpoint
    with pytest.raises(ckpt.CheckpointError, match="config key 'dqn.frame_once' is True"):
        ckpt.check_compatible(meta, load_config(dqn, ["dqn.frame_once=true"]), "r")
    with pytest.raises(ckpt.CheckpointError, match="config key 'dqn.buffer_size'"):
        ckpt.check_compatible(meta, load_config(dqn, ["dqn.buffer_size=1000"]), "r")
    ckpt.check_compatible(meta, load_config(dqn, ["dqn.lr=1e-3", "dqn.batch_size=32"]), "r")
    # actors feeding a learner whose checkpoints leave the buffer out: its size may change
    actors = ["mode=async", "num_actors=2", "env_backend=envpool"]
    meta = ckpt.run_meta(load_config(dqn, actors))
    ckpt.check_compatible(meta, load_config(dqn, actors + ["dqn.buffer_size=1000"]), "r")
    # a checkpoint written before a key was recorded is not refused for it
    ckpt.check_compatible(
        {"config": {"algo": "dqn"}}, load_config(dqn, ["dqn.frame_once=true"]), "r"
    )
    # the sections that size a multi-agent algorithm's networks
    qmix = os.path.join(os.path.dirname(CFG), "qmix_smax_3m.yaml")
    with pytest.raises(ckpt.CheckpointError, match="config key 'qmix.hidden_dim'"):
        ckpt.check_compatible(
            ckpt.run_meta(load_config(qmix)), load_config(qmix, ["qmix.hidden_dim=32"]), "r"
        )
    ippo = os.path.join(os.path.dirname(CFG), "ippo_mpe_spread.yaml")
    with pytest.raises(ckpt.CheckpointError, match="config key 'marl.agent_id'"):
        ckpt.check_compatible(
            ckpt.run_meta(load_config(ippo)), load_config(ippo, ["marl.agent_id=false"]), "r"
        )


# ----------------------------------------------------------------------------- resume
def _train(run_dir, updates, *extra):
    overrides = [
        "ppo.anneal_lr=false",
        "log_every=4",
        "eval.episodes=0",
        "checkpoint.every=8",
        f"total_env_steps={updates * PER_UPDATE}",
        *extra,
    ]
    kw = {"run_dir": str(run_dir)} if run_dir is not None else {}
    return tianjax.train(CFG, overrides, progress=False, verbose=False, **kw)


def test_fused_resume_equals_uninterrupted_run(tmp_path):
    n = 12
    first = _train(tmp_path / "a", n)
    assert first.summary["updates"] == n
    assert ckpt.Checkpointer(str(tmp_path / "a")).steps == [8, 12]  # every 8, and the final one
    resumed = _train(None, 2 * n, f"resume={tmp_path / 'a'}")
    whole = _train(tmp_path / "b", 2 * n)

    assert resumed.run_dir == first.run_dir  # metrics appended to the same run
    assert resumed.summary["resumed_from_step"] == n
    assert resumed.summary["updates"] == whole.summary["updates"] == 2 * n
    assert resumed.summary["env_steps"] == 2 * n * PER_UPDATE
    assert _equal(resumed.params, whole.params)

    with open(os.path.join(first.run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["updates"] for r in records] == list(range(4, 2 * n + 1, 4))
    assert [r["env_steps"] for r in records] == [u * PER_UPDATE for u in range(4, 2 * n + 1, 4)]
    times = [r["wall_time_s"] for r in records]
    assert times == sorted(times)  # wall-clock time goes on from where the first part ended
    assert ckpt.read_meta(first.run_dir)["updates"] == 2 * n


def test_resume_refuses_a_changed_shape(tmp_path):
    _train(tmp_path / "a", 4)
    code = cli_main(["train", CFG, f"resume={tmp_path / 'a'}", "num_envs=8", "--no-progress"])
    assert code == 2
    code = cli_main(["train", CFG, f"resume={tmp_path / 'nothing'}", "--no-progress"])
    assert code == 2


# ----------------------------------------------------------------------------- eval
def test_eval_reads_the_newest_checkpoint(tmp_path, capsys):
    result = _train(tmp_path / "a", 8, "eval.episodes=4")
    capsys.readouterr()
    assert cli_main(["eval", result.run_dir, "episodes=4"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("eval 4 episodes (checkpoint step 8): mean ")
    mean = float(line.split("mean ")[1].split()[0])
    # the same greedy evaluation train() ran on the final params (same seed, same episodes)
    assert mean == pytest.approx(result.summary["eval_return"], abs=0.01)
    step_dir = os.path.join(ckpt.checkpoint_dir(result.run_dir), "8")
    assert cli_main(["eval", step_dir, "episodes=4"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == line


@pytest.mark.parametrize(
    "args",
    [
        ["nowhere"],
        ["{run}", "episodes=0"],
        ["{run}", "episode=3"],
        ["{run}", "greedy=maybe"],
        ["{run}/checkpoints/999"],
    ],
)
def test_eval_bad_input_is_one_line(tmp_path, capsys, args):
    run = tmp_path / "a"
    _save_steps(run, [5])  # a checkpoints directory...
    with open(run / "config.yaml", "w") as f:  # ...and a config: enough for argument checks
        f.write("algo: ppo\n")
    os.makedirs(run / "checkpoints" / "999", exist_ok=True)
    code = cli_main(["eval", *[a.format(run=run) for a in args]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("tianjax: error:"), err

import json
import subprocess
import sys

import jax
import numpy as np

import tianjax
from tianjax.algos import make_algorithm
from tianjax.config import load_config
from tianjax.core.fused_loop import make_fused
from tianjax.envs.gymnax_env import make_gymnax

SUMMARY_KEYS = {
    "mode",
    "algo",
    "env",
    "env_steps",
    "updates",
    "wall_time_s",
    "compile_time_s",
    "env_steps_per_s",
    "final_return",
    "target_return",
    "convergence_time_s",
    "convergence_env_steps",
}


def test_fused_iterations_count_steps_and_versions():
    cfg = load_config(
        "configs/ppo_cartpole.yaml", ["num_envs=2", "rollout_len=8", "total_env_steps=64"]
    )
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    state, (metrics, episodes) = jax.jit(run, static_argnums=1)(init(jax.random.key(0)), 3)
    assert int(state.env_steps) == 3 * 2 * 8
    assert int(state.learner.version) == 3
    assert episodes.done.shape == (3, 8, 2)
    assert metrics["loss"].shape == (3,)


def test_skipped_iterations_leave_the_state_and_give_zero_outputs():
    """run(state, 5, num_valid=3) is run(state, 3), then two iterations that change nothing
    and output zeros: one program for chunks of any length up to 5."""
    cfg = load_config(
        "configs/ppo_cartpole.yaml", ["num_envs=2", "rollout_len=8", "total_env_steps=64"]
    )
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    s0 = init(jax.random.key(0))
    plain, (m3, e3) = jax.jit(run, static_argnums=1)(s0, 3)
    masked, (m5, e5) = jax.jit(run, static_argnums=1)(s0, 5, np.int32(3))
    for a, b in zip(
        jax.tree.leaves((plain.learner.params, plain.actor.obs)),
        jax.tree.leaves((masked.learner.params, masked.actor.obs)),
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(masked.learner.version) == 3
    np.testing.assert_array_equal(m5["loss"][:3], m3["loss"])
    assert (
        not np.any(m5["loss"][3:]) and not np.any(e5.done[3:]) and int(masked.env_steps) == 3 * 16
    )


def test_chunks_aim_at_two_seconds_in_whole_records_growing_at_most_fourfold():
    from tianjax.runtime.runners.fused import chunk_capacity, next_chunk

    # capacity: the run, or the whole records whose outputs fit 64 MiB; a record at least
    assert chunk_capacity(976, 4, 5_000) == 976
    assert chunk_capacity(10**6, 4, 1 << 20) == 64  # 64 iterations of 1 MiB each
    assert chunk_capacity(10**6, 5, 1 << 20) == 60  # whole records only
    assert chunk_capacity(10**6, 100, 1 << 20) == 100  # one record, even over the bound
    assert chunk_capacity(3, 4, 10) == 3
    # next: 2 s at the last chunk's pace, in whole records, at most 4x and the capacity
    assert next_chunk(4, 0.016, 4, 976) == 16  # 250 it/s would be 500: 4x growth caps it
    assert next_chunk(64, 0.256, 4, 976) == 256  # 500, capped at 4x
    assert next_chunk(256, 1.024, 4, 976) == 500  # 2 s at 250 it/s
    assert next_chunk(256, 1.0, 3, 976) == 510  # 512, down to whole records of 3
    assert next_chunk(500, 2.0, 4, 300) == 300  # the capacity
    assert next_chunk(10, 50.0, 4, 976) == 4  # slower than a record per 2 s: one record
    assert next_chunk(2, 0.001, 4, 3) == 3  # capacity below a record (a run of 3)


def test_train_with_a_short_last_chunk_is_the_core_run(tmp_path):
    """17 iterations in chunks of 1, 4 and 12 (the pace lets each grow fourfold; the last
    runs what is left of the program's 17): the parameters of one uninterrupted core scan,
    and a record per iteration."""
    over = [
        "num_envs=2",
        "rollout_len=8",
        f"total_env_steps={17 * 16}",
        "log_every=1",
        "eval.episodes=0",
    ]
    cfg = load_config("configs/ppo_cartpole.yaml", over)
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    core, _ = jax.jit(run, static_argnums=1)(
        jax.jit(init)(jax.random.split(jax.random.key(0), 1)[0]), 17
    )
    result = tianjax.train(
        "configs/ppo_cartpole.yaml",
        over,
        run_dir=str(tmp_path / "run"),
        progress=False,
        verbose=False,
    )
    assert result.summary["updates"] == 17 and result.summary["env_steps"] == 17 * 16
    for a, b in zip(jax.tree.leaves(core.learner.params), jax.tree.leaves(result.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    rows = [json.loads(x) for x in open(f"{result.run_dir}/metrics.jsonl")]
    assert [r["env_steps"] for r in rows] == [16 * (i + 1) for i in range(17)]


def test_python_api_writes_run_dir_and_seeds_run_side_by_side(tmp_path):
    result = tianjax.train(
        "configs/ppo_cartpole.yaml",
        ["total_env_steps=8192", "num_seeds=2", "log_every=4", "eval.episodes=0"],
        run_dir=str(tmp_path / "run"),
        progress=False,
        verbose=False,
    )
    assert SUMMARY_KEYS <= set(result.summary)
    assert result.summary["env_steps"] == 2 * 8192 and result.summary["updates"] == 16
    assert len(result.summary["final_return_per_seed"]) == 2
    # params carry a leading seed axis, and the two seeds learned different things
    leaf = jax.tree.leaves(result.params)[0]
    assert leaf.shape[0] == 2 and not np.allclose(leaf[0], leaf[1])
    lines = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["env_steps"] for r in lines] == [4 * 512, 8 * 512, 12 * 512, 16 * 512]
    assert json.load(open(tmp_path / "run" / "summary.json")) == result.summary
    assert (tmp_path / "run" / "config.yaml").exists()


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, needle in [
        (["configs/ppo_cartpole.yaml", "ppo.lr=oops"], "'ppo.lr'"),
        (["configs/nope.yaml"], "not found"),
        (["configs/ppo_cartpole.yaml", "env=NoSuchEnv-v0", f"run_dir={tmp_path}/r"], "'env'"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "tianjax.cli", "train", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1

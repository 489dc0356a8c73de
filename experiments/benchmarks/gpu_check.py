"""The GPU check of evaluation and devices on one host (one GPU is enough), in under ten
minutes; prints one table per part.

1. fused PPO env steps/s on gymnax CartPole-v1 against the reference fused PPO
   (experiments/benchmarks/minimal_ppo.py, PureJaxRL's shape) on the same GPU, alternating
   (experiments/benchmarks/bench_fused.py, at GPU batch sizes);
2. an async Atari run (envpool Breakout-v5, nature CNN) with the actors and the learner on
   the GPU (runtime.actor_devices=gpu:0, runtime.learner_devices=gpu:0: the memory rule of
   tianjax.launch.placement splits it three ways) and an evaluator: fresh samples/s, the
   learner's busy fraction, the evaluations made;
3. the peak memory of each process of that run: GPU memory (nvidia-smi's per-process
   used memory, polled every 0.5 s) and host RSS, by role.

    python experiments/benchmarks/gpu_check.py [--atari-steps 1500000] [--smoke]

`--smoke` runs every part tiny, on whatever JAX has (a CPU included), to check the script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))


def fused(smoke: bool) -> None:
    envs, steps, repeats = (
        (["4"], ["20480"], "1") if smoke else (["64", "2048"], ["2000000", "20000000"], "3")
    )
    cmd = [sys.executable, os.path.join(HERE, "bench_fused.py"), "--no-cold-start"]
    cmd += ["--repeats", repeats, "--envs", *envs, "--steps", *steps]
    print(
        "== 1. fused PPO against the reference on the same device\n$ " + " ".join(cmd), flush=True
    )
    subprocess.run(cmd, check=True)


class MemoryPoll(threading.Thread):
    """Peak GPU memory (nvidia-smi) and host RSS of every process under `pid`, by pid."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.stop_flag = pid, threading.Event()
        self.gpu: dict[int, float] = {}
        self.rss: dict[int, float] = {}
        self.role: dict[int, str] = {}

    def _gpu_now(self) -> dict[int, float]:
        if not shutil.which("nvidia-smi"):
            return {}
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        got = {}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit():
                try:
                    got[int(parts[0])] = float(parts[1])
                except ValueError:
                    pass
        return got

    def run(self) -> None:
        import psutil

        while not self.stop_flag.is_set():
            try:
                procs = [
                    psutil.Process(self.pid),
                    *psutil.Process(self.pid).children(recursive=True),
                ]
            except psutil.NoSuchProcess:
                break
            gpu = self._gpu_now()
            for p in procs:
                try:
                    cmd = p.cmdline()
                    rss = p.memory_info().rss / 2**20
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if "tianjax.launch.role" in cmd:
                    i = cmd.index("tianjax.launch.role")
                    role = cmd[i + 1]
                    if role == "actor":
                        role += " " + cmd[cmd.index("--actor-id") + 1]
                elif p.pid == self.pid:
                    role = "learner (and launcher)"
                else:
                    continue
                self.role[p.pid] = role
                self.rss[p.pid] = max(self.rss.get(p.pid, 0.0), rss)
                if p.pid in gpu:
                    self.gpu[p.pid] = max(self.gpu.get(p.pid, 0.0), gpu[p.pid])
            self.stop_flag.wait(0.5)


def atari(smoke: bool, steps: int) -> None:
    import json

    run_dir = tempfile.mkdtemp(prefix="gpu-check-")
    platform = "cpu" if smoke else "gpu"
    overrides = [
        "env=Breakout-v5" if not smoke else "env=Breakout-v5",
        "mode=async",
        "num_actors=2",
        f"total_env_steps={2048 if smoke else steps}",
        f"runtime.actor_devices={platform}:0",
        f"runtime.learner_devices={platform}:0",
        "eval.episodes=4",
        "eval.every_s=20",
        "loggers=[]",
        f"run_dir={run_dir}",
    ]
    if smoke:
        overrides += ["num_envs=2", "rollout_len=16", "ppo.num_minibatches=2"]
    cmd = [
        sys.executable,
        "-m",
        "tianjax.cli",
        "train",
        "ppo_breakout_async",
        *overrides,
        "--no-progress",
    ]
    print("\n== 2. async Atari, actors and learner on the GPU\n$ " + " ".join(cmd), flush=True)
    t = time.perf_counter()
    proc = subprocess.Popen(cmd)
    poll = MemoryPoll(proc.pid)
    poll.start()
    code = proc.wait()
    poll.stop_flag.set()
    poll.join()
    if code != 0:
        sys.exit(f"gpu_check: the async run failed with code {code}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    print(f"wall time {time.perf_counter() - t:.0f} s (compilation {s['compile_time_s']:.0f} s)")
    for key in (
        "env_steps",
        "updates",
        "samples_fresh_per_s",
        "samples_consumed_per_s",
        "learner_busy_fraction",
        "learner_devices",
        "evaluations",
        "eval_return",
        "eval_best_return",
        "final_return",
    ):
        v = s.get(key)
        print(f"  {key:24s} {v:,.3f}" if isinstance(v, float) else f"  {key:24s} {v}")
    print("\n== 3. peak memory of each process (MiB)")
    print(f"  {'process':26s} {'GPU':>8s} {'host RSS':>9s}")
    for pid, role in sorted(poll.role.items(), key=lambda kv: kv[1]):
        gpu = poll.gpu.get(pid)
        print(f"  {role:26s} {'-' if gpu is None else f'{gpu:,.0f}':>8s} {poll.rss[pid]:9,.0f}")
    shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--atari-steps", type=int, default=1_500_000)
    ap.add_argument("--smoke", action="store_true", help="every part tiny, on any device")
    args = ap.parse_args()
    import jax

    print(f"JAX {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()})")
    fused(args.smoke)
    atari(args.smoke, args.atari_steps)


if __name__ == "__main__":
    main()

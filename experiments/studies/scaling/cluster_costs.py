"""The measured costs behind the cluster model (cluster_model.py, beside this file), taken on
this machine through tianjax's own code paths for configs/ppo_latency_async.yaml.

    python experiments/studies/scaling/cluster_costs.py [--out FILE] [--quick]
        # FILE defaults to experiments/studies/scaling/results/costs.json
    python experiments/studies/scaling/cluster_costs.py --parts env update  # some (development)

The model simulates actors, transport and learner as events; it cannot measure anything
itself, so every service time it draws comes from here. Each figure says what it counts:
wall time (what a process waits) or CPU time (what it takes from the machine's cores,
`time.process_time` or getrusage: the process's threads together, XLA's and ZeroMQ's I/O
thread included), per vector step, per trajectory, per update or per message. With N actor
processes on C cores, the CPU figures decide when the cores, not the simulator, set the pace.

1. env (`env_*`): one actor's simulator, a `tianjax/LatencyCartPole-v1` vector env of
   `num_envs` envs built by `make_host_env` with the shipped env_options (the actor's seed
   formula), stepped with random actions. Wall per vector step (mean, median, p90, p99,
   max) against the configured mean, and how far each step's wall time exceeded the delay
   it drew (`env_overshoot_*`: the dynamics and the sleep's late wake-up; the simulator's
   draws replayed from its seed): the model draws delays from the configured distribution,
   so the overshoot is the correction it needs. `env0_*`: the same env with no delay
   (step_ms=0, sigma=0, hiccup_p=0), the dynamics' own CPU per vector step; what the
   delayed env costs beyond it is the price of sleeping and waking once per step.
2. acting (`act_*`): the actor's `HostSource` (what `Actor.source(params, version,
   acted_at)` runs: `rollout_len` vector steps of the jitted policy and the env, and the
   truncation bootstrap) on the zero-delay env, compiled beforehand, in a process set up
   as an actor's (JAX on the CPU, one XLA thread, synchronous dispatch). CPU and wall per
   trajectory and per vector step, medians over trajectories: an actor's CPU demand, which
   with the env's delay gives its duty cycle. `actor_cpu_ms_per_step`: acting plus what
   sleeping adds per step (env_cpu_ms_per_step - env0_cpu_ms_per_step), an actor's CPU per
   vector step in a run of the delayed env (its messages aside).
3. update (`update_*`): the learner's own `ShardedUpdate` (runtime/learner/sharded_update.py,
   the `self.sgd` of learner.py) built from the config with num_actors=B, so the batch is B
   trajectories [T, num_envs x B]; wall and CPU per update (compile excluded, median after
   a warm-up, block_until_ready), the fit update_ms = a + b*B the model's learner uses, and
   CPU/wall: the cores XLA:CPU keeps busy, which the actors then do not get.
4. transfer (`traj_*`): one trajectory message in the actor's layout ((batch, episodes,
   acted_at), the learner's `batch_template`) from a `TrajectorySender` in a peer process
   to a `TrajectoryReceiver` here, over tcp loopback in the run's security (MAC on
   loopback), paced like a run (one message at a time). Bytes per message; sender CPU per
   message (the peer's whole process: encode, MAC, ZeroMQ's I/O thread); receiver CPU
   per message (this process: the receive, MAC check, decode, the learner receiver
   thread's finite check and device placement, split in `traj_*_call_cpu_ms`); wall from
   the send call to the decoded, placed message (one system-wide monotonic clock).
5. publish (`publish_*`, `param_*`): the parameters ([64, 64] PPO, as a `ParamsMessage`)
   published by the learner's `ParamPublisher` to K `ParamSubscriber`s in a peer process,
   K = 1, 8, 32: param bytes, the publisher process's CPU per publish vs K and the fit
   a + b*K (what one broadcast costs the learner's cores as actors are added), and one
   subscriber's CPU to take the newest version (what each actor pays per rollout).

`machine` holds the CPU count and the load average at the start and at the end: the
figures are this machine's, under whatever else ran on it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time

import numpy as np
import zmq

CONFIG = "configs/ppo_latency_async.yaml"
ZERO_DELAY = ["env_options.step_ms=0", "env_options.sigma=0", "env_options.hiccup_p=0"]
BENCH_KEY = bytes(range(32))  # a fixed run key: a benchmark on loopback (a run draws its own)
SYNC_TIMEOUT_MS = 60_000
TIMED_VERSION = 1_000_000  # parameter versions at or above this are timed
PARTS = ("env", "act", "update", "transfer", "publish")


def _cpu() -> float:
    """CPU seconds of this process so far, every thread (XLA's, ZeroMQ's I/O thread)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _config(overrides=()):
    from tianjax.config import load_config

    return load_config(CONFIG, list(overrides))


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, float), q))


def _fit(xs, ys) -> tuple[float, float]:
    """Least squares y = a + b*x: (a, b)."""
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b)


def _actor_seed(config, actor_id: int = 0) -> int:
    return config.seed + 7919 * (
        actor_id + 1
    )  # as tianjax.runtime.actor.actor.Actor seeds its source


# ------------------------------------------------------------------------------ 1. env step
def _step_env(config, n_steps: int, seed: int):
    """(wall s, CPU s) of each of n_steps vector steps of the configured env, random actions."""
    from tianjax.envs import make_host_env

    env = make_host_env(config.env_backend, config.env, config.num_envs, seed, **config.env_options)
    try:
        env.reset(seed)
        rng = np.random.default_rng(seed)
        actions = rng.integers(0, env.action_spec.num_actions, size=(n_steps, config.num_envs))
        wall, cpu = np.empty(n_steps), np.empty(n_steps)
        for i in range(n_steps):
            t, c = time.perf_counter(), time.process_time()
            env.step(actions[i])
            wall[i], cpu[i] = time.perf_counter() - t, time.process_time() - c
        return wall, cpu
    finally:
        env.close()


def measure_env(n_steps: int, n_steps_zero: int) -> dict:
    """Wall and CPU per vector step of the latency env as configured, the overshoot over the
    delays it drew, and the CPU of the dynamics alone (no delay)."""
    from tianjax.envs import Latency, draw_delay_s

    config = _config()
    seed = _actor_seed(config)
    wall, cpu = _step_env(config, n_steps, seed)
    opts = config.env_options
    latency = Latency(
        **{
            k: (tuple(v) if k == "slow_actors" else v)
            for k, v in opts.items()
            if k in Latency.__dataclass_fields__
        }
    )
    # the simulator's own stream (LatencyVectorEnv.reset seeds it so), one draw per step
    rng = np.random.default_rng([seed % 2**63, 0x1A7E])
    drawn = np.array([draw_delay_s(rng, latency, 1.0) for _ in range(n_steps)])
    over = wall - drawn
    zwall, zcpu = _step_env(_config(ZERO_DELAY), n_steps_zero, seed)
    ms = 1e3
    return {
        "env_steps_measured": int(n_steps),
        "env_num_envs": int(config.num_envs),
        "env_config_mean_ms": latency.mean_ms(-1),
        "env_config": {
            k: opts[k] for k in ("step_ms", "sigma", "hiccup_p", "hiccup_ms") if k in opts
        },
        "env_drawn_mean_ms": float(drawn.mean() * ms),
        "env_wall_ms_mean": float(wall.mean() * ms),
        "env_wall_ms_median": float(np.median(wall) * ms),
        "env_wall_ms_p90": _pct(wall * ms, 90),
        "env_wall_ms_p99": _pct(wall * ms, 99),
        "env_wall_ms_max": float(wall.max() * ms),
        "env_hiccups": int((drawn * ms >= latency.hiccup_ms).sum()) if latency.hiccup_ms > 0 else 0,
        "env_overshoot_ms_mean": float(over.mean() * ms),
        "env_overshoot_ms_median": float(np.median(over) * ms),
        "env_overshoot_ms_p99": _pct(over * ms, 99),
        "env_cpu_ms_per_step": float(cpu.mean() * ms),
        "env0_steps_measured": int(n_steps_zero),
        "env0_wall_ms_per_step": float(zwall.mean() * ms),
        "env0_cpu_ms_per_step": float(zcpu.mean() * ms),
        "env0_cpu_ms_per_step_median": float(np.median(zcpu) * ms),
    }


# ------------------------------------------------------------------------------ 2. acting
def _acting_source(config):
    """The actor's rollout source, compiled as Actor.__init__ compiles it, and the initial
    parameters on the device (as an actor holds them after its first message)."""
    import jax

    from tianjax.runtime import make_source

    source = make_source(config, seed=_actor_seed(config))
    template = jax.eval_shape(source.algo.init, jax.random.key(0)).params
    source.compile(template)
    params = jax.device_put(
        jax.device_get(jax.jit(source.algo.init)(jax.random.key(config.seed)).params)
    )
    return source, params


def measure_acting(n_traj: int, warmup: int = 2) -> dict:
    """CPU and wall of whole trajectories of acting on the zero-delay env (run in the peer
    process, which has an actor's XLA settings)."""
    config = _config(ZERO_DELAY)
    source, params = _acting_source(config)
    try:
        wall, cpu = [], []
        for i in range(warmup + n_traj):
            t, c = time.perf_counter(), time.process_time()
            source(params, 0, i * source.steps_per_call)
            if i >= warmup:
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
    finally:
        source.close()
    T, ms = config.rollout_len, 1e3
    return {
        "act_trajectories_measured": int(n_traj),
        "act_steps_per_traj": int(T),
        "act_envs_per_step": int(config.num_envs),
        "act_cpu_ms_per_traj": statistics.median(cpu) * ms,
        "act_wall_ms_per_traj": statistics.median(wall) * ms,
        "act_cpu_ms_per_step": statistics.median(cpu) * ms / T,
        "act_wall_ms_per_step": statistics.median(wall) * ms / T,
    }


def one_trajectory():
    """A real trajectory (numpy, the actor's layout) for the update to learn from."""
    source, params = _acting_source(_config(ZERO_DELAY))
    try:
        return source(params, 0, 0).batch
    finally:
        source.close()


# ------------------------------------------------------------------------------ 3. update
def _join(trajectory, k: int):
    """k copies of one actor trajectory joined along B (as the learner joins k actors')."""
    from tianjax.runtime import concat_batches

    return concat_batches([trajectory] * k)


def measure_update(sizes, reps: int, trajectory, warmup: int = 2) -> dict:
    """Wall and CPU per learner update on B trajectories, for each B in `sizes`."""
    import jax

    from tianjax.algos import make_algorithm
    from tianjax.envs import env_spec
    from tianjax.runtime import ShardedUpdate, batch_template

    wall_ms, cpu_ms, compile_s = {}, {}, {}
    for B in sizes:
        # what Learner.__init__ and Learner.compile build, for a batch of B actors' trajectories
        config = _config([f"num_actors={B}"])
        obs_shape, obs_dtype, action_spec = env_spec(config)
        algo = make_algorithm(
            config,
            obs_shape,
            action_spec,
            correct_staleness=config.staleness.correct,
            obs_dtype=obs_dtype,
        )
        template = batch_template(config, algo, obs_shape, obs_dtype)
        sgd = ShardedUpdate(config, algo, template[0], config.batch_trajectories)
        state = sgd.init_state(config.seed)
        t = time.perf_counter()
        sgd.compile(state)
        compile_s[B] = time.perf_counter() - t
        batch = sgd.global_batch(_join(trajectory, B))
        jax.block_until_ready(batch)
        walls, cpus = [], []
        for i in range(warmup + reps):
            t, c = time.perf_counter(), time.process_time()
            state, metrics = sgd(state, batch, False)
            jax.block_until_ready((state, metrics))
            if i >= warmup:
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
        wall_ms[B], cpu_ms[B] = statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3
        del state, batch, sgd
    Bs = list(sizes)
    a, b = _fit(Bs, [wall_ms[B] for B in Bs])
    ca, cb = _fit(Bs, [cpu_ms[B] for B in Bs])
    ratio = {B: cpu_ms[B] / wall_ms[B] for B in Bs}
    return {
        "update_reps": int(reps),
        "update_samples_per_traj": int(trajectory.reward.size),
        "update_wall_ms": {str(B): wall_ms[B] for B in Bs},
        "update_cpu_ms": {str(B): cpu_ms[B] for B in Bs},
        "update_fit_a_ms": a,
        "update_fit_b_ms_per_traj": b,
        "update_cpu_fit_a_ms": ca,
        "update_cpu_fit_b_ms_per_traj": cb,
        "update_cpu_over_wall": {str(B): ratio[B] for B in Bs},
        "update_cpu_over_wall_median": statistics.median(ratio.values()),
        "update_compile_s": {str(B): compile_s[B] for B in Bs},
    }


# ------------------------------------------------------------------------------ the peer process
def _actor_side(config):
    """(algorithm, message template) as an actor process builds them."""
    from tianjax.algos import make_algorithm
    from tianjax.envs import env_spec
    from tianjax.runtime import batch_template

    obs_shape, obs_dtype, action_spec = env_spec(config)
    algo = make_algorithm(config, obs_shape, action_spec, obs_dtype=obs_dtype)
    return algo, batch_template(config, algo, obs_shape, obs_dtype)


def _recv_json(sock: zmq.Socket) -> dict:
    if not sock.poll(SYNC_TIMEOUT_MS):
        raise TimeoutError("benchmark peer went silent")
    return sock.recv_json()


def _peer(sync_endpoint: str) -> None:
    """The actor's side, in its own process: acting, and the other end of the transfer
    and publish parts. Its JAX runs as an actor's does (one XLA thread on the CPU, set by
    tianjax.launch.supervisor, and synchronous dispatch, by tianjax.launch.role), set
    before JAX starts its backend."""
    from tianjax.launch import ACTOR_XLA_FLAGS, actor_jax

    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + ACTOR_XLA_FLAGS).strip()
    actor_jax()
    import jax

    from tianjax.core import ParamsMessage
    from tianjax.transport import secure_context

    config = _config()
    algo, template = _actor_side(config)
    message = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), template)  # the actor's layout
    params_template = ParamsMessage(
        jax.eval_shape(algo.init, jax.random.key(0)).params, np.zeros((), np.int64)
    )
    net = secure_context(BENCH_KEY, config.runtime, server=False)
    ctx = zmq.Context()
    sync = ctx.socket(zmq.PAIR)
    sync.linger = 0
    sync.connect(sync_endpoint)
    sync.send_json({"ready": True})
    try:
        while (cmd := _recv_json(sync))["op"] != "quit":
            if cmd["op"] == "act":
                sync.send_json(measure_acting(cmd["n"], cmd["warmup"]))
            elif cmd["op"] == "traj":
                sync.send_json(_peer_send(config, net, sync, cmd, message))
            else:
                sync.send_json(_peer_subscribe(config, net, sync, cmd, params_template))
    finally:
        sync.close()
        ctx.destroy(linger=0)
        net.close()


def _peer_send(config, net, sync, cmd, message) -> dict:
    """Sends `warmup + n` trajectory messages, one every gap_s; the timed ones' CPU (this
    process, every thread) and the send calls' start times."""
    from tianjax.transport import TrajectorySender

    sender = TrajectorySender(
        BENCH_KEY,
        cmd["endpoint"],
        sender="actor-0",
        to=cmd["to"],
        hwm=config.runtime.send_hwm,
        ctx=net.ctx,
        handshake=net.handshake,
    )
    try:
        gap, warm, n = cmd["gap_s"], cmd["warmup"], cmd["n"]
        for i in range(warm):
            assert sender.send(message, 0, timeout_ms=SYNC_TIMEOUT_MS)
            time.sleep(gap)
        time.sleep(0.05)
        starts, calls = [], []
        cpu = _cpu()
        for i in range(n):
            starts.append(time.perf_counter())
            c = time.thread_time()
            assert sender.send(message, 0, timeout_ms=SYNC_TIMEOUT_MS)
            calls.append(time.thread_time() - c)
            time.sleep(gap)
        _recv_json(sync)  # the receiver has them all (our I/O thread is done)
        cpu = _cpu() - cpu
        return {"cpu": cpu, "starts": starts, "call_cpu": calls}
    finally:
        sender.close()


def _peer_subscribe(config, net, sync, cmd, params_template) -> dict:
    """K subscribers: each first holds a version, then (told the last timed one) takes the
    newest once; the CPU of that take (drain, MAC check, decode) per subscriber."""
    from tianjax.transport import ParamSubscriber

    subs = [
        ParamSubscriber(
            BENCH_KEY,
            cmd["endpoint"],
            params_template,
            max_bytes=int(config.runtime.max_message_mb * 2**20),
            ctx=net.ctx,
            handshake=net.handshake,
        )
        for _ in range(cmd["k"])
    ]
    try:
        deadline = time.monotonic() + SYNC_TIMEOUT_MS / 1e3
        while any(s.version < 0 for s in subs):
            if time.monotonic() > deadline:
                held = sum(s.version >= 0 for s in subs)
                raise TimeoutError(
                    f"parameters reached {held} of {len(subs)} subscribers "
                    f"(rejected: {[dict(s.rejected) for s in subs][:3]})"
                )
            for s in subs:
                if s.version < 0:
                    s.latest(0)
            time.sleep(0.005)
        sync.send_json({"ready": True})
        last = _recv_json(sync)["last"]
        takes, got = [], 0
        for s in subs:
            c = time.thread_time()
            out = s.latest(5000)
            takes.append(time.thread_time() - c)
            got += out is not None and out[0] == last
        return {"got_last": got, "take_cpu": takes}
    finally:
        for s in subs:
            s.close()


class Peer:
    """A spawned peer process and the PAIR socket that drives it."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sync = self.ctx.socket(zmq.PAIR)
        self.sync.linger = 0
        port = self.sync.bind_to_random_port("tcp://127.0.0.1")
        self.proc = mp.get_context("spawn").Process(
            target=_peer, args=(f"tcp://127.0.0.1:{port}",), daemon=True
        )
        self.proc.start()
        _recv_json(self.sync)  # it has built its templates

    def close(self) -> None:
        try:
            self.sync.send_json({"op": "quit"})
        finally:
            self.proc.join(timeout=10)
            if self.proc.is_alive():
                self.proc.terminate()
            self.sync.close()
            self.ctx.destroy(linger=0)


# ------------------------------------------------------------------------------ 4. transfer
def measure_transfer(peer: Peer, n: int, gap_s: float = 0.002, warmup: int = 5) -> dict:
    """One trajectory message at a time, peer -> here, as an actor sends to the learner."""
    import jax

    from tianjax.runtime import ShardedUpdate, check_finite
    from tianjax.transport import TrajectoryReceiver, as_authenticator, encode, secure_context

    config = _config()
    algo, template = _actor_side(config)
    place = ShardedUpdate(config, algo, template[0], config.batch_trajectories).placer()
    rt = config.runtime
    net = secure_context(
        BENCH_KEY, rt, server=True, max_connections_per_host=config.max_connections_per_host
    )
    rx = TrajectoryReceiver(
        BENCH_KEY,
        template,
        host=rt.bind_host,
        transport="tcp",
        hwm=rt.recv_hwm,
        max_bytes=int(rt.max_message_mb * 2**20),
        ctx=net.ctx,
        handshake=net.handshake,
        limit=net.limit,
    )
    try:
        zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), template)
        frames = encode(
            zeros,
            auth=as_authenticator(BENCH_KEY),
            kind="traj",
            version=0,
            sender="actor-0",
            seq=0,
            inc="0" * 16,
            to=rx.address,
        )
        wire = sum(memoryview(f).nbytes for f in frames)
        peer.sync.send_json(
            {
                "op": "traj",
                "endpoint": rx.endpoint,
                "to": rx.address,
                "n": n,
                "warmup": warmup,
                "gap_s": gap_s,
            }
        )
        for _ in range(warmup):
            if rx.recv(SYNC_TIMEOUT_MS) is None:
                raise TimeoutError("no trajectory from the peer")
        done, calls, payload = [], [], 0
        cpu = _cpu()
        for _ in range(n):
            if not rx.socket.poll(SYNC_TIMEOUT_MS):
                raise TimeoutError("the peer stopped sending")
            c = time.thread_time()
            msg = rx.recv(0)
            c1 = time.thread_time()
            # the learner's receiver thread: the finite check and the copy to the device
            if msg is None or not check_finite(msg.tree):
                raise RuntimeError(f"a trajectory was rejected: {dict(rx.rejected)}")
            c2 = time.thread_time()
            if place is not None:
                jax.block_until_ready(place(msg.tree))
            calls.append((c1 - c, c2 - c1, time.thread_time() - c2))
            done.append(time.perf_counter())
            payload = msg.nbytes
        cpu = _cpu() - cpu
        peer.sync.send_json({"op": "done"})
        sent = _recv_json(peer.sync)
    finally:
        rx.close()
        net.close()
    lat = (np.array(done) - np.array(sent["starts"])) * 1e3
    return {
        "traj_messages_measured": int(n),
        "traj_gap_ms": gap_s * 1e3,
        "traj_bytes": int(payload),
        "traj_wire_bytes": int(wire),
        "traj_send_cpu_ms": sent["cpu"] / n * 1e3,
        "traj_send_call_cpu_ms": statistics.median(sent["call_cpu"]) * 1e3,
        "traj_recv_cpu_ms": cpu / n * 1e3,
        "traj_recv_call_cpu_ms": statistics.median(sum(x) for x in calls) * 1e3,
        "traj_decode_call_cpu_ms": statistics.median(x[0] for x in calls) * 1e3,
        "traj_check_call_cpu_ms": statistics.median(x[1] for x in calls) * 1e3,
        "traj_place_call_cpu_ms": statistics.median(x[2] for x in calls) * 1e3,
        "traj_wall_ms_median": float(np.median(lat)),
        "traj_wall_ms_p90": _pct(lat, 90),
        "traj_wall_ms_p99": _pct(lat, 99),
    }


# ------------------------------------------------------------------------------ 5. publish
def measure_publish(peer: Peer, ks, n: int, gap_s: float = 0.003) -> dict:
    """The learner's ParamPublisher to K subscribers: its CPU per publish vs K."""
    import jax

    from tianjax.core import ParamsMessage
    from tianjax.transport import (
        BROADCAST,
        ParamPublisher,
        as_authenticator,
        encode,
        envelope,
        secure_context,
    )

    # a learner of max(ks) actors (its connection limit leaves room for each of them)
    config = _config([f"num_actors={max(ks)}"])
    algo, _ = _actor_side(config)
    params = jax.device_get(jax.jit(algo.init)(jax.random.key(config.seed)).params)
    tree = ParamsMessage(params, np.asarray(0, np.int64))
    rt = config.runtime
    frames = encode(
        tree,
        auth=as_authenticator(BENCH_KEY),
        kind="params",
        version=0,
        sender="learner-0",
        seq=0,
        inc="0" * 16,
        to=BROADCAST,
    )
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    wire = len(envelope.pack(frames))
    cpu_ms, call_ms, take_ms = {}, {}, []
    for k in ks:
        net = secure_context(
            BENCH_KEY, rt, server=True, max_connections_per_host=config.max_connections_per_host
        )
        pub = ParamPublisher(
            BENCH_KEY,
            host=rt.bind_host,
            transport="tcp",
            sender="learner-0",
            ctx=net.ctx,
            handshake=net.handshake,
            limit=net.limit,
        )
        try:
            peer.sync.send_json({"op": "params", "endpoint": pub.endpoint, "k": k})
            v = 0
            while not peer.sync.poll(10):  # until every subscriber holds a version
                if v > 3000:  # 30 s
                    raise TimeoutError(
                        f"K={k}: the subscribers never all held a version "
                        f"({pub.subscriptions} subscribed)"
                    )
                v += 1
                pub.publish(v, tree)
            assert peer.sync.recv_json()["ready"]
            time.sleep(0.05)
            calls = []
            cpu = _cpu()
            for i in range(n):
                c = time.thread_time()
                pub.publish(TIMED_VERSION + i, tree)
                calls.append(time.thread_time() - c)
                time.sleep(gap_s)
            time.sleep(0.05)  # the I/O thread's last writes
            cpu = _cpu() - cpu
            peer.sync.send_json({"last": TIMED_VERSION + n - 1})
            out = _recv_json(peer.sync)
            if out["got_last"] != k:
                print(
                    f"warning: {k - out['got_last']} of {k} subscribers missed the last version",
                    file=sys.stderr,
                )
        finally:
            pub.close()
            net.close()
        cpu_ms[k], call_ms[k] = cpu / n * 1e3, statistics.median(calls) * 1e3
        take_ms += out["take_cpu"]
    a, b = _fit(list(ks), [cpu_ms[k] for k in ks])
    return {
        "publish_messages_measured": int(n),
        "publish_gap_ms": gap_s * 1e3,
        "param_bytes": int(param_bytes),
        "param_wire_bytes": int(wire),
        "publish_cpu_ms": {str(k): cpu_ms[k] for k in ks},
        "publish_call_cpu_ms": {str(k): call_ms[k] for k in ks},
        "publish_fit_a_ms": a,
        "publish_fit_b_ms_per_sub": b,
        "param_take_cpu_ms": statistics.median(take_ms) * 1e3,
    }


# ------------------------------------------------------------------------------ the report
def _table(r: dict) -> str:
    def get(key, fmt="{:.3f}"):
        return fmt.format(r[key]) if key in r else "-"

    def row(what, value):
        return f"  {what:<62} {value}"

    out = []
    if "env_wall_ms_mean" in r:
        out += [
            f"env: {r['env_steps_measured']} vector steps of {r['env_num_envs']} envs, "
            f"configured {r['env_config']}",
            row("configured mean delay, ms per vector step", get("env_config_mean_ms")),
            row("drawn mean delay (these steps), ms per vector step", get("env_drawn_mean_ms")),
            row(
                "wall ms per vector step: mean / median / p90 / p99 / max",
                " / ".join(
                    get(k, "{:.2f}")
                    for k in (
                        "env_wall_ms_mean",
                        "env_wall_ms_median",
                        "env_wall_ms_p90",
                        "env_wall_ms_p99",
                        "env_wall_ms_max",
                    )
                ),
            ),
            row(
                "wall minus the drawn delay, ms: mean / median / p99",
                " / ".join(
                    get(k)
                    for k in (
                        "env_overshoot_ms_mean",
                        "env_overshoot_ms_median",
                        "env_overshoot_ms_p99",
                    )
                ),
            ),
            row("CPU ms per vector step (with delay)", get("env_cpu_ms_per_step")),
            row(
                f"CPU ms per vector step, no delay ({r['env0_steps_measured']} steps; median)",
                f"{get('env0_cpu_ms_per_step')} ({get('env0_cpu_ms_per_step_median')})",
            ),
        ]
    if "act_cpu_ms_per_traj" in r:
        out += [
            f"acting: {r['act_trajectories_measured']} trajectories of {r['act_steps_per_traj']} vector steps,"
            " zero-delay env, medians",
            row(
                "CPU ms per trajectory / per vector step",
                f"{get('act_cpu_ms_per_traj')} / {get('act_cpu_ms_per_step')}",
            ),
            row(
                "wall ms per trajectory / per vector step",
                f"{get('act_wall_ms_per_traj')} / {get('act_wall_ms_per_step')}",
            ),
            row(
                "actor CPU ms per vector step, delayed env (+ sleeping's cost)",
                get("actor_cpu_ms_per_step"),
            ),
        ]
    if "update_wall_ms" in r:
        out.append(
            f"update: batch of B trajectories x {r['update_samples_per_traj']} samples, "
            f"median of {r['update_reps']}"
        )
        out.append(row("B: wall ms per update / CPU ms per update / CPU/wall", ""))
        for B, w in r["update_wall_ms"].items():
            out.append(
                row(
                    f"  B={B}",
                    f"{w:.2f} / {r['update_cpu_ms'][B]:.2f} / {r['update_cpu_over_wall'][B]:.2f}",
                )
            )
        out += [
            row(
                "fit wall: a ms + b ms per trajectory",
                f"{r['update_fit_a_ms']:.2f} + {r['update_fit_b_ms_per_traj']:.3f} B",
            ),
            row(
                "fit CPU: a ms + b ms per trajectory",
                f"{r['update_cpu_fit_a_ms']:.2f} + {r['update_cpu_fit_b_ms_per_traj']:.3f} B",
            ),
        ]
    if "traj_bytes" in r:
        out += [
            f"transfer: {r['traj_messages_measured']} trajectory messages, one every {r['traj_gap_ms']:g} ms,"
            " tcp loopback",
            row(
                "bytes per trajectory: payload / on the wire",
                f"{r['traj_bytes']} / {r['traj_wire_bytes']}",
            ),
            row(
                "sender CPU ms per message: process / send call",
                f"{get('traj_send_cpu_ms')} / {get('traj_send_call_cpu_ms')}",
            ),
            row(
                "receiver CPU ms per message: process / recv+check+place",
                f"{get('traj_recv_cpu_ms')} / {get('traj_recv_call_cpu_ms')}",
            ),
            row(
                "  of which recv+MAC+decode / finite check / device placement",
                " / ".join(get(f"traj_{k}_call_cpu_ms") for k in ("decode", "check", "place")),
            ),
            row(
                "wall ms send call -> decoded and placed: median / p90 / p99",
                " / ".join(
                    get(k) for k in ("traj_wall_ms_median", "traj_wall_ms_p90", "traj_wall_ms_p99")
                ),
            ),
        ]
    if "param_bytes" in r:
        out += [
            f"publish: {r['publish_messages_measured']} publishes per K, one every {r['publish_gap_ms']:g} ms",
            row(
                "param bytes: payload / on the wire",
                f"{r['param_bytes']} / {r['param_wire_bytes']}",
            ),
        ]
        for k, c in r["publish_cpu_ms"].items():
            out.append(
                row(
                    f"  K={k}: publisher CPU ms per publish: process / publish call",
                    f"{c:.3f} / {r['publish_call_cpu_ms'][k]:.3f}",
                )
            )
        out += [
            row(
                "fit: a ms + b ms per subscriber",
                f"{r['publish_fit_a_ms']:.3f} + {r['publish_fit_b_ms_per_sub']:.4f} K",
            ),
            row("subscriber CPU ms to take the newest version (median)", get("param_take_cpu_ms")),
        ]
    m = r["machine"]
    out.append(
        f"machine: {m['cpu_count']} CPUs, load average {m['loadavg_start']} at the start, "
        f"{m.get('loadavg_end')} at the end, {r.get('elapsed_s', 0):.0f} s"
    )
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    ap.add_argument("--out", default=os.path.join(results, "costs.json"))
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (under 30 s)")
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    args = ap.parse_args(argv)
    q = args.quick
    t0 = time.perf_counter()
    r: dict = {
        "config": CONFIG,
        "quick": q,
        "machine": {
            "cpu_count": os.cpu_count(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    import jax

    r["machine"]["jax"] = jax.__version__
    r["machine"]["devices"] = [str(d) for d in jax.devices()]
    parts = set(args.parts)
    if "env" in parts:
        r.update(measure_env(100 if q else 250, 300 if q else 1000))
    if "update" in parts:
        r.update(
            measure_update(
                (1, 16) if q else (1, 2, 4, 8, 16, 32),
                3 if q else 5,
                one_trajectory(),
                warmup=1 if q else 2,
            )
        )
    if parts & {"act", "transfer", "publish"}:
        peer = Peer()
        try:
            if "act" in parts:
                peer.sync.send_json({"op": "act", "n": 6 if q else 20, "warmup": 1 if q else 2})
                r.update(_recv_json(peer.sync))
            if "transfer" in parts:
                r.update(measure_transfer(peer, 150 if q else 500))
            if "publish" in parts:
                r.update(measure_publish(peer, (1, 8, 32), 40 if q else 150))
        finally:
            peer.close()
    if "act_cpu_ms_per_step" in r and "env_cpu_ms_per_step" in r:
        r["actor_cpu_ms_per_step"] = (
            r["act_cpu_ms_per_step"] + r["env_cpu_ms_per_step"] - r["env0_cpu_ms_per_step"]
        )
    r["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    r["elapsed_s"] = time.perf_counter() - t0
    print(_table(r))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""`srun tianjax launch CONFIG [key=value ...]`: each task of a SLURM job step finds its own
role in the job's environment, so one command starts a whole multi-host run.

With N tasks and `--learners L` (default 1):

- tasks 0 .. L-1 are the learner processes (learner i is task i), joined by
  jax.distributed with task 0's host as the coordinator; learner i binds its three ports
  (`base_port + 3 i` ..) on its own host's address;
- tasks L .. N-1 are the actors: task L + k is actor k, and trains for learner k mod L,
  on that learner's host (from the node list and the tasks per node);
- `num_actors` becomes (N - L) / L per learner (it must divide), and `total_env_steps`
  is the whole run's budget, split evenly over the learners;
- with `--groups G` (learner groups, no jax.distributed): tasks 0 .. G-1 are the groups'
  learners, task G the averager, tasks G+1 .. the actors, actor k for group k mod G;
  num_actors is the actor task count and total_env_steps the run's, split over the groups;
- the run key is a file on the shared filesystem that task 0 writes (mode 0600, written
  whole then renamed into place) and every other task waits for; by default
  RUN_DIR/run-<job id>.<step id>.key, so a later step never reads an old key.

Where each task runs comes from SLURM_JOB_NODELIST (SLURM_STEP_NODELIST where set, e.g.
`node[01-03,07],gpu-a1`) and SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE (`2(x3),1`),
with SLURM's default block distribution (tasks fill a node before the next);
SLURM_PROCID is the task's rank, SLURM_NTASKS the count. The functions here are pure:
they read a mapping, so the same code serves a test that sets the variables by hand.
"""

from __future__ import annotations

import os
import re
import time
from typing import Mapping, NamedTuple

from tianjax.config import ConfigError


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list to hosts: "n[01-03,07],gpu1" -> n01 n02 n03 n07 gpu1."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", text.strip()):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if not prefix and not ranges:
            continue
        if ranges is None:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ConfigError(f"launch: cannot read the SLURM node list {text!r} (at {part!r})")
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{len(lo)}d}{suffix}")
    if not hosts:
        raise ConfigError(f"launch: the SLURM node list {text!r} names no host")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """ "2(x3),1" -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ConfigError(f"launch: cannot read SLURM's tasks per node {text!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


class SlurmTask(NamedTuple):
    rank: int  # SLURM_PROCID
    ntasks: int  # SLURM_NTASKS
    hosts: tuple[str, ...]  # the host of every task, by rank
    job: str  # "<job id>.<step id>", naming the key file

    @property
    def host(self) -> str:
        return self.hosts[self.rank]


def _need(env: Mapping[str, str], *names: str) -> str:
    for n in names:
        if env.get(n):
            return env[n]
    raise ConfigError(
        f"launch: without --role, run it as a task of a SLURM job step (srun tianjax launch ...): "
        f"{' / '.join(names)} is not set"
    )


def slurm_task(env: Mapping[str, str]) -> SlurmTask:
    """This task's rank and every task's host, from the SLURM variables in `env`."""
    rank = int(_need(env, "SLURM_PROCID"))
    ntasks = int(_need(env, "SLURM_NTASKS", "SLURM_NPROCS"))
    nodes = expand_nodelist(
        _need(env, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    )
    per_node_text = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node_text:
        per_node = expand_tasks_per_node(per_node_text)
    else:  # spread as evenly as SLURM's block distribution would
        base, extra = divmod(ntasks, len(nodes))
        per_node = [base + (i < extra) for i in range(len(nodes))]
    if len(per_node) != len(nodes) or sum(per_node) != ntasks:
        raise ConfigError(
            f"launch: SLURM's tasks per node ({per_node_text}) do not add up to {ntasks} tasks "
            f"on {len(nodes)} nodes"
        )
    hosts = tuple(h for h, n in zip(nodes, per_node) for _ in range(n))
    if not 0 <= rank < ntasks:
        raise ConfigError(f"launch: SLURM_PROCID {rank} is outside 0-{ntasks - 1}")
    own = env.get("SLURMD_NODENAME")
    if own and own != hosts[rank] and own.split(".")[0] != hosts[rank].split(".")[0]:
        raise ConfigError(
            f"launch: task {rank} runs on {own}, but the block distribution of the node list puts "
            f"it on {hosts[rank]}: start the step with the default distribution (srun "
            "--distribution=block)"
        )
    job = f"{env.get('SLURM_JOB_ID', 'job')}.{env.get('SLURM_STEP_ID', '0')}"
    return SlurmTask(rank, ntasks, hosts, job)


class Role(NamedTuple):
    role: str  # "learner" or "actor"
    index: int  # learner index, or actor id
    num_learners: int
    actors_per_learner: int
    learner_host: str  # a learner's own host; an actor's learner's host
    coordinator_host: str  # task 0's host


def role_of(task: SlurmTask, learners: int) -> Role:
    if learners < 1:
        raise ConfigError(f"launch: --learners must be >= 1, got {learners}")
    actors = task.ntasks - learners
    if actors < learners or actors % learners:
        raise ConfigError(
            f"launch: {task.ntasks} SLURM tasks with --learners {learners} leave {actors} actor "
            f"tasks; every learner needs the same number of actors (at least one), so the task "
            f"count must be {learners} + a multiple of {learners}"
        )
    if task.rank < learners:
        return Role("learner", task.rank, learners, actors // learners, task.host, task.hosts[0])
    k = task.rank - learners
    return Role("actor", k, learners, actors // learners, task.hosts[k % learners], task.hosts[0])


class GroupsRole(NamedTuple):
    role: str  # "learner", "averager" or "actor"
    index: int  # the group a learner is, or the actor id
    num_actors: int  # the run's actor tasks
    learner_host: str  # a learner's own host; an actor's group's learner's host
    averager_host: str


def role_of_groups(task: SlurmTask, groups: int) -> GroupsRole:
    """Learner groups (`--groups G`): tasks 0..G-1 are the groups' learners, task G the
    averager, tasks G+1.. the actors (actor k trains for group k mod G, on its learner's
    host); num_actors is the run's actor task count, which must split evenly."""
    actors = task.ntasks - groups - 1
    if groups < 2 or actors < groups or actors % groups:
        raise ConfigError(
            f"launch: {task.ntasks} SLURM tasks with --groups {groups} leave {actors} actor tasks "
            f"after the {groups} learners and the averager; every group needs the same number "
            f"of actors (at least one), so the task count must be {groups + 1} + a multiple of "
            f"{groups} (and --groups at least 2)"
        )
    averager = task.hosts[groups]
    if task.rank < groups:
        return GroupsRole("learner", task.rank, actors, task.host, averager)
    if task.rank == groups:
        return GroupsRole("averager", 0, actors, task.host, averager)
    k = task.rank - groups - 1
    return GroupsRole("actor", k, actors, task.hosts[k % groups], averager)


# ----------------------------------------------------------------------------- the run key
def write_key_file(path: str) -> None:
    """A fresh run key (hex) at `path`, mode 0600, complete before it appears."""
    from tianjax.transport.auth import new_run_key

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, new_run_key().hex().encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def wait_for_key_file(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"launch: no run key at {path} after {timeout_s:.0f} s (task 0 writes it; is the "
                "directory on a filesystem every node shares?)"
            )
        time.sleep(0.2)


__all__ = [
    "Role",
    "SlurmTask",
    "expand_nodelist",
    "expand_tasks_per_node",
    "role_of",
    "slurm_task",
    "wait_for_key_file",
    "write_key_file",
]

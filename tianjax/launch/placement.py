"""Where the processes of a run on one host go, and what each is told
(`runtime.actor_devices`, `runtime.learner_devices`): the Podracer "Sebulba" split that
Cleanba's --actor-device-ids / --learner-device-ids and Stoix's sebulba arch give, e.g.
actors on GPU 0 and the learner on GPUs 1 to 7.

Acting processes, the actors and then the evaluator (slots 0 .. num_actors - 1, then
num_actors), are spread over the actor devices in the order listed: slot i on
ids[i % len(ids)]. Each process sees only its own device: on GPUs through
CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES on ROCm; a launcher that was itself given
CUDA_VISIBLE_DEVICES numbers its devices within that list), on XLA:CPU as one CPU device
(JAX_NUM_CPU_DEVICES=1). A platform alone ("gpu") means every GPU of the host (counted
without starting JAX: CUDA_VISIBLE_DEVICES, the driver's /proc/driver/nvidia/gpus, or
`nvidia-smi -L`); where they cannot be counted, each process sees every GPU, as JAX's
default has it, but allocates as it goes (below).

The learner's update spans the learner devices (tianjax.runtime.learner.sharded_update's
mesh). Its process sees only those where it can still be told: before JAX has started in
it (`tianjax train`, a launched learner process), through JAX's jax_cuda_visible_devices;
where JAX had already started (a notebook that ran JAX first), the mesh still spans only
the listed devices, and one line says the process may hold memory on the others.

Memory, the rule: a GPU's memory (MEMORY_SHARE of it) is split evenly among the processes
of the run placed on it, the learner counted once where its devices include that GPU.
Acting processes allocate as they go (XLA_PYTHON_CLIENT_PREALLOCATE=false), capped at their
share (XLA_CLIENT_MEM_FRACTION, the variable jaxlib reads; its deprecated
XLA_PYTHON_CLIENT_MEM_FRACTION is removed, since jaxlib refuses both at once); the learner
preallocates its share (JAX's default preallocation) where it shares a GPU, and keeps JAX's
default fraction where it has its GPUs to itself. No process preallocates on a device it
does not use, since it sees none.

A device list naming a device the host does not have is refused at start with one line
(`check_devices`: a ConfigError naming the key).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tianjax.config import Config, ConfigError
from tianjax.config.device_lists import DeviceList

MEMORY_SHARE = 0.9  # of a GPU's memory, split among the run's processes on it
VISIBLE_ENV = {
    "gpu": "CUDA_VISIBLE_DEVICES",
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "HIP_VISIBLE_DEVICES",
}
JAX_PLATFORM = {"gpu": "cuda", "cuda": "cuda", "rocm": "rocm", "cpu": "cpu", "tpu": "tpu"}
DEVICE_ENV = "TIANJAX_DEVICE"  # what a placed acting process was given, as "platform:id"
LEARNER_ENV = "TIANJAX_LEARNER_DEVICES"  # a learner process started placed: its device list
_placed_here: list[DeviceList] = []  # the learner placement applied to this process, if any


def acting_slots(config: Config) -> int:
    """Acting processes of a run: its actors, and its evaluator (eval.every_*)."""
    return config.num_actors + (1 if config.eval.periodic else 0)


def host_devices(platform: str, environ=None) -> int | None:
    """How many devices of `platform` this host has, without starting JAX on a GPU (None:
    cannot tell). CPU: this process's XLA CPU devices (jax_num_cpu_devices or
    --xla_force_host_platform_device_count)."""
    environ = os.environ if environ is None else environ
    if platform == "cpu":
        import jax

        return len(jax.devices("cpu"))
    if platform not in VISIBLE_ENV:
        return None
    visible = environ.get(VISIBLE_ENV[platform])
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    if platform in ("gpu", "cuda"):
        gpus = "/proc/driver/nvidia/gpus"
        if os.path.isdir(gpus):
            return len(os.listdir(gpus))
        if shutil.which("nvidia-smi"):
            try:
                out = subprocess.run(
                    ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False
                ).stdout
                return sum(1 for line in out.splitlines() if line.startswith("GPU "))
            except (OSError, subprocess.SubprocessError):
                return None
    return None


def actor_device_ids(config: Config, environ=None) -> tuple[int, ...] | None:
    """The actor devices' ids: as listed, or for a GPU platform alone every GPU of the host
    (None: a platform whose devices are not split, or GPUs that cannot be counted)."""
    listed = config.runtime.actor_device_list
    if listed.ids is not None:
        return listed.ids
    if listed.platform in VISIBLE_ENV:
        n = host_devices(listed.platform, environ)
        return tuple(range(n)) if n else None
    return None


def actor_device(config: Config, slot: int, environ=None) -> int | None:
    """The device id of acting slot `slot` (None: not placed on one)."""
    ids = actor_device_ids(config, environ)
    return None if not ids else ids[slot % len(ids)]


def processes_on(config: Config, device: int, environ=None) -> int:
    """Processes of the run on GPU `device` of the actors' platform: the acting slots placed
    there, and the learner where its devices include it."""
    ids = actor_device_ids(config, environ) or ()
    n = sum(1 for slot in range(acting_slots(config)) if ids and ids[slot % len(ids)] == device)
    learner = config.runtime.learner_device_list
    same = (
        learner is not None
        and JAX_PLATFORM[learner.platform]
        == JAX_PLATFORM[config.runtime.actor_device_list.platform]
    )
    return n + (1 if same and device in learner.ids else 0)


def _visible(platform: str, ids, environ) -> str:
    """`ids` as the visible-devices variable names them, within a list the launcher was
    itself given."""
    given = environ.get(VISIBLE_ENV[platform])
    if given is None:
        return ",".join(map(str, ids))
    mine = [v.strip() for v in given.split(",") if v.strip()]
    return ",".join(mine[i] for i in ids)


def _memory(env: dict, share: float | None, preallocate: bool) -> None:
    env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)  # jaxlib refuses it beside the new one
    if share is not None:
        env["XLA_CLIENT_MEM_FRACTION"] = f"{share:.3f}"
    if not preallocate:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"


def actor_environment(config: Config, slot: int, environ=None) -> dict:
    """The environment variables acting slot `slot` is started with (to update a copy of
    the launcher's environment with; a value None removes the variable)."""
    environ = os.environ if environ is None else environ
    listed = config.runtime.actor_device_list
    env: dict = {"JAX_PLATFORMS": JAX_PLATFORM[listed.platform]}
    if listed.platform == "cpu":
        if listed.ids is not None:  # one XLA CPU device of its own
            env["JAX_NUM_CPU_DEVICES"] = "1"
            env[DEVICE_ENV] = f"cpu:{listed.ids[slot % len(listed.ids)]}"
        return env
    if listed.platform not in VISIBLE_ENV:
        return env
    device = actor_device(config, slot, environ)
    mem: dict = {}
    if device is None:  # every GPU seen, none preallocated
        _memory(mem, None, preallocate=False)
    else:
        env[VISIBLE_ENV[listed.platform]] = _visible(listed.platform, [device], environ)
        env[DEVICE_ENV] = f"{listed.platform}:{device}"
        _memory(mem, MEMORY_SHARE / processes_on(config, device, environ), preallocate=False)
    env.update(mem)
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    return env


def apply(env: dict, changes: dict) -> dict:
    """`env` with `changes` made (None removes a variable)."""
    out = dict(env)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def learner_share(config: Config, environ=None) -> float | None:
    """The memory fraction of a learner on listed GPUs that actors share (None: its own)."""
    listed = config.runtime.learner_device_list
    if listed is None or listed.platform not in VISIBLE_ENV:
        return None
    actors = config.runtime.actor_device_list
    if JAX_PLATFORM[actors.platform] != JAX_PLATFORM[listed.platform]:
        return None
    most = max(processes_on(config, d, environ) for d in listed.ids)
    return MEMORY_SHARE / most if most > 1 else None


def learner_environment(config: Config, environ=None) -> dict:
    """The environment variables a learner process (a child of the launcher) is started with."""
    environ = os.environ if environ is None else environ
    listed = config.runtime.learner_device_list
    if listed is None or listed.platform not in VISIBLE_ENV:
        return {}
    env = {
        VISIBLE_ENV[listed.platform]: _visible(listed.platform, listed.ids, environ),
        LEARNER_ENV: str(listed),
    }
    share = learner_share(config, environ)
    if share is not None:
        _memory(env, share, preallocate=True)
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
    return env


def place_learner(config: Config) -> None:
    """Makes this process the learner's placement, before JAX starts in it: its GPUs are
    the listed ones and its memory share the rule's. Where JAX has already started, says in
    one line that it may hold memory on other devices (the mesh still spans only the listed)."""
    listed = config.runtime.learner_device_list
    if listed is None or listed.platform not in VISIBLE_ENV:
        return
    import jax

    if _backends_started():
        if not _placed_here or _placed_here[-1] != listed:
            print(
                f"tianjax: warning: runtime.learner_devices {listed}: JAX had already started "
                "in this process, which may hold memory on every device; the update's mesh "
                "spans only those listed",
                file=sys.stderr,
                flush=True,
            )
        return
    ids = _visible(listed.platform, listed.ids, os.environ)
    option = "jax_rocm_visible_devices" if listed.platform == "rocm" else "jax_cuda_visible_devices"
    jax.config.update(option, ids)
    share = learner_share(config)
    if share is not None:
        os.environ.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
        os.environ["XLA_CLIENT_MEM_FRACTION"] = f"{share:.3f}"
    _placed_here.append(listed)


def placed_here() -> DeviceList | None:
    """The learner placement applied to this process, or given to it at its start by its
    launcher (None: none)."""
    if _placed_here:
        return _placed_here[-1]
    given = os.environ.get(LEARNER_ENV)
    if given:
        from tianjax.config.device_lists import parse_devices

        return parse_devices(given, LEARNER_ENV)
    return None


def learner_devices(config: Config) -> list:
    """The local JAX devices the learner's update spans where runtime.learner_devices lists
    them: every device of the platform where this process sees only the listed ones, else
    those whose ids are listed, in the order listed (a ConfigError naming the key for one
    this process does not have)."""
    import jax

    listed = config.runtime.learner_device_list
    local = jax.local_devices(backend=JAX_PLATFORM[listed.platform])
    if placed_here() == listed and listed.platform in VISIBLE_ENV:
        return local
    by_id = {d.id: d for d in local}
    missing = [i for i in listed.ids if i not in by_id]
    if missing:
        raise ConfigError(
            f"config key 'runtime.learner_devices': this process has {listed.platform} devices "
            f"{sorted(by_id)}, so {listed} names one it does not have "
            f"({', '.join(map(str, missing))})"
        )
    return [by_id[i] for i in listed.ids]


def _backends_started() -> bool:
    """Whether JAX has started its backends in this process (its device options then no
    longer apply). NOTE: jax 0.10 has no public way to ask; its own option validators ask
    xla_bridge.backends_are_initialized, as does this (where it is gone: taken as started)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


def check_devices(config: Config) -> None:
    """A ConfigError naming the key (one line) where a device list names a device this host
    does not have."""
    rt = config.runtime
    for key, listed in (
        ("runtime.actor_devices", rt.actor_device_list),
        ("runtime.learner_devices", rt.learner_device_list),
    ):
        if listed is None or listed.ids is None:
            continue
        have = host_devices(listed.platform)
        if have is None:
            continue  # cannot tell here: JAX says so in the process that uses it
        missing = [i for i in listed.ids if i >= have]
        if missing:
            raise ConfigError(
                f"config key '{key}': this host has {have} {listed.platform} device(s) "
                f"(ids 0-{have - 1}), so {listed} names one it does not have "
                f"({', '.join(map(str, missing))})"
            )


__all__ = [
    "DEVICE_ENV",
    "JAX_PLATFORM",
    "MEMORY_SHARE",
    "VISIBLE_ENV",
    "acting_slots",
    "actor_device",
    "actor_device_ids",
    "actor_environment",
    "apply",
    "check_devices",
    "host_devices",
    "LEARNER_ENV",
    "learner_devices",
    "learner_environment",
    "learner_share",
    "place_learner",
    "placed_here",
    "processes_on",
]

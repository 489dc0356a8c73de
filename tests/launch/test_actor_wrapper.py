"""runtime.actor_wrapper (tianjax/launch/supervisor.py): the command put before each actor
process's own, "{actor}" replaced by its id. A real supervisor starts real actor processes
through a shell that says where it ran and execs the actor: the process started is the
actor itself, under its id. A wrapper with any other placeholder is refused by name."""

import time

import pytest

from tianjax.config import ConfigError, load_config
from tianjax.launch.role import STARTUP_FAILED
from tianjax.launch.supervisor import ActorSupervisor

from .test_role import REPO

# says which actor it starts and its own pid, then becomes the actor (exec keeps the pid)
WRAPPER = ["sh", "-c", 'echo "wrapped actor {actor} as pid $$" >&2; exec "$@"', "sh"]


def test_each_actor_starts_through_the_wrapper_as_the_same_process(tmp_path):
    # an env that cannot be made: each actor gets through its start-up to the env, says why,
    # and exits STARTUP_FAILED, with no learner needed
    config = load_config(
        str(REPO / "configs" / "ppo_latency_async.yaml"),
        ["num_actors=2", "env=tianjax/NoSuchEnv-v0"],
        runtime={"actor_wrapper": WRAPPER},
    )
    sup = ActorSupervisor(config, {}, b"k" * 32, log_dir=str(tmp_path))
    sup.start_all()
    pids = {i: sup.pid(i) for i in (0, 1)}
    deadline = time.monotonic() + 120
    failed: dict = {}
    while len(failed) < 2 and time.monotonic() < deadline:
        failed.update(sup.check().failed)
        time.sleep(0.1)
    sup.stop(grace_s=0)
    assert sorted(failed) == [0, 1], failed
    for i in (0, 1):
        log = (tmp_path / sup.log_name(i)).read_text()
        assert f"wrapped actor {i} as pid {pids[i]}\n" in log, log
        assert sup.exit_codes[i] == STARTUP_FAILED
        assert f"actor {i} cannot start" in log, log


@pytest.mark.parametrize("part", ["{host}", "{0}", "{actor"])
def test_a_wrapper_with_another_placeholder_is_refused_by_name(part):
    with pytest.raises(ConfigError, match=r"runtime\.actor_wrapper\[1\]"):
        load_config(None, runtime={"actor_wrapper": ["nice", part]})

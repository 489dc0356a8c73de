"""Actor and learner devices on one host (tianjax.launch.placement), known values: which
device each acting process gets, the environment it is started with (visible devices, the
memory rule), the learner's, and the refusal of a device the host does not have."""

from __future__ import annotations

import pytest

from tianjax.config import ConfigError, load_config
from tianjax.launch import placement as D


def _config(*overrides):
    return load_config("ppo_cartpole_async", list(overrides))


def test_actors_then_the_evaluator_are_spread_over_the_listed_gpus_in_order():
    c = _config(
        "num_actors=3",
        "runtime.actor_devices=gpu:2,0",
        "eval.episodes=2",
        "eval.every_s=10",
    )
    assert D.acting_slots(c) == 4  # three actors and the evaluator
    assert [D.actor_device(c, s, {}) for s in range(4)] == [2, 0, 2, 0]
    assert D.processes_on(c, 2, {}) == D.processes_on(c, 0, {}) == 2
    env = D.actor_environment(c, 3, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"})
    assert env == {
        "JAX_PLATFORMS": "cuda",
        "CUDA_VISIBLE_DEVICES": "0",  # the evaluator (slot 3) sees only its own GPU
        "TIANJAX_DEVICE": "gpu:0",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # it allocates as it goes...
        "XLA_CLIENT_MEM_FRACTION": "0.450",  # ...up to its share: 0.9 split two ways
        "XLA_PYTHON_CLIENT_MEM_FRACTION": None,  # jaxlib refuses the old name beside the new
    }
    launched = D.apply({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5", "HOME": "/h"}, env)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in launched and launched["HOME"] == "/h"


def test_ids_are_numbered_within_the_launchers_own_visible_devices():
    c = _config("num_actors=2", "runtime.actor_devices=gpu:0,2")
    given = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    assert D.actor_environment(c, 1, given)["CUDA_VISIBLE_DEVICES"] == "6"
    assert D.host_devices("gpu", given) == 3


def test_a_gpu_platform_alone_is_every_gpu_of_the_host_and_where_uncounted_none_preallocated():
    c = _config("num_actors=3", "runtime.actor_devices=gpu")
    counted = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert [D.actor_device(c, s, counted) for s in range(3)] == [0, 1, 0]
    assert D.actor_environment(c, 1, counted)["XLA_CLIENT_MEM_FRACTION"] == "0.900"
    if D.host_devices("gpu", {}) is None:  # (a host without NVIDIA's driver)
        env = D.actor_environment(c, 0, {})
        assert "CUDA_VISIBLE_DEVICES" not in env
        assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_the_sebulba_split_actors_on_gpu_0_and_the_learner_on_the_rest():
    c = _config("num_actors=2", "runtime.actor_devices=gpu:0", "runtime.learner_devices=gpu:1-7")
    learner = D.learner_environment(c, {})
    assert learner == {
        "CUDA_VISIBLE_DEVICES": "1,2,3,4,5,6,7",
        "TIANJAX_LEARNER_DEVICES": "gpu:1,2,3,4,5,6,7",
    }
    assert D.learner_share(c, {}) is None  # its GPUs to itself: JAX's default preallocation
    assert D.actor_environment(c, 1, {})["XLA_CLIENT_MEM_FRACTION"] == "0.450"


def test_a_gpu_the_learner_shares_with_actors_is_split_among_all_of_them():
    c = _config("num_actors=2", "runtime.actor_devices=gpu:0", "runtime.learner_devices=gpu:0")
    assert D.processes_on(c, 0, {}) == 3
    assert D.actor_environment(c, 0, {})["XLA_CLIENT_MEM_FRACTION"] == "0.300"
    learner = D.learner_environment(c, {})
    assert learner["XLA_CLIENT_MEM_FRACTION"] == "0.300"
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in learner  # the learner preallocates its share


def test_cpu_devices_one_xla_cpu_device_per_process_and_a_platform_alone_as_before():
    c = _config("runtime.actor_devices=cpu:0,1")
    assert D.actor_environment(c, 1, {}) == {
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "1",
        "TIANJAX_DEVICE": "cpu:1",
    }
    assert D.actor_environment(_config(), 0, {}) == {"JAX_PLATFORMS": "cpu"}


def test_a_device_the_host_does_not_have_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    D.check_devices(_config("runtime.actor_devices=gpu:1", "runtime.learner_devices=gpu:0"))
    with pytest.raises(ConfigError) as e:
        D.check_devices(_config("runtime.actor_devices=gpu:0,3"))
    assert str(e.value) == (
        "config key 'runtime.actor_devices': this host has 2 gpu device(s) (ids 0-1), so "
        "gpu:0,3 names one it does not have (3)"
    )
    with pytest.raises(ConfigError, match="'runtime.learner_devices': this host has 2 gpu"):
        D.check_devices(_config("runtime.learner_devices=gpu:1-2"))
    n = D.host_devices("cpu")  # this process's XLA CPU devices
    with pytest.raises(ConfigError, match=f"this host has {n} cpu device"):
        D.check_devices(_config(f"runtime.actor_devices=cpu:0,{n}"))

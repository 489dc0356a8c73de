import dataclasses

import pytest

from tianjax.config import Config, ConfigError, load_config
from tianjax.config.describe import field_comments
from tianjax.config.runtime import RuntimeConfig


def test_default_config_file_loads_and_matches_documented_defaults():
    cfg = load_config("configs/ppo_cartpole.yaml")
    assert isinstance(cfg, Config)
    assert (cfg.algo, cfg.env, cfg.mode, cfg.env_backend) == (
        "ppo",
        "CartPole-v1",
        "fused",
        "gymnax",
    )
    assert cfg.ppo.lr == pytest.approx(2.5e-4)  # YAML 1.1 reads 2.5e-4 as a string
    assert cfg.network.hidden == (64, 64)
    assert cfg.steps_per_update == 512


def test_dotted_overrides_are_typed():
    cfg = load_config(
        "configs/ppo_cartpole.yaml",
        [
            "ppo.lr=1e-3",
            "num_envs=8",
            "network.hidden=[32, 32]",
            "target_return=null",
            "total_env_steps=5e4",
        ],
    )
    assert cfg.ppo.lr == pytest.approx(1e-3)
    assert cfg.num_envs == 8
    assert cfg.network.hidden == (32, 32)
    assert cfg.target_return is None
    assert cfg.total_env_steps == 50_000 and isinstance(cfg.total_env_steps, int)


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["lerning_rate=1"], "lerning_rate"),
        (["ppo.lr_typo=1"], "ppo.lr_typo"),
        (["num_envs=four"], "num_envs"),
        (["num_envs=2.5"], "num_envs"),
        (["ppo.anneal_lr=3"], "ppo.anneal_lr"),
        (["mode=turbo"], "mode"),
        (["ppo.lr=-1"], "ppo.lr"),
        (["ppo.num_minibatches=1024"], "ppo.num_minibatches"),  # minibatch larger than the batch
        (["ppo.num_minibatches=3"], "ppo.num_minibatches"),  # does not divide 512
        (["env_backend=envpool"], "mode"),  # fused needs a JAX env
        (["ppo=3"], "ppo"),
        (["network.hidden=[64, 0]"], "network.hidden"),
        (["staleness.schedule=cutoff"], "staleness.max_staleness"),
        (["total_env_steps=100"], "total_env_steps"),
        (["ppo.gamma=nan"], "ppo.gamma"),
        (["balance.mode=auto"], "balance.mode"),
        (["balance.target_staleness=-1"], "balance.target_staleness"),
        (["balance.target_replay_ratio=0"], "balance.target_replay_ratio"),
        (["balance.deadband=1.5"], "balance.deadband"),
        (["groups.count=2"], "groups.count"),  # fused: no actor processes to group
        (["groups.count=0"], "groups.count"),
        (["groups.sync_every=0"], "groups.sync_every"),
        (["groups.outer=adam"], "groups.outer"),
        (["groups.outer_momentum=1"], "groups.outer_momentum"),
        (["groups.timeout_s=0"], "groups.timeout_s"),
        (["groups.round_wait_s=-1"], "groups.round_wait_s"),
        (["groups.schedule=cutoff"], "groups.max_staleness"),
        (["groups.checkpoint_every=0"], "groups.checkpoint_every"),
        (["runtime.standby_learner=true"], "runtime.standby_learner"),  # no restart_learner
        (["staleness.correct=false", "staleness.scale_lr=true"], "staleness.scale_lr"),
        (["algo=impala", "staleness.scale_lr=true"], "staleness.scale_lr"),  # PPO's
        (["ppo.behaviour_clip_eps=0"], "ppo.behaviour_clip_eps"),
        (["ppo.behaviour_clip=false", "ppo.behaviour_clip_eps=0.5"], "ppo.behaviour_clip_eps"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as e:
        load_config("configs/ppo_cartpole.yaml", overrides)
    assert f"'{key}'" in str(e.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: [ppo\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(lst)


def test_override_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["num_envs"])


def test_every_shipped_config_loads_and_every_key_is_commented():
    import glob

    paths = sorted(glob.glob("configs/*.yaml"))
    assert paths
    for path in paths:
        load_config(path)
        for line in open(path):
            s = line.strip()
            if s and not s.startswith("#") and ":" in s and not s.endswith(":"):
                assert "#" in s, f"{path}: key without a comment: {s}"


def test_balance_is_adaptive_by_default_in_async_only():
    assert load_config("configs/ppo_cartpole_async.yaml", ["balance.mode=null"]).balance_adaptive
    assert not load_config(
        "configs/ppo_cartpole_async.yaml", ["balance.mode=fixed"]
    ).balance_adaptive
    # sync and fused have nothing to balance: adaptive there is the fixed behaviour
    assert not load_config(
        "configs/ppo_cartpole_async.yaml", ["mode=sync", "balance.mode=adaptive"]
    ).balance_adaptive
    assert not load_config("configs/ppo_cartpole.yaml", []).balance_adaptive


@pytest.mark.parametrize(
    "overrides,key,why",
    [
        (["env_backend=envpool"], "runtime.deterministic", "steps outside JAX"),
        (["mode=sync"], "runtime.deterministic", "variant of mode async"),
        (["groups.count=2"], "runtime.deterministic", "learner groups"),
        (["staleness.forced_lag=2"], "staleness.forced_lag", "deterministic_lag sets"),
        (["staleness.max_staleness=0"], "staleness.max_staleness", ">= runtime.deterministic_lag"),
        (["runtime.max_pool=3"], "runtime.max_pool", "must hold 2 rounds"),
        (["num_actors=3"], "num_actors", "hosts whole shards"),
        (["eval.episodes=2", "eval.every_s=5"], "eval", "evaluator process"),
        (["runtime.deterministic_lag=-1"], "runtime.deterministic_lag", "int >= 0"),
    ],
)
def test_deterministic_mode_is_refused_where_it_cannot_hold(overrides, key, why):
    base = ["env_backend=gymnax", "runtime.deterministic=true", "runtime.batch_trajectories=2"]
    with pytest.raises(ConfigError, match=why) as e:
        load_config("configs/ppo_cartpole_async.yaml", [*base, *overrides])
    assert f"'{key}'" in str(e.value)
    with pytest.raises(ConfigError, match="on-policy"):
        load_config(
            "configs/dqn_cartpole.yaml",
            ["mode=async", "num_actors=1", "runtime.deterministic=true"],
        )


@dataclasses.dataclass
class _Commented:
    a: int = 1  # a's inline comment, which goes
    # on here (a continuation: the next field has its own comment)
    b: int = 2  # b's
    # c's block above it: c has no inline comment, so this is not b's
    c: int = 3
    d: int = 4  # d's (one line)

    # E's block, after a blank line
    e: int = 5
    f: int = 6  # f's, the last field's, going
    # on to the end of the class


def test_each_field_gets_the_comment_beside_or_above_it_never_a_neighbours():
    assert field_comments(_Commented) == {
        "a": "a's inline comment, which goes on here (a continuation: the next field has its "
        "own comment)",
        "b": "b's",
        "c": "c's block above it: c has no inline comment, so this is not b's",
        "d": "d's (one line)",
        "e": "E's block, after a blank line",
        "f": "f's, the last field's, going on to the end of the class",
    }
    # the schema's own: a block above a field is that field's, not the previous one's
    runtime = field_comments(RuntimeConfig)
    assert runtime["max_actor_restarts"].endswith("restarted up to this many times")
    assert runtime["standby_actors"].startswith("a warm standby per actor process")

"""The eval section: every bad value is one ConfigError naming its key, and the key it
replaces is refused with the new name."""

import pytest

from tianjax.config import ConfigError, load_config


@pytest.mark.parametrize(
    "override,key",
    [
        ("eval.episodes=-1", "eval.episodes"),
        ("eval.every_updates=0", "eval.every_updates"),
        ("eval.every_s=0", "eval.every_s"),
        ("eval.every_s=-2.5", "eval.every_s"),
        ("eval.greedy=sometimes", "eval.greedy"),
        ("eval.video=1", "eval.video"),
        ("eval.often=3", "eval.often"),
    ],
)
def test_a_bad_eval_value_names_its_key(override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'"):
        load_config("ppo_cartpole", [override])


def test_every_updates_and_every_s_together_are_refused():
    with pytest.raises(ConfigError, match="'eval.every_s': set either"):
        load_config("ppo_cartpole", ["eval.every_updates=10", "eval.every_s=5"])


@pytest.mark.parametrize("key", ["every_updates=10", "every_s=5", "video=true", "keep_best=true"])
def test_asking_for_more_than_no_evaluation_needs_episodes(key):
    with pytest.raises(ConfigError, match=f"'eval.{key.split('=')[0]}': needs eval.episodes"):
        load_config("ppo_cartpole", ["eval.episodes=0", f"eval.{key}"])


def test_eval_episodes_is_refused_with_its_new_name():
    with pytest.raises(ConfigError, match="'eval_episodes': renamed to 'eval.episodes'"):
        load_config("ppo_cartpole", ["eval_episodes=5"])
    with pytest.raises(ConfigError, match="renamed to 'eval.episodes'"):
        load_config({"eval_episodes": 0})


def test_the_section_reads_as_documented():
    c = load_config("ppo_cartpole", ["eval.every_s=2.5"]).eval
    assert (c.episodes, c.every_s, c.every_updates, c.greedy, c.on, c.periodic) == (
        10,
        2.5,
        None,
        True,
        True,
        True,
    )
    off = load_config("ppo_cartpole", ["eval.episodes=0"]).eval
    assert not off.on and not off.periodic

"""What each learner group gets of a run: its actors, its budget, its directory, its ports.

A groups config (groups.count = G > 1) describes the whole run, however it is launched
(`tianjax train`, `srun tianjax launch --groups G`, or one role per command):

- `num_actors` is the run's actor count, split evenly: each group has num_actors / G;
- `total_env_steps` is the run's budget, split evenly: each group trains num_actors / G
  actors for total_env_steps / G env steps (a group that is lost takes its share with it);
- group g's actors are the ids g, g + G, g + 2G, ... (actor k trains for group k mod G, as
  with lock-step learners), so env_options that name actors (slow_actors) name the same
  processes whether a run is grouped or lock-step;
- group g writes to RUN_DIR/group-g and the averager to RUN_DIR/averager;
- across hosts, group g listens on base_port + 3g .. + 2 (as learner g of a lock-step run)
  and the averager on base_port + 3G (deltas) and + 1 (averages).
"""

from __future__ import annotations

import dataclasses
import os

from tianjax.config import Config, ConfigError

AVERAGER_DIR = "averager"


def check_split(config: Config) -> None:
    """Raises ConfigError naming the key when the run does not split evenly over its groups."""
    g = config.groups.count
    if config.num_actors % g:
        raise ConfigError(
            f"config key 'num_actors': {config.num_actors} actors do not split evenly over "
            f"groups.count={g} groups (num_actors is the run's: give each group as many)"
        )
    share = config.total_env_steps // g
    if share < config.num_actors // g * config.num_envs * config.rollout_len:
        raise ConfigError(
            f"config key 'total_env_steps': {config.total_env_steps} split over {g} groups "
            f"leaves {share} env steps per group, less than one batch of its actors"
        )


def group_config(config: Config, index: int) -> Config:
    """Group `index`'s config: its share of the actors and the budget, its own run directory
    (config.run_dir/group-<index>) and, when the run resumes, its own part of the run resumed."""
    check_split(config)
    g = config.groups.count
    if not 0 <= index < g:
        raise ConfigError(f"launch: group {index} is outside 0-{g - 1} (groups.count={g})")
    return dataclasses.replace(
        config,
        num_actors=config.num_actors // g,
        total_env_steps=config.total_env_steps // g,
        run_dir=group_dir(config.run_dir, index) if config.run_dir else None,
        resume=group_dir(config.resume, index) if config.resume else None,
    )


def group_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"group-{index}")


def averager_dir(run_dir: str) -> str:
    return os.path.join(run_dir, AVERAGER_DIR)


def group_actor_ids(index: int, count: int, per_group: int) -> list[int]:
    """Group `index`'s actor ids: k with k mod count == index."""
    return [index + count * j for j in range(per_group)]


def averager_ports(base_port: int, count: int) -> dict[str, int]:
    """The averager's ports across hosts: after the groups' 3 each."""
    return {"deltas": base_port + 3 * count, "averages": base_port + 3 * count + 1}


__all__ = [
    "averager_dir",
    "averager_ports",
    "check_split",
    "group_actor_ids",
    "group_config",
    "group_dir",
]

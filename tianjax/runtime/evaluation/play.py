"""One evaluation, host side: the episodes of one pinned parameter version on the config's
env, and what an evaluation leaves besides its record (a video, the best parameters).

JAX envs play their episodes in one jitted loop (tianjax.core.evaluation.play_episodes);
host envs (envpool, gymnasium) step `eval.episodes` envs from Python with the jitted policy
until each has finished one episode, whole games scored unclipped where the env tells
them apart (Atari's lives; `play_host`). Every evaluation of a run uses the key
fold_in(key(seed + 1), version), so the same version is evaluated on the same episodes.

`Evaluation(config, run_dir)` builds the env, the compiled policy, the video maker and
the best-params keeper once, at the start of the process that evaluates (an env that
cannot render says so then), and `evaluate(params, version, env_steps)` makes one
evaluation's fields.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.core.evaluation import play_episodes
from tianjax.core.rollout import clip_action
from tianjax.runtime.evaluation.best import BestParams
from tianjax.runtime.evaluation.recording import JAX_BACKENDS, video_maker
from tianjax.runtime.record.evaluations import eval_fields

MAX_STEPS = 100_000  # an episode not ended by then counts as it stands


def eval_key(config: Config, version: int) -> jax.Array:
    """The key of every evaluation of `version` in this run."""
    return jax.random.fold_in(jax.random.key(config.seed + 1), version)


def play_host(
    env, policy, params, key, episodes: int, seed: int | None = None, max_steps: int = MAX_STEPS
):
    """(returns [episodes], lengths [episodes]) of each host env's first whole episode from
    a reset (reseeded with `seed` where given); `policy(params, obs, key)` gives the
    clipped actions of a batch."""
    obs = env.reset(seed)
    ret = np.zeros(episodes)
    length = np.zeros(episodes, np.int64)
    finished = np.zeros(episodes, bool)
    for _ in range(max_steps):
        key, sub = jax.random.split(key)
        out = env.step(np.asarray(policy(params, obs, sub)))
        # whole games, scored unclipped, where the env tells them apart (Atari's lives)
        ret += np.where(finished, 0.0, out.report_reward)
        length += ~finished
        finished |= np.asarray(out.report_done)
        obs = out.obs
        if finished.all():
            break
    return ret, length


def host_policy(algo, action_spec, greedy: bool):
    """policy(params, obs, key) -> clipped actions of a batch (jitted), greedy or sampled."""
    if greedy:
        act = jax.jit(lambda p, o: clip_action(algo.greedy(p, o), action_spec))
        return lambda p, o, k: act(p, o)
    big = np.iinfo(np.int32).max
    return jax.jit(lambda p, o, k: clip_action(algo.act(p, o, k, big).action, action_spec))


class Evaluation:
    """`env`: the JAX env object a run trains on (default: the config's); `returns`: play
    the episodes here (False: a fused run plays them inside its own program and asks only
    for the video and the best params)."""

    def __init__(self, config: Config, run_dir: str | None, env=None, returns: bool = True):
        self.config, ec = config, config.eval
        self.episodes, self.greedy = ec.episodes, ec.greedy
        self._play = self._host = None
        if returns and config.env_backend in JAX_BACKENDS:
            from tianjax.envs.factory import make_jax_env

            env = env or make_jax_env(config.env_backend, config.env, config.env_options)
            algo = make_algorithm(
                config,
                env.obs_shape,
                env.action_spec,
                correct_staleness=False,
                obs_dtype=getattr(env, "obs_dtype", None),
            )
            self.algo = algo
            self.wins = bool(getattr(env, "reports_wins", False))
            self._play = jax.jit(
                lambda p, k: play_episodes(env, algo, p, k, self.episodes, self.greedy, MAX_STEPS)
            )
        elif returns:
            from tianjax.envs.factory import make_host_env

            self._host = make_host_env(
                config.env_backend, config.env, self.episodes, config.seed + 1, **config.env_options
            )
            algo = make_algorithm(
                config,
                tuple(self._host.obs_shape),
                self._host.action_spec,
                correct_staleness=False,
                obs_dtype=self._host.obs_dtype,
            )
            self.algo = algo
            self.wins = False
            self._policy = host_policy(algo, self._host.action_spec, self.greedy)
        self.video = video_maker(config, run_dir, env=env) if run_dir else None
        self.best = BestParams(run_dir) if ec.keep_best and run_dir else None

    def compile(self) -> None:
        """Compiles the episodes' programs now (an evaluator process at its start, while the
        learner compiles too) rather than at the first evaluation, mid-training."""
        if self._play is None and self._host is None:
            return
        params = jax.jit(self.algo.init)(jax.random.key(0)).params
        key = eval_key(self.config, 0)
        if self._play is not None:
            self._play = self._play.lower(params, key).compile()
        else:
            obs = np.zeros((self.episodes, *self._host.obs_shape), self._host.obs_dtype)
            jax.block_until_ready(self._policy(params, obs, key))

    def returns(self, params, version: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(returns, lengths, won or None) of the episodes of `params` (of `version`)."""
        key = eval_key(self.config, version)
        if self._play is not None:
            out = jax.device_get(self._play(params, key))
            return out.returns, out.lengths, out.won if self.wins else None
        # the same start states every evaluation (reset with one seed): versions compared on
        # the same episodes, as `tianjax eval` plays them
        seed = self.config.seed + 1
        ret, length = play_host(self._host, self._policy, params, key, self.episodes, seed)
        return ret, length, None

    def evaluate(self, params, version: int, env_steps: int) -> dict:
        """One evaluation of `params` (of `version`, at `env_steps`): its eval_* fields,
        the video (eval.video) and the best params (eval.keep_best) written."""
        t = time.perf_counter()
        returns, lengths, won = self.returns(params, version)
        fields = eval_fields(returns, lengths, won)
        self.extras(params, version, env_steps, fields)
        fields["eval_s"] = time.perf_counter() - t
        return fields

    def extras(self, params, version: int, env_steps: int, fields: dict) -> dict:
        """What an evaluation leaves besides its fields: the video (its path added to
        `fields`), and `params` kept as RUN_DIR/best where they are the best yet."""
        if self.video is not None:
            fields["eval_video"] = self.video(params, version, eval_key(self.config, version))
        if self.best is not None:
            self.best.offer(params, version, env_steps, fields["eval_return"])
        return fields

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
        if self.video is not None:
            self.video.close()


__all__ = ["MAX_STEPS", "Evaluation", "eval_key", "host_policy", "play_host"]

"""DQN (Mnih et al., 2015) with double-Q targets (van Hasselt et al., 2016).

One update is one gradient step on a batch of replayed Transitions:

    a*_i  = argmax_a Q_online(s'_i, a)              (double Q; argmax_a Q_target without it)
    y_i   = r_i + gamma * (1 - terminated_i) * Q_target(s'_i, a*_i)      (no gradient)
    loss  = mean_i  w_i * huber_delta(Q_online(s_i, a_i) - y_i)

Termination does not bootstrap; truncation does, from the true final observation that
the rollout stores in `next_obs`. The target network is refreshed every
`target_update_every` updates (a hard copy when `target_tau == 1`, else Polyak averaging
target <- tau * online + (1 - tau) * target). Exploration is epsilon-greedy, epsilon
decaying linearly from `eps_start` to `eps_end` over the first `eps_fraction` of
`total_env_steps` env steps, counted globally: in fused and in-process runs the loop's own
count, across actor processes the learner's count of env steps admitted, which every
parameter message carries, so N actors follow one schedule and a restarted actor goes on
with it.

How staleness enters: every replayed transition carries the version of the parameters
that acted in it, so tau_i = learner_version - behaviour_version_i is its age in updates.
Q-learning is off-policy, so no importance ratio is needed (the target does not depend on
the behaviour policy); staleness only enters as the per-sample weight w_i = w(tau_i)
(tianjax.core.staleness: schedule, optional max_staleness mask acting as a recency window on
the buffer, normalised to mean 1 over the kept samples). With the default `constant`
schedule, or whenever every tau is 0, the weights are exactly 1 and the loss is the
plain DQN loss. `correct_staleness=False` (what the fused runner uses) skips the weights
altogether, i.e. plain uniform experience replay.

With `dqn.frame_once` (tianjax.core.replay.frames) the replay stores each frame once and cannot
give a transition cut by a time limit inside a stored chunk its final observation; `update`
then takes the buffer's per-sample mask as a fourth argument and multiplies the weights by
it (0 for those transitions: w_i * m_i in the loss above, its mean still over all N).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from tianjax.algos.common import check_replay, periodic_target, replay_step, sample_weights
from tianjax.config import Config, ConfigError, check_key
from tianjax.core.algorithm import ActOutput, Algorithm
from tianjax.core.buffer_kind import TRANSITIONS
from tianjax.core.types import ActionSpec, Transition
from tianjax.core.update import LearnerState, guarded, init_state, make_optimizer
from tianjax.networks import QNetwork


def make_loss(apply_fn, *, gamma: float, double_q: bool, huber_delta: float):
    """loss_fn(params, target_params, batch: Transition, weight [N]) -> (loss, metrics).

    `apply_fn(params, obs [N, ...]) -> Q [N, A]`. Any leading batch shape works ([T, B]
    as well as [N]); `weight` has the shape of `batch.reward`.
    """

    def loss_fn(params, target_params, batch: Transition, weight):
        sg = jax.lax.stop_gradient
        q = apply_fn(params, batch.obs)  # [N, A]
        action = batch.action.astype(jnp.int32)
        q_sa = jnp.take_along_axis(q, action[..., None], axis=-1)[..., 0]
        q_next_target = apply_fn(target_params, batch.next_obs)  # [N, A]
        if double_q:
            next_action = jnp.argmax(apply_fn(params, batch.next_obs), axis=-1)
            q_next = jnp.take_along_axis(q_next_target, next_action[..., None], axis=-1)[..., 0]
        else:
            q_next = jnp.max(q_next_target, axis=-1)
        not_done = 1.0 - batch.terminated.astype(jnp.float32)
        target = sg(batch.reward.astype(jnp.float32) + gamma * not_done * q_next)
        td = q_sa - target
        loss = jnp.mean(weight * optax.huber_loss(td, delta=huber_delta))
        metrics = {
            "q_mean": sg(jnp.mean(q_sa)),
            "q_max": sg(jnp.max(q)),
            "target_mean": sg(jnp.mean(target)),
            "td_abs": sg(jnp.mean(jnp.abs(td))),
        }
        return loss, metrics

    return loss_fn


def epsilon_schedule(eps_start: float, eps_end: float, decay_steps: float):
    """epsilon(env_steps): linear from eps_start at 0 to eps_end at decay_steps, then flat."""
    decay_steps = max(float(decay_steps), 1.0)

    def epsilon(env_steps):
        frac = jnp.clip(jnp.asarray(env_steps, jnp.float32) / decay_steps, 0.0, 1.0)
        return eps_start + frac * (eps_end - eps_start)

    return epsilon


def epsilon_greedy(key, q: jax.Array, epsilon) -> tuple[jax.Array, jax.Array]:
    """Samples actions [B] from epsilon-greedy over q [B, A]; returns (action, log mu(a|s))."""
    k_explore, k_rand = jax.random.split(key)
    num_actions = q.shape[-1]
    greedy = jnp.argmax(q, axis=-1).astype(jnp.int32)
    rand = jax.random.randint(k_rand, greedy.shape, 0, num_actions, jnp.int32)
    explore = jax.random.uniform(k_explore, greedy.shape) < epsilon
    action = jnp.where(explore, rand, greedy)
    prob = epsilon / num_actions + (1.0 - epsilon) * (action == greedy)
    return action, jnp.log(prob)


def check_config(config: Config) -> None:
    """The dqn section against the run: frame_once where a loop serves it, a buffer that
    holds a rollout."""
    if config.dqn.frame_once:
        check_key(
            config.mode == "fused" or config.num_actors >= 1,
            "dqn.frame_once",
            "is served by mode: fused and by actor processes (num_actors >= 1); the "
            "in-process host loop (num_actors: 0) keeps obs and next_obs",
        )
    check_replay(config)


def make(
    config: Config,
    obs_shape: tuple[int, ...],
    action_spec: ActionSpec,
    *,
    correct_staleness: bool = True,
) -> Algorithm:
    """DQN for `config`. `correct_staleness=False` skips the staleness weights (all 1)."""
    if not action_spec.discrete:
        raise ConfigError(
            "config key 'algo': dqn needs a discrete action space, got a "
            f"continuous one of shape {tuple(action_spec.shape)}; use ppo or impala"
        )
    cfg = config.dqn
    obs_shape = tuple(obs_shape)
    net = QNetwork(config.network, obs_shape, action_spec.num_actions)
    apply_fn = net.apply
    optimizer = make_optimizer(cfg.lr, cfg.max_grad_norm)
    update_target = periodic_target(cfg.target_update_every, cfg.target_tau)
    loss_fn = make_loss(
        apply_fn, gamma=cfg.gamma, double_q=cfg.double_q, huber_delta=cfg.huber_delta
    )
    epsilon = epsilon_schedule(
        cfg.eps_start, cfg.eps_end, cfg.eps_fraction * config.total_env_steps
    )

    def init(key):
        k_net, k_state = jax.random.split(key)
        obs = jnp.zeros((1,) + obs_shape, jnp.float32)
        params = net.init(k_net, obs)
        return init_state(params, optimizer, k_state, with_target=True)

    def act(params, obs, key, env_steps=0):
        """Epsilon-greedy. log_prob is log mu(a|s) of the epsilon-greedy policy (nothing
        consumes it for replay); value is zeros (DQN has no state-value head)."""
        q = apply_fn(params, obs)
        action, log_prob = epsilon_greedy(key, q, epsilon(env_steps))
        return ActOutput(action, log_prob, jnp.zeros(action.shape, jnp.float32))

    def value(params, obs):
        return jnp.zeros(obs.shape[: obs.ndim - len(obs_shape)], jnp.float32)

    def greedy(params, obs):
        return jnp.argmax(apply_fn(params, obs), axis=-1).astype(jnp.int32)

    def update(state: LearnerState, batch: Transition, fresh=True, mask=None):
        """One gradient step on replayed transitions (`fresh` is unused: replay has no
        fresh/reused batches; progress here is the env steps the actors produced).
        `mask` [N] (optional) multiplies the per-sample weights: the frame-once replay
        gives 0 to the transitions whose true next observation it does not hold."""
        w, _ = sample_weights(correct_staleness, state.version, batch.version, config.staleness)
        if mask is not None:
            w = w * jax.lax.stop_gradient(mask.astype(jnp.float32))
        new_state, metrics = replay_step(loss_fn, optimizer, state, batch, w, update_target)
        if mask is not None:
            metrics["mask_mean"] = jnp.mean(mask.astype(jnp.float32))
        return new_state, metrics

    def schedules(env_steps):
        return {"epsilon": epsilon(env_steps)}

    return Algorithm(
        "dqn", TRANSITIONS, init, act, value, greedy, guarded(update), loss_fn, net, schedules
    )


__all__ = ["check_config", "epsilon_greedy", "epsilon_schedule", "make", "make_loss"]

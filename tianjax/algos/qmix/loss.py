"""QMIX (Rashid et al., 2018): recurrent agent Q-networks and a monotonic mixing network.

Each agent i keeps a GRU hidden state h^i and outputs Q^i(h^i_t, a) from its own
observation (plus a one-hot agent id; parameters shared). A hypernetwork mixer,
conditioned on the global state s_t, combines the chosen agent Qs into

    Q_tot(q, s) = w2(s) . elu(W1(s)^T q + b1(s)) + b2(s),   W1 = |hyper_1(s)|, w2 = |hyper_2(s)|

whose absolute-valued weights make Q_tot monotonic in every q^i (so the per-agent argmax
is the joint argmax). Targets are double-Q with a target network (agents and mixer):

    a*^i  = argmax_{a available at t+1} Q^i_online(h^i_{t+1}, a)
    v_t   = Q_tot^target([Q^i_target(h'^i_{t+1}, a*^i)]_i, s_{t+1})
    y_t   = r_t + gamma * (1 - terminated_t) * [(1 - lambda c_t) v_t + lambda c_t y_{t+1}]
    loss  = sum_t m_t w_t (Q_tot(q_t(a_t), s_t) - y_t)^2 / sum_t m_t

with lambda = `qmix.td_lambda` (pymarl2's TD(lambda) targets; 0 gives the one-step target
y_t = r_t + gamma (1 - terminated_t) v_t), c_t = 1 - done_t (the lambda-return stops at an
episode's end, where only v_t, the value of the final observation, can bootstrap) and
c_{T-1} = 0 (the sequence's last step bootstraps from v_{T-1}). Replayed steps come from
older policies: like pymarl2, the lambda-return does not correct for that (the staleness
weight w_t only scales each step's loss).

over replayed sequences (tianjax.core.types.Sequences, time-major [T, B] here: obs and next_obs
MAObs, reward the team reward [T, B]), where s_{t+1} and the observation at t+1 are the true
next ones (the final observation where an episode ended: truncation bootstraps from it,
termination does not), the hidden state starts from the one stored with the sequence and
is reset after every episode end, the first `burn_in` steps only warm the hidden state (no
loss, no gradient through it: R2D2's burn-in), and w_t is the staleness weight of the
sample's behaviour version (1 when fresh).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from tianjax.algos.common import check_replay, periodic_target, replay_step, sample_weights
from tianjax.algos.dqn.loss import epsilon_schedule
from tianjax.config import Config, ConfigError, check_key
from tianjax.core.algorithm import ActOutput, Algorithm
from tianjax.core.buffer_kind import SEQUENCES
from tianjax.core.types import ActionSpec, MAObs, Sequences
from tianjax.core.update import LearnerState, guarded, init_state, make_optimizer
from tianjax.networks.dense import Dense

MASKED_Q = -1e9
# NOTE: the agents' Q head and the mixer's state-conditioned biases start near zero. With
# the default (LeCun) init, Q_tot on SMAX 3m's first states reached 0.2 to 2.8 depending on
# the seed (the agents' Qs 0.15 to 0.28), against a team reward of about 1 for a win: early
# targets were bootstrapped from that noise rather than from the sparse reward, and 3m was
# not learned in 0.6 M env steps (win rate 0.00). Started near zero (|Q_tot| < 0.12), the
# reward sets the values first.
SMALL_INIT = nn.initializers.variance_scaling(0.01, "fan_in", "truncated_normal")


class AgentRNN(nn.Module):
    """Q^i(h, o): Dense -> GRU -> Dense, one step; inputs [..., D], hidden [..., H]."""

    hidden_dim: int
    num_actions: int

    @nn.compact
    def __call__(self, h, x):
        x = nn.relu(Dense(self.hidden_dim)(x))
        h, _ = nn.GRUCell(self.hidden_dim)(h, x)
        return h, Dense(self.num_actions, kernel_init=SMALL_INIT)(h)


class Mixer(nn.Module):
    """Q_tot(q [..., N], s [..., S]) -> [...], monotonic in every q^i."""

    embed_dim: int = 32
    hyper_hidden: int = 64

    @nn.compact
    def __call__(self, q, s):
        n, e = q.shape[-1], self.embed_dim
        w1_h = nn.relu(Dense(self.hyper_hidden, name="hyper_w1_hidden")(s))
        w1 = jnp.abs(Dense(e * n, name="hyper_w1")(w1_h)).reshape(s.shape[:-1] + (n, e))
        b1 = Dense(e, kernel_init=nn.initializers.zeros, name="hyper_b1")(s)
        w2_h = nn.relu(Dense(self.hyper_hidden, name="hyper_w2_hidden")(s))
        w2 = jnp.abs(Dense(e, name="hyper_w2")(w2_h))
        b2_h = nn.relu(Dense(e, name="hyper_b2_hidden")(s))
        b2 = Dense(1, kernel_init=nn.initializers.zeros, name="hyper_b2")(b2_h)[..., 0]
        h = nn.elu(jnp.einsum("...n,...ne->...e", q, w1) + b1)
        return jnp.sum(h * w2, axis=-1) + b2


def agent_inputs(obs: jax.Array) -> jax.Array:
    """[..., N, D] -> [..., N, D + N]: each agent's observation with its one-hot id."""
    n = obs.shape[-2]
    ids = jnp.broadcast_to(jnp.eye(n, dtype=obs.dtype), obs.shape[:-1] + (n,))
    return jnp.concatenate([obs, ids], axis=-1)


def double_q_choice(
    q_next_online: jax.Array, q_next_target: jax.Array, avail_next: jax.Array
) -> jax.Array:
    """Per-agent double-Q bootstrap values [..., N]: the target net's Q of the online net's
    best available action."""
    chex.assert_equal_shape([q_next_online, q_next_target, avail_next])
    best = jnp.argmax(jnp.where(avail_next, q_next_online, MASKED_Q), axis=-1)
    return jnp.take_along_axis(q_next_target, best[..., None], axis=-1)[..., 0]


def td_targets(
    reward_t: jax.Array, terminated_t: jax.Array, q_tot_next: jax.Array, gamma: float
) -> jax.Array:
    """y_t = r_t + gamma * (1 - terminated_t) * Q_tot^target(next) [...] (no gradient)."""
    chex.assert_equal_shape([reward_t, terminated_t, q_tot_next])
    return jax.lax.stop_gradient(
        reward_t + gamma * (1.0 - terminated_t.astype(jnp.float32)) * q_tot_next
    )


def lambda_targets(
    reward_t: jax.Array,
    terminated_t: jax.Array,
    done_t: jax.Array,
    q_tot_next: jax.Array,
    gamma: float,
    lam: float,
) -> jax.Array:
    """TD(lambda) targets [T, ...] of time-major sequences (the module docstring's y_t; no
    gradient): computed backwards from y_{T-1} = r_{T-1} + gamma (1 - terminated) v_{T-1}."""
    chex.assert_equal_shape([reward_t, terminated_t, done_t, q_tot_next])
    discount = gamma * (1.0 - terminated_t.astype(jnp.float32))
    carry_on = lam * (1.0 - done_t.astype(jnp.float32))

    def step(y_next, x):
        r, d, c, v = x
        y = r + d * ((1.0 - c) * v + c * y_next)
        return y, y

    last = reward_t[-1] + discount[-1] * q_tot_next[-1]
    _, ys = jax.lax.scan(
        step, last, (reward_t[:-1], discount[:-1], carry_on[:-1], q_tot_next[:-1]), reverse=True
    )
    return jax.lax.stop_gradient(jnp.concatenate([ys, last[None]], axis=0))


class QMIXParams(NamedTuple):
    agent: dict
    mixer: dict


def make_unroll(agent: AgentRNN):
    """unroll(agent_params, hidden [B, N, H], seq) -> (q [T, B, N, A], q_next [T, B, N, A]).

    q_t comes from the observation at t; q_next_t from the true next observation with the
    hidden state after step t (before any reset), so it is Q at t + 1 within an episode
    and Q of the final observation at an episode's end.
    """

    def unroll(params, hidden, seq: Sequences):
        def step(h, x):
            obs, next_obs, done = x
            h, q = agent.apply(params, h, agent_inputs(obs))
            _, q_next = agent.apply(params, h, agent_inputs(next_obs))
            h = jnp.where(done[:, None, None], jnp.zeros_like(h), h)
            return h, (q, q_next)

        _, (q, q_next) = jax.lax.scan(step, hidden, (seq.obs.obs, seq.next_obs.obs, seq.done))
        return q, q_next

    return unroll


def make_loss(agent: AgentRNN, mixer: Mixer, *, gamma: float, burn_in: int, td_lambda: float = 0.0):
    """loss_fn(params: QMIXParams, target_params: QMIXParams, seq, weight [T, B]) -> (loss, metrics)."""
    unroll = make_unroll(agent)

    def loss_fn(params: QMIXParams, target_params: QMIXParams, seq: Sequences, weight):
        sg = jax.lax.stop_gradient
        T = seq.reward.shape[0]
        if burn_in:
            # time-major fields are cut at burn_in; the stored carry (no T axis) starts the warm-up
            warm = time_slice(seq, slice(None, burn_in))
            seq = time_slice(seq, slice(burn_in, None))
            hidden = sg(_final_hidden(agent, params.agent, warm))
            h_target = sg(_final_hidden(agent, target_params.agent, warm))
            weight = weight[burn_in:]
        else:
            hidden = h_target = seq.carry
        q, q_next = unroll(params.agent, hidden, seq)
        _, q_next_target = unroll(target_params.agent, h_target, seq)
        q_taken = jnp.take_along_axis(q, seq.action[..., None].astype(jnp.int32), axis=-1)[..., 0]
        q_tot = mixer.apply(params.mixer, q_taken, seq.obs.state)
        chosen = double_q_choice(sg(q_next), q_next_target, seq.next_obs.avail)
        q_tot_next = mixer.apply(target_params.mixer, chosen, seq.next_obs.state)
        if td_lambda:
            y = lambda_targets(seq.reward, seq.terminated, seq.done, q_tot_next, gamma, td_lambda)
        else:
            y = td_targets(seq.reward, seq.terminated, q_tot_next, gamma)
        td = q_tot - y
        loss = jnp.sum(weight * jnp.square(td)) / jnp.maximum(jnp.sum(weight > 0), 1)
        metrics = {
            "q_mean": sg(jnp.mean(q_tot)),
            "target_mean": sg(jnp.mean(y)),
            "td_abs": sg(jnp.mean(jnp.abs(td))),
            "learn_steps": jnp.asarray(T - burn_in, jnp.float32),
        }
        return loss, metrics

    return loss_fn


def time_slice(seq: Sequences, index: slice) -> Sequences:
    """Time-major sequences [T, B, ...] cut to `index` along T; the carry [B, ...] is kept."""
    return jax.tree.map(lambda x: x[index], seq._replace(carry=None))._replace(carry=seq.carry)


def _final_hidden(agent: AgentRNN, params, seq: Sequences) -> jax.Array:
    def step(h, x):
        obs, done = x
        h, _ = agent.apply(params, h, agent_inputs(obs))
        return jnp.where(done[:, None, None], jnp.zeros_like(h), h), None

    return jax.lax.scan(step, seq.carry, (seq.obs.obs, seq.done))[0]


def masked_epsilon_greedy(
    key, q: jax.Array, avail: jax.Array, epsilon
) -> tuple[jax.Array, jax.Array]:
    """Epsilon-greedy over available actions: q, avail [..., A] -> (action [...], log mu(a|s))."""
    k_explore, k_rand = jax.random.split(key)
    greedy = jnp.argmax(jnp.where(avail, q, MASKED_Q), axis=-1).astype(jnp.int32)
    rand = jax.random.categorical(k_rand, jnp.where(avail, 0.0, MASKED_Q)).astype(jnp.int32)
    explore = jax.random.uniform(k_explore, greedy.shape) < epsilon
    action = jnp.where(explore, rand, greedy)
    n_avail = jnp.maximum(jnp.sum(avail, axis=-1), 1)
    prob = epsilon / n_avail + (1.0 - epsilon) * (action == greedy)
    return action, jnp.log(prob)


def time_major(items: Sequences) -> Sequences:
    """Replayed items [B, T, ...] -> time-major [T, B, ...] with the team reward [T, B]."""
    seq = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), items._replace(carry=None))
    reward = seq.reward.mean(axis=-1) if seq.reward.ndim == 3 else seq.reward
    return seq._replace(reward=reward, carry=items.carry)


def check_config(config: Config) -> None:
    """The qmix section against the run: burn-in inside a sequence, a buffer that holds a rollout."""
    check_key(
        config.qmix.burn_in < config.rollout_len,
        "qmix.burn_in",
        f"must be below rollout_len ({config.rollout_len}), the replayed sequence length",
    )
    check_replay(config)


def make(
    config: Config, obs_shape, action_spec: ActionSpec, *, correct_staleness: bool = True
) -> Algorithm:
    """QMIX for a multi-agent env with discrete actions (`obs_shape` an MAObs of shapes).

    Acts on MAObs [B] with the agents' GRU state [B, N, H] as its carry; learns from
    replayed Sequences [batch, T] (the fused loop's items: one per env per rollout).
    """
    try:
        (n, d), (s,), _ = (tuple(x) for x in obs_shape)
    except (TypeError, ValueError):
        raise ConfigError(
            f"config key 'env_backend': qmix needs a multi-agent env (jaxmarl), got "
            f"observations of shape {tuple(obs_shape)}"
        ) from None
    if not action_spec.discrete:
        raise ConfigError(
            "config key 'algo': qmix needs discrete actions; for continuous MPE use maddpg"
        )
    cfg = config.qmix
    agent = AgentRNN(cfg.hidden_dim, action_spec.num_actions)
    mixer = Mixer(cfg.mixer_embed, cfg.hyper_hidden)
    optimizer = make_optimizer(cfg.lr, cfg.max_grad_norm)
    update_target = periodic_target(cfg.target_update_every, cfg.target_tau)
    loss_fn = make_loss(agent, mixer, gamma=cfg.gamma, burn_in=cfg.burn_in, td_lambda=cfg.td_lambda)
    epsilon = epsilon_schedule(
        cfg.eps_start, cfg.eps_end, cfg.eps_fraction * config.total_env_steps
    )

    def init_carry(batch: int):
        return jnp.zeros((batch, n, cfg.hidden_dim), jnp.float32)

    def init(key):
        k_agent, k_mixer, k_state = jax.random.split(key, 3)
        params = QMIXParams(
            agent.init(k_agent, init_carry(1), jnp.zeros((1, n, d + n))),
            mixer.init(k_mixer, jnp.zeros((1, n)), jnp.zeros((1, s))),
        )
        return init_state(params, optimizer, k_state, with_target=True)

    def act(params, obs: MAObs, key, env_steps=0, carry=None):
        carry = init_carry(obs.obs.shape[0]) if carry is None else carry
        h, q = agent.apply(params.agent, carry, agent_inputs(obs.obs))
        action, log_prob = masked_epsilon_greedy(key, q, obs.avail, epsilon(env_steps))
        return ActOutput(action, log_prob, jnp.zeros(action.shape, jnp.float32), h)

    def greedy(params, obs: MAObs, carry=None):
        """(action [B, N], next carry): the argmax over available actions."""
        carry = init_carry(obs.obs.shape[0]) if carry is None else carry
        h, q = agent.apply(params.agent, carry, agent_inputs(obs.obs))
        return jnp.argmax(jnp.where(obs.avail, q, MASKED_Q), axis=-1).astype(jnp.int32), h

    def value(params, obs: MAObs):
        return jnp.zeros(obs.obs.shape[:-1], jnp.float32)

    def update(state: LearnerState, items: Sequences, fresh=True):
        """One gradient step on replayed sequences (`fresh` unused: replay has no fresh/reused batches)."""
        seq = time_major(items)
        w, _ = sample_weights(correct_staleness, state.version, seq.version, config.staleness)
        return replay_step(loss_fn, optimizer, state, seq, w, update_target)

    def schedules(env_steps):
        return {"epsilon": epsilon(env_steps)}

    return Algorithm(
        "qmix",
        SEQUENCES,
        init,
        act,
        value,
        greedy,
        guarded(update),
        loss_fn,
        (agent, mixer),
        schedules=schedules,
        init_carry=init_carry,
    )


__all__ = [
    "AgentRNN",
    "Mixer",
    "QMIXParams",
    "agent_inputs",
    "double_q_choice",
    "lambda_targets",
    "make",
    "make_loss",
    "make_unroll",
    "masked_epsilon_greedy",
    "td_targets",
    "time_major",
    "time_slice",
]

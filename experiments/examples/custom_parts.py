"""Your own env, network and algorithm, trained by tianjax fused and async.

    python experiments/examples/custom_parts.py               # both modes, 100k env steps each
    python experiments/examples/custom_parts.py --steps 4096  # a quick check (what the tests run)

Three parts a user writes, each in plain JAX / Flax:

- `Catch`, a gymnax-API env (stateless `reset(key, params)` / `step(key, state, action,
  params)` with auto-reset): a ball falls down a 10x5 grid, the paddle on the bottom row
  moves left, stays or moves right; +1 for a catch, -1 for a miss, 9 steps an episode.
  A random policy scores about -0.6, a perfect one +1.
- `CatchNet`, a flax module returning (logits, value), used instead of tianjax's built-in
  actor-critic.
- A2C with the staleness weight, registered as "a2c". Its objective, for a [T, B] batch
  with behaviour versions v_i, learner version V, tau_i = V - v_i:

      w_i  = w(tau_i) * min(rho_bar, pi_0(a_i|s_i) / mu(a_i|s_i))   (tianjax.core.staleness)
      A_i  = GAE(lambda) advantages from the behaviour critic
      L    = mean_i w_i * ( -log pi(a_i|s_i) A_i + c_v/2 (V(s_i) - G_i)^2 - c_e H[pi(.|s_i)] )

  With fresh samples (tau = 0, mu = pi_0) every w_i is 1: plain A2C.

Fused mode passes the parts as Python objects (`tianjax.train(config, env=Catch(),
network=CatchNet(3))`). Async mode runs actors in other processes, which build the parts
from the config by name: `env: custom_parts:Catch` and `network.module:
custom_parts:make_network` (this file's directory reaches the actors on their PYTHONPATH),
and `imports: [custom_parts]`, which registers "a2c" in every process.
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments import spaces

import tianjax
from tianjax.algos import Algorithm, actor_critic
from tianjax.core import distributions as D
from tianjax.core import gae, gradient_step, guarded, init_state, make_optimizer
from tianjax.core import staleness as S

ROWS, COLS = 10, 5


# ----------------------------------------------------------------------------- the env
@struct.dataclass
class CatchState:
    ball_row: jax.Array
    ball_col: jax.Array
    paddle: jax.Array


@struct.dataclass
class CatchParams:
    rows: int = ROWS
    cols: int = COLS


class Catch:
    """gymnax API: reset(key, params) -> (obs, state); step(...) -> 6 values, auto-reset."""

    name = "Catch"

    @property
    def default_params(self) -> CatchParams:
        return CatchParams()

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (ROWS, COLS), jnp.float32)

    def action_space(self, params):
        return spaces.Discrete(3)

    def _obs(self, s: CatchState):
        grid = jnp.zeros((ROWS, COLS), jnp.float32)
        grid = grid.at[s.ball_row, s.ball_col].set(1.0)
        return grid.at[ROWS - 1, s.paddle].set(1.0)

    def reset(self, key, params=None):
        s = CatchState(jnp.int32(0), jax.random.randint(key, (), 0, COLS), jnp.int32(COLS // 2))
        return self._obs(s), s

    def step(self, key, state: CatchState, action, params=None):
        paddle = jnp.clip(state.paddle + action.astype(jnp.int32) - 1, 0, COLS - 1)
        s = CatchState(state.ball_row + 1, state.ball_col, paddle)
        done = s.ball_row == ROWS - 1
        reward = jnp.where(done, jnp.where(s.ball_col == paddle, 1.0, -1.0), 0.0)
        final_obs = self._obs(s)
        reset_obs, reset_state = self.reset(key, params)
        state = jax.tree.map(lambda r, c: jnp.where(done, r, c), reset_state, s)
        obs = jnp.where(done, reset_obs, final_obs)
        return obs, state, reward, done, jnp.bool_(False), {"final_observation": final_obs}


# ----------------------------------------------------------------------------- the network
class CatchNet(nn.Module):
    """A shared 64-unit trunk over the flattened grid; (logits [B, A], value [B])."""

    num_actions: int

    @nn.compact
    def __call__(self, obs):
        x = obs.reshape(obs.shape[:-2] + (-1,)).astype(jnp.float32)
        x = nn.relu(nn.Dense(64)(x))
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(x)
        return logits, nn.Dense(1)(x)[..., 0]


def make_network(obs_shape, action_spec) -> nn.Module:
    """The factory `network.module` names: built from the env's spaces in every process."""
    return CatchNet(action_spec.num_actions)


# ----------------------------------------------------------------------------- the algorithm
LR, GAMMA, LAMBDA, VF_COEF, ENT_COEF, MAX_GRAD_NORM = 1e-2, 0.99, 0.95, 0.5, 0.01, 0.5


class A2CBatch(NamedTuple):
    obs: jax.Array  # [T, B, ...]
    action: jax.Array  # [T, B]
    advantage: jax.Array  # [T, B]
    target: jax.Array  # [T, B] return target G
    weight: jax.Array  # [T, B] staleness weight w_i (1 when fresh)


def a2c_loss(apply_fn):
    def loss_fn(params, batch: A2CBatch):
        dist, value = apply_fn(params, batch.obs)
        w = batch.weight
        pg = -jnp.mean(w * D.log_prob(dist, batch.action) * batch.advantage)
        v = 0.5 * jnp.mean(w * jnp.square(value - batch.target))
        ent = jnp.mean(w * D.entropy(dist))
        return pg + VF_COEF * v - ENT_COEF * ent, {
            "policy_loss": pg,
            "value_loss": v,
            "entropy": ent,
        }

    return loss_fn


def make_a2c(config, obs_shape, action_spec, *, correct_staleness: bool = True) -> Algorithm:
    """A2C for tianjax's protocol (tianjax/core/algorithm.py): one gradient step per batch."""
    policy = actor_critic(config, obs_shape, action_spec)  # honours network.module / network=
    optimizer = make_optimizer(LR, MAX_GRAD_NORM)  # constant learning rate
    loss_fn = a2c_loss(policy.apply)

    def init(key):
        k_net, k_state = jax.random.split(key)
        return init_state(policy.init_params(k_net), optimizer, k_state)

    def update(state, traj, fresh=True):  # fresh: False for a reuse pass (no schedule here uses it)
        last_value = policy.value(state.params, traj.last_obs)
        v_t = jnp.concatenate([traj.behaviour_value[1:], last_value[None]], axis=0)
        r_t = traj.reward + GAMMA * traj.bootstrap_value  # truncation bootstraps
        discount_t = GAMMA * (1.0 - traj.done.astype(jnp.float32))
        adv = jax.vmap(gae, in_axes=(1, 1, None, 1, 1), out_axes=1)(
            r_t, discount_t, LAMBDA, traj.behaviour_value, v_t
        )
        if correct_staleness:
            w, mask = S.staleness_weights(state.version, traj.version, config.staleness)
            dist, _ = policy.apply(state.params, traj.obs)
            rho = S.truncated_ratio(
                D.log_prob(dist, traj.action), traj.behaviour_log_prob, config.staleness.rho_bar
            )
            w = S.normalise(w * rho, mask) if config.staleness.normalise else w * rho
        else:
            w = jnp.ones(traj.reward.shape, jnp.float32)
        batch = A2CBatch(traj.obs, traj.action, adv, adv + traj.behaviour_value, w)
        params, opt_state, metrics = gradient_step(
            loss_fn, optimizer, state.params, state.opt_state, batch
        )
        metrics["weight_min"], metrics["weight_max"] = jnp.min(w), jnp.max(w)
        return state._replace(
            params=params, opt_state=opt_state, version=state.version + 1
        ), metrics

    return Algorithm(
        "a2c",
        "onpolicy",
        init,
        policy.act,
        policy.value,
        policy.greedy,
        guarded(update),
        loss_fn,
        policy.network,
    )


tianjax.algos.register("a2c", make_a2c)


# ----------------------------------------------------------------------------- training
def config(mode: str, steps: int, run_dir: str | None = None) -> dict:
    base = {
        "algo": "a2c",
        "env_backend": "gymnax",
        "total_env_steps": steps,
        "num_envs": 16,
        "rollout_len": 16,
        "log_every": 8,
        "target_return": 0.8,
        "eval": {"episodes": 0},
        "run_dir": run_dir,
    }
    if mode == "fused":
        return dict(base, mode="fused")
    return dict(
        base,
        mode="async",
        num_actors=2,
        env="custom_parts:Catch",
        imports=["custom_parts"],
        network={"module": "custom_parts:make_network"},
        staleness={"schedule": "polynomial"},
    )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000, help="env steps per mode")
    ap.add_argument("--modes", default="fused,async")
    ap.add_argument("--run-dir", default=None, help="parent directory of the runs")
    args = ap.parse_args(argv)
    out = {}
    for mode in args.modes.split(","):
        run_dir = f"{args.run_dir}/{mode}" if args.run_dir else None
        if mode == "fused":
            result = tianjax.train(
                config(mode, args.steps, run_dir),
                env=Catch(),
                network=CatchNet(3),
                verbose=False,
                progress=False,
            )
        else:
            result = tianjax.train(config(mode, args.steps, run_dir), verbose=False, progress=False)
        s = result.summary
        out[mode] = s
        print(
            f"{mode:6s} a2c Catch: {s['env_steps']:,} env steps, {s['updates']:,} updates, "
            f"return (last 100 episodes) {s['final_return']:.2f}, wall {s['wall_time_s']:.1f} s "
            f"(compile {s['compile_time_s']:.1f} s), mean staleness "
            f"{s.get('staleness_mean', 0.0):.2f}",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()

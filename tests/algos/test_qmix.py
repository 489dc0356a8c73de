"""QMIX: the mixer is monotonic in every agent's Q; targets by hand; burn-in and resets."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tianjax.algos.qmix import loss as Q
from tianjax.core.types import MAObs, Sequences

N, S = 3, 4
MIXER = Q.Mixer(embed_dim=8, hyper_hidden=16)
_apply = jax.jit(MIXER.apply)
_grad = jax.jit(jax.grad(lambda p, q, s: MIXER.apply(p, q, s), argnums=1))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**30),
    scale=st.floats(0.1, 10.0),
    i=st.integers(0, N - 1),
    delta=st.floats(1e-3, 5.0),
)
def test_mixer_is_monotonic_in_each_agent_q(seed, scale, i, delta):
    k_p, k_q, k_s = jax.random.split(jax.random.key(seed), 3)
    params = MIXER.init(k_p, jnp.zeros((N,)), jnp.zeros((S,)))
    q = scale * jax.random.normal(k_q, (N,))
    s = scale * jax.random.normal(k_s, (S,))
    assert bool(jnp.all(_grad(params, q, s) >= 0))  # dQ_tot / dq_i >= 0 for every agent
    assert float(_apply(params, q.at[i].add(delta), s)) >= float(_apply(params, q, s)) - 1e-5


def _randomised(params, seed):
    """Every leaf of `params` drawn at random (biases too), so each term of a formula counts."""
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        treedef, [0.7 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )


def _np(params):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), params["params"])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _agent_np(p, h, x):
    """AgentRNN written out: Dense -> relu -> GRU (flax's gates) -> Dense; h [H], x [D + N]."""
    dense = lambda q, v: v @ q["kernel"] + q.get("bias", 0.0)  # noqa: E731
    g = p["GRUCell_0"]
    x = np.maximum(dense(p["Dense_0"], x), 0.0)
    r = _sigmoid(dense(g["ir"], x) + dense(g["hr"], h))
    z = _sigmoid(dense(g["iz"], x) + dense(g["hz"], h))
    n = np.tanh(dense(g["in"], x) + r * dense(g["hn"], h))
    h = (1.0 - z) * n + z * h
    return h, dense(p["Dense_1"], h)


def _mixer_np(p, q, s):
    """Mixer written out: w2(s) . elu(q W1(s) + b1(s)) + b2(s) for one q [N], s [S]."""
    dense = lambda name, v: v @ p[name]["kernel"] + p[name]["bias"]  # noqa: E731
    relu = lambda v: np.maximum(v, 0.0)  # noqa: E731
    w1 = np.abs(dense("hyper_w1", relu(dense("hyper_w1_hidden", s)))).reshape(len(q), -1)
    b1 = dense("hyper_b1", s)
    w2 = np.abs(dense("hyper_w2", relu(dense("hyper_w2_hidden", s))))
    b2 = dense("hyper_b2", relu(dense("hyper_b2_hidden", s)))[0]
    x = q @ w1 + b1
    return float(np.where(x > 0, x, np.expm1(x)) @ w2 + b2)


def test_target_by_hand_on_a_two_agent_batch():
    mixer = Q.Mixer(embed_dim=2, hyper_hidden=2)
    params = mixer.init(jax.random.key(7), jnp.zeros((2,)), jnp.zeros((1,)))
    # every weight drawn at random (the state-conditioned biases start at zero), so that
    # each term of the formula below counts
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(8), len(leaves))
    params = jax.tree.unflatten(
        treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    )
    p = jax.tree.map(np.asarray, params["params"])
    assert abs(p["hyper_b1"]["kernel"]).min() > 0 and abs(p["hyper_b2"]["kernel"]).min() > 0
    # two transitions, two agents, three actions; the second agent cannot take action 2 next
    q_next_online = jnp.array(
        [[[1.0, 3.0, 2.0], [0.5, 0.1, 9.0]], [[4.0, 0.0, 1.0], [2.0, 3.0, 1.0]]]
    )
    q_next_target = jnp.array(
        [[[10.0, 20.0, 30.0], [-1.0, -2.0, -3.0]], [[7.0, 8.0, 9.0], [0.5, 0.25, 0.125]]]
    )
    avail = jnp.array([[[True, True, True], [True, True, False]]] * 2)
    reward = jnp.array([1.0, -0.5])
    terminated = jnp.array([False, True])
    state = jnp.array([[0.3], [-1.2]])
    gamma = 0.9
    # double Q by hand: online argmax among available, target's value of it
    # transition 0: agent 0 -> action 1 (20), agent 1 -> action 0 (9.0 is masked) (-1)
    # transition 1: agent 0 -> action 0 (7), agent 1 -> action 1 (0.25)
    chosen = np.array([[20.0, -1.0], [7.0, 0.25]])
    np.testing.assert_array_equal(Q.double_q_choice(q_next_online, q_next_target, avail), chosen)

    q_tot_0 = _mixer_np(p, chosen[0], np.asarray(state[0]))  # the mixer written out
    expected = [1.0 + gamma * q_tot_0, -0.5]  # terminated: no bootstrap
    mixed = mixer.apply(params, jnp.asarray(chosen), state)
    np.testing.assert_allclose(mixed[0], q_tot_0, rtol=1e-5)
    y = Q.td_targets(reward, terminated, mixed, gamma)
    np.testing.assert_allclose(y, expected, rtol=1e-5)


def test_lambda_targets_by_hand_stop_at_episode_ends():
    # one sequence of 4 steps (B = 1): the episode is truncated after step 1 (done, not
    # terminated: it bootstraps from its final observation, and the lambda-return stops)
    r = jnp.array([[1.0], [2.0], [0.5], [-1.0]])
    v = jnp.array([[10.0], [20.0], [30.0], [40.0]])
    terminated = jnp.zeros((4, 1), bool)
    done = jnp.array([[False], [True], [False], [False]])
    g, lam = 0.9, 0.5
    y3 = -1.0 + g * 40.0  # the sequence's last step: one-step
    y2 = 0.5 + g * ((1 - lam) * 30.0 + lam * y3)
    y1 = 2.0 + g * 20.0  # the episode ended: only its final observation's value
    y0 = 1.0 + g * ((1 - lam) * 10.0 + lam * y1)
    y = Q.lambda_targets(r, terminated, done, v, g, lam)
    np.testing.assert_allclose(y[:, 0], [y0, y1, y2, y3], rtol=1e-6)
    # a terminated step bootstraps nothing, and the step before it chains onto its reward
    y = Q.lambda_targets(r, terminated.at[2, 0].set(True), done.at[2, 0].set(True), v, g, lam)
    np.testing.assert_allclose(y[1:3, 0], [y1, 0.5], rtol=1e-6)
    # lambda = 0 is the one-step target; lambda = 1 the discounted sum to the cut
    np.testing.assert_allclose(
        Q.lambda_targets(r, terminated, done, v, g, 0.0),
        Q.td_targets(r, terminated, v, g),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        Q.lambda_targets(r, terminated, done, v, g, 1.0)[2:, 0],
        [0.5 + g * (-1.0 + g * 40.0), -1.0 + g * 40.0],
        rtol=1e-6,
    )


def test_agent_and_team_qs_start_near_zero_on_smax_states():
    """At init the Qs are small against SMAX 3m's rewards (a win is worth about 1) on every
    state, so the first targets are set by rewards, not by the init's noise (LeCun init:
    agent Qs up to 0.28, Q_tot up to 2.8 on these states)."""
    from tianjax.envs.marl import make_jaxmarl

    env = make_jaxmarl("SMAX_3m")
    obs, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(0), 64))  # [64, N, ...]
    n, d = obs.obs.shape[1:]
    agent = Q.AgentRNN(hidden_dim=64, num_actions=obs.avail.shape[-1])
    mixer = Q.Mixer(embed_dim=32, hyper_hidden=64)
    x = jnp.concatenate([obs.obs, jnp.broadcast_to(jnp.eye(n), (64, n, n))], axis=-1)
    h0 = jnp.zeros((64, n, 64))
    for seed in range(3):
        k_a, k_m = jax.random.split(jax.random.key(seed))
        _, q = agent.apply(agent.init(k_a, h0, x), h0, x)
        q_tot = mixer.apply(mixer.init(k_m, q[..., 0], obs.state), q.max(-1), obs.state)
        assert float(jnp.abs(q).max()) < 0.1
        assert float(jnp.abs(q_tot).max()) < 0.25


def _seq(key, T=6, B=2, D=5, A=4, H=8):
    ks = jax.random.split(key, 5)
    obs = jax.random.normal(ks[0], (T + 1, B, N, D))
    state = jax.random.normal(ks[1], (T + 1, B, S))
    avail = jnp.ones((T + 1, B, N, A), bool)
    done = jnp.zeros((T, B), bool).at[2, 0].set(True)
    return Sequences(
        obs=MAObs(obs[:-1], state[:-1], avail[:-1]),
        action=jax.random.randint(ks[2], (T, B, N), 0, A),
        reward=jax.random.normal(ks[3], (T, B)),
        next_obs=MAObs(obs[1:], state[1:], avail[1:]),
        terminated=done,
        done=done,
        carry=jnp.zeros((B, N, H)),
        version=jnp.zeros((T, B), jnp.int32),
    )


def test_hidden_state_resets_after_an_episode_end_and_next_q_is_the_next_step():
    agent = Q.AgentRNN(hidden_dim=8, num_actions=4)
    seq = _seq(jax.random.key(0))
    params = agent.init(jax.random.key(1), jnp.zeros((2, N, 8)), jnp.zeros((2, N, 5 + N)))
    q, q_next = Q.make_unroll(agent)(params, seq.carry, seq)
    # within an episode, Q of the next observation is the next step's Q
    np.testing.assert_allclose(q_next[:-1, 1], q[1:, 1], rtol=1e-5, atol=1e-6)
    # env 0 ended at step 2: step 3 starts from a zero hidden state
    _, q3 = agent.apply(params, jnp.zeros((N, 8)), Q.agent_inputs(seq.obs.obs[3, 0]))
    np.testing.assert_allclose(q[3, 0], q3, rtol=1e-5, atol=1e-6)


def test_burn_in_steps_carry_no_loss():
    agent, mixer = Q.AgentRNN(hidden_dim=8, num_actions=4), Q.Mixer(embed_dim=8, hyper_hidden=16)
    seq = _seq(jax.random.key(2))
    params = Q.QMIXParams(
        agent.init(jax.random.key(3), jnp.zeros((2, N, 8)), jnp.zeros((2, N, 5 + N))),
        mixer.init(jax.random.key(4), jnp.zeros((2, N)), jnp.zeros((2, S))),
    )
    loss_fn = Q.make_loss(agent, mixer, gamma=0.99, burn_in=2)
    w = jnp.ones(seq.reward.shape)
    base, m = loss_fn(params, params, seq, w)
    assert float(m["learn_steps"]) == 4
    # rewards of burn-in steps do not enter the loss; rewards after it do
    bumped = seq._replace(reward=seq.reward.at[:2].add(100.0))
    np.testing.assert_allclose(loss_fn(params, params, bumped, w)[0], base, rtol=1e-6)
    bumped = seq._replace(reward=seq.reward.at[3].add(100.0))
    assert float(loss_fn(params, params, bumped, w)[0]) > float(base) + 1.0
    # zero-weight (e.g. too stale) samples drop out
    w3 = w.at[3].set(0.0)
    np.testing.assert_allclose(
        loss_fn(params, params, bumped, w3)[0], loss_fn(params, params, seq, w3)[0], rtol=1e-6
    )


def test_loss_targets_by_hand_per_step():
    """The loss's target y_t at every step of one 4-step sequence, worked out by hand.

    The sequence starts mid-episode (a stored hidden state), is cut by a time limit after
    step 1 (done, not terminated: the final observation bootstraps, the lambda-return
    stops, the hidden state resets) and terminates after step 3. At two steps the online
    network's favourite next action is unavailable. The per-step targets are read from the
    real loss: with all weight on step t, d loss / d b2 (the mixer's output bias) is
    2 (Q_tot_t - y_t), and Q_tot_t is the mixer written out on the agents written out.
    """
    T, N2, D2, S2, A2, H = 4, 2, 2, 2, 3, 3
    agent, mixer = Q.AgentRNN(hidden_dim=H, num_actions=A2), Q.Mixer(embed_dim=2, hyper_hidden=2)

    def init(seed):
        return Q.QMIXParams(
            _randomised(
                agent.init(
                    jax.random.key(seed), jnp.zeros((1, N2, H)), jnp.zeros((1, N2, D2 + N2))
                ),
                seed + 1,
            ),
            _randomised(
                mixer.init(jax.random.key(seed), jnp.zeros((1, N2)), jnp.zeros((1, S2))), seed + 2
            ),
        )

    online, target = init(10), init(20)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(T + 1, N2, D2))  # obs[t + 1] follows obs[t] within an episode
    final_obs = rng.normal(size=(N2, D2))  # the final observation of the episode cut after step 1
    state = rng.normal(size=(T + 1, S2))
    final_state = rng.normal(size=(S2,))
    next_obs = obs[1:].copy()
    next_obs[1] = final_obs
    next_state = state[1:].copy()
    next_state[1] = final_state
    carry = rng.normal(size=(N2, H))
    action = rng.integers(0, A2, size=(T, N2))
    reward = np.array([1.0, -0.5, 2.0, 0.25])
    done = np.array([False, True, False, True])
    terminated = np.array([False, False, False, True])
    g, lam = 0.9, 0.6

    # the agents by hand: online and target unrolls, Q of the next observation from the
    # hidden state after the step, the hidden state reset after an episode's end
    ids = np.eye(N2)
    a_on, a_tg = _np(online.agent), _np(target.agent)
    h_on, h_tg = carry.copy(), carry.copy()
    q_taken, q_next_on, q_next_tg = np.zeros((T, N2)), np.zeros((T, N2, A2)), np.zeros((T, N2, A2))
    for t in range(T):
        for i in range(N2):
            h_on[i], q = _agent_np(a_on, h_on[i], np.concatenate([obs[t, i], ids[i]]))
            q_taken[t, i] = q[action[t, i]]
            _, q_next_on[t, i] = _agent_np(a_on, h_on[i], np.concatenate([next_obs[t, i], ids[i]]))
            h_tg[i], _ = _agent_np(a_tg, h_tg[i], np.concatenate([obs[t, i], ids[i]]))
            _, q_next_tg[t, i] = _agent_np(a_tg, h_tg[i], np.concatenate([next_obs[t, i], ids[i]]))
        if done[t]:
            h_on[:], h_tg[:] = 0.0, 0.0
    avail_next = np.ones((T, N2, A2), bool)
    avail_next[0, 0, q_next_on[0, 0].argmax()] = False  # agent 0 cannot take it at step 1
    avail_next[2, 1, q_next_on[2, 1].argmax()] = False  # agent 1 cannot take it at step 3
    # double Q: the target's Q of the online network's best available next action
    chosen = np.zeros((T, N2))
    for t in range(T):
        for i in range(N2):
            best = max(
                (a for a in range(A2) if avail_next[t, i, a]), key=lambda a: q_next_on[t, i, a]
            )
            chosen[t, i] = q_next_tg[t, i, best]
    assert chosen[0, 0] != q_next_tg[0, 0, q_next_on[0, 0].argmax()]  # the mask matters here
    v = [_mixer_np(_np(target.mixer), chosen[t], next_state[t]) for t in range(T)]
    q_tot = np.array([_mixer_np(_np(online.mixer), q_taken[t], state[t]) for t in range(T)])

    y_lambda = np.zeros(T)
    y_lambda[3] = reward[3]  # terminated: no bootstrap
    y_lambda[2] = reward[2] + g * ((1 - lam) * v[2] + lam * y_lambda[3])
    y_lambda[1] = reward[1] + g * v[1]  # cut by the time limit: its final observation's value only
    y_lambda[0] = reward[0] + g * ((1 - lam) * v[0] + lam * y_lambda[1])
    y_one_step = np.array(
        [reward[0] + g * v[0], reward[1] + g * v[1], reward[2] + g * v[2], reward[3]]
    )

    avail = np.ones((T + 1, N2, A2), bool)
    avail[1:] = avail_next
    f32 = lambda x: jnp.asarray(x[:, None], jnp.float32)  # noqa: E731  [T, ...] -> [T, B = 1, ...]
    seq = Sequences(
        obs=MAObs(f32(obs[:-1]), f32(state[:-1]), jnp.asarray(avail[:-1, None])),
        action=jnp.asarray(action[:, None], jnp.int32),
        reward=f32(reward),
        next_obs=MAObs(f32(next_obs), f32(next_state), jnp.asarray(avail_next[:, None])),
        terminated=jnp.asarray(terminated[:, None]),
        done=jnp.asarray(done[:, None]),
        carry=jnp.asarray(carry[None], jnp.float32),
        version=jnp.zeros((T, 1), jnp.int32),
    )
    for lam_, expected in ((lam, y_lambda), (0.0, y_one_step)):
        loss_fn = Q.make_loss(agent, mixer, gamma=g, burn_in=0, td_lambda=lam_)
        grad_b2 = jax.jit(jax.grad(lambda p, w: loss_fn(p, target, seq, w)[0]))
        y = []
        for t in range(T):
            w = jnp.zeros((T, 1)).at[t, 0].set(1.0)
            d_b2 = grad_b2(online, w).mixer["params"]["hyper_b2"]["bias"][0]
            y.append(q_tot[t] - float(d_b2) / 2)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5, err_msg=f"lambda {lam_}")


def test_rollout_stores_the_hidden_state_that_replays_its_actions():
    """Acting and learning unroll the same GRU: from the carry stored with a sequence, the
    replayed greedy actions are the ones taken (epsilon 0), across an episode end (MPE
    episodes are 26 steps; two rollouts of 20 steps cross one)."""
    from tianjax.algos import make_algorithm
    from tianjax.config import load_config
    from tianjax.core.rollout import make_rollout
    from tianjax.envs.marl import make_jaxmarl

    env = make_jaxmarl("MPE_simple_spread_v3")
    cfg = load_config(
        {
            "algo": "qmix",
            "env": env.name,
            "env_backend": "jaxmarl",
            "num_envs": 3,
            "rollout_len": 20,
            "total_env_steps": 600,
            "qmix": {"eps_start": 0.0, "eps_end": 0.0, "hidden_dim": 16},
        }
    )
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec)
    params = algo.init(jax.random.key(0)).params
    init, rollout = make_rollout(env, algo, 3, 20)
    rollout = jax.jit(rollout)
    state = init(jax.random.key(1))
    state, first, _ = rollout(params, 0, state)
    state, items, _ = rollout(params, 1, state)
    assert float(jnp.abs(items.carry).sum()) > 0  # the second sequence starts mid-episode
    assert bool(items.done.any())
    seq = Q.time_major(items)
    agent = Q.AgentRNN(16, env.action_spec.num_actions)
    q, _ = Q.make_unroll(agent)(params.agent, seq.carry, seq)
    replayed = jnp.argmax(jnp.where(seq.obs.avail, q, Q.MASKED_Q), axis=-1)
    np.testing.assert_array_equal(replayed, seq.action)
    np.testing.assert_array_equal(seq.version, 1)
    assert seq.reward.shape == (20, 3)  # the team reward


def test_fused_qmix_learns_from_replayed_sequences(tmp_path):
    import tianjax

    result = tianjax.train(
        {
            "algo": "qmix",
            "env": "MPE_simple_spread_v3",
            "env_backend": "jaxmarl",
            "num_envs": 4,
            "rollout_len": 16,
            "total_env_steps": 1024,
            "log_every": 4,
            "target_return": None,
            "compile_cache": None,
            "qmix": {
                "learning_starts": 256,
                "batch_size": 4,
                "hidden_dim": 16,
                "target_update_every": 2,
            },
        },
        run_dir=str(tmp_path / "q"),
        progress=False,
        verbose=False,
    )
    # 16 iterations, learning from the 4th on (256 env steps collected): 13 updates
    assert result.summary["updates"] == 13 and result.summary["skipped_updates"] == 0
    assert np.isfinite(result.metrics["loss"][-1]) and result.metrics["target_synced"][-1] >= 0
    from tianjax.runtime.record.saved_runs import evaluate_run

    # `tianjax eval`: the checkpoint restores, and the greedy policy carries its GRU state
    out = evaluate_run(str(tmp_path / "q"), episodes=2)
    assert out.returns.shape == (2,) and np.all(np.isfinite(out.returns)) and out.returns.max() < 0
    assert (
        out.won is None and out.win_rate is None and "win rate" not in out.line()
    )  # MPE reports none

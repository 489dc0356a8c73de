"""The adaptive balance controller: a set-point on the staleness of consumed samples.

TianJi (He et al., arXiv 2502.20190) relaxes the dependencies between actors and the
learner and balances production p against consumption c. `BalanceController`
(tianjax.runtime.balance.limits) measures p, c and staleness and enforces limits; this
class decides. Every `period_s` it compares the mean staleness tau of the samples consumed since its last
decision with `balance.target_staleness` and moves one of its actions, within bounds:

- `window`: trajectories all actors together may have in flight or pooled (credits), from
  one batch (k; two where the reserve below applies) to the bound per actor times the
  actors; below one per actor, the last actors wait (fresher samples, fewer produced). With a
  learner that cannot keep up, the pool holds the whole window and a trajectory waits about
  window / k updates (k trajectories per batch), so tau ~ window / k: the step is
  proportional, dW = round(gain * k * (target - tau)), at least 1;
- `publish_every`: tau grows by about (publish_every - 1) / 2;
- `max_reuse`: every extra pass over a batch is an update that ages what waits in the pool.

Too stale by more than publish_every and reuse can add ((publish_every - 1) / 2 + reuse):
the window shrinks; by less: publish_every falls first, then reuse, then the window (the
cheapest knobs to give up first). Too fresh: the window grows first (throughput), then reuse (only used when
the learner would otherwise idle), then publish_every. Inside a dead band around the
target nothing moves.

Why it cannot cycle: decisions are clocked in updates, and a measurement always reflects
the last action. After a move, the samples of the next `depth` updates were made (or
granted) under the old setting: the window's trajectories already in flight or pooled
take up to window / k updates to be consumed, parameters reach the actors publish_every
updates later, reuse passes and the update in flight add theirs,

    depth = ceil(window / k) + publish_every + max_reuse + 1        (of the new actions)

so those updates' samples are not measured, and the next decision waits for at least
`min_updates` updates measured after them (and a period_s of wall time). Each decision
then sees the plant's response to the last move alone, and the proportional step (gain
1/2 of the error in the tau ~ window / k model) closes half the error per decision: no
limit cycle however long an update takes (a time-clocked controller with 1.6 s updates
decided on samples from before its last two moves and swung between the bounds).

The reserve. Which side sets the pace is measured every period by `pace`: the learner when
the actors waited for credits (their heartbeats' `waiting_credit` over their wall time) for
a larger share of the period than the learner was idle (no update running). While the
learner is the slower side, the window's floor is two batches (2k) instead of one, if the
set-point has room for it: tau at 2k less what publish_every can take off stays within the
dead band above the target. The window then stops at 2k on the way down, publish_every
pays for the extra batch, and on target with room for it the window rises to 2k; where
there is no room the set-point comes first and the floor stays k. Why a second batch, and
why it costs an update: the learner takes a batch (handing its credits back) one update
before it can run (tianjax.runtime.learner.learner, QUEUED), so with a window of k the
actors have about two updates' time to deliver the batch after next, and its samples are
about 2 updates old when learned from; with 2k they have three updates' time, at tau about
3. In a learner-bound run the learner idles only when the actors miss that deadline, so
the reserve is worth its update of staleness where their delivery time varies by more
than an update (a loaded machine); at the shipped target 2 with publish_every 1 it never
fits (tau 3 is 50% over the target and nothing else can take it off).

Off-policy (DQN) the set-point is `balance.target_replay_ratio` (samples learned per
sample produced), held within `replay_tolerance` (5%, so that a run ends within 10% of
its setting with room to spare). Two actions serve it:

- `replay_scale` in [1 - tolerance, 1]: the learner paces its gradient steps to
  target x scale, so gradient steps per arriving trajectory are
  target x scale x trajectory samples / batch size (`balance_grad_steps`). It is the fast
  knob. A learner behind (the runtime holding actors' credits back because it owes more
  gradient steps than a trajectory per actor, `throttled`, or c / p below what it paces
  to) takes fewer gradient steps per arrival, so the actors go on producing;
- `window`: a learner still behind at the lowest scale shrinks the actors' window (fewer
  trajectories in flight, so fresher replay). Two calm periods in a row (no credit held,
  c / p at what it paces to) take the scale back up a step (the hysteresis keeps a learner
  just short of the target from flipping between two scales every period); at scale 1
  and ahead of the target (c / p above it: a backlog being caught up), the window grows.

With `balance.mode: fixed` the actions never move (the runtime section's values).
Pure: no sockets, threads or clocks; the caller passes `now` (seconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field


def pace(credit_wait: float, learner_idle: float) -> bool:
    """Whether the learner is the slower side: the actors waited for credits (the learner
    behind, holding their slots) for a larger share of their time than the learner waited
    for data (idle, no batch ready). Shares of wall time, over the same stretch of it."""
    return credit_wait > learner_idle


@dataclass(frozen=True)
class Actions:
    """What the runtime applies: the credits window split over actors, the publication
    period and the reuse budget."""

    window: int  # trajectories in flight or pooled, all actors together
    publish_every: int
    max_reuse: int
    replay_scale: float = 1.0  # off-policy: the learner paces to target replay ratio x this

    def credits(self, rank: int, n_actors: int) -> int:
        """Credits of the actor at `rank` (0-based, in registration order): the window split
        as evenly as integers allow; a window smaller than the actors leaves the last ones
        idle (fresher samples at the cost of throughput)."""
        n = max(n_actors, 1)
        return self.window // n + (rank < self.window % n)


@dataclass
class AdaptiveBalance:
    """Decides `Actions` from measurements. `max_*` are the bounds (the runtime section's
    values); every action starts at its bound."""

    adaptive: bool
    target_staleness: float
    batch_trajectories: int  # k: trajectories per update
    max_credits_per_actor: int
    max_publish_every: int
    max_reuse: int
    n_actors: int = 1
    period_s: float = 1.0
    deadband: float = 0.15  # relative: no move while |tau - target| <= deadband * target
    gain: float = 0.5
    target_replay_ratio: float | None = None  # off-policy set-point
    traj_samples: int = 0  # samples per trajectory (off-policy: for balance_grad_steps)
    batch_size: int = 0  # off-policy: samples per gradient step
    replay_tolerance: float = 0.05  # off-policy: replay_scale stays in [1 - this, 1]

    min_updates: int = 2  # on-policy: updates measured before a decision (after the skip)

    actions: Actions = field(init=False)
    moves: int = 0
    decisions: int = 0  # periods decided (a move or a hold)
    last_action: str = "hold"
    _last_decision: float | None = None
    _tau_sum: float = 0.0
    _tau_n: int = 0
    _updates: int = 0  # updates measured since the last decision (after the skip)
    _skip: int = 0  # updates still to pass unmeasured after the last move (the pipeline)
    _measured: float = float("nan")
    _calm: int = 0  # off-policy: decisions in a row at which the learner kept up
    learner_bound: bool | None = None  # the pace, as of the newest period that measured it
    reserve: bool = False  # on-policy: the window's floor is two batches (see decide)
    _pace_at: tuple | None = None  # (busy_s, credit_wait_s, actor_wall_s, now) at the last decision

    def __post_init__(self):
        self.actions = Actions(
            self.max_credits_per_actor * max(self.n_actors, 1),
            self.max_publish_every,
            self.max_reuse,
        )

    # ------------------------------------------------------------------ measurements
    def consumed(self, tau_sum: float, samples: int) -> None:
        """One update's samples learned from (reuse counted) and the sum of their staleness;
        the updates right after a move are not measured (they show the setting before it)."""
        if self._skip > 0:
            self._skip -= 1
            return
        self._tau_sum += float(tau_sum)
        self._tau_n += samples
        self._updates += 1

    @property
    def updates_needed(self) -> int:
        """Updates still to be consumed before the next on-policy decision may be taken."""
        return self._skip + max(self.min_updates - self._updates, 0)

    def depth(self, actions: Actions | None = None) -> int:
        """Updates after which every sample consumed was made under `actions`: the window's
        batches, the publication period, the reuse passes and the update in flight."""
        a = actions or self.actions
        k = max(self.batch_trajectories, 1)
        return -(-a.window // k) + a.publish_every + a.max_reuse + 1

    def reachable(self) -> tuple[float, str]:
        """The most staleness the bounds allow (about, in updates: the largest window's
        batches waiting behind the first, the update in flight, half the largest
        publication period and every reuse pass) and the bound that limits it."""
        k = max(self.batch_trajectories, 1)
        window = self.max_credits_per_actor * max(self.n_actors, 1)
        most = (window - k) / k + 1 + (self.max_publish_every - 1) / 2 + self.max_reuse
        return most, (
            f"runtime.credits_per_actor {self.max_credits_per_actor} x {max(self.n_actors, 1)} "
            f"actors in batches of {k}, runtime.publish_every {self.max_publish_every}, "
            f"runtime.max_reuse {self.max_reuse}"
        )

    def unreachable(self) -> str | None:
        """One line when the set-point is above what the bounds allow (said at start), else
        None."""
        if not self.adaptive or self.target_replay_ratio is not None:
            return None
        most, bounds = self.reachable()
        if self.target_staleness <= most * (1 + self.deadband):
            return None
        return (
            f"balance.target_staleness {self.target_staleness:g} is out of reach: the bounds "
            f"({bounds}) allow a mean staleness of about {most:.2f}; raise "
            "runtime.credits_per_actor or runtime.publish_every"
        )

    def actors_changed(self, n_actors: int) -> None:
        """An actor left or joined: the window keeps its per-actor share, within bounds."""
        n_old, n_new = max(self.n_actors, 1), max(n_actors, 1)
        self.n_actors = n_actors
        if n_new != n_old:
            share = self.actions.window / n_old
            self._set(window=self._clip_window(round(share * n_new)))

    # ------------------------------------------------------------------ decisions
    def decide(
        self,
        now: float,
        production_rate: float = 0.0,
        consumption_rate: float = 0.0,
        throttled: bool = False,
        busy_s: float | None = None,
        credit_wait_s: float | None = None,
        actor_wall_s: float | None = None,
    ) -> Actions:
        """The actions from now on. Moves at most once per `period_s`. Off-policy,
        `throttled` says the runtime is holding actors' credits back (the learner behind).
        On-policy, the pace (see `pace`): `busy_s`, the learner's seconds with an update
        running, and `credit_wait_s` of `actor_wall_s`, the actors' seconds waiting for a
        credit of their wall time (summed over actors), all counted from any fixed start."""
        if self._last_decision is None:
            self._last_decision = now
            self._pace_at = (busy_s, credit_wait_s, actor_wall_s, now)
            return self.actions
        if now - self._last_decision < self.period_s:
            return self.actions
        self._last_decision = now
        self.decisions += 1
        self._measure_pace(now, busy_s, credit_wait_s, actor_wall_s)
        tau_n, tau_sum = self._tau_n, self._tau_sum
        self._tau_sum, self._tau_n = 0.0, 0
        self.last_action = "hold"
        if not self.adaptive:
            return self.actions
        if self.target_replay_ratio is not None:
            self._decide_replay(production_rate, consumption_rate, throttled)
            return self.actions
        if self._updates < self.min_updates:
            # too few updates measured since the pipeline flushed: keep measuring
            self._tau_sum, self._tau_n = tau_sum, tau_n
            return self.actions
        self._updates = 0
        if tau_n == 0:
            return self.actions  # nothing learned this period: nothing measured
        tau = tau_sum / tau_n
        self._measured = tau
        error = self.target_staleness - tau  # > 0: fresher than asked
        a = self.actions
        floor = self._reserve_floor(tau)
        # NOTE: never narrower than half a window step (1 / k updates of tau), or it dithers
        band = max(self.deadband * self.target_staleness, 0.55 / max(self.batch_trajectories, 1))
        if abs(error) <= band:
            if a.window < floor:  # on target, and room for the reserve: take it
                self._set("reserve_up", window=floor)
            return self.actions
        step = max(1, round(self.gain * self.batch_trajectories * abs(error)))
        # what publish_every and reuse can take off at most: a larger error needs the window
        small = (a.publish_every - 1) / 2 + a.max_reuse
        if error < 0 and -error > small and a.window > floor:
            self._set("window_down", window=max(floor, self._clip_window(a.window - step)))
        elif error < 0:  # too stale, by less than the small knobs add (or the reserve held)
            if a.publish_every > 1:
                self._set("publish_every_down", publish_every=a.publish_every - 1)
            elif a.max_reuse > 0:
                self._set("reuse_down", max_reuse=a.max_reuse - 1)
            elif a.window > self._clip_window(0):  # below the reserve: the set-point comes first
                self._set("window_down", window=self._clip_window(a.window - step))
        else:  # fresher than needed: spend the slack on throughput
            if a.window < self._clip_window(10**9):
                self._set("window_up", window=self._clip_window(a.window + step))
            elif a.max_reuse < self.max_reuse:
                self._set("reuse_up", max_reuse=a.max_reuse + 1)
            elif a.publish_every < self.max_publish_every:
                self._set("publish_every_up", publish_every=a.publish_every + 1)
        return self.actions

    def _measure_pace(self, now: float, busy_s, credit_wait_s, actor_wall_s) -> None:
        """`learner_bound` from this period's shares (see `pace`); unchanged when the
        period measured none (no update finished, no heartbeat, an actor restarted)."""
        before, self._pace_at = self._pace_at, (busy_s, credit_wait_s, actor_wall_s, now)
        if before is None or None in before or None in (busy_s, credit_wait_s, actor_wall_s):
            return
        wall = actor_wall_s - before[2]
        wait = credit_wait_s - before[1]
        span = now - before[3]
        if wall <= 0 or wait < 0 or span <= 0:
            return
        idle = min(max(1.0 - (busy_s - before[0]) / span, 0.0), 1.0)
        self.learner_bound = pace(wait / wall, idle)

    def _reserve_floor(self, tau: float) -> int:
        """The window's floor: one batch (k), or two (the reserve) while the learner is
        the slower side and the set-point has room for it: tau at a window of 2k (about
        one update per batch more than at k: tau ~ window / k), less what publish_every can
        take off, within the dead band above the target. (Reuse cannot: with the learner
        behind, a fresh batch always waits, and no reuse pass runs.)"""
        base, k = self._clip_window(0), self.batch_trajectories
        two = self._clip_window(2 * k)
        a = self.actions
        at_two = tau + (two - a.window) / max(k, 1) - (a.publish_every - 1) / 2
        self.reserve = (
            bool(self.learner_bound)
            and two > base
            and (at_two <= self.target_staleness * (1 + self.deadband))
        )
        return two if self.reserve else base

    def _decide_replay(self, p: float, c: float, throttled: bool) -> None:
        if p <= 0 or c <= 0:
            return  # nothing produced, or learning not started (dqn.learning_starts)
        ratio = c / p
        self._measured = ratio
        a = self.actions
        # NOTE: a band narrower than the tolerance, so that the ratio is held within it
        band = min(self.deadband, self.replay_tolerance / 2)
        paced = self.target_replay_ratio * a.replay_scale  # what the learner paces to
        floor = 1.0 - self.replay_tolerance
        step = self.replay_tolerance / 2
        if throttled or ratio < paced * (1 - band):  # behind
            self._calm = 0
            if a.replay_scale > floor + 1e-9:
                self._set("grad_steps_down", replay_scale=max(floor, a.replay_scale - step))
            elif a.window > self._clip_window(0):
                self._set("window_down", window=self._clip_window(a.window - 1))
            return
        self._calm += 1
        if a.replay_scale < 1.0 - 1e-9:
            if self._calm >= 2:  # the full ratio back, a step at a time
                self._calm = 0
                self._set("grad_steps_up", replay_scale=min(1.0, a.replay_scale + step))
        elif ratio > self.target_replay_ratio * (1 + band) and a.window < self._clip_window(10**9):
            self._set("window_up", window=self._clip_window(a.window + 1))

    def _clip_window(self, w: int) -> int:
        # NOTE: never below one batch (k trajectories): the learner must be able to fill it
        upper = max(self.n_actors, 1) * self.max_credits_per_actor
        return int(min(max(w, self.batch_trajectories, 1), upper))

    def _set(self, name: str = "resize", **changes) -> None:
        self.actions = Actions(**{**self.actions.__dict__, **changes})
        if name != "resize":  # a resize follows the actors; a move is a decision
            self.moves += 1
            self.last_action = name
        # what was measured so far shows the setting before: start again after the pipeline
        self._tau_sum, self._tau_n, self._updates = 0.0, 0, 0
        self._skip = self.depth()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """What a checkpoint keeps, JSON-able: the actions, the counts of moves and decisions,
        the last measurement and the pace. Not its clock (a restarted learner's periods
        start afresh) nor a half-measured period (the pipeline refills first)."""
        return {
            "actions": dict(self.actions.__dict__),
            "n_actors": self.n_actors,
            "moves": self.moves,
            "decisions": self.decisions,
            "last_action": self.last_action,
            "measured": self._measured,
            "calm": self._calm,
            "learner_bound": self.learner_bound,
            "reserve": self.reserve,
        }

    def load_state_dict(self, state: dict) -> None:
        """Goes on from `state_dict()`'s: the actions within this controller's bounds (a run
        resumed with other runtime values), measuring after the pipeline's depth."""
        a = state["actions"]
        self.n_actors = int(state["n_actors"])
        self.actions = Actions(
            window=self._clip_window(int(a["window"])),
            publish_every=min(max(int(a["publish_every"]), 1), self.max_publish_every),
            max_reuse=min(max(int(a["max_reuse"]), 0), self.max_reuse),
            replay_scale=float(a.get("replay_scale", 1.0)),
        )
        self.moves, self.decisions = int(state["moves"]), int(state["decisions"])
        self.last_action = str(state["last_action"])
        self._measured, self._calm = float(state["measured"]), int(state["calm"])
        self.learner_bound, self.reserve = state["learner_bound"], bool(state["reserve"])
        self._tau_sum, self._tau_n, self._updates = 0.0, 0, 0
        self._skip = self.depth()

    # ------------------------------------------------------------------ reporting
    def metrics(self) -> dict:
        """Set-point, measurement and action (the report plots them over time)."""
        a = self.actions
        out = {
            "balance_adaptive": float(self.adaptive),
            "balance_window": a.window,
            "balance_credits_per_actor": a.window / max(self.n_actors, 1),
            "balance_publish_every": a.publish_every,
            "balance_max_reuse": a.max_reuse,
            "balance_moves": self.moves,
            # the pace as the controller last measured it (1: the learner, 0: the
            # actors, nan: not yet), and whether the window keeps a batch in reserve
            "balance_learner_bound": float("nan")
            if self.learner_bound is None
            else float(self.learner_bound),
            "balance_reserve": float(self.reserve),
        }
        if self.target_replay_ratio is not None:
            out["balance_target_replay_ratio"] = self.target_replay_ratio
            out["balance_replay_ratio_measured"] = self._measured
            out["balance_replay_scale"] = a.replay_scale
            if self.batch_size:
                out["balance_grad_steps"] = (
                    self.target_replay_ratio * a.replay_scale * self.traj_samples / self.batch_size
                )
        else:
            out["balance_target_staleness"] = self.target_staleness
            out["balance_staleness_measured"] = self._measured
        return out


__all__ = ["Actions", "AdaptiveBalance", "pace"]

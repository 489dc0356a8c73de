"""The evaluator process of a sync or async run (RLlib's evaluation worker): it takes the
learner's parameters as an actor does, from the conflating parameter channel (the newest
version wins), and, whenever an evaluation is due (tianjax.runtime.evaluation.schedule),
plays `eval.episodes` episodes of exactly that version (a copy it holds: the learner goes
on meanwhile), then sends the evaluation's fields to the learner as one control message
({"type": "evaluation", "version", "env_steps", "age_s", eval_*}), which the learner logs
as a record of its own.

It never holds the learner up: it takes no credits, sends no trajectories and does not
register as an actor (sync mode does not wait for it), and the learner's publisher does
not wait for any subscriber. Its videos and the best params it writes into the run
directory itself. The launcher supervises it as it does the actors
(tianjax.launch.supervisor): an evaluator that dies is started again, up to
`runtime.max_actor_restarts` times, and one out of restarts is said in one line while the
run goes on. It stops when the learner says so, when its launcher dies, or when no
parameters came for `runtime.heartbeat_timeout_s`.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

from tianjax.config import Config
from tianjax.core.types import ParamsMessage
from tianjax.runtime.actor.actor import LEARNER_GONE
from tianjax.runtime.evaluation.play import Evaluation
from tianjax.runtime.evaluation.schedule import EvalSchedule
from tianjax.runtime.process import shutdown
from tianjax.transport.channels import ControlClient, ParamSubscriber
from tianjax.transport.security import secure_context

IDENTITY = "evaluator"  # its name on the control channel
# NOTE: the learner publishes after every update (tens a second); verifying and decoding
# each message costs the evaluator CPU that a busy machine's actors need. The channel keeps
# only the newest message, so reading less often loses nothing: at most every READ_S with
# every_updates, and with every_s not before the next evaluation is due.
READ_S = 0.25


class Evaluator:
    def __init__(self, config: Config, endpoints: dict, run_key: bytes, run_dir: str):
        self.config = config
        rt = config.runtime
        # the env, the compiled policy, the video maker: built first, while the learner
        # compiles too (an env that cannot render says so now, in this process's log)
        self.evaluation = Evaluation(config, run_dir)
        self.evaluation.compile()
        template = jax.eval_shape(self.evaluation.algo.init, jax.random.key(0)).params
        self.net = secure_context(run_key, rt, server=False)
        net = dict(ctx=self.net.ctx, handshake=self.net.handshake, limit=self.net.limit)
        self.params_in = ParamSubscriber(
            run_key,
            endpoints["params"],
            ParamsMessage(template, np.zeros((), np.int64)),
            max_bytes=int(rt.max_message_mb * 2**20),
            **net,
        )
        self.control = ControlClient(run_key, endpoints["control"], identity=IDENTITY, **net)
        self.schedule = EvalSchedule(config.eval, now=time.monotonic())
        self.sent = 0

    def _stop_asked(self) -> bool:
        if shutdown.requested.is_set():
            raise SystemExit(143)
        if self.control.to is None:
            return False
        while (msg := self.control.recv(0)) is not None:
            if msg.get("type") == "stop":
                return True
        return False

    def run(self) -> int:
        rt = self.config.runtime
        last_heard = time.monotonic()
        waited = rt.connect_timeout_s  # for the first parameters: a learner may be compiling
        try:
            while not self._stop_asked():
                time.sleep(self._idle_s(time.monotonic(), rt.heartbeat_s))
                got = self.params_in.latest(int(1000 * rt.heartbeat_s))
                now = time.monotonic()
                if got is None:
                    if now - last_heard > waited:
                        print(
                            f"tianjax: evaluator stopping: no parameters from the learner for "
                            f"{waited:.0f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                        return LEARNER_GONE
                    continue
                last_heard, waited = now, rt.heartbeat_timeout_s
                version, message = got
                self.control.to = self.params_in.source  # (a restarted learner's too)
                if not self.schedule.due(version, now):
                    continue
                steps = int(message.env_steps)
                fields = self.evaluation.evaluate(jax.device_put(message.params), version, steps)
                msg = {
                    "type": "evaluation",
                    "version": int(version),
                    "env_steps": steps,
                    "age_s": time.monotonic() - now,
                    **fields,
                }
                if self.control.send(msg):
                    self.sent += 1
                self.schedule.done(version, now)
            return 0
        finally:
            self.close()

    def _idle_s(self, now: float, most: float) -> float:
        """How long to leave the parameter channel unread (at most `most`: stops and a
        vanished learner are still noticed)."""
        s = self.schedule
        if s.every_s is not None and self.control.to is not None:
            return min(max(s.last_time + s.every_s - now, 0.0), most)
        return READ_S

    def close(self) -> None:
        self.evaluation.close()
        for ch in (self.params_in, self.control):
            ch.close()
        self.net.close()


__all__ = ["IDENTITY", "READ_S", "Evaluator"]

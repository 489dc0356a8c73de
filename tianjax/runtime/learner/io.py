"""The learner's sockets and the threads that serve them: parameters out (PUB; the
publisher thread signs and sends them), trajectories in (PULL; the receiver
thread checks and decodes them) and control (ROUTER; read by the learner's
loop through its ingress), all in the run's own secure context (its gatekeeper admits only
this run's peers), and the descriptor reserve that keeps checkpoints possible however
many peers connect.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from tianjax.config import Config
from tianjax.core.types import ParamsMessage
from tianjax.errors import RunFailed
from tianjax.runtime.learner.inflight import snapshot, to_host
from tianjax.runtime.learner.publisher import Publisher
from tianjax.runtime.learner.receiver import Receiver
from tianjax.runtime.process.resources import FdReserve, raise_fd_limit
from tianjax.transport.channels import ControlServer, ParamPublisher, TrajectoryReceiver
from tianjax.transport.security import secure_context
from tianjax.transport.sockets import address, process_incarnation


class GatekeeperStopped(RunFailed):
    """The ZAP handler's thread died (nothing can be admitted any more), or the
    connection limit's (nothing bounds one host's connections any more)."""


class LearnerIO:
    """`template`: an actor message's ShapeDtypeStructs; `place`: what the receiver thread
    applies to each decoded message (tianjax.runtime.learner.sharded_update); `env_steps()`:
    the count stamped on each parameter message as it is sent. `endpoints`, `ipc_dir`, `listen_fds`:
    as `Learner`'s."""

    def __init__(
        self,
        config: Config,
        run_key,
        template,
        place: Callable | None,
        env_steps: Callable[[], int],
        endpoints: dict | None = None,
        ipc_dir: str | None = None,
        listen_fds: dict | None = None,
    ):
        rt = config.runtime
        host, ep, fds = rt.bind_host, endpoints or {}, listen_fds or {}
        # peers hold descriptors here before they authenticate: use all the OS allows, and
        # keep a reserve for checkpoints (see tianjax.runtime.process.resources)
        raise_fd_limit()
        self.fd_reserve = FdReserve()
        # its own context: the gatekeeper (ZAP handler) admits only this run's peers, and
        # each host may hold only so many connections on each socket
        self.net = secure_context(
            run_key, rt, server=True, max_connections_per_host=config.max_connections_per_host
        )
        net = dict(
            ctx=self.net.ctx,
            handshake=self.net.handshake,
            host=host,
            transport=rt.transport,
            ipc_dir=ipc_dir,
            limit=self.net.limit,
        )
        # one name per learner process, and this process's incarnation on all three sockets:
        # actors take the address from the parameters, register with it and send only to
        # it, and nothing addressed to another learner, or to this one before a restart, is
        # taken (transport/codec.py)
        name, inc = f"learner-{jax.process_index()}", process_incarnation()
        self.address = address(name, inc)
        self.params_pub = ParamPublisher(
            run_key,
            endpoint=ep.get("params"),
            **net,
            use_fd=fds.get("params"),
            sender=name,
            incarnation=inc,
        )
        self.traj_in = TrajectoryReceiver(
            run_key,
            template,
            endpoint=ep.get("traj"),
            **net,
            use_fd=fds.get("traj"),
            name=name,
            incarnation=inc,
            hwm=rt.recv_hwm,
            max_bytes=int(rt.max_message_mb * 2**20),
        )
        self.control = ControlServer(
            run_key,
            endpoint=ep.get("control"),
            **net,
            use_fd=fds.get("control"),
            sender=name,
            incarnation=inc,
        )
        # checks and decodes trajectories on its own thread while updates run, and (one
        # process, one device) starts their copies to the device there
        self.rx = Receiver(self.traj_in, self.net.ctx, place=place)
        # and signs and sends parameters on another
        # NOTE: the count goes out as it is when the message is sent (an int read across
        # threads), so actor-side schedules (epsilon) never hear of an older one than need be
        self.publisher = Publisher(
            self.params_pub, stamp=lambda m: m._replace(env_steps=np.asarray(env_steps(), np.int64))
        )
        self._offered = None  # (tag, version, params) of the last state offered

    @property
    def endpoints(self) -> dict:
        return {
            "params": self.params_pub.endpoint,
            "traj": self.traj_in.endpoint,
            "control": self.control.endpoint,
        }

    def publish(self, state, tag: int, version: int, env_steps: int) -> None:
        """Offers `state`'s parameters to the publisher thread without waiting for them:
        a device copy of (version, params) whose host copy is under way, so the version
        sent is the device's own (exact even while a skipped update is still unread). In a
        multi-process run (where a device copy would be a program every process must run)
        the host copy is made here, with the loop's `version`. `tag` names the state: the
        same tag again re-sends what was copied for it."""
        if self._offered is None or self._offered[0] != tag:
            if jax.process_count() == 1:
                version, params = snapshot((state.version, state.params))
            else:
                params = to_host(state.params)
            self._offered = (tag, version, params)
        _, version, params = self._offered
        self.publisher.offer(version, ParamsMessage(params, np.asarray(env_steps, np.int64)))

    def check(self) -> None:
        """Raises GatekeeperStopped if the gatekeeper's thread is gone (every server socket
        then refuses all connections: the run cannot take a new or restarted actor), or the
        connection limit's (connections would go uncounted, and its reports would pile up)."""
        for part, what, consequence in (
            (self.net.gatekeeper, "connection gatekeeper", "no actor can connect"),
            (
                self.net.limit,
                "connection-limit thread",
                "connections from one host are no longer bounded",
            ),
        ):
            if part is not None and not part.alive:
                why = (
                    f": {type(part.error).__name__}: {part.error}" if part.error is not None else ""
                )
                raise GatekeeperStopped(
                    f"the learner's {what} stopped{why}; {consequence}, so the learner stops"
                )

    def stop_threads(self) -> None:
        """Joins the receiver and publisher threads (the publisher sends what it holds first)."""
        self.rx.stop()
        self.publisher.stop()

    def stop_actors(self, error: str | None = None) -> None:
        """Tells every actor to stop; with `error`, that the run failed (they exit non-zero)."""
        self.control.broadcast(
            {"type": "stop"} if error is None else {"type": "stop", "error": error[:500]}
        )

    def close(self) -> None:
        self.rx.close()
        self.publisher.stop()
        for ch in (self.params_pub, self.traj_in, self.control):
            ch.close()
        self.net.close()
        self.fd_reserve.close()


__all__ = ["GatekeeperStopped", "LearnerIO"]

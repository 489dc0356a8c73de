"""Listening sockets that the launcher holds for the whole run, so a learner restart never
has to win its ports back.

A learner that dies frees its ports; whoever binds them first gets the actors' next
connections. With `runtime.restart_learner` the launcher therefore binds the learner's
three listening sockets itself and keeps them until the run ends; each learner
incarnation is handed their descriptors (`pass_fds`) and serves them through ZeroMQ's
ZMQ_USE_FD. While no learner is up the ports stay bound by the launcher: no other process
can take them, and actors' reconnects wait in the listen backlog for the next learner.

ipc sockets (`runtime.transport: ipc`) live in a private directory (mode 0700) that the
launcher creates and removes at exit (`PrivateDir`), so no other user can connect to
them or replace them, whatever the umask.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile

CHANNELS = ("params", "traj", "control")
BACKLOG = 256


class PrivateDir:
    """A fresh directory readable by this user only, removed by close()."""

    def __init__(self, prefix: str = "tianjax-"):
        self.path = tempfile.mkdtemp(prefix=prefix)  # mode 0700, whatever the umask
        os.chmod(self.path, 0o700)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HeldPorts:
    """A role's listening sockets (the learner's three `CHANNELS` unless `channels` names
    others: the averager's of learner groups), bound (on random free ports, or ipc paths in
    `ipc_dir`) and held by this process. `endpoints` is what peers connect to; `fds` what
    the role's process serves them through."""

    def __init__(
        self,
        host: str,
        transport: str,
        ipc_dir: str | None = None,
        channels: tuple[str, ...] = CHANNELS,
    ):
        self._socks: dict[str, socket.socket] = {}
        self.endpoints: dict[str, str] = {}
        try:
            for name in channels:
                if transport == "ipc":
                    if ipc_dir is None:
                        raise ValueError("ipc sockets need a private directory")
                    path = os.path.join(ipc_dir, f"{name}.ipc")
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.bind(path)
                    self.endpoints[name] = f"ipc://{path}"
                else:
                    family = socket.AF_INET6 if ":" in host else socket.AF_INET
                    s = socket.socket(family, socket.SOCK_STREAM)
                    s.bind((host.strip("[]"), 0))
                    port = s.getsockname()[1]
                    shown = f"[{host.strip('[]')}]" if family == socket.AF_INET6 else host
                    self.endpoints[name] = f"tcp://{shown}:{port}"
                s.listen(BACKLOG)
                self._socks[name] = s
        except BaseException:
            self.close()
            raise

    @property
    def fds(self) -> dict[str, int]:
        return {name: s.fileno() for name, s in self._socks.items()}

    def close(self) -> None:
        for s in self._socks.values():
            s.close()
        self._socks = {}


__all__ = ["BACKLOG", "CHANNELS", "HeldPorts", "PrivateDir"]

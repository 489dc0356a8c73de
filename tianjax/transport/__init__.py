"""ZeroMQ transport of a TianJi run (arXiv 2502.20190): parameters learner -> actors
(latest version wins), trajectories actors -> learner (high-water marks as backpressure),
control both ways; every message authenticated with a per-run key, every connection with
credentials derived from it (`security`), nothing pickled.

Import the submodules directly (`tianjax.transport.channels`, `.codec`, `.auth`); this
package re-exports their public names.
"""

from tianjax.transport.auth import (
    KEY_ENV,
    InsecureNoAuth,
    MessageAuth,
    RunKey,
    load_key,
    new_run_key,
    write_key_file,
)
from tianjax.transport.channels import (
    ControlClient,
    ControlServer,
    ParamPublisher,
    ParamSubscriber,
    TrajectoryReceiver,
    TrajectorySender,
)
from tianjax.transport.codec import (
    REASONS,
    CodecError,
    Message,
    ReplayGuard,
    TreeSpec,
    decode,
    encode,
)
from tianjax.transport.security import Gatekeeper, Handshake, SecureContext, resolve_security

__all__ = [
    "KEY_ENV",
    "InsecureNoAuth",
    "MessageAuth",
    "RunKey",
    "load_key",
    "new_run_key",
    "write_key_file",
    "ControlClient",
    "ControlServer",
    "ParamPublisher",
    "ParamSubscriber",
    "TrajectoryReceiver",
    "TrajectorySender",
    "REASONS",
    "CodecError",
    "Message",
    "ReplayGuard",
    "TreeSpec",
    "decode",
    "encode",
    "Gatekeeper",
    "Handshake",
    "SecureContext",
    "resolve_security",
]

"""ZeroMQ transport of a TianJi run (arXiv 2502.20190): parameters learner -> actors
(latest version wins), trajectories actors -> learner (high-water marks as backpressure),
control both ways; every message authenticated with a per-run key, every connection with
credentials derived from it (`security`), nothing pickled.

Import from here: the keys and authenticators (`auth`), the three channels (`channels`),
the codec (`codec`), the handshakes (`security`), and `envelope`, which packs a message into
the one frame a conflating parameter socket keeps.
"""

from tianjax.transport import envelope
from tianjax.transport.auth import (
    KEY_ENV,
    InsecureNoAuth,
    MessageAuth,
    RunKey,
    as_authenticator,
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
    BROADCAST,
    REASONS,
    CodecError,
    Message,
    ReplayGuard,
    TreeSpec,
    decode,
    encode,
)
from tianjax.transport.security import (
    Gatekeeper,
    Handshake,
    SecureContext,
    resolve_security,
    secure_context,
)

__all__ = [
    "KEY_ENV",
    "InsecureNoAuth",
    "MessageAuth",
    "RunKey",
    "as_authenticator",  # a run key (or key bytes) as what a channel signs with
    "load_key",
    "new_run_key",
    "write_key_file",
    "ControlClient",
    "ControlServer",
    "ParamPublisher",
    "ParamSubscriber",
    "TrajectoryReceiver",
    "TrajectorySender",
    "BROADCAST",  # the recipient of parameter messages: every actor
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
    "secure_context",  # the SecureContext a role's runtime section asks for
    "envelope",
]

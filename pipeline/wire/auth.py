"""Authentication of control-channel messages with the run's secret.

Every message on the prefill <-> decode channel is ``HMAC-SHA256(secret, payload) || payload``.
The secret is 32 random bytes created once per run directory with mode 0600 (``RUN_DIR/secret``,
:mod:`pipeline.runtime.secret`),
so only processes that can read the run directory (the run's own workers) can produce messages a
worker accepts. A decode worker drops any message whose tag does not verify, and answers only
verified hand-offs, so a peer without the secret can neither inject a request nor obtain a result.
Payloads are msgspec structs: nothing from the network is unpickled.

What this does not do: encrypt (a peer on the path can read prompts and generations) or stop the
replay of a captured message; run on a trusted fabric, or use UCX/IB transports that are not
routed beyond the cluster.
"""

from __future__ import annotations

import hashlib
import hmac

TAG_BYTES = 32


class Unauthenticated(ValueError):
    """A message's tag does not match its payload under the run's secret."""


def sign(secret: bytes, payload: bytes) -> bytes:
    """``tag || payload``."""
    return hmac.new(secret, payload, hashlib.sha256).digest() + payload


def verify(secret: bytes, message: bytes) -> bytes:
    """The payload of ``message``.

    Raises:
        Unauthenticated: the tag is missing or does not match.
    """
    tag, payload = message[:TAG_BYTES], message[TAG_BYTES:]
    if len(tag) < TAG_BYTES or not hmac.compare_digest(tag, hmac.new(secret, payload, hashlib.sha256).digest()):
        raise Unauthenticated("message not signed with this run's secret")
    return payload

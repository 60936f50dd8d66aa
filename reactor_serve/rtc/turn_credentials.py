"""Short-lived TURN credentials from a shared secret: the TURN REST scheme
(draft-uberti-behave-turn-rest), which coturn checks with `use-auth-secret` and
`static-auth-secret` and no user database.

    username   = "<unix time the credential expires>:<tag>"
    credential = base64(HMAC-SHA1(secret, username))

The TURN server recomputes the HMAC from its copy of the secret and refuses a
username whose time has passed. We mint one per session (for the client and for the
server's own peer connection), so a credential copied out of one page is worth one
session's lifetime, instead of a static password handed to everyone for ever.

The tag is what TURN logs show as the user. It is a digest of the session id keyed
by the secret: operators holding a session id can match it to TURN's logs, and
nobody can get the id back from it (the id is the session's capability).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass

__all__ = ["TurnCredentials", "mint_turn_credentials", "session_tag", "turn_password"]

# Hex digits of the keyed digest kept in the tag: 64 bits, plenty to tell sessions
# apart in logs, short enough for TURN servers' username limits (coturn takes 512).
_TAG_HEX = 16


@dataclass(frozen=True)
class TurnCredentials:
    username: str
    credential: str
    # Unix time after which the TURN server refuses them.
    expires_at: int


def turn_password(secret: str, username: str) -> str:
    """base64(HMAC-SHA1(secret, username)): the credential the TURN server expects."""
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def session_tag(secret: str, session_id: str) -> str:
    """The username's tag for `session_id`: keyed by the secret, so it neither gives
    the id away nor can be computed by anyone without the secret."""
    mac = hmac.new(secret.encode(), b"reactor-serve session\x00" + session_id.encode(),
                   hashlib.sha256)
    return mac.hexdigest()[:_TAG_HEX]


def mint_turn_credentials(
    secret: str, ttl_s: int, tag: str, *, now: float | None = None
) -> TurnCredentials:
    """Credentials valid for `ttl_s` seconds from `now` (default: the current time)."""
    if not secret:
        raise ValueError("the TURN secret is empty")
    if ":" in tag:
        # coturn takes the expiry from before the first colon and ignores the rest,
        # but other servers split differently: keep the tag colon-free.
        raise ValueError(f"a TURN username tag cannot contain ':', got {tag!r}")
    expires_at = int(time.time() if now is None else now) + int(ttl_s)
    username = f"{expires_at}:{tag}"
    return TurnCredentials(username, turn_password(secret, username), expires_at)

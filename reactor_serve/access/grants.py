"""`Grant`: what one verified token allows, and the rules that apply it.

Scoped tokens (minted with `authorization_details`, as the official SDKs mint one per
connect) act only on the models they name and on the sessions they started or were
bound to; `max_sessions` caps how many that is. An unscoped token is the key itself:
every model and every session the key started. Either way, a session started under
one key is nothing to a token of another.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Grant", "SessionOwner"]


@dataclass(frozen=True)
class SessionOwner:
    """Who started a session: the key, and the token (its `jti`) it was started with."""

    key_id: str
    token_id: str


@dataclass(frozen=True)
class Grant:
    key_id: str
    token_id: str
    expires_at: float
    scoped: bool = False
    # None: every model the key allows.
    models: tuple[str, ...] | None = None
    sessions: tuple[str, ...] = ()
    max_sessions: int | None = None
    max_session_s: int | None = None

    def allows_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_start(self) -> str | None:
        """Why this token may not start sessions at all, or None."""
        if self.scoped and self.sessions and self.max_sessions is None:
            return "this token is bound to existing sessions and may not start new ones"
        return None

    def allows_session(self, session_id: str, owner: SessionOwner) -> bool:
        if owner.key_id != self.key_id:
            return False
        if not self.scoped:
            return True
        return session_id in self.sessions or owner.token_id == self.token_id

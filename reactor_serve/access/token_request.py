"""The body of `POST /tokens`, checked whole before anything is minted.

The contract is the official platform's, as `reactor_sdk.fetch_jwt` sends it: `null`
(or `{}`) for a token with the key's whole reach, or

    {"authorization_details": [{"type": "session",
        "resources": {"models": {"match": [names]} | {"all": true},
                      "sessions": {"bind": [session ids]}},
        "constraints": {"max_sessions": n, "max_session_duration_seconds": s}}],
     "expires_after": seconds}

Every field is checked for type and range, unknown fields are refused, and each
refusal names the field: a client learns exactly what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_BOUND_SESSIONS",
    "MAX_SESSION_DURATION_S",
    "InvalidTokenRequest",
    "TokenRequest",
]

MAX_SESSION_DURATION_S = 86_400
MAX_BOUND_SESSIONS = 64
_MAX_MODELS = 64
_MAX_SESSIONS_CONSTRAINT = 1000
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SESSION_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")


class InvalidTokenRequest(ValueError):
    """The request body is not a token request; the message names the field."""


@dataclass(frozen=True)
class TokenRequest:
    scoped: bool = False
    models: tuple[str, ...] | None = None
    sessions: tuple[str, ...] = ()
    max_sessions: int | None = None
    max_session_s: int | None = None
    expires_after: int | None = None

    @classmethod
    def parse(cls, body: Any) -> TokenRequest:
        if body is None:
            return cls()
        if not isinstance(body, dict):
            raise InvalidTokenRequest("the body must be null or a JSON object")
        _only(body, {"authorization_details", "expires_after"}, "body")
        expires_after = body.get("expires_after")
        if expires_after is not None:
            expires_after = _integer(expires_after, "expires_after", 1, None)
        details = body.get("authorization_details")
        if details is None:
            return cls(expires_after=expires_after)
        if not isinstance(details, list) or len(details) != 1:
            raise InvalidTokenRequest(
                "authorization_details: a list with exactly one entry of type 'session'")
        parsed = cls.from_detail(details[0])
        return cls(scoped=True, models=parsed.models, sessions=parsed.sessions,
                   max_sessions=parsed.max_sessions, max_session_s=parsed.max_session_s,
                   expires_after=expires_after)

    @classmethod
    def from_detail(cls, detail: Any) -> TokenRequest:
        where = "authorization_details[0]"
        if not isinstance(detail, dict):
            raise InvalidTokenRequest(f"{where}: must be an object")
        _only(detail, {"type", "resources", "constraints"}, where)
        if detail.get("type") != "session":
            raise InvalidTokenRequest(f"{where}.type: must be 'session'")
        resources = detail.get("resources")
        if not isinstance(resources, dict):
            raise InvalidTokenRequest(f"{where}.resources: must be an object")
        _only(resources, {"models", "sessions"}, f"{where}.resources")
        models = _models(resources.get("models"), f"{where}.resources.models")
        sessions: tuple[str, ...] = ()
        if "sessions" in resources:
            sessions = _sessions(resources["sessions"], f"{where}.resources.sessions")
        constraints = detail.get("constraints", {})
        if not isinstance(constraints, dict):
            raise InvalidTokenRequest(f"{where}.constraints: must be an object")
        _only(constraints, {"max_sessions", "max_session_duration_seconds"},
              f"{where}.constraints")
        max_sessions = constraints.get("max_sessions")
        if max_sessions is not None:
            max_sessions = _integer(max_sessions, f"{where}.constraints.max_sessions",
                                    1, _MAX_SESSIONS_CONSTRAINT)
            if max_sessions < len(sessions):
                raise InvalidTokenRequest(
                    f"{where}.constraints.max_sessions: {max_sessions} is fewer than the "
                    f"{len(sessions)} sessions bound")
        duration = constraints.get("max_session_duration_seconds")
        if duration is not None:
            duration = _integer(duration, f"{where}.constraints.max_session_duration_seconds",
                                1, MAX_SESSION_DURATION_S)
        return cls(scoped=True, models=models, sessions=sessions,
                   max_sessions=max_sessions, max_session_s=duration)

    def detail(self) -> dict[str, Any]:
        """The checked request as one `authorization_details` entry (what a token carries)."""
        resources: dict[str, Any] = {
            "models": {"all": True} if self.models is None else {"match": list(self.models)}}
        if self.sessions:
            resources["sessions"] = {"bind": list(self.sessions)}
        detail: dict[str, Any] = {"type": "session", "resources": resources}
        constraints = {name: value for name, value in (
            ("max_sessions", self.max_sessions),
            ("max_session_duration_seconds", self.max_session_s)) if value is not None}
        if constraints:
            detail["constraints"] = constraints
        return detail


def _only(document: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(key)[:40] for key in document if key not in allowed)
    if unknown:
        raise InvalidTokenRequest(f"{where}: unknown field {unknown[0]!r}")


def _integer(value: Any, where: str, low: int, high: int | None) -> int:
    # bool is an int to Python, never to a client.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTokenRequest(f"{where}: must be an integer")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise InvalidTokenRequest(f"{where}: must be {bound}")
    return value


def _models(value: Any, where: str) -> tuple[str, ...] | None:
    if not isinstance(value, dict) or len(value) != 1:
        raise InvalidTokenRequest(f"{where}: must be {{\"match\": [...]}} or {{\"all\": true}}")
    if "all" in value:
        if value["all"] is not True:
            raise InvalidTokenRequest(f"{where}.all: must be true")
        return None
    names = value.get("match")
    if not isinstance(names, list) or not 1 <= len(names) <= _MAX_MODELS:
        raise InvalidTokenRequest(f"{where}.match: a list of 1 to {_MAX_MODELS} model names")
    for index, name in enumerate(names):
        if not isinstance(name, str) or not _MODEL.fullmatch(name):
            raise InvalidTokenRequest(f"{where}.match[{index}]: not a model name")
    return tuple(dict.fromkeys(names))


def _sessions(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, dict) or set(value) != {"bind"}:
        raise InvalidTokenRequest(f"{where}: must be {{\"bind\": [session ids]}}")
    ids = value["bind"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_BOUND_SESSIONS:
        raise InvalidTokenRequest(
            f"{where}.bind: a list of 1 to {MAX_BOUND_SESSIONS} session ids")
    for index, sid in enumerate(ids):
        if not isinstance(sid, str) or not _SESSION_ID.fullmatch(sid):
            raise InvalidTokenRequest(f"{where}.bind[{index}]: not a session id")
    return tuple(dict.fromkeys(ids))

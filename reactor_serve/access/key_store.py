"""`KeyStore`: the API keys and JWT signing key ids in the access database.

Every call is one short transaction, so any number of processes (the ingress
replicas, `reactor keys` on an operator's laptop) share one database safely.
Blocking: callers on an event loop run it in a thread (`KeyCache` does).
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import func, insert, select, update

from reactor_serve.access.api_keys import (
    ApiKey,
    KeyLimits,
    MalformedKey,
    key_digest,
    new_key,
    parse_key,
)
from reactor_serve.access.database import Database
from reactor_serve.access.deployment_secret import DeploymentSecret
from reactor_serve.access.grants import SessionOwner
from reactor_serve.access.schema import api_keys, session_owners, signing_keys

__all__ = [
    "LIMIT_RANGES",
    "InvalidKeySettings",
    "KeyRejected",
    "KeyStore",
    "UnknownKey",
    "check_limits",
]

# The inclusive range each limit may be set to.
LIMIT_RANGES: dict[str, tuple[int, int]] = {
    "max_concurrent": (1, 10_000),
    "starts_per_minute": (1, 100_000),
    "max_session_s": (1, 86_400),
}
_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class InvalidKeySettings(ValueError):
    """A key's name or limits are out of range; the message names the field."""


class UnknownKey(LookupError):
    """No key has this id."""


class KeyRejected(PermissionError):
    """A presented key does not authenticate. `reason` is safe to tell the client:
    an unknown id and a wrong secret read alike, so keys cannot be enumerated."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check_limits(name: str, limits: KeyLimits) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidKeySettings("name: 1 to 200 printable characters")
    if limits.models is not None:
        if not limits.models:
            raise InvalidKeySettings("models: name at least one, or leave it out for all")
        for model in limits.models:
            if not _MODEL.fullmatch(model):
                raise InvalidKeySettings(f"models: {model!r} is not a model name")
    for field, (low, high) in LIMIT_RANGES.items():
        value = getattr(limits, field)
        # bool is an int to Python, never a limit.
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not low <= value <= high):
            raise InvalidKeySettings(f"{field}: must be an integer from {low} to {high}")


class KeyStore:
    def __init__(
        self,
        database: Database,
        secret: DeploymentSecret,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.database = database
        self.secret = secret
        self._pepper = secret.key_pepper
        self._clock = clock

    # ---- keys ------------------------------------------------------------------------

    def create(self, name: str, limits: KeyLimits = KeyLimits()) -> tuple[ApiKey, str]:
        """A new key: (what is stored, the key's text, to be shown once)."""
        check_limits(name, limits)
        made = new_key()
        row = {
            "key_id": made.key_id,
            "name": name,
            "digest": key_digest(made.secret, self._pepper),
            "models": json.dumps(list(limits.models)) if limits.models is not None else None,
            "max_concurrent": limits.max_concurrent,
            "starts_per_minute": limits.starts_per_minute,
            "max_session_s": limits.max_session_s,
            "created_at": self._clock(),
            "revoked_at": None,
        }
        with self._begin() as connection:
            connection.execute(insert(api_keys).values(**row))
        return _api_key(row), made.text

    def list(self) -> list[ApiKey]:
        with self._begin() as connection:
            rows = connection.execute(select(api_keys).order_by(api_keys.c.created_at))
            return [_api_key(row._mapping) for row in rows]

    def get(self, key_id: str) -> ApiKey | None:
        row = self._row(key_id)
        return None if row is None else _api_key(row)

    def get_many(self, key_ids: Iterable[str]) -> dict[str, ApiKey]:
        wanted = sorted(set(key_ids))
        if not wanted:
            return {}
        with self._begin() as connection:
            rows = connection.execute(select(api_keys).where(api_keys.c.key_id.in_(wanted)))
            return {row.key_id: _api_key(row._mapping) for row in rows}

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key (its tokens stop working too); revoking twice keeps the first time."""
        with self._begin() as connection:
            connection.execute(update(api_keys)
                               .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                               .values(revoked_at=self._clock()))
        key = self.get(key_id)
        if key is None:
            raise UnknownKey(key_id)
        return key

    def authenticate(self, text: str) -> ApiKey:
        """The key a client presented, or `KeyRejected` saying why not."""
        try:
            key_id, secret = parse_key(text)
        except MalformedKey as exc:
            raise KeyRejected(str(exc)) from None
        row = self._row(key_id)
        # Compare against a digest even for an unknown id: both take the same time.
        stored = row["digest"] if row is not None else "0" * 64
        if not hmac.compare_digest(key_digest(secret, self._pepper), stored) or row is None:
            raise KeyRejected("unknown API key")
        key = _api_key(row)
        if key.revoked:
            raise KeyRejected("the API key was revoked")
        return key

    # ---- signing key ids -------------------------------------------------------------

    def signing_kids(self) -> dict[str, float | None]:
        """{kid: when it retires (None: current)} of every kid not yet retired, made
        on first use."""
        now = self._clock()
        with self._begin() as connection:
            rows = connection.execute(select(signing_keys)).all()
            if not rows:
                connection.execute(insert(signing_keys).values(
                    kid=secrets.token_hex(8), created_at=now, retire_at=None))
                rows = connection.execute(select(signing_keys)).all()
        return {row.kid: row.retire_at for row in rows
                if row.retire_at is None or row.retire_at > now}

    def rotate_signing_key(self, grace_s: float) -> str:
        """A new current kid; the others keep verifying for `grace_s` (the longest a
        token lives), so nobody holding a token is logged out by the rotation."""
        now = self._clock()
        kid = secrets.token_hex(8)
        with self._begin() as connection:
            connection.execute(update(signing_keys).where(signing_keys.c.retire_at.is_(None))
                               .values(retire_at=now + grace_s))
            connection.execute(insert(signing_keys).values(kid=kid, created_at=now, retire_at=None))
        return kid

    # ---- who started which session ----------------------------------------------------

    def record_owner(self, session_id: str, owner: SessionOwner, model: str,
                     started_at: float | None = None) -> None:
        with self._begin() as connection:
            connection.execute(insert(session_owners).values(
                session_id=session_id, key_id=owner.key_id, token_id=owner.token_id,
                model=model, started_at=self._clock() if started_at is None else started_at))

    def owner(self, session_id: str) -> SessionOwner | None:
        with self._begin() as connection:
            row = connection.execute(select(session_owners)
                                     .where(session_owners.c.session_id == session_id)).first()
        return None if row is None else SessionOwner(row.key_id, row.token_id)

    def live_sessions(self, key_id: str) -> int:
        """The key's sessions not yet ended (waiting and orphaned ones included)."""
        with self._begin() as connection:
            return int(connection.execute(
                select(func.count()).select_from(session_owners)
                .where(session_owners.c.key_id == key_id,
                       session_owners.c.ended_at.is_(None))).scalar_one())

    def starts_since(self, key_id: str, since: float) -> list[float]:
        """When the key's sessions started after `since`, oldest first."""
        with self._begin() as connection:
            return [row[0] for row in connection.execute(
                select(session_owners.c.started_at)
                .where(session_owners.c.key_id == key_id, session_owners.c.started_at > since)
                .order_by(session_owners.c.started_at))]

    def sessions_started_by(self, token_id: str) -> int:
        with self._begin() as connection:
            return int(connection.execute(
                select(func.count()).select_from(session_owners)
                .where(session_owners.c.token_id == token_id)).scalar_one())

    # ---- plumbing --------------------------------------------------------------------

    def _row(self, key_id: str) -> dict[str, Any] | None:
        with self._begin() as connection:
            row = connection.execute(select(api_keys).where(api_keys.c.key_id == key_id)).first()
            return None if row is None else dict(row._mapping)

    def _begin(self) -> Any:
        return self.database.begin()


def _api_key(row: Any) -> ApiKey:
    models = row["models"]
    return ApiKey(
        key_id=row["key_id"],
        name=row["name"],
        limits=KeyLimits(
            models=tuple(json.loads(models)) if models is not None else None,
            max_concurrent=row["max_concurrent"],
            starts_per_minute=row["starts_per_minute"],
            max_session_s=row["max_session_s"],
        ),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
    )

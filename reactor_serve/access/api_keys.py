"""API keys: how one looks, how it is stored, and what it allows.

A key is `rsk_<key id>_<secret>`. The id is public (it names the key in lists, usage
and logs); the secret is 256 random bits, shown once by `reactor keys create` and
stored only as an HMAC under the deployment's secret. So a copy of the database
alone neither contains a usable key nor lets one be checked offline.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field

__all__ = [
    "KEY_PREFIX",
    "MAX_KEY_LENGTH",
    "ApiKey",
    "KeyLimits",
    "MalformedKey",
    "NewKey",
    "key_digest",
    "new_key",
    "parse_key",
]

KEY_PREFIX = "rsk_"
_KEY = re.compile(r"rsk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
# Longest text a key header may hold before it is refused unread.
MAX_KEY_LENGTH = 128


class MalformedKey(ValueError):
    """The text is not an API key of ours (wrong shape, length or characters)."""


@dataclass(frozen=True)
class KeyLimits:
    """What a key's sessions may use. `None`: the server's own limit applies."""

    models: tuple[str, ...] | None = None
    max_concurrent: int | None = None
    starts_per_minute: int | None = None
    max_session_s: int | None = None


@dataclass(frozen=True)
class ApiKey:
    """A stored key: everything but its secret."""

    key_id: str
    name: str
    limits: KeyLimits = field(default_factory=KeyLimits)
    created_at: float = 0.0
    revoked_at: float | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def allows_model(self, model: str) -> bool:
        return self.limits.models is None or model in self.limits.models


@dataclass(frozen=True)
class NewKey:
    """A key just made: the text to hand over once, and what is stored of it."""

    text: str
    key_id: str
    secret: str


def new_key() -> NewKey:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return NewKey(f"{KEY_PREFIX}{key_id}_{secret}", key_id, secret)


def parse_key(text: str) -> tuple[str, str]:
    """(key id, secret) of a key's text, or `MalformedKey` saying what is wrong."""
    if not isinstance(text, str) or not text:
        raise MalformedKey("the API key is empty")
    if len(text) > MAX_KEY_LENGTH:
        raise MalformedKey(f"the API key is longer than {MAX_KEY_LENGTH} characters")
    match = _KEY.fullmatch(text.strip())
    if match is None:
        raise MalformedKey(f"the API key is not a reactor-serve key ({KEY_PREFIX}...)")
    return match[1], match[2]


def key_digest(secret: str, pepper: bytes) -> str:
    """The stored form of a key's secret: HMAC-SHA256 under the deployment's secret."""
    return hmac.new(pepper, secret.encode("ascii"), hashlib.sha256).hexdigest()

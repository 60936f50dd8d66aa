"""Signed access tokens: JWTs minted from an API key, checked on every request.

HS256 only, pinned on both sides, so `alg: none` and an RS256 header carrying our
key as a "public key" are refused before any signature math. The header's `kid` names
the signing key (derived from the deployment's secret), so keys rotate without
logging anyone out. The payload carries the key id (`sub`), a token id (`jti`), the
expiry the server capped, and the checked `authorization_details`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import jwt

from reactor_serve.access.grants import Grant
from reactor_serve.access.token_request import InvalidTokenRequest, TokenRequest

__all__ = [
    "ALGORITHM",
    "ISSUER",
    "MAX_TOKEN_BYTES",
    "TokenRejected",
    "TokenSigner",
    "TokenVerifier",
    "UnknownSigningKey",
]

ALGORITHM = "HS256"
ISSUER = "reactor-serve"
# Far above any token we mint: a longer one is refused before it is parsed.
MAX_TOKEN_BYTES = 8192
# A client's clock may run this far ahead of ours and its fresh token still verify.
_LEEWAY_S = 5
# Three base64url segments, the signature not empty.
_COMPACT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
# Tokens remembered as verified, most recently seen kept.
_REMEMBERED = 10_000


class TokenRejected(PermissionError):
    """A token does not authenticate; `reason` is safe to send to the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnknownSigningKey(TokenRejected):
    """The token names a signing key this verifier does not hold (yet: a rotation
    made by another process is read again before the token is refused)."""


class TokenSigner:
    def __init__(self, kid: str, key: bytes, *, clock: Callable[[], float] = time.time) -> None:
        self.kid = kid
        self._key = key
        self._clock = clock

    def mint(self, key_id: str, request: TokenRequest, lifetime_s: int) -> tuple[str, Grant]:
        now = int(self._clock())
        token_id = secrets.token_urlsafe(12)
        payload: dict[str, Any] = {
            "iss": ISSUER,
            "sub": key_id,
            "jti": token_id,
            "iat": now,
            "exp": now + lifetime_s,
        }
        if request.scoped:
            payload["authorization_details"] = [request.detail()]
        token = jwt.encode(payload, self._key, algorithm=ALGORITHM, headers={"kid": self.kid})
        return token, _grant(payload)


class TokenVerifier:
    """Checks tokens against the signing keys it is given (kid → key).

    A token is checked whole once (header, HS256 signature, claims); the grant of a
    token that verified is then remembered by the token's exact text, so the same
    client's next requests cost a dictionary lookup and the expiry check, never the
    signature again. Any other text, a byte changed included, is checked afresh."""

    def __init__(
        self,
        keys: Mapping[str, bytes],
        *,
        clock: Callable[[], float] = time.time,
        remember: int = _REMEMBERED,
    ) -> None:
        self._keys = dict(keys)
        self._clock = clock
        self._verified: OrderedDict[str, Grant] = OrderedDict()
        self._remember = remember

    @property
    def kids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def verify(self, token: str) -> Grant:
        grant = self._verified.get(token)
        if grant is not None:
            if grant.expires_at <= self._clock() - _LEEWAY_S:
                del self._verified[token]
                raise TokenRejected("the token has expired")
            return grant
        grant = self._verify(token)
        self._verified[token] = grant
        if len(self._verified) > self._remember:
            self._verified.popitem(last=False)
        return grant

    def _verify(self, token: str) -> Grant:
        if not token:
            raise TokenRejected("the token is empty")
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenRejected(f"the token is longer than {MAX_TOKEN_BYTES} bytes")
        # The compact JWS checked here with the standard library rather than PyJWT's
        # decoder (PyJWT signs): for HS256 alone it is three base64url segments and
        # one HMAC, and PyJWT's general decoder costs several times the whole check.
        kid = unverified_kid(token)  # first: it names a wrong `alg` (none, RS256)
        if not _COMPACT.fullmatch(token):
            raise TokenRejected("the token is not a JWT")
        key = self._keys.get(kid)
        if key is None:
            raise UnknownSigningKey("the token's signing key (kid) is unknown or retired")
        signing_input, _, signature = token.rpartition(".")
        expected = hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _b64decode(signature)):
            raise TokenRejected("the token's signature does not verify")
        try:
            payload = json.loads(_b64decode(signing_input.partition(".")[2]))
        except ValueError:
            raise TokenRejected("the token's claims are not JSON") from None
        if not isinstance(payload, dict):
            raise TokenRejected("the token's claims are not an object")
        for claim in ("exp", "iat", "sub", "jti", "iss"):
            if claim not in payload:
                raise TokenRejected(f"the token has no {claim!r} claim")
        if payload["iss"] != ISSUER:
            raise TokenRejected("the token is not valid: it was issued by someone else")
        now = self._clock()
        issued, expires = payload["iat"], payload["exp"]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in (issued, expires)):
            raise TokenRejected("the token's times are malformed")
        if expires <= now - _LEEWAY_S:
            raise TokenRejected("the token has expired")
        if issued > now + _LEEWAY_S:
            raise TokenRejected("the token was issued in the future")
        try:
            return _grant(payload)
        except (KeyError, TypeError, ValueError, IndexError, InvalidTokenRequest):
            raise TokenRejected("the token's claims are malformed") from None


def _b64decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def unverified_kid(token: str) -> str:
    """The `kid` of a token's header, checked only for shape; refuses any other `alg`.

    Read here rather than with `jwt.get_unverified_header`, which decodes the whole
    token: the signature check right after decodes it again, and this runs on every
    token a server has not seen before."""
    encoded, dot, _ = token.partition(".")
    try:
        if not dot or len(encoded) > 1024:
            raise ValueError("no header")
        header = json.loads(_b64decode(encoded))
    except (ValueError, UnicodeError, TypeError):
        raise TokenRejected("the token is not a JWT") from None
    if not isinstance(header, dict):
        raise TokenRejected("the token is not a JWT")
    if header.get("alg") != ALGORITHM:
        raise TokenRejected(f"the token must be signed with {ALGORITHM}")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid or len(kid) > 64:
        raise TokenRejected("the token's header names no signing key (kid)")
    return kid


def _grant(payload: Mapping[str, Any]) -> Grant:
    """The grant a verified payload carries. Our own signature vouches for its shape,
    but a payload signed by an older version is still checked, not trusted."""
    sub, jti, exp = payload["sub"], payload["jti"], payload["exp"]
    if not (isinstance(sub, str) and isinstance(jti, str) and isinstance(exp, int)):
        raise ValueError("claims")
    details = payload.get("authorization_details")
    if details is None:
        return Grant(key_id=sub, token_id=jti, expires_at=float(exp))
    request = TokenRequest.from_detail(details[0])
    return Grant(
        key_id=sub, token_id=jti, expires_at=float(exp), scoped=True,
        models=request.models, sessions=request.sessions,
        max_sessions=request.max_sessions, max_session_s=request.max_session_s,
    )


def _short(exc: Exception) -> str:
    return str(exc)[:120] or type(exc).__name__

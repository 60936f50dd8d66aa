"""`AccessControl`: the decisions the HTTP layer asks for, on its event loop.

- `mint`: an API key and a `POST /tokens` body in, a signed token out;
- `authenticate`: a token in, its `Grant` out (or `AccessDenied`);
- `authorize_start`, `record_start`, `authorize_session`: what a grant may do.

Verifying a token touches no database on the common path: the signing keys and each
key's record are cached briefly (a revocation takes effect within `key_ttl_s`), and
who started a session never changes once written, so it is cached for good. Misses
go to the database on a thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from reactor_serve.access.api_keys import ApiKey
from reactor_serve.access.database import DatabaseError, open_database
from reactor_serve.access.deployment_secret import DeploymentSecret, MissingSecret
from reactor_serve.access.grants import Grant, SessionOwner
from reactor_serve.access.key_store import KeyRejected, KeyStore
from reactor_serve.access.token_request import InvalidTokenRequest, TokenRequest
from reactor_serve.access.tokens import (
    TokenRejected,
    TokenSigner,
    TokenVerifier,
    UnknownSigningKey,
)
from reactor_serve.access.usage_ledger import UsageLedger

__all__ = [
    "DEFAULT_TOKEN_LIFETIME_S",
    "MAX_TOKEN_LIFETIME_S",
    "AccessControl",
    "AccessDenied",
    "StartTerms",
]

# The official platform's ceiling: no token outlives six hours.
MAX_TOKEN_LIFETIME_S = 6 * 3600
DEFAULT_TOKEN_LIFETIME_S = 3600
_KIDS_TTL_S = 60.0
# An unknown kid re-reads the signing keys at most this often (a rotation made by
# another process), so forged kids cannot turn every request into a query.
_KIDS_RETRY_S = 1.0
_OWNERS_CACHED = 100_000
# A session held to its key's concurrency frees a place only when one ends: a client
# told to come back sooner would only be refused again.
_CONCURRENCY_RETRY_S = 5.0
# How long a key's cached record may stand in for the database while it is away.
_STALE_KEY_S = 300.0


@dataclass(frozen=True)
class StartTerms:
    """What a start is allowed: the session's longest time (the key's limit or the
    token's, whichever is lower; None: only the server's own)."""

    max_duration_s: float | None = None


@dataclass
class AccessDenied(Exception):
    """A request refused: its HTTP status (400, 401, 403, 429 or 503), a reason safe to
    show the client, and for 429/503 when to retry."""

    status: int
    reason: str
    retry_after_s: float | None = None

    def __str__(self) -> str:
        return self.reason


class AccessControl:
    def __init__(
        self,
        store: KeyStore,
        *,
        key_ttl_s: float = 2.0,
        max_token_lifetime_s: int = MAX_TOKEN_LIFETIME_S,
        default_token_lifetime_s: int = DEFAULT_TOKEN_LIFETIME_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.key_ttl_s = key_ttl_s
        self.max_token_lifetime_s = max_token_lifetime_s
        self.default_token_lifetime_s = min(default_token_lifetime_s, max_token_lifetime_s)
        self._clock = clock
        self._verifier = TokenVerifier({}, clock=clock)
        self._signer: TokenSigner | None = None
        self._kids_read_at = float("-inf")
        self._keys: dict[str, tuple[ApiKey | None, float]] = {}
        self._owners: OrderedDict[str, SessionOwner] = OrderedDict()
        self._opened_with: tuple[str | None, str | None, dict[str, Any]] | None = None
        self._ledgers: dict[bool, UsageLedger] = {}
        # A lock per key while one of its sessions is being started (start_session).
        self._starting: dict[str, asyncio.Lock] = {}

    @classmethod
    def open(cls, database_url: str | None = None, *, auth_secret: str | None = None,
             **kwargs: Any) -> AccessControl:
        """Access over the database at `database_url` (default: `default_database_url`),
        migrated; the secret from `auth_secret`, the environment or beside a SQLite file.
        Raises `DatabaseError` or `MissingSecret`, each naming what to fix."""
        database = open_database(database_url)
        try:
            secret = DeploymentSecret.resolve(auth_secret, database.sqlite_path)
        except MissingSecret:
            database.dispose()
            raise
        access = cls(KeyStore(database, secret), **kwargs)
        access._opened_with = (database_url, auth_secret, kwargs)
        return access

    def __reduce__(self) -> tuple[Any, ...]:
        # Serve ships the ingress app to each replica by pickling it: a replica opens
        # the database anew (its own connections, caches and throttle) rather than
        # receiving a live engine.
        if self._opened_with is None:
            raise TypeError("an AccessControl built from a KeyStore cannot be pickled; "
                            "use AccessControl.open")
        url, secret, kwargs = self._opened_with
        return (_reopen, (url, secret, kwargs))

    def usage_ledger(
        self,
        *,
        holds_slot: bool = True,
        on_closed: Callable[[str, str, str, float, int], None] | None = None,
    ) -> UsageLedger:
        """This process's ledger of session usage on the access database (one per
        kind, `on_closed` given by its first caller), closed with `close`."""
        ledger = self._ledgers.get(holds_slot)
        if ledger is None:
            ledger = self._ledgers[holds_slot] = UsageLedger(
                self.store.database, holds_slot=holds_slot, on_closed=on_closed)
        return ledger

    def close(self) -> None:
        for ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()
        self.store.database.dispose()

    # ---- tokens ------------------------------------------------------------------

    async def mint(self, api_key: str | None, body: Any) -> dict[str, Any]:
        """`POST /tokens`: the answer body (`{"jwt": ...}` and when it expires)."""
        if not api_key:
            raise AccessDenied(401, "send the API key in the 'Reactor-API-Key' header")
        try:
            request = TokenRequest.parse(body)
        except InvalidTokenRequest as exc:
            # A grant that cannot be given as asked: refused (403), naming the field,
            # like any other grant the key does not allow. (A body that is not JSON
            # at all is a 400, from the route.)
            raise AccessDenied(403, str(exc)) from None
        key = await self._db(self.store.authenticate, api_key)
        self._keys[key.key_id] = (key, self._clock())
        if request.models is not None:
            refused = [model for model in request.models if not key.allows_model(model)]
            if refused:
                raise AccessDenied(403, f"this API key does not allow model {refused[0]!r}")
        for sid in request.sessions:
            owner = await self._owner(sid)
            if owner is None or owner.key_id != key.key_id:
                raise AccessDenied(403, f"session {sid!r} was not started with this API key")
        lifetime = min(request.expires_after or self.default_token_lifetime_s,
                       self.max_token_lifetime_s)
        signer = await self._current_signer()
        token, grant = signer.mint(key.key_id, request, lifetime)
        return {"jwt": token, "expires_at": int(grant.expires_at), "expires_in": lifetime}

    async def authenticate(self, token: str | None) -> Grant:
        if not token:
            raise AccessDenied(
                401, "a token is required: send 'Authorization: Bearer <token>' "
                     "(POST /tokens with your API key mints one)")
        try:
            try:
                grant = self._verifier.verify(token)
            except UnknownSigningKey:
                await self._refresh_kids(force=False)
                grant = self._verifier.verify(token)
        except TokenRejected as exc:
            raise AccessDenied(401, exc.reason) from None
        key = await self._key(grant.key_id)
        if key is None:
            raise AccessDenied(401, "the token's API key no longer exists")
        if key.revoked:
            raise AccessDenied(401, "the token's API key was revoked")
        return grant

    # ---- what a grant may do -----------------------------------------------------

    async def authorize_start(self, grant: Grant, model: str) -> StartTerms:
        """Whether the grant may start a session on `model` now, and on what terms.
        403 for what the key or token never allows; 429 with `Retry-After`, naming
        the quota, for what it allows again later."""
        key = await self._key(grant.key_id)
        if key is None or key.revoked:
            raise AccessDenied(401, "the token's API key was revoked")
        if not key.allows_model(model) or not grant.allows_model(model):
            raise AccessDenied(403, f"the token does not allow model {model!r}")
        why = grant.may_start()
        if why is not None:
            raise AccessDenied(403, why)
        if grant.max_sessions is not None:
            started = await self._db(self.store.sessions_started_by, grant.token_id)
            if started + len(grant.sessions) >= grant.max_sessions:
                raise AccessDenied(
                    403, f"the token may hold at most {grant.max_sessions} sessions")
        limits = key.limits
        if limits.max_concurrent is not None:
            live = await self._db(self.store.live_sessions, key.key_id)
            if live >= limits.max_concurrent:
                raise AccessDenied(
                    429, f"quota max_concurrent: the key holds {live} of its "
                         f"{limits.max_concurrent} sessions (waiting and orphaned ones "
                         f"count); end one first", retry_after_s=_CONCURRENCY_RETRY_S)
        if limits.starts_per_minute is not None:
            now = self._clock()
            starts = await self._db(self.store.starts_since, key.key_id, now - 60.0)
            if len(starts) >= limits.starts_per_minute:
                oldest = starts[-limits.starts_per_minute]
                raise AccessDenied(
                    429, f"quota starts_per_minute: the key started "
                         f"{limits.starts_per_minute} sessions in the last minute",
                    retry_after_s=max(1.0, oldest + 60.0 - now))
        durations = [d for d in (limits.max_session_s, grant.max_session_s) if d is not None]
        return StartTerms(max_duration_s=float(min(durations)) if durations else None)

    async def start_session(
        self,
        grant: Grant,
        model: str,
        create: Callable[[float | None], Awaitable[Any]],
        stop: Callable[[str], Awaitable[None]],
        requested_at: float,
    ) -> Any:
        """Authorise a start, `create(max_duration_s)` the session, and record it as
        the grant's key's. One key's starts in this process go one at a time, so two
        at once cannot both pass its concurrency quota. A session that cannot be
        recorded is stopped: a session nobody can be shown to own is one nobody may use."""
        # One lock per key ever started from here: keys are made by operators, so few.
        async with self._starting.setdefault(grant.key_id, asyncio.Lock()):
            terms = await self.authorize_start(grant, model)
            info = await create(terms.max_duration_s)
            try:
                await self.record_start(grant, model, info.session_id, requested_at)
            except AccessDenied:
                await stop(info.session_id)
                raise
            return info

    async def record_start(self, grant: Grant, model: str, session_id: str,
                           requested_at: float | None = None) -> None:
        """The session is the grant's key's (and token's). Its usage starts when it
        was asked for (`requested_at`): the time spent checking the token and
        reserving the session is the client's wait too."""
        owner = SessionOwner(grant.key_id, grant.token_id)
        await self._db(self.store.record_owner, session_id, owner, model, requested_at)
        self._remember_owner(session_id, owner)
        if requested_at is not None:
            self.usage_ledger(holds_slot=False).session_state(
                session_id, "waiting", requested_at)

    async def authorize_session(self, grant: Grant, session_id: str) -> None:
        owner = await self._owner(session_id)
        if owner is None or not grant.allows_session(session_id, owner):
            raise AccessDenied(403, "the token does not grant this session")

    # ---- caches ------------------------------------------------------------------

    async def _key(self, key_id: str) -> ApiKey | None:
        cached = self._keys.get(key_id)
        now = self._clock()
        if cached is not None and now - cached[1] < self.key_ttl_s:
            return cached[0]
        try:
            key = await self._db(self.store.get, key_id)
        except AccessDenied:
            # The database is away: a key read recently enough still stands, so live
            # clients keep working through a database restart (a revocation made
            # meanwhile takes effect once it is back).
            if cached is not None and now - cached[1] < _STALE_KEY_S:
                return cached[0]
            raise
        self._keys[key_id] = (key, now)
        return key

    def forget_key(self, key_id: str) -> None:
        """Drop a key's cached record (this process revoked it)."""
        self._keys.pop(key_id, None)

    async def _owner(self, session_id: str) -> SessionOwner | None:
        owner = self._owners.get(session_id)
        if owner is not None:
            return owner
        owner = await self._db(self.store.owner, session_id)
        if owner is not None:
            self._remember_owner(session_id, owner)
        return owner

    def _remember_owner(self, session_id: str, owner: SessionOwner) -> None:
        self._owners[session_id] = owner
        while len(self._owners) > _OWNERS_CACHED:
            self._owners.popitem(last=False)

    async def _current_signer(self) -> TokenSigner:
        if self._signer is None or self._clock() - self._kids_read_at > _KIDS_TTL_S:
            await self._refresh_kids(force=True)
        assert self._signer is not None
        return self._signer

    async def _refresh_kids(self, *, force: bool) -> None:
        now = self._clock()
        if not force and now - self._kids_read_at < _KIDS_RETRY_S:
            return
        self._kids_read_at = now
        kids = await self._db(self.store.signing_kids)
        secret = self.store.secret
        if frozenset(kids) != self._verifier.kids:
            # A new verifier (its remembered tokens too) only when the keys changed.
            self._verifier = TokenVerifier(
                {kid: secret.signing_key(kid) for kid in kids}, clock=self._clock)
        current = next((kid for kid, retire_at in sorted(kids.items()) if retire_at is None),
                       None)
        if current is not None:
            self._signer = TokenSigner(current, secret.signing_key(current), clock=self._clock)

    async def _db(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.to_thread(call, *args)
        except KeyRejected as exc:
            raise AccessDenied(401, exc.reason) from None
        except DatabaseError as exc:
            # The client cannot fix this; say so without the URL, and when to retry.
            raise AccessDenied(503, "the access database is unavailable; retry shortly",
                               retry_after_s=2.0) from exc


def _reopen(url: str | None, secret: str | None, kwargs: dict[str, Any]) -> AccessControl:
    return AccessControl.open(url, auth_secret=secret, **kwargs)

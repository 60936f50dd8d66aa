"""The access tables, as SQLAlchemy Core metadata: what the migrations build and the
stores read and write. A change here comes with a migration under `migrations/`
(tests/access/test_migrations.py compares the two)."""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Double,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    true,
)

__all__ = ["api_keys", "metadata", "session_owners", "signing_keys", "usage_intervals"]

metadata = MetaData()

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(16), primary_key=True),
    Column("name", String(200), nullable=False),
    # HMAC-SHA256 of the key's secret under the deployment's secret, in hex.
    Column("digest", String(64), nullable=False),
    # JSON list of model names; NULL: every model.
    Column("models", Text, nullable=True),
    Column("max_concurrent", Integer, nullable=True),
    Column("starts_per_minute", Integer, nullable=True),
    Column("max_session_s", Integer, nullable=True),
    # Seconds since the epoch: one type that SQLite and PostgreSQL compare alike.
    Column("created_at", Double, nullable=False),
    Column("revoked_at", Double, nullable=True),
)

signing_keys = Table(
    "signing_keys",
    metadata,
    # The JWT header's `kid`; the key itself is derived from the deployment's secret
    # and is never stored.
    Column("kid", String(32), primary_key=True),
    Column("created_at", Double, nullable=False),
    # Tokens signed with it stop verifying then; NULL while it is current.
    Column("retire_at", Double, nullable=True),
)

session_owners = Table(
    "session_owners",
    metadata,
    Column("session_id", String(128), primary_key=True),
    Column("key_id", String(16), nullable=False, index=True),
    # The `jti` of the token that started it: a scoped token acts on its own sessions.
    Column("token_id", String(64), nullable=False),
    Column("model", String(128), nullable=False),
    Column("started_at", Double, nullable=False),
    # Set when the session ends: until then it counts against its key's concurrency.
    Column("ended_at", Double, nullable=True),
    Column("end_reason", String(32), nullable=True),
)

usage_intervals = Table(
    "usage_intervals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(128), nullable=False, index=True),
    # waiting, ready or orphaned: what the session was doing for the interval.
    Column("state", String(16), nullable=False),
    Column("started_at", Double, nullable=False),
    # NULL while the interval is open.
    Column("ended_at", Double, nullable=True, index=True),
    # The last time the process holding the session said it was still in this state:
    # an interval left open by a crash is closed here, losing at most one heartbeat.
    Column("seen_at", Double, nullable=False),
    Column("end_reason", String(32), nullable=True),
    # Frames delivered to the client during the interval.
    Column("frames", Integer, nullable=False, server_default="0"),
    # Whether a model slot (a replica, or `reactor run`'s one session) was held: a
    # session waiting in Serve's admission queue holds none.
    Column("held", Boolean, nullable=False, server_default=true()),
)

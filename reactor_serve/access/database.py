"""The access database: which one (a URL), opened and migrated to the newest schema.

SQLite by default, in the user's state directory, so `reactor run` and a laptop's
`serve run` need nothing installed; PostgreSQL (or any URL SQLAlchemy speaks) for a
cluster, where every ingress replica reaches the same one. The schema is Alembic's:
opening a database upgrades it to the newest revision under `migrations/`, so a
deployment never runs against tables older than its code.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

__all__ = [
    "DATABASE_URL_ENV",
    "Database",
    "DatabaseError",
    "alembic_config",
    "default_database_url",
    "open_database",
    "upgrade",
]

DATABASE_URL_ENV = "REACTOR_DATABASE_URL"
_MIGRATIONS = Path(__file__).with_name("migrations")
# One upgrade at a time per process: two ingress apps in one process (tests) share it.
_MIGRATING = threading.Lock()


class DatabaseError(RuntimeError):
    """The access database cannot be reached, opened or migrated; the message says
    which URL (without its password) and why."""


def default_database_url() -> str:
    """`REACTOR_DATABASE_URL`, else SQLite under `$XDG_STATE_HOME/reactor-serve`."""
    configured = os.environ.get(DATABASE_URL_ENV)
    if configured:
        return configured
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return f"sqlite:///{state / 'reactor-serve' / 'access.sqlite3'}"


class Database:
    """An engine on the access database, its schema at the newest revision."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def url(self) -> str:
        """The URL with any password masked: safe for logs and messages."""
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def url_with_password(self) -> str:
        """The URL to open it again elsewhere (a replica): never for logs."""
        return self.engine.url.render_as_string(hide_password=False)

    @property
    def sqlite_path(self) -> Path | None:
        """The file of a SQLite database, None for any other."""
        url = self.engine.url
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return None
        return Path(url.database)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """`engine.begin()`, with driver errors raised as `DatabaseError` naming the
        (masked) URL: callers handle one error type whatever the database."""
        try:
            with self.engine.begin() as connection:
                yield connection
        except SQLAlchemyError as exc:
            raise DatabaseError(f"database {self.url}: {_reason(exc)}") from None

    def dispose(self) -> None:
        self.engine.dispose()


def open_database(url: str | None = None, *, migrate: bool = True) -> Database:
    """Open (creating a SQLite file's directory) and migrate the database at `url`."""
    text = url or default_database_url()
    try:
        parsed = make_url(text)
    except ArgumentError as exc:
        raise DatabaseError(f"database URL {text!r} is not a URL: {exc}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        # psycopg 3 is the driver we install; SQLAlchemy's default would be psycopg2.
        parsed = parsed.set(drivername="postgresql+psycopg")
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    masked = parsed.render_as_string(hide_password=True)
    try:
        engine = create_engine(parsed, **kwargs)
    except (ArgumentError, ImportError) as exc:
        raise DatabaseError(f"database {masked}: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
    database = Database(engine)
    if migrate:
        try:
            upgrade(database)
        except SQLAlchemyError as exc:
            engine.dispose()
            raise DatabaseError(f"database {masked}: {_reason(exc)}") from None
    return database


def alembic_config(connection: Connection) -> Any:
    """Alembic's configuration for our migrations, run on `connection` (no alembic.ini)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def upgrade(database: Database, revision: str = "head") -> None:
    """Run the Alembic migrations up to `revision` on the database."""
    from alembic import command

    with _MIGRATING, database.engine.begin() as connection:
        command.upgrade(alembic_config(connection), revision)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own transaction handling off: it would begin a transaction only at
    # the first write, so a read before it (which interval is open) could be stale by
    # then. `_sqlite_begin_immediate` begins each one instead.
    dbapi_connection.isolation_level = None
    # WAL: readers (every token check's key lookup) never wait for a writer.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin_immediate(connection: Connection) -> None:
    # The write lock taken as the transaction begins: two writers (two usage ledgers,
    # a key being revoked) run one after the other, each reading what the other wrote.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def _reason(exc: SQLAlchemyError) -> str:
    """The driver's own words, without SQLAlchemy's statement dump and link."""
    original = getattr(exc, "orig", None)
    return str(original or exc).strip().splitlines()[0]

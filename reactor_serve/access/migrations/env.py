"""Alembic's environment for the access schema: always run by `database.upgrade` on a
connection it opened, never from an alembic.ini."""

from __future__ import annotations

from alembic import context

from reactor_serve.access.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite alters tables by copying them: batch mode does that for us.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()

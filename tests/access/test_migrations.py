"""The Alembic migrations build exactly the tables schema.py describes, on SQLite and
on PostgreSQL, and downgrade to nothing."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from reactor_serve.access.database import alembic_config, open_database, upgrade
from reactor_serve.access.schema import metadata


def test_migrations_match_the_schema(database_url):
    database = open_database(database_url)
    with database.engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), metadata)
    database.dispose()
    assert differences == []


def test_downgrade_to_base_drops_every_table_and_upgrade_rebuilds(database_url):
    from alembic import command

    database = open_database(database_url)
    with database.engine.begin() as connection:
        command.downgrade(alembic_config(connection), "base")
    assert set(inspect(database.engine).get_table_names()) <= {"alembic_version"}
    upgrade(database)
    assert {"api_keys", "signing_keys", "session_owners"} <= set(
        inspect(database.engine).get_table_names())
    database.dispose()

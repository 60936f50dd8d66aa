"""API keys, JWT signing key ids, and which key started each session.

Revision ID: 0001_keys
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_keys"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("models", sa.Text, nullable=True),
        sa.Column("max_concurrent", sa.Integer, nullable=True),
        sa.Column("starts_per_minute", sa.Integer, nullable=True),
        sa.Column("max_session_s", sa.Integer, nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("revoked_at", sa.Double, nullable=True),
    )
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("retire_at", sa.Double, nullable=True),
    )
    op.create_table(
        "session_owners",
        sa.Column("session_id", sa.String(128), primary_key=True),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("token_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
    )
    op.create_index("ix_session_owners_key_id", "session_owners", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_session_owners_key_id", table_name="session_owners")
    op.drop_table("session_owners")
    op.drop_table("signing_keys")
    op.drop_table("api_keys")

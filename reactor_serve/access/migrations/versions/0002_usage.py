"""Usage metering: when each session ended, and its intervals by state.

Revision ID: 0002_usage
Revises: 0001_keys
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_usage"
down_revision = "0001_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session_owners") as table:
        table.add_column(sa.Column("ended_at", sa.Double, nullable=True))
        table.add_column(sa.Column("end_reason", sa.String(32), nullable=True))
    op.create_table(
        "usage_intervals",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("ended_at", sa.Double, nullable=True),
        sa.Column("seen_at", sa.Double, nullable=False),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("frames", sa.Integer, nullable=False, server_default="0"),
        sa.Column("held", sa.Boolean, nullable=False, server_default=sa.true()),
    )
    op.create_index("ix_usage_intervals_session_id", "usage_intervals", ["session_id"])
    op.create_index("ix_usage_intervals_ended_at", "usage_intervals", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_usage_intervals_ended_at", table_name="usage_intervals")
    op.drop_index("ix_usage_intervals_session_id", table_name="usage_intervals")
    op.drop_table("usage_intervals")
    with op.batch_alter_table("session_owners") as table:
        table.drop_column("end_reason")
        table.drop_column("ended_at")

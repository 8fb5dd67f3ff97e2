"""change feed consumers

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "changeconsumer",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("tenant_id", sa.Integer(), sa.ForeignKey("tenant.id"), nullable=False, index=True),
        sa.Column("table_name", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),  # pipeline:<name> for a table-fed pipeline
        sa.Column("cursor", sa.String(length=200), nullable=False),
        sa.Column("start", sa.String(length=40), nullable=False),
        sa.Column("initial_load", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("acked_at", sa.DateTime(), nullable=True),
        sa.Column("lagging_since", sa.DateTime(), nullable=True),
        sa.UniqueConstraint("tenant_id", "table_name", "name"),
    )


def downgrade() -> None:
    op.drop_table("changeconsumer")

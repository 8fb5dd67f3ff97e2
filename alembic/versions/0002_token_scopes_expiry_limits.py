"""token expiry, last use, pipelines, operator tokens; tenant limits

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("token") as batch:
        batch.alter_column("tenant_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column("pipelines", sa.String(), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("last_used_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("prefix", sa.String(), nullable=False, server_default=""))
    with op.batch_alter_table("tenant") as batch:
        batch.add_column(sa.Column("max_events_per_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_bytes_per_s", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("max_backlog_events", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.drop_column("max_backlog_events")
        batch.drop_column("max_bytes_per_s")
        batch.drop_column("max_events_per_s")
    with op.batch_alter_table("token") as batch:
        batch.drop_column("prefix")
        batch.drop_column("last_used_at")
        batch.drop_column("expires_at")
        batch.drop_column("pipelines")
        batch.alter_column("tenant_id", existing_type=sa.Integer(), nullable=False)

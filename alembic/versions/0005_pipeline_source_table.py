"""pipelines: the table a pipeline reads the changes of, indexed

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

A table's leader asks every few seconds which pipelines its table feeds: with the source table a
column of its own, that is one indexed query instead of parsing every definition of the tenant.
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("pipeline") as batch:
        batch.add_column(sa.Column("source_table", sa.String(length=63), nullable=True))
        batch.create_index("ix_pipeline_tenant_source_table", ["tenant_id", "source_table"])
    connection = op.get_bind()
    rows = connection.execute(sa.text(
        "SELECT p.id, v.definition FROM pipeline p JOIN pipelineversion v ON v.pipeline_id = p.id AND v.version = p.version"
    )).all()
    for pipeline_id, definition in rows:
        source = (json.loads(definition).get("source") or {}).get("table")
        if source is not None:
            connection.execute(sa.text("UPDATE pipeline SET source_table = :t WHERE id = :i"), {"t": source, "i": pipeline_id})


def downgrade() -> None:
    with op.batch_alter_table("pipeline") as batch:
        batch.drop_index("ix_pipeline_tenant_source_table")
        batch.drop_column("source_table")

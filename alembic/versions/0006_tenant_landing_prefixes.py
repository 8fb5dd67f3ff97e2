"""tenants: the landing prefixes an operator granted each, to register files written elsewhere

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26

Until now only CALVE_LANDING_PREFIXES (read at start) granted them: a grant took a restart of
every api process. Granted through the api, a grant is in the database and reaches the api
processes as a token's limits do.
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.add_column(sa.Column("landing_prefixes", sa.String(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("tenant") as batch:
        batch.drop_column("landing_prefixes")

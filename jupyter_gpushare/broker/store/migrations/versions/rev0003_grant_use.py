"""measured use per grant and GPU, power per node and hour

Schema 3. Revision ID: 0003; revises: 0002.
"""

from __future__ import annotations

from alembic import op

from jupyter_gpushare.broker.store import schema_steps

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    schema_steps.grant_use(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError(schema_steps.NO_DOWNGRADE)

"""measured use per team, pool and month; heartbeats by time

Schema 4. Revision ID: 0004; revises: 0003.
"""

from __future__ import annotations

from alembic import op

from jupyter_gpushare.broker.store import schema_steps

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    schema_steps.usage(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError(schema_steps.NO_DOWNGRADE)

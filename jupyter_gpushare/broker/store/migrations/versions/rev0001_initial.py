"""initial schema: requests, grants (ledger), nodes, heartbeats

Schema 1. Revision ID: 0001; revises: (none).
"""

from __future__ import annotations

from alembic import op

from jupyter_gpushare.broker.store import schema_steps

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    schema_steps.initial(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError(schema_steps.NO_DOWNGRADE)

"""grants: one record of how each grant ended (kind, by whom)

Schema 6. Revision ID: 0006; revises: 0005.
"""

from __future__ import annotations

from alembic import op

from jupyter_gpushare.broker.store import schema_steps

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    schema_steps.grant_end(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError(schema_steps.NO_DOWNGRADE)

"""jobs: a submission's idempotency key (a submission sent again finds its job)

Schema 7. Revision ID: 0007; revises: 0006.
"""

from __future__ import annotations

from alembic import op

from jupyter_gpushare.broker.store import schema_steps

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    schema_steps.job_idempotency(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError(schema_steps.NO_DOWNGRADE)

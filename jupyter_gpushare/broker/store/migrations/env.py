"""Alembic's environment for the broker's schema: always online, on the connection that
:func:`jupyter_gpushare.broker.store.migrate.migrate` passes in ``config.attributes``, one
transaction per revision (a failing revision leaves the database at the one before)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo

from jupyter_gpushare.broker.store.migrate import record_version
from jupyter_gpushare.broker.store.tables import metadata

config = context.config
connection = config.attributes.get("connection")
if context.is_offline_mode() or connection is None:
    raise RuntimeError(
        "the broker's migrations run on a live connection: use `jupyter-gpushare upgrade-db` "
        "(or jupyter_gpushare.broker.store.migrate.migrate(engine)), not the alembic command"
    )
applied: list[int] = config.attributes.setdefault("applied", [])


def _on_version_apply(
    ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any], run_args: Mapping[str, Any]
) -> None:
    assert ctx.connection is not None
    record_version(ctx.connection, step, applied)


context.configure(
    connection=connection,
    target_metadata=metadata,
    transaction_per_migration=True,
    on_version_apply=_on_version_apply,
)
with context.begin_transaction():
    context.run_migrations()

"""The broker's tables (SQLAlchemy 2 Core): requests, grants (the GPU-hour ledger), nodes,
heartbeats, measured use, jobs, and the legacy schema-version row.

The ``gpushare_grants`` table is also the GPU-hour ledger: a grant row is an interval
``[granted_at, released_at)`` (``released_at`` is NULL while the grant lives), and rows
are never deleted. How the tables got their shape, version by version, is in
:mod:`.migrations` (Alembic revisions); :mod:`.migrate` runs them at start.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

schema_table = Table(
    "gpushare_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
)
"""The schema version as the broker wrote it before Alembic (1..6), still written by every
revision (:func:`.migrate.record_version`): an older broker reads it to refuse a newer database."""

requests_table = Table(
    "gpushare_requests",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("username", String(255), nullable=False),
    Column("server", String(255), nullable=False, default=""),
    Column("team", String(255), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("profile", String(255), nullable=False, default=""),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("code", String(64), nullable=False, default=""),
    Column("spec", JSON, nullable=False),
    Column("grant_id", String(64), nullable=True),
    Column("idempotency_key", String(255), nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("username", "idempotency_key", name="uq_gpushare_request_idem"),
    Index("ix_gpushare_requests_status", "status"),
    Index("ix_gpushare_requests_user", "username"),
)

grants_table = Table(
    "gpushare_grants",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("request_id", String(64), nullable=False, unique=True),
    Column("username", String(255), nullable=False),
    Column("server", String(255), nullable=False, default=""),
    Column("team", String(255), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("profile", String(255), nullable=False, default=""),
    Column("kind", String(16), nullable=False),
    Column("node", String(255), nullable=False),
    Column("slices", JSON, nullable=False),
    Column("units_milli", Integer, nullable=False),
    Column("borrowed", Boolean, nullable=False),
    Column("preemptible", Boolean, nullable=False),
    Column("priority", String(255), nullable=False),
    Column("priority_value", Integer, nullable=False),
    Column("grace_period_s", Integer, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("granted_at", Float, nullable=False),
    Column("released_at", Float, nullable=True),
    Column("release_reason", Text, nullable=True),
    Column("preempt_for", String(64), nullable=True),
    Column("preempt_reason", Text, nullable=True),
    Column("preempt_deadline", Float, nullable=True),
    # schema 6: how the grant ended (jupyter_gpushare.core.grant_end): the kind from a
    # closed set, and for a preemption the request and team it was taken for; NULL while
    # the grant lives
    Column("end_kind", String(16), nullable=True),
    Column("ended_by_request", String(64), nullable=True),
    Column("ended_by_team", String(255), nullable=True),
    Index("ix_gpushare_grants_live", "released_at"),
    Index("ix_gpushare_grants_user", "username"),
    Index("ix_gpushare_grants_period", "team", "pool", "granted_at"),
)

nodes_table = Table(
    "gpushare_nodes",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("cordoned", Boolean, nullable=False),
    Column("updated_at", Float, nullable=False),
    # schema 5: why the broker itself drained the node (a run was lost with it, e.g. Slurm's
    # NODE_FAIL), so it resumes the node once the engine has it back, across its restarts;
    # NULL: no drain, or an admin's (any other write clears it)
    Column("broker_drain", Text, nullable=True),
)

heartbeats_table = Table(
    "gpushare_heartbeats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("grant_id", String(64), nullable=False),
    Column("ts", Float, nullable=False),
    Column("simulated", Boolean, nullable=False),
    Column("gpus", JSON, nullable=False),
    Index("ix_gpushare_heartbeats_grant", "grant_id", "ts"),
)

grant_use_table = Table(
    "gpushare_grant_use",
    metadata,
    Column("grant_id", String(64), primary_key=True),
    Column("gpu_uuid", String(255), primary_key=True),
    Column("month", String(7), primary_key=True),  # YYYY-MM (UTC) of the heartbeats
    Column("samples", Integer, nullable=False),
    Column("utilization_pct_sum", Float, nullable=False),
    Column("memory_used_mib_sum", Float, nullable=False),
    Column("last_ts", Float, nullable=False),
)
"""Measured use of each grant on each GPU per month, summed from its heartbeats (kept for
good: the monthly report reads it; see :mod:`..service.usage`)."""

node_power_table = Table(
    "gpushare_node_power",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("hour_start", Float, primary_key=True),
    Column("samples", Integer, nullable=False),
    Column("watts_sum", Float, nullable=False),
    Column("watts_max", Float, nullable=False),
)
"""Power of each node's reporting GPUs, per hour: samples of the node's total, their sum and
their maximum (see :mod:`..service.usage`)."""


# -- batch jobs (schema 2) -------------------------------------------------------------------

jobs_table = Table(
    "gpushare_jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("username", String(255), nullable=False),
    Column("team", String(255), nullable=False),
    Column("server", String(255), nullable=False, default=""),
    Column("name", String(255), nullable=False),
    Column("path", Text, nullable=False, default=""),
    Column("profile", String(255), nullable=False, default=""),
    Column("pool", String(255), nullable=False),
    Column("priority", String(255), nullable=False),
    Column("request_spec", JSON, nullable=False),  # the batch request, asked again on requeue
    Column("parameters", JSON, nullable=False),
    Column("max_runtime_s", Integer, nullable=False),
    Column("checkpoint", Boolean, nullable=False),
    Column("backend", String(64), nullable=False),
    Column("output_path", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("attempt", Integer, nullable=False),
    Column("request_id", String(64), nullable=True),
    Column("grant_id", String(64), nullable=True),
    Column("handle", JSON, nullable=True),
    Column("error", JSON, nullable=True),
    Column("gpu_hours", Float, nullable=False, default=0.0),  # closed attempts
    Column("preempt_signalled", Boolean, nullable=False, default=False),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("ended_at", Float, nullable=True),
    # a submission sent again (its answer was lost with a broker that died) finds its job
    Column("idempotency_key", String(255), nullable=True),
    Index("ix_gpushare_jobs_state", "state"),
    Index("ix_gpushare_jobs_user", "username", "created_at"),
    Index("uq_gpushare_jobs_idem", "username", "idempotency_key", unique=True),
)

job_notebooks_table = Table(
    "gpushare_job_notebooks",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("notebook", Text, nullable=False),  # the snapshot taken at submit time (JSON)
    Column("size", Integer, nullable=False),
)

job_events_table = Table(
    "gpushare_job_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("ts", Float, nullable=False),
    Column("from_state", String(16), nullable=True),
    Column("to_state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Index("ix_gpushare_job_events_job", "job_id", "id"),
)


usage_table = Table(
    "gpushare_usage_month",
    metadata,
    Column("team", String(255), primary_key=True),
    Column("pool", String(255), primary_key=True),
    Column("month", String(7), primary_key=True),  # YYYY-MM (UTC)
    Column("samples", Integer, nullable=False),
    Column("utilization_pct_sum", Float, nullable=False),
    Column("memory_used_mib_sum", Float, nullable=False),
    Column("last_ts", Float, nullable=False),
)
"""Measured use from heartbeats, summed per team, pool and month (kept for good, while the
heartbeat detail rows are deleted after ``BrokerLimits.heartbeat_retention_s``)."""

heartbeats_ts_index = Index("ix_gpushare_heartbeats_ts", heartbeats_table.c.ts)
grants_end_index = Index(
    "ix_gpushare_grants_end", grants_table.c.end_kind, grants_table.c.released_at
)

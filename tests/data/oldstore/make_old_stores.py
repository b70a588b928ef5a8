"""Databases written by the broker's code from before Alembic, one per schema version, with
real rows in every table: the test data of tests/test_store_alembic.py.

    .venv/bin/python tests/data/oldstore/make_old_stores.py

checks out (``git worktree add``, under a temporary folder) the commit that introduced each
schema version (:data:`OLD_CODE`), runs that commit's own ``migrate(engine)`` on a new SQLite
file with ``PYTHONPATH`` pointing there, and inserts :data:`ROWS` (the columns its tables
have). Writes ``schema-N.db`` here (SQLite, N = 1..6), and ``schema-N.pg.sql`` (N = 5, 6: the
same on a throw-away PostgreSQL server, dumped with ``pg_dump --inserts``).

``--write URL`` (internal): the step run under the old code.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

OLD_CODE = {
    1: "3e64149",  # broker: tornado service, REST API + OpenAPI, SQLAlchemy persistence
    2: "3dc093e",  # jobs: job store (schema 2)
    3: "7ab0b7e",  # report: measured use from lasting per-grant and per-node-hour aggregates
    4: "e1d7923",  # broker hardening (usage per month; heartbeats by time)
    5: "588c275",  # broker: the nodes the broker drained after a run was lost with them
    6: "fa86c57",  # main just before the move to Alembic (schema 6, the grant end records)
}
"""Schema version -> the commit whose code wrote it (each the commit that introduced it,
and for 6 the last commit with the hand-written migrations)."""

PG_VERSIONS = (5, 6)

T0 = 1_780_000_000.0
SPEC = {"pool": "train", "gpus": 1, "kind": "interactive"}
GRANT = dict(
    server="",
    team="a",
    pool="train",
    profile="",
    kind="interactive",
    node="train-n0",
    slices=[{"gpu": "GPU-0", "milli": 1000}],
    units_milli=1000,
    borrowed=False,
    preemptible=True,
    priority="research",
    priority_value=100,
    grace_period_s=30,
    spec=SPEC,
    preempt_for=None,
    preempt_reason=None,
    preempt_deadline=None,
    end_kind=None,
    ended_by_request=None,
    ended_by_team=None,
)
"""(the end record, schema 6, as the broker writes it at release; older schemas drop it and
their migration to 6 writes it from the release reason)"""
ROWS: dict[str, list[dict[str, Any]]] = {
    "gpushare_requests": [
        dict(
            id=f"r{i}",
            username=user,
            server="",
            team=team,
            pool="train",
            kind="interactive",
            profile="",
            status=status,
            reason="",
            code="",
            spec=SPEC,
            grant_id=f"g{i}",
            idempotency_key=f"k{i}",
            created_at=T0 + i,
            updated_at=T0 + i,
        )
        for i, (user, team, status) in enumerate(
            [("alice", "a", "granted"), ("bob", "b", "released"), ("carol", "b", "released")]
        )
    ],
    "gpushare_grants": [
        dict(
            GRANT,
            id="g0",
            request_id="r0",
            username="alice",
            granted_at=T0,
            released_at=None,
            release_reason=None,
        ),
        dict(
            GRANT,
            id="g1",
            request_id="r1",
            username="bob",
            team="b",
            granted_at=T0 + 1,
            released_at=T0 + 100,
            release_reason="preempted: team a reclaims",
            preempt_for="r0",
            preempt_reason="team a reclaims",
            preempt_deadline=T0 + 90,
            end_kind="preempted",
            ended_by_request="r0",
            ended_by_team="a",
        ),
        dict(
            GRANT,
            id="g2",
            request_id="r2",
            username="carol",
            team="b",
            granted_at=T0 + 2,
            released_at=T0 + 200,
            release_reason="culled: idle 2 h",
            end_kind="culled",
            ended_by_request=None,
            ended_by_team=None,
        ),
    ],
    "gpushare_nodes": [
        dict(name="train-n0", cordoned=False, updated_at=T0, broker_drain=None),
        dict(name="train-n1", cordoned=True, updated_at=T0 + 5, broker_drain=None),
    ],
    "gpushare_heartbeats": [
        dict(
            id=i + 1,
            grant_id="g0",
            ts=T0 + 10 * i,
            simulated=True,
            gpus=[{"uuid": "GPU-0", "utilization_pct": 40 + i, "memory_used_mib": 1024}],
        )
        for i in range(3)
    ],
    "gpushare_grant_use": [
        dict(
            grant_id="g0",
            gpu_uuid="GPU-0",
            month="2026-05",
            samples=3,
            utilization_pct_sum=123.0,
            memory_used_mib_sum=3072.0,
            last_ts=T0 + 20,
        ),
    ],
    "gpushare_node_power": [
        dict(
            node="train-n0", hour_start=T0 - T0 % 3600, samples=3, watts_sum=900.0, watts_max=310.5
        ),
    ],
    "gpushare_usage_month": [
        dict(
            team="a",
            pool="train",
            month="2026-05",
            samples=3,
            utilization_pct_sum=123.0,
            memory_used_mib_sum=3072.0,
            last_ts=T0 + 20,
        ),
    ],
    "gpushare_jobs": [
        dict(
            id="j0",
            username="alice",
            team="a",
            server="",
            name="train.ipynb",
            path="work/train.ipynb",
            profile="",
            pool="train",
            priority="research",
            request_spec=SPEC,
            parameters={"epochs": 2},
            max_runtime_s=3600,
            checkpoint=False,
            backend="local",
            output_path="/tmp/out/j0.ipynb",
            state="succeeded",
            reason="",
            attempt=1,
            request_id="r0",
            grant_id="g0",
            handle={"pid": 4242},
            error=None,
            gpu_hours=0.25,
            preempt_signalled=False,
            cancel_requested=False,
            created_at=T0,
            updated_at=T0 + 900,
            started_at=T0 + 5,
            ended_at=T0 + 900,
        ),
    ],
    "gpushare_job_notebooks": [
        dict(job_id="j0", notebook='{"cells": [], "nbformat": 4}', size=29),
    ],
    "gpushare_job_events": [
        dict(
            id=1,
            job_id="j0",
            ts=T0,
            from_state=None,
            to_state="queued",
            attempt=1,
            reason="submitted",
        ),
        dict(
            id=2,
            job_id="j0",
            ts=T0 + 900,
            from_state="running",
            to_state="succeeded",
            attempt=1,
            reason="",
        ),
    ],
}


def write(url: str) -> int:
    """Under the old code: migrate a new database at ``url`` and insert the rows."""
    try:
        db = importlib.import_module("jupyter_gpushare.broker.store.db")
    except ImportError:  # before the broker's rooms
        db = importlib.import_module("jupyter_gpushare.broker.db")
    engine = db.make_engine(url)
    db.migrate(engine)
    tables = {t.name: t for t in db.metadata.sorted_tables}
    with engine.begin() as conn:
        for name, rows in ROWS.items():
            if name in tables:
                have = set(tables[name].c.keys())
                conn.execute(
                    tables[name].insert(),
                    [{k: v for k, v in row.items() if k in have} for row in rows],
                )
    if url.startswith("sqlite"):
        with engine.connect() as conn:  # one self-contained file, no -wal beside it
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.exec_driver_sql("PRAGMA journal_mode=DELETE")
    engine.dispose()
    print(f"schema {db.SCHEMA_VERSION} written by {db.__file__}: {url}")
    return 0


def _pg_tool(name: str) -> str:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]
    return found if isinstance(found, str) else found[0]


def run_old(version: int, worktree: Path, url: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(worktree), PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, __file__, "--write", url], env=env, check=True, cwd=worktree)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="URL", help="(internal) run under the old code")
    args = parser.parse_args()
    if args.write:
        return write(args.write)
    sys.path.insert(0, str(REPO / "tests"))
    from pgserver import PgServer  # type: ignore[import-not-found]

    server = PgServer()
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-oldstore-"))
    try:
        for version, commit in OLD_CODE.items():
            worktree = tmp / f"code-{version}"
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), commit],
                check=True,
                capture_output=True,
            )
            target = HERE / f"schema-{version}.db"
            target.unlink(missing_ok=True)
            run_old(version, worktree, f"sqlite:///{target}")
            if version in PG_VERSIONS:
                url = server.new_database(f"old{version}")
                run_old(version, worktree, url)
                dump = subprocess.run(
                    [
                        _pg_tool("pg_dump"),
                        "--inserts",
                        "--no-owner",
                        "--no-privileges",
                        "--dbname",
                        url.replace("postgresql+psycopg2://", "postgresql://"),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                (HERE / f"schema-{version}.pg.sql").write_text(dump)
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=True
            )
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The broker's schema through Alembic (issue 24): databases written by the code from before
Alembic (tests/data/oldstore, made by make_old_stores.py from the commits that wrote each
schema version) upgrade in place, keep every row, and end identical to a new database; a
newer database is refused; a revision that fails leaves the database at the one before."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pgserver import postgres  # noqa: F401  (fixture)
from sqlalchemy import Engine, inspect, text

from jupyter_gpushare.broker.store.db import make_engine, metadata
from jupyter_gpushare.broker.store.migrate import (
    SCHEMA_VERSION,
    SCRIPT_LOCATION,
    SchemaError,
    current_version,
    migrate,
)

OLD = Path(__file__).parent / "data" / "oldstore"
END_RECORDS = {
    "g0": (None, None, None),
    "g1": ("preempted", "r0", "a"),
    "g2": ("culled", None, None),
}


def shape(engine: Engine) -> dict[str, Any]:
    """Every table's columns (name, type, nullable), indexes, unique constraints and key."""
    insp = inspect(engine)
    out: dict[str, Any] = {}
    for table in sorted(insp.get_table_names()):
        out[table] = (
            sorted((c["name"], str(c["type"]), c["nullable"]) for c in insp.get_columns(table)),
            sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in insp.get_indexes(table)
            ),
            sorted(
                (u["name"] or "", tuple(u["column_names"]))
                for u in insp.get_unique_constraints(table)
            ),
            tuple(insp.get_pk_constraint(table)["constrained_columns"]),
        )
    return out


def rows(engine: Engine) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table but the version tables, as the driver reads it."""
    with engine.connect() as conn:
        return {
            table: [dict(r._mapping) for r in conn.execute(text(f"SELECT * FROM {table}"))]
            for table in inspect(conn).get_table_names()
            if table not in ("gpushare_schema", "alembic_version")
        }


def versions(engine: Engine) -> tuple[int, str | None]:
    with engine.connect() as conn:
        recorded = conn.execute(text("SELECT version FROM gpushare_schema")).scalar_one()
        revision = MigrationContext.configure(conn).get_current_revision()
    return recorded, revision


def assert_upgraded_keeps_rows(engine: Engine, fresh: Engine, old_version: int) -> None:
    before = rows(engine)
    assert sum(map(len, before.values())) > 0
    assert migrate(engine) == list(range(old_version + 1, SCHEMA_VERSION + 1))
    after = rows(engine)
    assert set(after) == set(before) | set(rows(fresh))
    for table, old_rows in before.items():
        key = lambda r: tuple(str(v) for v in r.values())  # noqa: E731
        kept = sorted(({k: r[k] for k in old_rows[0]} for r in after[table]), key=key)
        assert kept == sorted(old_rows, key=key), table
    ends = {
        r["id"]: (r["end_kind"], r["ended_by_request"], r["ended_by_team"])
        for r in after["gpushare_grants"]
    }
    assert ends == END_RECORDS
    assert versions(engine) == (SCHEMA_VERSION, f"{SCHEMA_VERSION:04d}")
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    assert shape(engine) == shape(fresh)
    assert migrate(engine) == []  # once


def sqlite_copy(version: int, tmp_path: Path) -> Engine:
    target = tmp_path / f"schema-{version}.db"
    shutil.copy(OLD / f"schema-{version}.db", target)
    return make_engine(f"sqlite:///{target}")


@pytest.fixture
def fresh_sqlite(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path}/fresh.db")
    assert migrate(engine) == list(range(1, SCHEMA_VERSION + 1))
    return engine


def test_a_new_database_is_the_tables_as_declared(fresh_sqlite: Engine) -> None:
    with fresh_sqlite.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    assert versions(fresh_sqlite) == (SCHEMA_VERSION, f"{SCHEMA_VERSION:04d}")
    assert SCHEMA_VERSION == 7


def test_a_database_at_the_head_is_not_handed_to_alembic(
    fresh_sqlite: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # every broker start (and every restart of a killed one) checks the schema: at the head
    # that is one read, not Alembic's environment (~15 ms and two INFO lines a start)
    caplog.set_level(logging.INFO)
    assert migrate(fresh_sqlite) == []
    assert not [r for r in caplog.records if r.name.startswith("alembic")], caplog.text
    with fresh_sqlite.begin() as conn:  # one step behind: Alembic runs the last revision
        conn.execute(text("UPDATE alembic_version SET version_num = :v"),
                     {"v": f"{SCHEMA_VERSION - 1:04d}"})
        conn.execute(text("UPDATE gpushare_schema SET version = :v"), {"v": SCHEMA_VERSION - 1})
    assert migrate(fresh_sqlite) == [SCHEMA_VERSION]
    assert [r for r in caplog.records if r.name.startswith("alembic")]


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_an_old_sqlite_database_upgrades_in_place(
    version: int, tmp_path: Path, fresh_sqlite: Engine
) -> None:
    engine = sqlite_copy(version, tmp_path)
    with engine.connect() as conn:  # as the old code left it: no Alembic yet
        assert conn.execute(text("SELECT version FROM gpushare_schema")).scalar() == version
        assert not inspect(conn).has_table("alembic_version")
    assert_upgraded_keeps_rows(engine, fresh_sqlite, version)


@pytest.mark.parametrize("how", ["recorded", "revision"])
def test_a_newer_database_is_refused(how: str, tmp_path: Path) -> None:
    engine = sqlite_copy(6, tmp_path)
    migrate(engine)
    with engine.begin() as conn:
        if how == "recorded":
            conn.execute(text("UPDATE gpushare_schema SET version = 8"))
        else:
            conn.execute(text("UPDATE alembic_version SET version_num = '0008'"))
    before = rows(engine), shape(engine)
    with pytest.raises(
        SchemaError,
        match="database schema version 8 is newer than this broker's 7; upgrade jupyter-gpushare",
    ):
        migrate(engine)
    assert (rows(engine), shape(engine)) == before


def broken_scripts(tmp_path: Path) -> Path:
    """A copy of the migrations whose revision 0006 fails after doing its DDL."""
    location = tmp_path / "migrations"
    shutil.copytree(SCRIPT_LOCATION, location, ignore=shutil.ignore_patterns("__pycache__"))
    revision = location / "versions" / "rev0006_grant_end.py"
    code = revision.read_text()
    assert "    schema_steps.grant_end(op.get_bind())\n" in code
    revision.write_text(
        code.replace(
            "    schema_steps.grant_end(op.get_bind())\n",
            "    schema_steps.grant_end(op.get_bind())\n    raise RuntimeError('broken step')\n",
        )
    )
    return location


def assert_still_at_5(engine: Engine) -> None:
    assert versions(engine) == (5, "0005")
    with engine.connect() as conn:
        insp = inspect(conn)
        assert "end_kind" not in {c["name"] for c in insp.get_columns("gpushare_grants")}
        assert "ix_gpushare_grants_end" not in {
            i["name"] for i in insp.get_indexes("gpushare_grants")
        }


def test_a_failing_revision_leaves_sqlite_at_the_one_before(tmp_path: Path) -> None:
    """SQLite too: the migration's connection begins its transactions itself, so the
    ALTER TABLE and CREATE INDEX of the failing revision roll back with it."""
    engine = sqlite_copy(4, tmp_path)
    with pytest.raises(RuntimeError, match="broken step"):
        migrate(engine, script_location=broken_scripts(tmp_path))
    assert_still_at_5(engine)  # revision 0005 went through, 0006 left nothing behind


def test_upgrade_db_prints_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from jupyter_gpushare.cli import main

    engine = sqlite_copy(4, tmp_path)
    url = str(engine.url)
    assert main(["upgrade-db", "--db-url", url]) == 0
    out = capsys.readouterr().out
    assert f"{url}: schema 4 -> 7" in out
    assert "applied schema 5: nodes: the broker's own drain" in out
    assert "applied schema 6: grants: one record of how each grant ended" in out
    assert "applied schema 7: jobs: a submission's idempotency key" in out
    assert current_version(engine) == 7
    assert main(["upgrade-db", "--db-url", url]) == 0
    assert capsys.readouterr().out.strip() == f"{url}: schema 7, up to date (nothing to do)"


def test_upgrade_db_refuses_a_newer_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jupyter_gpushare.cli import main

    engine = sqlite_copy(6, tmp_path)
    with engine.begin() as conn:
        conn.execute(text("UPDATE gpushare_schema SET version = 9"))
    assert main(["upgrade-db", "--db-url", str(engine.url)]) == 1
    assert "database schema version 9 is newer than this broker's 7" in capsys.readouterr().err


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_restore(server: Any, name: str, version: int) -> Engine:
    """A database on the real server from the dump of one the old code wrote."""
    url = server.new_database(name)
    psql = shutil.which("psql") or os.path.join(server.bindir, "psql")
    subprocess.run(
        [
            psql,
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url.replace("postgresql+psycopg2://", "postgresql://"),
            "-f",
            str(OLD / f"schema-{version}.pg.sql"),
        ],
        check=True,
        capture_output=True,
    )
    return make_engine(url)


@pytest.mark.parametrize("version", [5, 6])
def test_an_old_postgres_database_upgrades_in_place(version: int, postgres: Any) -> None:  # noqa: F811
    fresh = make_engine(postgres.new_database(f"fresh{version}"))
    migrate(fresh)
    engine = pg_restore(postgres, f"old{version}", version)
    try:
        assert_upgraded_keeps_rows(engine, fresh, version)
    finally:
        engine.dispose()
        fresh.dispose()


def test_a_failing_revision_leaves_postgres_at_the_one_before(
    postgres: Any,  # noqa: F811  (the pgserver fixture)
    tmp_path: Path,
) -> None:
    engine = pg_restore(postgres, "broken5", 5)
    try:
        with pytest.raises(RuntimeError, match="broken step"):
            migrate(engine, script_location=broken_scripts(tmp_path))
        assert_still_at_5(engine)
        assert migrate(engine) == [6, 7]  # the real revisions then go through
    finally:
        engine.dispose()

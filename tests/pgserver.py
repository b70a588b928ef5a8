"""A throw-away PostgreSQL server for tests (real ``initdb`` + ``pg_ctl``, trust auth).

``start_postgres() -> PgServer`` (``.url`` is a SQLAlchemy URL, ``.new_database(name)``
returns the URL of a fresh database, ``.stop()``); ``pg_missing_reason()`` is ``None`` when the
binaries exist, else the reason to skip. The server runs as the ``postgres`` system user
(or ``nobody``) when the tests run as root, from a private folder under /tmp.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest
from ports import free_port as _free_port


def _bindir() -> str | None:
    found = shutil.which("pg_ctl")
    if found:
        return os.path.dirname(found)
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return dirs[-1] if dirs else None


def pg_missing_reason() -> str | None:
    bindir = _bindir()
    if bindir is None or not os.path.exists(os.path.join(bindir, "initdb")):
        return "PostgreSQL binaries (initdb, pg_ctl) not installed: apt-get install -y postgresql"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 not installed (pip install psycopg2-binary)"
    return None


class PgServer:
    def __init__(self) -> None:
        bindir = _bindir()
        assert bindir
        self.bindir = bindir
        self.dir = tempfile.mkdtemp(prefix="gpushare-pg-")
        os.chmod(self.dir, 0o777)
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.user = None
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                try:
                    pwd.getpwnam(name)
                    self.user = name
                    break
                except KeyError:
                    continue
        self._run(
            [
                os.path.join(bindir, "initdb"),
                "-D",
                self.data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ]
        )
        self._run(
            [
                os.path.join(bindir, "pg_ctl"),
                "-D",
                self.data,
                "-l",
                os.path.join(self.dir, "pg.log"),
                "-w",
                "-t",
                "60",
                "-o",
                f"-p {self.port} -k {self.dir} -h 127.0.0.1 -c fsync=off -c max_connections=300",
                "start",
            ]
        )
        self.url = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, cmd: list[str]) -> None:
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def new_database(self, name: str, template: str | None = None) -> str:
        """A new empty database (a copy of ``template`` if given, e.g. a seeded one), dropped
        first if it exists; its SQLAlchemy URL."""
        import psycopg2

        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres"
        )
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            copy = f' TEMPLATE "{template}"' if template else ""
            cur.execute(f'CREATE DATABASE "{name}"{copy}')
        conn.close()
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run(
                [os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "immediate", "stop"]
            )
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> object:
    """Session fixture: a running :class:`PgServer` (skips, saying why, without binaries)."""
    reason = pg_missing_reason()
    if reason:
        pytest.skip(reason)
    server = PgServer()
    yield server
    server.stop()

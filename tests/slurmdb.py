"""Slurm accounting for the test cluster: a private MariaDB server and ``slurmdbd``.

:class:`SlurmDB` starts, in a folder of its own:

* ``mariadbd`` on a private data folder made by ``mariadb-install-db``, listening on a unix
  socket and on ``127.0.0.1`` at a free port (slurmdbd's MySQL client reaches it by TCP), with
  a ``slurm`` database user whose password is random;
* ``slurmdbd -D`` with a private ``slurmdbd.conf`` (mode 600, next to the cluster's
  ``slurm.conf``: slurmdbd reads it from ``$SLURM_CONF``'s folder) that listens on a free port
  of the cluster's bridge address, so ``slurmctld`` in its network namespace reaches it.

Both are found by the pid they were started with and killed on :meth:`SlurmDB.stop`.
:meth:`SlurmDB.conf_lines` are the ``slurm.conf`` lines that turn accounting on; the cluster
fixture of :mod:`slurmcluster` takes them as ``extra_conf`` and starts the database through its
``before_ctld`` hook (:func:`accounting_cluster`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from ports import free_port

DB_READY_S = 60.0


def have_slurmdbd() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmdbd", "mariadbd",
                                         "mariadb-install-db", "sacctmgr"))


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], what: str,
               logs: Any, timeout: float = DB_READY_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{logs()}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not listening on {host}:{port} after {timeout:g}s:\n{logs()}")


class SlurmDB:
    """MariaDB plus slurmdbd for one test cluster (module docstring)."""

    def __init__(self, conf_dir: str | os.PathLike[str], *, listen_ip: str,
                 munge_socket: str, env: dict[str, str]) -> None:
        self.conf_dir = Path(conf_dir)
        self.dir = self.conf_dir / "accounting"
        self.listen_ip = listen_ip
        self.munge_socket = munge_socket
        self.env = env
        self.suffix = secrets.token_hex(3)
        self.db_port = free_port()
        self.dbd_port = free_port()
        self.password = secrets.token_hex(12)
        self.database = f"slurm_acct_{self.suffix}"
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def conf_lines(self) -> list[str]:
        """``slurm.conf`` lines for accounting through this slurmdbd, with limits enforced."""
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={self.listen_ip}",
            f"AccountingStoragePort={self.dbd_port}",
            # the munge socket for slurmdbd connections (AuthInfo is not used for those)
            f"AccountingStoragePass={self.munge_socket}",
            "AccountingStorageEnforce=associations,limits,qos,safe",
            "AccountingStorageTRES=gres/gpu,gres/shard",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=5",
        ]

    # -- start ------------------------------------------------------------------------------

    def log(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for path in sorted(self.dir.glob("*.log")):
            with contextlib.suppress(OSError):
                parts.append(f"== {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = open(self.log(name), "ab")  # noqa: SIM115 - closed on stop
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self._procs.append(proc)
        return proc

    def start(self) -> SlurmDB:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._mariadb()
            self._slurmdbd()
        except BaseException:
            self.stop()
            raise
        return self

    def _mariadb(self) -> None:
        data = self.dir / "mysql"
        sock = str(self.dir / "mysql.sock")
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--skip-test-db", "--auth-root-authentication-method=socket"],
            check=True, capture_output=True, timeout=120, env=self.env,
        )
        proc = self._spawn(
            ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={sock}",
             "--bind-address=127.0.0.1", f"--port={self.db_port}", "--user=root",
             f"--pid-file={self.dir / 'mysql.pid'}", "--innodb-buffer-pool-size=32M",
             "--innodb-log-file-size=16M", "--skip-name-resolve", "--log-error="
             + str(self.log("mariadbd-own"))],
            "mariadbd",
        )
        _wait_port("127.0.0.1", self.db_port, proc, "mariadbd", self.logs)
        sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.password}'; "
               f"GRANT ALL ON `{self.database}`.* TO 'slurm'@'127.0.0.1'; "
               f"GRANT ALL ON `{self.database}_job_table`.* TO 'slurm'@'127.0.0.1';")
        subprocess.run(["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", sql],
                       check=True, capture_output=True, timeout=30, env=self.env)

    def _slurmdbd(self) -> None:
        conf = self.conf_dir / "slurmdbd.conf"
        conf.write_text("\n".join([
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost",
            f"DbdAddr={self.listen_ip}",
            f"DbdPort={self.dbd_port}",
            "SlurmUser=root",
            "DebugLevel=debug2",
            f"LogFile={self.log('slurmdbd-own')}",
            f"PidFile={self.dir / 'slurmdbd.pid'}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.db_port}",
            "StorageUser=slurm",
            f"StoragePass={self.password}",
            f"StorageLoc={self.database}",
        ]) + "\n")
        conf.chmod(0o600)
        proc = self._spawn(["slurmdbd", "-D"], "slurmdbd")
        _wait_port(self.listen_ip, self.dbd_port, proc, "slurmdbd", self.logs)

    # -- use --------------------------------------------------------------------------------

    def sacctmgr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``sacctmgr -i ARGS`` against this slurmdbd."""
        done = subprocess.run(["sacctmgr", "-i", *args], env=self.env, capture_output=True,
                              text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"sacctmgr {' '.join(args)}: exit {done.returncode}\n"
                               f"{done.stdout}{done.stderr}\n{self.logs()}")
        return done

    # -- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill slurmdbd, then mariadbd, by the pids they were started with."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()


@contextlib.contextmanager
def accounting_cluster(**kwargs: Any) -> Iterator[tuple[Any, SlurmDB]]:
    """A started :class:`slurmcluster.SlurmCluster` with accounting through a
    :class:`SlurmDB` (its ``slurm.conf`` lines go in as ``extra_conf``, it starts in the
    ``before_ctld`` hook, and the cluster is registered with ``sacctmgr add cluster``).
    Skips where Slurm, slurmdbd or MariaDB is not installed."""
    from slurmcluster import SlurmCluster

    if not have_slurmdbd():
        pytest.skip("slurmctld/slurmdbd/mariadbd is not on PATH "
                    "(apt-get install slurm-wlm slurmdbd munge mariadb-server; .ci/run does it)")
    extra = list(kwargs.pop("extra_conf", None) or [])
    cluster = SlurmCluster(**kwargs)
    db = SlurmDB(cluster.dir, listen_ip=cluster.host_ip, munge_socket=cluster.munge_socket,
                 env=cluster.env)
    cluster.extra_conf = [*db.conf_lines(), *extra]
    previous = cluster.before_ctld

    def before_ctld(c: Any) -> None:
        db.start()
        db.sacctmgr("add", "cluster", c.name)
        if previous is not None:
            previous(c)

    cluster.before_ctld = before_ctld
    try:
        cluster.start()
        yield cluster, db
    finally:
        cluster.stop()
        db.stop()
        cluster.cleanup()


@contextlib.contextmanager
def exported_cluster(policy: Any, *, shards_per_gpu: int = 8, users: dict[str, list[str]]
                     | None = None, **kwargs: Any) -> Iterator[tuple[Any, SlurmDB, Any, list[
                         subprocess.CompletedProcess[str]]]]:
    """An :func:`accounting_cluster` configured by ``jupyter-gpushare export slurm`` of
    ``policy``: its ``slurm.conf`` lines (all but the node lines, which the cluster writes for
    its own nodes), its ``gres.conf`` (with the cluster's fake devices as ``File=``) and its
    ``sacctmgr`` commands, run once slurmctld has registered its TRES with slurmdbd (before,
    ``GrpTRES=gres/gpu=...`` is refused: "no TRES known"). ``users`` maps a user to the accounts
    it is added to. Yields (cluster, db, export, the commands' results)."""
    import shlex

    from jupyter_gpushare.export.slurm import export_slurm

    export = export_slurm(policy, shards_per_gpu=shards_per_gpu)

    def before_ctld(cluster: Any) -> None:
        gres = export_slurm(policy, shards_per_gpu=shards_per_gpu,
                            device=str(cluster.dir) + "/{node}/dev/fakegpu{index}")
        (Path(cluster.dir) / "gres.conf").write_text("\n".join(gres.gres_conf) + "\n")

    conf = [line for line in export.slurm_conf
            if line and not line.startswith(("#", "NodeName="))]
    conf += list(kwargs.pop("extra_conf", None) or [])
    with accounting_cluster(shards_per_gpu=shards_per_gpu, extra_conf=conf,
                            before_ctld=before_ctld, **kwargs) as (cluster, db):
        results = [cluster.run(*shlex.split(cmd), check=False) for cmd in export.commands()]
        for user, accounts in (users or {}).items():
            db.sacctmgr("add", "user", user, "account=" + ",".join(accounts))
        yield cluster, db, export, results

"""A real Slurm cluster of several nodes for the tests, each daemon in its own namespaces.

``SlurmCluster`` starts, in a temporary folder:

* one ``munged`` in the root namespace (its unix socket is a file, reachable from every
  network namespace);
* ``slurmctld`` and one ``slurmd`` per node, each in a network namespace of its own
  (``ip netns``, names with a random per-cluster suffix) joined by a veth pair to a bridge
  in the root namespace, with private ``10.x.y.0/24`` addresses chosen at random, and in a
  UTS namespace of its own (``unshare --uts``) so each node has its own hostname;
* fake GPUs per node (``mknod c 195 N``) as GRES ``gpu`` and ``shard`` (``shards_per_gpu``
  shards per GPU).

The namespaces have no default route and each daemon resolves names from its own
``/etc/hosts`` (bind-mounted in a mount namespace of its own, with an empty
``resolv.conf``), so nothing leaves them; the clients
(``sbatch``, ``squeue``...) run in the root namespace with :attr:`SlurmCluster.env` and reach
``slurmctld`` across the bridge. Every daemon is found by the pid it was started with (and
a node's job processes by its network namespace), killed on :meth:`SlurmCluster.stop`, and
the namespaces and the bridge are removed.

Other test files use it with ``from slurmcluster import slurm_cluster, SlurmCluster``; the
``extra_conf`` lines replace (same key) or add ``slurm.conf`` lines, and ``before_ctld`` is
called with the cluster before ``slurmctld`` starts (e.g. to start ``slurmdbd`` through
:meth:`SlurmCluster.start_daemon`, listening on :attr:`SlurmCluster.host_ip`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

SLURM_READY_S = 60.0


IN_SERVICE_STATES = {"idle", "mixed", "allocated", "completing"}  # sinfo %T


def have_slurm() -> bool:
    return shutil.which("slurmctld") is not None


needs_slurm = pytest.mark.skipif(not have_slurm(), reason="slurmctld is not on PATH "
                                 "(apt-get install slurm-wlm munge; .ci/run does it)")


@dataclass
class SlurmNode:
    """One slurmd: its name (= hostname and Slurm NodeName), namespace and address."""

    name: str
    netns: str
    ip: str
    veth: str
    gpus: int
    devices: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=30)


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that no route or address of this machine overlaps."""
    used = _run("ip", "-4", "-o", "route", "show", "table", "all").stdout
    used += _run("ip", "-4", "-o", "addr").stdout
    nets = []
    for word in used.split():
        with contextlib.suppress(ValueError):
            if "/" in word or word.count(".") == 3:
                nets.append(ipaddress.ip_network(word, strict=False))
    rng = random.SystemRandom()
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randint(64, 250)}.{rng.randint(0, 255)}.0/24")
        if not any(net.overlaps(n) for n in nets if n.version == 4 and n.prefixlen > 0):
            return net  # type: ignore[return-value]
    raise RuntimeError("no free 10.x.y.0/24 subnet found")


class SlurmCluster:
    """slurmctld plus ``len(nodes)`` slurmd nodes in network namespaces (module docstring)."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        nodes: tuple[str, ...] | list[str] = ("node1", "node2", "node3"),
        gpus_per_node: int = 2,
        shards_per_gpu: int = 8,
        cpus_per_node: int = 8,
        memory_mib: int = 64000,
        partition: str = "gpu",
        extra_conf: list[str] | None = None,
        before_ctld: Callable[[SlurmCluster], None] | None = None,
    ) -> None:
        self.suffix = secrets.token_hex(3)
        self.name = f"gs{self.suffix}"  # ClusterName (also for sacctmgr)
        self.dir = Path(tempfile.mkdtemp(prefix=f"slurm-{self.suffix}-", dir=base_dir))
        self.dir.chmod(0o755)
        self.gpus_per_node = gpus_per_node
        self.shards_per_gpu = shards_per_gpu
        self.cpus_per_node = cpus_per_node
        self.memory_mib = memory_mib
        self.partition = partition
        self.extra_conf = list(extra_conf or [])
        self.before_ctld = before_ctld
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.host_ip = str(hosts[0])  # the bridge, in the root namespace
        self.bridge = f"gsb{self.suffix}"
        self.ctld_name = f"ctld-{self.suffix}"
        self.ctld = SlurmNode(self.ctld_name, f"gs-{self.suffix}-ctld", str(hosts[1]),
                              f"gsv{self.suffix}c", 0)
        self.nodes: dict[str, SlurmNode] = {}
        for i, name in enumerate(nodes):
            self.nodes[name] = SlurmNode(name, f"gs-{self.suffix}-{i}", str(hosts[2 + i]),
                                         f"gsv{self.suffix}{i}", gpus_per_node)
        self.conf_path = str(self.dir / "slurm.conf")
        self.munge_socket = str(self.dir / "munge" / "munge.socket.2")
        self.env = dict(os.environ, SLURM_CONF=self.conf_path)
        for key in list(self.env):
            if key.startswith("SLURM_") and key != "SLURM_CONF":
                del self.env[key]
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._netns: list[str] = []
        self._links: list[str] = []
        self.started = False

    # -- names ------------------------------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        return list(self.nodes)

    def log_path(self, daemon: str) -> Path:
        return self.dir / "log" / f"{daemon}.log"

    # -- start ------------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        try:
            self._layout()
            self._network()
            self._munge()
            self._write_conf()
            if self.before_ctld is not None:
                self.before_ctld(self)
            self.ctld.proc = self._in_ns(self.ctld, ["slurmctld", "-D", "-f", self.conf_path],
                                         "slurmctld")
            for node in self.nodes.values():
                self._start_slurmd(node)
            self.wait_ready()
            self.started = True
        except BaseException:
            self.stop()
            raise
        return self

    def _layout(self) -> None:
        for sub in ("log", "run", "state", "spool", "munge", "jobs"):
            (self.dir / sub).mkdir(exist_ok=True)
            (self.dir / sub).chmod(0o755)
        for node in self.nodes.values():
            (self.dir / "spool" / node.name).mkdir()
            dev = self.dir / node.name / "dev"
            dev.mkdir(parents=True)
            for i in range(node.gpus):
                path = dev / f"fakegpu{i}"
                os.mknod(path, 0o666 | 0o020000, os.makedev(195, i))  # S_IFCHR
                node.devices.append(str(path))

    def _network(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _run("ip", "addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        everyone = [self.ctld, *self.nodes.values()]
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.ip} {n.name}\n" for n in everyone)
        etc = self.dir / "etc"  # bind-mounted over /etc/hosts, /etc/resolv.conf per daemon
        etc.mkdir(exist_ok=True)
        (etc / "hosts").write_text(hosts)
        (etc / "resolv.conf").write_text("# no name servers: nothing leaves the namespaces\n")
        for node in everyone:
            _run("ip", "netns", "add", node.netns)
            self._netns.append(node.netns)
            peer = node.veth + "p"
            _run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", peer)
            self._links.append(node.veth)
            _run("ip", "link", "set", peer, "netns", node.netns)
            _run("ip", "link", "set", node.veth, "master", self.bridge, "up")
            _run("ip", "-n", node.netns, "addr", "add", f"{node.ip}/{self.subnet.prefixlen}",
                 "dev", peer)
            _run("ip", "-n", node.netns, "link", "set", peer, "up")
            _run("ip", "-n", node.netns, "link", "set", "lo", "up")

    def _munge(self) -> None:
        key = self.dir / "munge" / "munge.key"
        _run("mungekey", "--create", f"--keyfile={key}")
        key.chmod(0o600)
        proc = self.start_daemon(
            ["munged", "-F", "--force", f"--key-file={key}", f"--socket={self.munge_socket}",
             f"--pid-file={self.dir / 'munge' / 'munged.pid'}",
             f"--log-file={self.dir / 'log' / 'munged-own.log'}",
             f"--seed-file={self.dir / 'munge' / 'seed'}"],
            "munged",
        )
        deadline = time.monotonic() + 15
        while not os.path.exists(self.munge_socket):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not start:\n" + self.logs())
            time.sleep(0.05)

    def conf_lines(self) -> list[str]:
        d = self.dir
        settings: dict[str, str] = {
            "ClusterName": self.name,
            "SlurmctldHost": f"{self.ctld_name}({self.ctld.ip})",
            "SlurmctldPort": "6817",
            "SlurmdPort": "6818",
            "AuthType": "auth/munge",
            "CryptoType": "crypto/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": str(d / "state"),
            "SlurmdSpoolDir": str(d / "spool" / "%n"),
            "SlurmctldPidFile": str(d / "run" / "slurmctld.pid"),
            "SlurmdPidFile": str(d / "run" / "slurmd-%n.pid"),
            "SlurmctldLogFile": str(d / "log" / "slurmctld-own.log"),
            "SlurmdLogFile": str(d / "log" / "slurmd-%n-own.log"),
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "SchedulerType": "sched/backfill",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SlurmdParameters": "config_overrides",
            "ReturnToService": "2",
            "GresTypes": "gpu,shard",
            "SlurmdTimeout": "6",
            "SlurmctldTimeout": "10",
            "MessageTimeout": "5",
            "InactiveLimit": "0",
            "KillWait": "3",
            "MinJobAge": "600",
            "MailProg": "/bin/true",
            "SchedulerParameters": "batch_sched_delay=0,sched_min_interval=0",
        }
        extra: list[str] = []
        keys = {k.lower(): k for k in settings}
        for line in self.extra_conf:
            key = line.split("=", 1)[0].strip()
            if "=" in line and key.lower() in keys and not key.lower().startswith(
                ("nodename", "partitionname")
            ):
                settings[keys[key.lower()]] = line.split("=", 1)[1].strip()
            else:
                extra.append(line)
        lines = [f"{k}={v}" for k, v in settings.items()] + extra
        shards = self.gpus_per_node * self.shards_per_gpu
        for node in self.nodes.values():
            lines.append(
                f"NodeName={node.name} NodeAddr={node.ip} CPUs={self.cpus_per_node} "
                f"RealMemory={self.memory_mib} Gres=gpu:{node.gpus},shard:{shards} State=UNKNOWN"
            )
        lines.append(f"PartitionName={self.partition} Nodes=ALL Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=NO")
        return lines

    def gres_lines(self) -> list[str]:
        lines = []
        for node in self.nodes.values():
            if not node.devices:
                continue
            lines.append(f"NodeName={node.name} Name=gpu File={node.devices[0][:-1]}"
                         f"[0-{len(node.devices) - 1}]")
            for dev in node.devices:
                lines.append(f"NodeName={node.name} Name=shard Count={self.shards_per_gpu} "
                             f"File={dev}")
        return lines

    def _write_conf(self) -> None:
        Path(self.conf_path).write_text("\n".join(self.conf_lines()) + "\n")
        (self.dir / "gres.conf").write_text("\n".join(self.gres_lines()) + "\n")

    def start_daemon(self, argv: list[str], log_name: str, *, netns: str | None = None,
                     hostname: str | None = None, env: dict[str, str] | None = None
                     ) -> subprocess.Popen[bytes]:
        """Start a daemon (in ``netns`` with its own ``hostname`` if given) whose output goes
        to ``log/<log_name>.log``; it is killed, by this pid, on :meth:`stop`."""
        if netns is not None:
            # nsenter (not ip netns exec, which remounts /sys without cgroups) into the
            # network namespace, then new UTS and mount namespaces: own hostname, own
            # /etc/hosts and an empty resolv.conf; every step execs, so the pid is the daemon's
            script = ('mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf '
                      '&& hostname "$0" && shift 2 && exec "$@"')
            argv = ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--uts", "--mount",
                    "sh", "-c", script, hostname or log_name, str(self.dir / "etc" / "hosts"),
                    str(self.dir / "etc" / "resolv.conf"), *argv]
        log = open(self.log_path(log_name), "ab")  # noqa: SIM115 - closed on stop
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env or self.env,
                                start_new_session=True)
        self._procs.append(proc)
        return proc

    def _in_ns(self, node: SlurmNode, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        return self.start_daemon(argv, log_name, netns=node.netns, hostname=node.name)

    def _start_slurmd(self, node: SlurmNode) -> None:
        node.proc = self._in_ns(node, ["slurmd", "-D", "-N", node.name, "-f", self.conf_path],
                                f"slurmd-{node.name}")

    # -- state ------------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 30
            ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``sbatch``, ``squeue``...) against this cluster."""
        return subprocess.run(argv, env=self.env, check=check, capture_output=True, text=True,
                              timeout=timeout)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states: dict[str, str] = {}
        for line in out.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def wait_nodes(self, want: Callable[[str], bool], names: list[str] | None = None,
                   timeout: float = SLURM_READY_S) -> dict[str, str]:
        names = names or self.node_names
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            self._check_alive()
            states = self.node_states()
            if all(want(states.get(n, "")) for n in names):
                return states
            time.sleep(0.25)
        raise RuntimeError(f"Slurm nodes not ready after {timeout:g}s: {states}\n" + self.logs())

    def wait_ready(self, timeout: float = SLURM_READY_S) -> None:
        """Until every node is idle (a clear error with the daemons' logs otherwise)."""
        self.wait_nodes(lambda s: s == "idle", timeout=timeout)

    def _check_alive(self) -> None:
        for proc in (self.ctld.proc, *(n.proc for n in self.nodes.values())):
            if proc is not None and proc.poll() is not None and proc is self.ctld.proc:
                raise RuntimeError(f"slurmctld exited with {proc.returncode}:\n" + self.logs())

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted((self.dir / "log").glob("*.log")):
            with contextlib.suppress(OSError):
                parts.append(f"== {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    # -- failures ---------------------------------------------------------------------------

    def netns_pids(self, netns: str) -> list[int]:
        out = _run("ip", "netns", "pids", netns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    def kill_node(self, name: str) -> None:
        """``kill -9`` the node's slurmd and every process in its namespace (its jobs): a
        dead machine, as slurmctld sees it."""
        node = self.nodes[name]
        for _ in range(5):
            pids = self.netns_pids(node.netns)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        if node.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(5)

    def restart_node(self, name: str, *, wait: bool = True, busy_ok: bool = False) -> None:
        """Start the node's slurmd again (after :meth:`kill_node`), resume it if Slurm keeps
        it down, and wait until it is idle (``busy_ok``: or in service with jobs on it, as on
        a cluster that goes on scheduling meanwhile, the soak's)."""
        wanted = IN_SERVICE_STATES if busy_ok else {"idle"}
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None:
            self.kill_node(name)
        self._start_slurmd(node)
        if wait:
            deadline = time.monotonic() + SLURM_READY_S
            while time.monotonic() < deadline:
                state = self.node_states().get(name, "")
                if state in wanted:
                    return
                if state.startswith(("down", "drain")):
                    self.run("scontrol", "update", f"nodename={name}", "state=resume",
                             check=False)
                time.sleep(0.3)
            raise RuntimeError(f"node {name} did not come back:\n" + self.logs())

    def kill_ctld(self) -> None:
        """``kill -9`` of slurmctld alone: the nodes and their jobs go on, nothing answers
        ``squeue``, ``sbatch`` or ``scancel``."""
        proc = self.ctld.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def restart_ctld(self, timeout: float = SLURM_READY_S) -> None:
        """Start slurmctld again (after :meth:`kill_ctld`): it recovers its jobs from its
        state folder; wait until it answers for every node."""
        self.kill_ctld()
        self.ctld.proc = self._in_ns(self.ctld, ["slurmctld", "-D", "-f", self.conf_path],
                                     "slurmctld")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if len(states) == len(self.nodes):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("slurmctld did not come back:\n" + self.logs())
        # what an admin does after a slurmctld crash: resume the nodes it set down or
        # drained (a run it forgot, an id it gave twice), and see them in service
        while time.monotonic() < deadline:
            out = [n for n, s in states.items() if s not in IN_SERVICE_STATES]
            if not out:
                return
            for name in out:
                if states[name].startswith(("down", "drain")):
                    self.run("scontrol", "update", f"nodename={name}", "state=resume",
                             check=False)
            time.sleep(0.5)
            states = self.node_states()
        raise RuntimeError(f"nodes not back in service after slurmctld: {states}\n"
                           + self.logs())

    # -- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every daemon started (by pid) and every process left in the namespaces;
        delete the namespaces and the bridge."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(5)
        for ns in self._netns:  # slurmstepd and job processes left behind
            for pid in self.netns_pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for ns in self._netns:
            _run("ip", "netns", "del", ns, check=False)
        for link in self._links:
            _run("ip", "link", "del", link, check=False)
        self._netns.clear()
        self._links.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        self.started = False

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


@contextlib.contextmanager
def running_cluster(**kwargs: Any) -> Iterator[SlurmCluster]:
    """A started :class:`SlurmCluster` (skips the test where Slurm is not installed)."""
    if not have_slurm():
        pytest.skip("slurmctld is not on PATH (apt-get install slurm-wlm munge)")
    cluster = SlurmCluster(**kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Three nodes (node1..node3) with 2 fake GPUs of 8 shards each, for a test module."""
    with running_cluster() as cluster:
        yield cluster

"""The test Slurm cluster itself (tests/slurmcluster.py): three real slurmd nodes in their own
network and UTS namespaces, fake GPUs as GRES gpu and shard, torn down without a trace."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from slurmcluster import SlurmCluster, needs_slurm, slurm_cluster  # noqa: F401 - a fixture

pytestmark = [pytest.mark.slow, needs_slurm]


def wait_done(cluster: SlurmCluster, job_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = cluster.run("scontrol", "show", "job", job_id, check=False).stdout
        state = next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "")
        if state in {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end:\n{out}\n{cluster.logs()}")


def sbatch(cluster: SlurmCluster, out: Path, *args: str) -> str:
    script = "hostname; echo CVD=$CUDA_VISIBLE_DEVICES; echo SHARDS=$SLURM_SHARDS_ON_NODE"
    done = cluster.run("sbatch", "--parsable", f"--output={out}", *args, "--wrap", script)
    return done.stdout.strip().split(";")[0]


def fields(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    out = {"hostname": lines[0]}
    for line in lines[1:]:
        key, _, value = line.partition("=")
        out[key] = value
    return out


def test_three_nodes_each_with_its_hostname_gpus_and_shards(
    slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture
) -> None:
    cluster = slurm_cluster
    assert cluster.node_names == ["node1", "node2", "node3"]
    assert cluster.node_states() == {n: "idle" for n in cluster.node_names}
    jobs = {}
    for node in cluster.node_names:
        jobs[node] = sbatch(cluster, cluster.dir / f"gpu-{node}.txt", f"--nodelist={node}",
                            "--gres=gpu:2")
    shard = sbatch(cluster, cluster.dir / "shard.txt", "--nodelist=node2", "--gres=shard:3")
    for node, job_id in jobs.items():
        assert wait_done(cluster, job_id) == "COMPLETED"
        got = fields(cluster.dir / f"gpu-{node}.txt")
        assert got["hostname"] == node  # its own UTS namespace
        assert got["CVD"] == "0,1"  # the two fake GPUs, through GRES
    assert socket.gethostname() not in cluster.node_names
    assert wait_done(cluster, shard) == "COMPLETED"
    got = fields(cluster.dir / "shard.txt")
    assert got["hostname"] == "node2" and got["SHARDS"] == "3"
    # every node is in a network namespace of its own, reached over the bridge
    addrs = {cluster.nodes[n].ip for n in cluster.node_names} | {cluster.ctld.ip}
    assert len(addrs) == 4 and all(a.startswith("10.") for a in addrs)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for node in [*cluster.nodes.values(), cluster.ctld]:
        assert node.netns in netns
        assert node.proc is not None and node.proc.pid in cluster.netns_pids(node.netns)
        routes = subprocess.run(["ip", "-n", node.netns, "-4", "route"], capture_output=True,
                                text=True).stdout.splitlines()
        # no default route: nothing in a namespace can reach past the bridge's subnet
        assert [r.split()[0] for r in routes] == [str(cluster.subnet)], routes


def test_a_killed_node_goes_down_and_comes_back(
    slurm_cluster: SlurmCluster,  # noqa: F811 - the fixture
) -> None:
    cluster = slurm_cluster
    cluster.kill_node("node3")
    states = cluster.wait_nodes(lambda s: s.startswith("down"), ["node3"], timeout=60)
    assert states["node1"] == "idle"
    cluster.restart_node("node3")
    assert cluster.node_states()["node3"] == "idle"


def test_teardown_leaves_no_daemon_namespace_or_link() -> None:
    # in the default short folder: a pytest-xdist tmp_path makes munged's socket path longer
    # than a Unix socket may be (108 bytes)
    cluster = SlurmCluster(nodes=["a1", "a2"], gpus_per_node=1, shards_per_gpu=4,
                           extra_conf=["SlurmctldDebug=verbose", "# an added line"])
    cluster.start()
    conf = Path(cluster.conf_path).read_text()
    assert "SlurmctldDebug=verbose" in conf and "SlurmctldDebug=info" not in conf
    assert "# an added line" in conf
    assert "Name=shard Count=4" in (cluster.dir / "gres.conf").read_text()
    procs = list(cluster._procs)
    names = [n.netns for n in cluster.nodes.values()] + [cluster.ctld.netns]
    cluster.cleanup()
    assert all(p.poll() is not None for p in procs)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(n in netns for n in names)
    assert cluster.suffix not in links and not cluster.dir.exists()

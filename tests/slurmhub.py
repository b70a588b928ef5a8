"""A real JupyterHub whose servers are Slurm jobs on a :class:`slurmcluster.SlurmCluster`.

Shared by ``tests/test_spawner_slurm_hub.py`` and ``benchmarks/slurm_spawn.py``::

    from slurmhub import slurm_hub_config, hub_env
    extra = slurm_hub_config(cluster, home_root, spawner="gpushare", policy=p, broker_port=n)
    hub = start_hub(tmp, extra_config=extra, env=hub_env(cluster))

The nodes run in network namespaces, so the hub, its API and the broker listen on the
cluster's bridge address (:attr:`SlurmCluster.host_ip`, in the root namespace), which the
single-user servers reach from their node; the hub and proxy reach a server at its node's
address (``node_addresses``). Hub users have no system accounts here: the test-only
subclasses below give each user a home in the test folder, and jobs are submitted (and
run) as root without ``sudo`` (``exec_prefix = ""``). Everything else is the product code:
``SlurmGPUShareSpawner`` and, for the benchmark's baseline, batchspawner's own spawner.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from batchspawner import BatchSpawnerBase
from traitlets import Unicode, default

HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent


class _NoSystemUsers(BatchSpawnerBase):
    """HOME and the job's working folder under ``home_root``; no ``pwd`` look-ups."""

    home_root = Unicode("/tmp", config=True, help="Folder holding each test user's home.")

    @default("req_homedir")
    def _home_default(self) -> str:
        path = os.path.join(self.home_root, self.user.name)
        os.makedirs(path, exist_ok=True)
        return path

    def user_env(self, env: dict[str, Any]) -> dict[str, Any]:
        env["USER"] = self.user.name
        env["HOME"] = self.req_homedir
        return env


def _classes() -> tuple[type, type]:
    import batchspawner

    from jupyter_gpushare.spawner.slurm import SlurmGPUShareSpawner

    class TestSlurmGPUShareSpawner(_NoSystemUsers, SlurmGPUShareSpawner):  # type: ignore[misc]
        """SlurmGPUShareSpawner for hub users without system accounts (tests only)."""

    class TestPlainSlurmSpawner(_NoSystemUsers, batchspawner.MultiSlurmSpawner):  # type: ignore[misc]
        """batchspawner's SlurmSpawner (MultiSlurmSpawner adds only the node-name map)."""

    return TestSlurmGPUShareSpawner, TestPlainSlurmSpawner


TestSlurmGPUShareSpawner, TestPlainSlurmSpawner = _classes()


def hub_env(cluster: Any) -> dict[str, str]:
    """The hub's environment: the cluster's ``SLURM_CONF`` for sbatch, squeue, scancel."""
    return {"SLURM_CONF": cluster.conf_path}


def slurm_hub_config(
    cluster: Any,
    home_root: Path | str,
    *,
    spawner: str = "gpushare",
    policy: Path | str | None = None,
    broker_port: int | None = None,
    poll: float = 0.3,
    plain_node: str = "node1",
) -> str:
    """``extra_config`` for :func:`realhub.start_hub` (``spawner``: gpushare | plain)."""
    ip = cluster.host_ip
    nodes = {n.name: n.ip for n in cluster.nodes.values()}
    lines = [
        "import sys",
        f"sys.path.insert(0, {str(HERE)!r})",
        "from slurmhub import TestSlurmGPUShareSpawner, TestPlainSlurmSpawner",
        f"c.JupyterHub.hub_ip = {ip!r}",
        f"c.JupyterHub.hub_connect_ip = {ip!r}",
        "c.JupyterHub.cleanup_servers = False",
        "c.Spawner.http_timeout = 120",
        "c.Spawner.start_timeout = 180",
        # JupyterHub's default env_keep, plus SLURM_CONF for sbatch (it gets this env)
        "c.Spawner.env_keep = ['PATH', 'PYTHONPATH', 'CONDA_ROOT', 'CONDA_DEFAULT_ENV',"
        " 'VIRTUAL_ENV', 'LANG', 'LC_ALL', 'JUPYTERHUB_SINGLEUSER_APP', 'SLURM_CONF']",
        "c.BatchSpawnerBase.exec_prefix = ''",
        "c.BatchSpawnerBase.batchspawner_singleuser_cmd = "
        + repr(str(VENV_BIN / "batchspawner-singleuser")),
        f"c.BatchSpawnerBase.startup_poll_interval = {poll}",
        f"c.BatchSpawnerBase.req_partition = {cluster.partition!r}",
        f"c.TestSlurmGPUShareSpawner.home_root = {str(home_root)!r}",
        f"c.TestPlainSlurmSpawner.home_root = {str(home_root)!r}",
        f"c.TestSlurmGPUShareSpawner.node_addresses = {nodes!r}",
        f"c.TestPlainSlurmSpawner.daemon_resolver = {nodes!r}",
    ]
    if spawner == "plain":
        # by hand, what the gpushare spawner derives from a 1/4 GPU grant of team alpha
        lines += [
            "c.JupyterHub.spawner_class = TestPlainSlurmSpawner",
            "c.TestPlainSlurmSpawner.req_nprocs = '1'",
            "c.TestPlainSlurmSpawner.req_memory = '1024M'",
            "c.TestPlainSlurmSpawner.req_runtime = '02:00:00'",
            f"c.TestPlainSlurmSpawner.req_gres = 'shard:{max(1, cluster.shards_per_gpu // 4)}'",
            "c.TestPlainSlurmSpawner.req_options = "
            f"'--account=alpha --qos=interactive --nodelist={plain_node} --no-requeue'",
        ]
    else:
        assert policy is not None and broker_port is not None
        lines += [
            "from jupyter_gpushare.hubsetup import setup_gpushare",
            f"setup_gpushare(c, {str(policy)!r}, spawner=None, broker_port={broker_port},"
            f" broker_ip={ip!r}, data_dir=HUB_TMP, admin_users=['boss'])",
            "c.JupyterHub.spawner_class = TestSlurmGPUShareSpawner",
            f"c.GPUShareSpawner.policy_file = {str(policy)!r}",
            f"c.GPUShareSpawner.queue_poll_interval = {poll}",
            f"c.SlurmGPUShareSpawner.shards_per_gpu = {cluster.shards_per_gpu}",
        ]
    return "\n".join(lines) + "\n"

"""The telemetry service and the Slurm, Kubernetes and YTsaurus backends hold their parts.

Each of :class:`TelemetryService`, :class:`SlurmBackend`, :class:`KubeJobsBackend` and
:class:`YTsaurusBackend` was split into modules as mixins once (c01331c..c39dd20); the style
(as for the broker: tests/test_broker_composition.py) is collaborators the class holds, each
owning its state and handed what it needs when it is built. So:

* none of these classes has a base class of the project other than the ones it had before
  the split (``JobFolder`` and ``ConfigurableJobBackend``), directly or further up;
* no part inherits from a class of the project, and no part reaches into its owner: every
  ``self.<name>`` a part reads is its own (set in its ``__init__`` or defined in its class),
  none keeps its owner as an attribute, and each one is built and used here on its own;
* a setting changed on the owner once it is built reaches the part that holds it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubefake import FakeKube
from ytfake import FakeYt

from jupyter_gpushare.backends import ytsaurus_spec as ys
from jupyter_gpushare.backends.base import ConfigurableJobBackend, RunHandle
from jupyter_gpushare.backends.jobfolder import JobFolder
from jupyter_gpushare.backends.kube import KubeJobsBackend
from jupyter_gpushare.backends.kube_logs import KubeLogs
from jupyter_gpushare.backends.kube_objects import object_name
from jupyter_gpushare.backends.kube_poll import KubePoller
from jupyter_gpushare.backends.slurm import SlurmBackend
from jupyter_gpushare.backends.slurm_commands import SlurmCommandError, SlurmCommands
from jupyter_gpushare.backends.slurm_watch import SlurmWatch
from jupyter_gpushare.backends.ytsaurus import YTsaurusBackend
from jupyter_gpushare.backends.ytsaurus_logs import YTsaurusLogs
from jupyter_gpushare.backends.ytsaurus_result import YTsaurusResults
from jupyter_gpushare.serverextension.service import ServiceConfig, TelemetryService
from jupyter_gpushare.serverextension.service_broker import BrokerTalk
from jupyter_gpushare.serverextension.service_kernels import KernelTable
from jupyter_gpushare.serverextension.watchdog_action import WatchdogEnforcer
from jupyter_gpushare.telemetry.broker_link import BrokerLink
from jupyter_gpushare.telemetry.grant import GrantInfo
from jupyter_gpushare.telemetry.watchdog import Violation
from jupyter_gpushare.userfiles import Folder

PROJECT = "jupyter_gpushare"
LOG = logging.getLogger("test_parts_composition")

# owner -> (the project's base classes it had before c01331c, its parts by attribute)
OWNERS: dict[type, tuple[tuple[type, ...], dict[str, type]]] = {
    TelemetryService: (
        (),
        {"kernels": KernelTable, "enforcer": WatchdogEnforcer, "broker_talk": BrokerTalk},
    ),
    SlurmBackend: (
        (JobFolder, ConfigurableJobBackend),
        {"commands": SlurmCommands, "watch": SlurmWatch},
    ),
    KubeJobsBackend: ((ConfigurableJobBackend,), {"poller": KubePoller, "logs": KubeLogs}),
    YTsaurusBackend: (
        (ConfigurableJobBackend,),
        {"results": YTsaurusResults, "logs": YTsaurusLogs},
    ),
}
PARTS = [part for _, parts in OWNERS.values() for part in parts.values()]


def project_classes(classes: tuple[type, ...]) -> set[type]:
    return {c for c in classes if c.__module__.split(".")[0] == PROJECT}


# -- no mixins -----------------------------------------------------------------------------


@pytest.mark.parametrize("owner", list(OWNERS), ids=lambda c: c.__name__)
def test_each_owner_keeps_only_the_base_classes_it_had_before_the_split(owner: type) -> None:
    before, _ = OWNERS[owner]
    assert project_classes(owner.__bases__) == set(before), owner.__bases__
    allowed = {*before, *(c for b in before for c in b.__mro__)}
    gained = project_classes(owner.__mro__[1:]) - allowed
    assert not gained, f"{owner.__name__} is built on mixins again: {gained}"


@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_no_part_inherits_from_a_class_of_the_project(part: type) -> None:
    assert project_classes(part.__mro__[1:]) == set(), part.__mro__


def class_node(cls: type) -> ast.ClassDef:
    source = Path(inspect.getfile(cls)).read_text()
    return next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )


def own_names(node: ast.ClassDef) -> set[str]:
    """What the class defines (methods, properties, class attributes with a value) and what
    its ``__init__`` sets on ``self``."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and item.value is not None:
            names.add(ast.unparse(item.target))
    init = next(
        (i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == "__init__"), None
    )
    for sub in ast.walk(init) if init is not None else ():
        targets = (
            sub.targets
            if isinstance(sub, ast.Assign)
            else [sub.target]
            if isinstance(sub, ast.AnnAssign)
            else []
        )
        for t in targets:
            if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self":
                names.add(t.attr)
    return names


def self_reads(node: ast.ClassDef) -> set[str]:
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    }


@pytest.mark.parametrize("part", PARTS, ids=lambda c: c.__name__)
def test_no_part_reaches_into_its_owner(part: type) -> None:
    owners = {o.__name__ for o, (_, parts) in OWNERS.items() if part in parts.values()}
    assert_reads_only_what_it_is_handed(part, owners)


def assert_reads_only_what_it_is_handed(part: type, owners: set[str]) -> None:
    """``part`` is handed what it reads in its ``__init__`` (never one of ``owners``) and
    declares none of its owner's attributes or methods."""
    node = class_node(part)
    assert any(isinstance(i, ast.FunctionDef) and i.name == "__init__" for i in node.body), (
        f"{part.__name__} is handed nothing: a mixin"
    )
    declared_only = [
        ast.unparse(i.target) for i in node.body if isinstance(i, ast.AnnAssign) and i.value is None
    ]
    assert not declared_only, f"{part.__name__} declares its owner's attributes: {declared_only}"
    stubs = [i for i in node.body if isinstance(i, ast.If)]  # `if TYPE_CHECKING:` stubs
    assert not stubs, f"{part.__name__} declares its owner's methods"
    foreign = self_reads(node) - own_names(node)
    assert not foreign, f"{part.__name__} reads what it was not handed: {sorted(foreign)}"
    handed = inspect.signature(part.__init__).parameters.values()
    assert not [p.name for p in handed if str(p.annotation) in owners], "handed its owner"


def built_owners(tmp_path: Path) -> list[Any]:
    return [
        TelemetryService(ServiceConfig(sampler="simulated"), grant=GrantInfo(simulated=True)),
        SlurmBackend(jobs_dir=str(tmp_path / "jobs")),
        KubeJobsBackend(client=FakeKube()),
        YTsaurusBackend(client=FakeYt(), work_dir="//home/gpushare/jobs"),
    ]


def test_each_owner_holds_its_parts_and_no_part_holds_its_owner(tmp_path: Path) -> None:
    for owner in built_owners(tmp_path):
        _, parts = OWNERS[type(owner)]
        for name, kind in parts.items():
            part = getattr(owner, name)
            assert isinstance(part, kind), (type(owner).__name__, name)
            kept = [k for k, v in vars(part).items() if v is owner]
            assert not kept, f"{kind.__name__} keeps its owner as {kept}"


def test_a_setting_changed_on_the_backend_reaches_the_part_that_holds_it(tmp_path: Path) -> None:
    slurm = SlurmBackend(jobs_dir=str(tmp_path / "jobs"))
    slurm.min_poll_interval_s, slurm.scancel = 7.0, "/opt/slurm/bin/scancel"
    assert (slurm.commands.min_poll_interval_s, slurm.watch.scancel) == (7.0, slurm.scancel)
    kube = KubeJobsBackend(client=FakeKube())
    kube.image_pull_timeout_s, kube.poll_min_interval_s = 2.5, 0.25
    assert (kube.poller.image_pull_timeout_s, kube.poller.poll_min_interval_s) == (2.5, 0.25)
    assert kube.logs.poll_min_interval_s == 0.25
    yt = YTsaurusBackend(client=FakeYt())
    yt.output_cypress_dir = "//home/{username}/out"
    assert yt.results.output_cypress_dir == "//home/{username}/out"
    service = TelemetryService(ServiceConfig(sampler="simulated"), grant=GrantInfo(simulated=True))
    assert service.events is service.enforcer.events  # the enforcer's own, not a copy


# -- each part alone -----------------------------------------------------------------------


def test_the_watchdog_enforcer_stops_a_process_and_tells_it_alone() -> None:
    told: list[str] = []

    async def no_kernel(kernel_id: str, text: str) -> bool:
        raise AssertionError("a process is not a kernel")

    enforcer = WatchdogEnforcer(
        ServiceConfig(watchdog_kill_grace_s=5.0), None, None, lambda: None, told.append, no_kernel
    )
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        msg = f"process {proc.pid} uses 900 MiB of GPU-0, over the 512 MiB limit"
        v = Violation(None, None, "GPU-0", 900.0, 900.0, 512, 1.0, msg, pid=proc.pid)
        event = asyncio.run(enforcer.enforce(v))
    finally:
        proc.kill()
        proc.wait()
    assert event["outcome"] == "terminated" and "it was stopped (SIGTERM)" in event["message"]
    assert list(enforcer.events) == [event] and enforcer.repeats.count(str(proc.pid)) == 0
    assert [json.loads(m)["outcome"] for m in told] == ["terminated"]


def test_the_kernel_table_and_the_broker_talk_work_alone() -> None:
    config, grant = ServiceConfig(), GrantInfo(grant_id="g-1", team="nlp")
    link = BrokerLink(None, "", 1.0)  # no broker configured
    kernels = KernelTable(config, grant, link, None, None, lambda: None)
    asyncio.run(kernels.refresh())  # no kernel manager: nothing to read
    assert list(kernels) == [] and kernels.activity_ts() is None
    said: list[str] = []
    talk = BrokerTalk(
        config, grant, link, _Sampler(), lambda: None, kernels.activity_ts, said.append, said.append
    )
    assert asyncio.run(talk.heartbeat()) is None  # no sample yet: nothing to tell
    team = asyncio.run(talk.team_answer())
    assert team["team"] == "nlp" and team["error"] and team["usage"] is None
    assert talk.last_heartbeat is None and said == []


class _Sampler:
    simulated = True


def test_slurm_commands_and_the_watch_work_alone(tmp_path: Path) -> None:
    commands = SlurmCommands(
        squeue="/nonexistent/squeue", scontrol="scontrol", sinfo="sinfo", state_format="text",
        slurm_conf="/etc/slurm/test.conf", min_poll_interval_s=0.0, node_cache_s=0.0,
        command_timeout_s=5.0, run_as=lambda: "hub", log=LOG,
    )  # fmt: skip
    assert commands.env({"A": "1"})["SLURM_CONF"] == "/etc/slurm/test.conf"
    assert commands.run([sys.executable, "-c", "print('ok')"]).stdout == "ok\n"
    with pytest.raises(SlurmCommandError, match="/nonexistent/squeue"):
        commands.run([commands.squeue])
    (tmp_path / "j1" / "attempt-1").mkdir(parents=True)

    def job_folder(job_id: str, *rel: str) -> Folder:
        with Folder.root(str(tmp_path)) as top:
            return top.sub("/".join((job_id, *rel)))

    watch = SlurmWatch(commands, job_folder, "scancel", LOG)
    handle = RunHandle("slurm", "j1", 1, {"user": "alice"})
    assert watch.slurm_job(handle) is None  # never launched: not looked up in Slurm
    assert watch.poll(handle).alive is False


def test_kube_poller_and_logs_work_alone() -> None:
    fake = FakeKube()
    poller = KubePoller(
        lambda: fake,
        namespace="jupyterhub",
        poll_min_interval_s=0.0,
        image_pull_timeout_s=60.0,
        log=LOG,
    )
    handle = RunHandle("kube", "j1", 1, {})
    assert poller.ns_name(handle) == ("jupyterhub", object_name("j1", 1))
    named = RunHandle("kube", "j1", 1, {"namespace": "team-a", "name": "job-x"})
    assert poller.ns_name(named) == ("team-a", "job-x")
    assert poller.poll(handle).alive is False  # no Job of that name
    logs = KubeLogs(
        lambda: fake,
        namespace="jupyterhub",
        poll_min_interval_s=0.0,
        log_cache_bytes=1 << 20,
        log_cache_attempts=4,
        log=LOG,
    )
    assert logs.read_log("j1") == (b"", 0) and logs.log_size("j1") == 0


def test_ytsaurus_results_and_logs_work_alone() -> None:
    fake = FakeYt()
    results = YTsaurusResults(
        lambda: fake,
        deliver_output=False,
        output_cypress_dir="",
        signalled=lambda op_id: op_id == "op-1",
        log=LOG,
    )
    failed = {"result": {"error": {"message": "out of memory"}}}
    status = results.final(RunHandle("ytsaurus", "j1", 1, {}), "op-1", "failed", failed)
    assert status.terminated and "op-1 failed: out of memory" in status.error["summary"]
    assert results.fetch_output(RunHandle("ytsaurus", "j1", 1, {})) is None
    settings = ys.YtSettings(work_dir="//home/gpushare/jobs")
    base = "//home/gpushare/jobs/j1"
    for n in (2, 10, 1):
        fake.create("map_node", f"{base}/attempt-{n}", recursive=True)
    recorded = {
        "//home/gpushare/jobs/j1/attempt-1": "op-1",
        "//home/gpushare/jobs/j1/attempt-10": "op-9",
    }
    kept: list[str] = []
    logs = YTsaurusLogs(
        lambda: fake,
        lambda: settings,
        lambda paths: recorded.get(paths.dir),
        lambda op_id: True,
        lambda cache, key, value: kept.append(key),
        LOG,
    )
    assert logs.operations("j1") == ["op-1", "op-9"]  # in attempt order; attempt 2 ran none
    assert logs.read_log("j1") == (b"", 0) and kept == []  # unknown to YTsaurus: not kept

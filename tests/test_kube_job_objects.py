"""The Job and ConfigMap of one attempt on Kubernetes (pure builders, no API server here).

Every manifest is checked with ``kubernetes-validate`` (the published 1.30 schemas, strict);
the Kueue labels are checked against the names the Kueue export writes; the container's
command (``kube_run``) is run for real on this machine with the ConfigMap's files laid out
as the kubelet would mount them, so the notebook runs through papermill and lands at the
path it would have in the user's volume.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
from kubejobkit import NOTEBOOK, run_spec

from jupyter_gpushare.backends import kube_run
from jupyter_gpushare.backends.kube_objects import (
    CONFIGMAP_LIMIT_BYTES,
    INPUT_DIR,
    JobTemplate,
    Storage,
    configmap_manifest,
    job_manifest,
    object_name,
)
from jupyter_gpushare.export.kueue import kueue_objects
from jupyter_gpushare.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent
CASES = [  # (gpu backend, grant kind)
    ("whole", "whole"), ("whole", "fraction"), ("mig", "mig"), ("hami", "fraction"),
    ("hami", "whole"), ("hami-metax", "fraction"), ("kai", "fraction"), ("kai", "memory"),
    ("kai", "whole"), ("timeslice", "fraction"), ("whole", "cpu"),
]


def pod(job: dict) -> dict:
    return job["spec"]["template"]["spec"]


def limits(job: dict) -> dict:
    return pod(job)["containers"][0]["resources"].get("limits", {})


@pytest.mark.parametrize(("backend", "kind"), CASES)
def test_job_and_configmap_are_valid_kubernetes_objects(backend: str, kind: str) -> None:
    template = JobTemplate(gpu_backend=backend)
    spec = run_spec(kind)
    job = job_manifest(spec, "runs/out.ipynb", template)
    kubernetes_validate.validate(job, "1.30.0", strict=True)
    kubernetes_validate.validate(configmap_manifest(spec, "runs/out.ipynb", template),
                                 "1.30.0", strict=True)
    assert job["spec"]["suspend"] is True
    assert job["spec"]["backoffLimit"] == 0
    assert pod(job)["restartPolicy"] == "Never"
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert pod(job)["terminationGracePeriodSeconds"] == 120


def test_each_backend_gets_the_kube_spawners_resources() -> None:
    """The same strings as a single-user pod of KubeGPUShareSpawner (DESIGN.md)."""
    got = {(b, k): job_manifest(run_spec(k), "o.ipynb", JobTemplate(gpu_backend=b))
           for b, k in CASES}
    assert limits(got["whole", "whole"])["nvidia.com/gpu"] == "2"
    assert limits(got["mig", "mig"])["nvidia.com/mig-1g.18gb"] == "1"
    hami = got["hami", "fraction"]
    assert {k: v for k, v in limits(hami).items() if k.startswith("nvidia")} == {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "36096", "nvidia.com/gpucores": "25"}
    assert pod(hami)["schedulerName"] == "hami-scheduler"
    assert hami["spec"]["template"]["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == \
        "GPU-c"
    metax = limits(got["hami-metax", "fraction"])
    assert metax["metax-tech.com/vmemory"] == "36096Mi"
    kai = got["kai", "fraction"]
    assert pod(kai)["schedulerName"] == "kai-scheduler"
    assert pod(kai)["priorityClassName"] == "build"
    meta = kai["spec"]["template"]["metadata"]
    assert meta["labels"]["kai.scheduler/queue"] == "vision"
    assert meta["annotations"]["gpu-fraction"] == "0.25"
    assert "nvidia.com/gpu" not in limits(kai)  # KAI shares by annotation
    assert limits(got["timeslice", "fraction"])["nvidia.com/gpu.shared"] == "1"
    cpu = got["whole", "cpu"]
    env = {e["name"]: e["value"] for e in pod(cpu)["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not any(k.startswith("nvidia") for k in limits(cpu))
    whole = got["whole", "whole"]
    assert pod(whole)["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1",
                                          "gpushare.jupyter.org/pool": "train"}
    assert pod(whole)["containers"][0]["resources"]["requests"] == {
        "cpu": "4000m", "memory": "16384Mi"}


def test_a_simulated_grant_is_not_pinned() -> None:
    spec = run_spec("fraction", grant={"gpus": [{"uuid": "GPU-sim-1", "memory_mib": 1000,
                                                 "compute_pct": 25, "simulated": True}]})
    job = job_manifest(spec, "o.ipynb", JobTemplate(gpu_backend="hami"))
    assert "kubernetes.io/hostname" not in pod(job)["nodeSelector"]
    assert "nvidia.com/use-gpuuuid" not in job["spec"]["template"]["metadata"]["annotations"]


def test_kueue_labels_name_what_the_export_writes() -> None:
    policy = load_policy(ROOT / "hub_config" / "gpushare.yaml")
    objs = kueue_objects(policy)
    local_queues = {o["metadata"]["name"] for o in objs if o["kind"] == "LocalQueue"}
    classes = {o["metadata"]["name"] for o in objs if o["kind"] == "WorkloadPriorityClass"}
    flavors = [o for o in objs if o["kind"] == "ResourceFlavor"]
    for team in ("vision", "nlp", "research"):
        for prio in ("training", "interactive", "research"):
            job = job_manifest(run_spec("whole", grant={"team": team, "priority": prio}),
                               "o.ipynb", JobTemplate())
            labels = job["metadata"]["labels"]
            assert labels["kueue.x-k8s.io/queue-name"] in local_queues
            assert labels["kueue.x-k8s.io/priority-class"] in classes
    # the pod's pool selector matches exactly one flavor's node labels: Kueue's pick
    job = job_manifest(run_spec("whole", grant={"pool": "interactive"}), "o.ipynb",
                       JobTemplate())
    sel = pod(job)["nodeSelector"]
    fits = [f for f in flavors if all(sel.get(k) == v for k, v in f["spec"]["nodeLabels"].items())]
    assert [f["metadata"]["name"] for f in fits] == ["gpushare-interactive-h200"]


def test_names_are_unique_per_job_and_attempt_and_dns_safe() -> None:
    names = {object_name(j, a) for j in ("job-1", "job-2", "JOB_1", "job-1-a2") for a in (1, 2)}
    assert len(names) == 8
    long = object_name("job-" + "x" * 200, 3)
    assert len(long) <= 63
    for name in [*names, long]:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}},
            "1.30.0", strict=True)
    spec = run_spec("whole", attempt=2)
    job = job_manifest(spec, "o.ipynb", JobTemplate())
    assert job["metadata"]["labels"]["gpushare.jupyter.org/attempt"] == "2"
    assert job["metadata"]["name"] != job_manifest(run_spec("whole"), "o.ipynb",
                                                   JobTemplate())["metadata"]["name"]


def test_storage_is_mounted_as_z2jh_mounts_it() -> None:
    job = job_manifest(run_spec("whole"), "runs/out.ipynb", JobTemplate())
    [home, cm] = pod(job)["volumes"]
    # KubeSpawner 7's 'safe' slug of Ada.Lovelace@example.org, as in claim-{username}
    from kubespawner.slugs import safe_slug

    slug = safe_slug("Ada.Lovelace@example.org", max_length=48)
    assert home["persistentVolumeClaim"] == {"claimName": f"claim-{slug}"}
    mounts = pod(job)["containers"][0]["volumeMounts"]
    assert mounts[0] == {"name": home["name"], "mountPath": "/home/jovyan"}
    assert cm == {"name": "gpushare-input", "configMap": {"name": job["metadata"]["name"]}}
    assert mounts[1]["mountPath"] == INPUT_DIR and mounts[1]["readOnly"] is True
    static = job_manifest(run_spec("whole"), "o.ipynb", JobTemplate(storage=Storage(
        type="static", static_pvc_name="home-nfs", sub_path="home/{username}")))
    assert pod(static)["volumes"][0]["persistentVolumeClaim"] == {"claimName": "home-nfs"}
    assert pod(static)["containers"][0]["volumeMounts"][0]["subPath"] == f"home/{slug}"
    kubernetes_validate.validate(static, "1.30.0", strict=True)
    with pytest.raises(ValueError, match="static_pvc_name"):
        job_manifest(run_spec("whole"), "o.ipynb", JobTemplate(storage=Storage(type="static")))


def test_output_may_not_leave_the_users_files() -> None:
    for bad in ("../other/x.ipynb", "a/../../x.ipynb", ""):
        with pytest.raises(ValueError, match="not inside"):
            job_manifest(run_spec("whole"), bad, JobTemplate())
    job = job_manifest(run_spec("whole"), "/runs/out.ipynb", JobTemplate())
    assert pod(job)["containers"][0]["command"][-1].startswith("/home/jovyan/.gpushare/jobs/")


def test_a_notebook_too_big_for_a_configmap_is_refused() -> None:
    noise = base64.b64encode(os.urandom(CONFIGMAP_LIMIT_BYTES)).decode()  # does not compress
    big = dict(NOTEBOOK, cells=[{"cell_type": "markdown", "metadata": {}, "source": noise}])
    with pytest.raises(ValueError, match="ConfigMap holds at most"):
        configmap_manifest(run_spec("whole", notebook=big), "o.ipynb", JobTemplate())
    # a large but ordinary notebook compresses well enough
    text = dict(NOTEBOOK, cells=[{"cell_type": "markdown", "metadata": {},
                                  "source": "x = 1\n" * 300_000}])
    cm = configmap_manifest(run_spec("whole", notebook=text), "o.ipynb", JobTemplate())
    assert len(base64.b64decode(cm["binaryData"]["input.ipynb.gz"])) < CONFIGMAP_LIMIT_BYTES


def _mount_configmap(cm: dict, where: Path) -> Path:
    """Lay the ConfigMap's keys out as files, as the kubelet mounts a configMap volume."""
    where.mkdir(parents=True)
    for key, value in cm.get("data", {}).items():
        (where / key).write_text(value)
    for key, value in cm.get("binaryData", {}).items():
        (where / key).write_bytes(base64.b64decode(value))
    return where


@pytest.mark.slow
def test_the_container_command_runs_the_notebook_into_the_users_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    template = JobTemplate(storage=Storage(home_mount_path=str(home)))
    spec = run_spec("cpu")
    cm = configmap_manifest(spec, "runs/out.ipynb", template)
    job = job_manifest(spec, "runs/out.ipynb", template)
    container = pod(job)["containers"][0]
    inputs = _mount_configmap(cm, tmp_path / "input")
    command = [sys.executable, *container["command"][1:]]
    command[command.index(INPUT_DIR)] = str(inputs)
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(PATH=os.environ["PATH"], GPUSHARE_TERMINATION_LOG=str(tmp_path / "term"))
    home.mkdir()
    proc = subprocess.run(command, env=env, cwd=container["workingDir"], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads((home / "runs" / "out.ipynb").read_text())
    assert "answer 42" in json.dumps(out["cells"])  # parameters n = 7 injected
    message = json.loads((tmp_path / "term").read_text())
    assert message["exit_code"] == 0 and message["output_path"] == str(home / "runs/out.ipynb")
    assert (home / ".gpushare" / "jobs" / spec.job_id / "checkpoint").is_dir()
    assert "answer 42" in proc.stdout  # the pod's log


def test_the_termination_message_fits_and_keeps_the_summary() -> None:
    status = {"exit_code": 1, "terminated": False, "output_path": "/home/jovyan/o.ipynb",
              "error": {"summary": "ZeroDivisionError: division by zero in cell 3",
                        "traceback": "x" * 10_000, "source": "1/0", "evalue": "y" * 3000}}
    text = kube_run.termination_message(status)
    assert len(text.encode()) <= kube_run.MESSAGE_LIMIT
    data = json.loads(text)
    assert data["error"]["summary"].startswith("ZeroDivisionError")
    assert data["exit_code"] == 1
    small = {"exit_code": 0, "error": None, "terminated": False}
    assert json.loads(kube_run.termination_message(small)) == small

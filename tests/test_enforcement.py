"""Grant -> environment and pod fragments (pure functions, no cluster, no GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_gpushare.broker.client import GPUShare, GrantInfo
from jupyter_gpushare.spawner import enforcement as enf

H200 = 144384  # MiB


def grant(gpus=1, units=0.25, mem=None, compute=25.0, simulated=False, model="H200", **kw):
    shares = tuple(
        GPUShare(
            uuid=f"GPU-{i:04d}-real" if not simulated else f"GPU-sim-lab-0-{i}",
            memory_mib=mem if mem is not None else int(H200 * min(units, 1)),
            compute_pct=compute,
            model=model,
            simulated=simulated,
        )
        for i in range(gpus)
    )
    base = dict(id="g-1", team="vision", pool="interactive", profile="inference-quarter",
                node="lab-0", gpus=shares, units=units, borrowed=False, preemptible=False)
    base.update(kw)
    return GrantInfo(**base)


TOTAL = {f"GPU-{i:04d}-real": H200 for i in range(8)} | {
    f"GPU-sim-lab-0-{i}": H200 for i in range(8)
}


def test_env_contract_for_a_real_fraction_with_mps():
    env = enf.local_env(grant(), mps=True, real_gpus_present=True, broker_url="http://b/api/v1",
                        gpu_total_mib=TOTAL)
    assert env["GPUSHARE_GRANT_ID"] == "g-1"
    assert env["GPUSHARE_GPU_UUIDS"] == "GPU-0000-real"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0000-real"
    assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == str(H200 // 4)
    assert env["GPUSHARE_COMPUTE_PCT"] == "25"
    assert env["GPUSHARE_UNITS"] == "0.25"
    assert env["GPUSHARE_TEAM"] == "vision" and env["GPUSHARE_POOL"] == "interactive"
    assert env["GPUSHARE_PROFILE"] == "inference-quarter"
    assert env["GPUSHARE_BORROWED"] == "false"
    assert env["GPUSHARE_ENFORCEMENT"] == "mps"
    assert env["GPUSHARE_SIMULATED"] == "0"
    assert env["GPUSHARE_BROKER_URL"] == "http://b/api/v1"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={H200 // 4}M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) <= 0.25
    assert float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"]) > 0.24
    assert env["GPUSHARE_TORCH_MEMORY_FRACTION"] == env["XLA_PYTHON_CLIENT_MEM_FRACTION"]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == enf.PYHOOK_DIR


def test_no_mps_daemon_means_env_enforcement_and_no_mps_variables():
    env = enf.local_env(grant(), mps=False, real_gpus_present=True, gpu_total_mib=TOTAL)
    assert env["GPUSHARE_ENFORCEMENT"] == "env"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_simulated_grant_never_puts_simulated_uuids_in_cuda_visible_devices():
    g = grant(simulated=True)
    env = enf.local_env(g, mps=True, real_gpus_present=False, gpu_total_mib=TOTAL)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["GPUSHARE_SIMULATED"] == "1"
    assert env["GPUSHARE_GPU_UUIDS"] == "GPU-sim-lab-0-0"
    assert env["GPUSHARE_ENFORCEMENT"] == "env"  # MPS cannot limit a GPU that is not there
    env = enf.local_env(g, mps=False, real_gpus_present=True, gpu_total_mib=TOTAL)
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_multi_gpu_mps_limits_per_ordinal_and_whole_gpus_have_no_fraction():
    g = grant(gpus=2, units=2, mem=H200, compute=100.0, pool="train")
    env = enf.local_env(g, mps=True, real_gpus_present=True, gpu_total_mib=TOTAL)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0000-real,GPU-0001-real"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={H200}M,1={H200}M"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    assert "PYTHONPATH" not in env


def test_cpu_only_grant_hides_every_gpu():
    g = GrantInfo(id="g-cpu", team="vision", pool="", profile="cpu-only", units=0)
    env = enf.local_env(g, mps=True, real_gpus_present=True)
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["GPUSHARE_GPU_UUIDS"] == ""
    assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == "0"


def test_mps_daemon_detection(tmp_path):
    assert not enf.mps_daemon_running(str(tmp_path))
    os.mkfifo(tmp_path / "control")
    assert enf.mps_daemon_running(str(tmp_path))


def test_pyhook_sitecustomize_chains_and_caps_torch_lazily(tmp_path):
    """The hook runs in a fresh interpreter, chains the next sitecustomize, wraps 'torch'."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "class _Cuda:\n"
        "    calls = []\n"
        "    queued = []\n"
        "    def is_initialized(self): return False\n"
        "    def _lazy_call(self, fn): self.queued.append(fn)\n"
        "    def device_count(self): return 2\n"
        "    def set_per_process_memory_fraction(self, f, i): self.calls.append((f, i))\n"
        "cuda = _Cuda()\n"
    )
    code = (
        "import os, torch\n"
        "assert os.environ.get('CHAINED') == 'yes', 'next sitecustomize did not run'\n"
        "assert len(torch.cuda.queued) == 1 and not torch.cuda.calls\n"
        "torch.cuda.queued[0]()\n"
        "print(torch.cuda.calls)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([enf.PYHOOK_DIR, str(other), str(fake)])
    env["GPUSHARE_TORCH_MEMORY_FRACTION"] = "0.25"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(0.25, 0), (0.25, 1)]"


# --------------------------------------------------------------------- kubernetes fragments


def test_whole_backend():
    f = enf.pod_fragment(grant(gpus=4, units=4, mem=H200, compute=100.0), "whole")
    assert f.limits == {"nvidia.com/gpu": "4"}
    assert f.node_selector == {"kubernetes.io/hostname": "lab-0"}
    assert f.scheduler_name == ""
    assert f.env["GPUSHARE_ENFORCEMENT"] == "whole"
    assert "CUDA_VISIBLE_DEVICES" not in f.env


def test_whole_backend_warns_on_fraction():
    f = enf.pod_fragment(grant(), "whole")
    assert f.limits == {"nvidia.com/gpu": "1"}
    assert f.warnings and "fraction" in f.warnings[0]


def test_mig_backend_resource_from_model():
    g = grant(units=1 / 7, mem=10240, compute=14.0, model="H100 1g.10gb", pool="mig")
    f = enf.pod_fragment(g, "mig")
    assert f.limits == {"nvidia.com/mig-1g.10gb": "1"}
    with pytest.raises(ValueError, match="MIG profile"):
        enf.pod_fragment(grant(), "mig")
    assert enf.pod_fragment(grant(), "mig", mig_profile="3g.40gb").limits == {
        "nvidia.com/mig-3g.40gb": "1"
    }


def test_hami_backend_limits_scheduler_and_pinning():
    f = enf.pod_fragment(grant(), "hami")
    assert f.scheduler_name == "hami-scheduler"
    assert f.limits == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(H200 // 4),
        "nvidia.com/gpucores": "25",
    }
    assert f.annotations["nvidia.com/use-gpuuuid"] == "GPU-0000-real"
    assert f.node_selector == {"kubernetes.io/hostname": "lab-0"}
    # never memory oversubscription
    assert not any("oversubscri" in k.lower() for k in f.env)
    unpinned = enf.pod_fragment(grant(), "hami", pin=False)
    assert "nvidia.com/use-gpuuuid" not in unpinned.annotations and not unpinned.node_selector
    sim = enf.pod_fragment(grant(simulated=True), "hami")
    assert "nvidia.com/use-gpuuuid" not in sim.annotations and not sim.node_selector


def test_kai_backend_fraction_queue_and_build_priority():
    f = enf.pod_fragment(grant(), "kai", gpu_total_mib=TOTAL)
    assert f.scheduler_name == "kai-scheduler"
    assert f.labels["kai.scheduler/queue"] == "vision"
    assert f.priority_class_name == "build"
    assert f.labels["priorityClassName"] == "build"
    assert f.annotations["gpu-fraction"] == "0.25"
    assert "gpu-memory" not in f.annotations
    assert f.limits == {}
    assert f.warnings  # KAI alone does not isolate memory
    assert f.env["XLA_PYTHON_CLIENT_MEM_FRACTION"]
    mem = enf.pod_fragment(grant(units=0.114, mem=16384, compute=10.0), "kai", gpu_total_mib=TOTAL)
    assert mem.annotations["gpu-memory"] == "16384"
    assert "gpu-fraction" not in mem.annotations
    whole = enf.pod_fragment(grant(gpus=2, units=2, mem=H200, compute=100.0), "kai",
                             kai_queue="team-b")
    assert whole.limits == {"nvidia.com/gpu": "2"}
    assert whole.labels["kai.scheduler/queue"] == "team-b"


def test_timeslice_backend_warns_about_memory_isolation():
    f = enf.pod_fragment(grant(), "timeslice")
    assert f.limits == {"nvidia.com/gpu.shared": "1"}
    assert "no memory isolation" in f.warnings[0]


def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="unknown GPU backend"):
        enf.pod_fragment(grant(), "magic")


def test_kube_overrides_merge_with_configured_values():
    f = enf.pod_fragment(grant(), "hami")
    out = enf.kube_overrides(f, {"extra_labels": {"site": "x"}, "node_selector": {"zone": "a"}})
    assert out["extra_labels"]["site"] == "x"  # type: ignore[index]
    assert out["extra_labels"]["gpushare.jupyter.org/team"] == "vision"  # type: ignore[index]
    assert out["node_selector"] == {"zone": "a", "kubernetes.io/hostname": "lab-0"}
    assert out["scheduler_name"] == "hami-scheduler"
    assert "priority_class_name" not in out


def test_the_whole_cards_memory_tells_the_sampler_its_scale():
    env = enf.local_env(grant(gpus=2), mps=False, real_gpus_present=True, gpu_total_mib=TOTAL)
    assert env["GPUSHARE_GPU_MEMORY_MIB"] == str(H200)
    unknown = enf.local_env(grant(), mps=False, real_gpus_present=True)
    assert "GPUSHARE_GPU_MEMORY_MIB" not in unknown

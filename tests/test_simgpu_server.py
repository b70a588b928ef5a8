"""A notebook's own simulated GPU use (``jupyter_gpushare.simgpu``) in a real single-user
server with real kernels.

``jupyter lab`` runs as its own process (tests/labkit.py) with a simulated "Debug 1/8 GPU"
grant (14 GiB limit, local enforcement); each kernel is a real ipykernel started through the
server's API and driven over its own connection file. What the kernel asks with
``use_gpu_memory`` / ``use_gpu_compute`` must show in the server extension's own figures
(``/gpushare/api/metrics``), for that kernel only; above the limit the watchdog restarts the
kernel, and a restarted or shut-down kernel's request is gone. The request folder is the
default one (``gpushare-simgpu`` in the runtime folder the kernel inherits).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import BlockingKernelClient
from labkit import Lab, grant_env, start_lab

pytestmark = pytest.mark.slow
LIMIT_MIB = 14336
ARGS = ["--GPUShareServerApp.sample_interval_s=0.2",
        "--GPUShareServerApp.watchdog_grace_samples=2",
        "--GPUShareServerApp.watchdog_cooldown_s=600",
        "--GPUShareServerApp.simulated_background_load=False"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("simgpu")
    env = grant_env(JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    with start_lab(tmp, env, ARGS, with_extension=False) as running:
        yield running


def runtime(lab: Lab) -> Path:
    """The server's runtime folder (the kernels inherit it): ``JUPYTER_RUNTIME_DIR``."""
    return lab.root.parent / "runtime"


def request_file(lab: Lab, pid: int) -> Path:
    return runtime(lab) / "gpushare-simgpu" / f"{pid}.json"


class Kernel:
    """A kernel of the server, with a session on ``path``, driven over its connection file."""

    def __init__(self, lab: Lab, path: str) -> None:
        status, model = lab.api("POST", "api/sessions", {
            "path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}})
        assert status == 201, model
        self.lab, self.id = lab, model["kernel"]["id"]
        self.client = BlockingKernelClient()
        self.client.load_connection_file(str(runtime(lab) / f"kernel-{self.id}.json"))
        self.client.start_channels(hb=False)
        # until IOPub's subscription is up, a cell's output and its "idle" are lost and
        # execute_interactive waits out its timeout: wait for the kernel to answer on IOPub
        self.client.wait_for_ready(timeout=120)

    def run(self, code: str) -> str:
        """Run ``code``; its printed output (an error fails the test)."""
        out: list[str] = []

        def keep(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]))

        reply = self.client.execute_interactive(code, timeout=60, output_hook=keep)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def pid(self) -> int:
        return int(self.run("import os; print(os.getpid())").strip())

    def close(self) -> None:
        self.client.stop_channels()


def metrics(lab: Lab) -> dict[str, Any]:
    status, body = lab.api("GET", "gpushare/api/metrics")
    assert status == 200, body
    return dict(body)


def own_use(lab: Lab, kernel_id: str) -> tuple[float, float]:
    """(MiB, % of the card) the server extension attributes to the kernel now."""
    for k in metrics(lab)["attribution"]["kernels"]:
        if k["kernel_id"] == kernel_id:
            return float(k["memory_mib"]), float(k["sm_util_pct"] or 0.0)
    return 0.0, 0.0


def wait_for(what: str, get: Callable[[], Any], ok: Callable[[Any], bool],
             timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    value = get()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r}")
        time.sleep(0.2)
        value = get()
    return value


def test_a_kernels_simulated_use_moves_its_own_figures_only(lab: Lab) -> None:
    one, other = Kernel(lab, "one.ipynb"), Kernel(lab, "other.ipynb")
    try:
        said = one.run("from jupyter_gpushare.simgpu import use_gpu_memory, use_gpu_compute\n"
                       "print(use_gpu_memory('6 GiB'))\nprint(use_gpu_compute(50))")
        assert "'memory_mib': 6144.0" in said and "'simulated': True" in said, said
        wait_for("one's use", lambda: own_use(lab, one.id), lambda u: u == (6144.0, 50.0))
        gpu = metrics(lab)["gpus"][0]
        assert gpu["own_memory_mib"] == 6144.0 and gpu["memory_limit_mib"] == LIMIT_MIB
        assert own_use(lab, other.id)[0] == 0.0  # (its compute is modelled from its CPU)
        assert metrics(lab)["simulated"] is True
        one.run("from jupyter_gpushare.simgpu import release_gpu; release_gpu()")
        wait_for("one released", lambda: own_use(lab, one.id)[0], lambda m: m == 0.0)
    finally:
        one.close()
        other.close()


def test_over_the_limit_the_watchdog_restarts_the_kernel_and_its_use_is_gone(
    lab: Lab
) -> None:
    kernel = Kernel(lab, "big.ipynb")
    try:
        old_pid = kernel.pid()
        kernel.run("from jupyter_gpushare.simgpu import use_gpu_memory\n"
                   "use_gpu_memory('20 GiB')")
        event = wait_for(
            "watchdog event",
            lambda: [e for e in metrics(lab)["watchdog"]["events"]
                     if e.get("kernel_id") == kernel.id],
            bool)[-1]
        assert event["action"] == "restart" and event["outcome"] == "done", event
        assert event["message"] == (
            "GPU memory limit 14.0 GiB exceeded: kernel of big.ipynb used 20.0 GiB; "
            "the kernel was restarted")
        wait_for("old request deleted", request_file(lab, old_pid).exists, lambda e: not e)
        # the restarted kernel binds the same ports; until IOPub's subscription is up again a
        # cell's output is lost (CI once waited out the 60 s there): wait as at the start
        kernel.client.wait_for_ready(timeout=120)
        assert kernel.pid() != old_pid
        assert wait_for("restarted kernel", lambda: own_use(lab, kernel.id)[0],
                        lambda m: m == 0.0) == 0.0
    finally:
        kernel.close()


def test_a_shut_down_kernels_request_is_deleted(lab: Lab) -> None:
    kernel = Kernel(lab, "gone.ipynb")
    pid = kernel.pid()
    kernel.run("from jupyter_gpushare.simgpu import use_gpu_memory; use_gpu_memory('2 GiB')")
    request = request_file(lab, pid)
    assert request.exists()
    wait_for("use shown", lambda: own_use(lab, kernel.id)[0], lambda m: m == 2048.0)
    kernel.close()
    status, _ = lab.api("DELETE", f"api/kernels/{kernel.id}")
    assert status == 204
    wait_for("request deleted", request.exists, lambda e: not e, timeout=30)
    wait_for("kernel gone from the figures",
             lambda: [k for k in metrics(lab)["attribution"]["kernels"]
                      if k["kernel_id"] == kernel.id], lambda ks: not ks)


def test_a_killed_kernels_request_is_deleted_by_the_server(lab: Lab) -> None:
    """SIGKILL: the kernel cannot delete its own file; the server restarts the kernel, and
    its sampler deletes the request of the pid that left its kernels."""
    kernel = Kernel(lab, "killed.ipynb")
    try:
        pid = kernel.pid()
        kernel.run("from jupyter_gpushare.simgpu import use_gpu_memory\n"
                   "use_gpu_memory('3 GiB')")
        wait_for("use shown", lambda: own_use(lab, kernel.id)[0], lambda m: m == 3072.0)
        os.kill(pid, signal.SIGKILL)
        wait_for("request deleted", request_file(lab, pid).exists, lambda e: not e)
        # the restarted kernel binds the same ports: wait for its IOPub, as above (CI once
        # waited out the 60 s of the next cell here)
        kernel.client.wait_for_ready(timeout=120)
        assert kernel.pid() != pid
        wait_for("restarted kernel uses nothing", lambda: own_use(lab, kernel.id)[0],
                 lambda m: m == 0.0)
    finally:
        kernel.close()

"""An in-memory stand-in for the few ``yt.wrapper.YtClient`` calls the YTsaurus backend makes.

No YTsaurus cluster can run on these machines, so this plays the cluster's part, and says
so: Cypress is a dict, operations are records. Two things in it are real:

* every operation spec is built by the real ``yt.wrapper`` ``VanillaSpecBuilder`` (its
  ``build()`` against an offline client), exactly as ``run_operation`` builds it before
  sending, and kept in :attr:`FakeYt.specs`;
* with ``execute=True`` the operation's job really runs: its ``command`` in ``bash -c`` in a
  sandbox folder holding the ``file_paths`` under their base names, with the task's
  ``environment``; file descriptor 1 becomes the output table (rows in the ``json`` format),
  stderr the job's stderr; ``abort_job(interrupt_timeout=...)`` sends the task's
  ``interruption_signal`` and aborts after the timeout, as YTsaurus does.

What YTsaurus would do that this does not: scheduling in pools and trees, GPU allocation,
docker images and porto layers, fair-share preemption, restarts, access control.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yt.common import YtError

from jupyter_gpushare.backends.ytsaurus import offline_client


@dataclass
class FakeOperation:
    id: str
    spec: dict[str, Any]
    alias: str | None
    mutation_id: str | None
    state: str = "running"
    error: dict[str, Any] | None = None
    proc: subprocess.Popen[bytes] | None = None
    sandbox: Path | None = None
    job_id: str = ""
    aborts: list[tuple[str, int | None]] = field(default_factory=list)


class FakeStream:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self) -> bytes:
        return self._data


class FakeYt:
    """The client surface the backend uses (see the module docstring)."""

    def __init__(self, *, execute: bool = False, extra_env: dict[str, str] | None = None) -> None:
        self.execute = execute
        self.extra_env = dict(extra_env or {})
        self.nodes: dict[str, dict[str, Any]] = {}  # path -> {type, attrs, data}
        self.operations: dict[str, FakeOperation] = {}
        self.specs: list[dict[str, Any]] = []
        self.calls: list[str] = []
        self._tmp = tempfile.TemporaryDirectory(prefix="ytfake-")
        self._builder_client = offline_client()
        self._lock = threading.Lock()

    # -- Cypress ----------------------------------------------------------------------------

    @staticmethod
    def _split(path: str) -> tuple[str, str | None]:
        if "/@" in path:
            node, attr = path.split("/@", 1)
            return node, attr
        return path, None

    def _missing(self, path: str) -> YtError:
        return YtError(f"Error resolving path {path}", code=500)

    def exists(self, path: str) -> bool:
        node, attr = self._split(path)
        if node not in self.nodes:
            return False
        return attr is None or attr in self.nodes[node]["attrs"]

    def get(self, path: str) -> Any:
        node, attr = self._split(path)
        if node not in self.nodes or (attr is not None and attr not in self.nodes[node]["attrs"]):
            raise self._missing(path)
        return self.nodes[node]["attrs"][attr] if attr else self.nodes[node]["attrs"]

    def set(self, path: str, value: Any) -> None:
        node, attr = self._split(path)
        if node not in self.nodes or attr is None:
            raise self._missing(path)
        self.nodes[node]["attrs"][attr] = value

    def create(self, type: str, path: str, recursive: bool = False,
               ignore_existing: bool = False, **_: Any) -> None:
        self.calls.append(f"create {type} {path}")
        if path in self.nodes:
            if ignore_existing:
                return
            raise YtError(f"Node {path} already exists", code=501)
        parent = path.rsplit("/", 1)[0]
        if parent not in self.nodes and parent.count("/") > 2:
            if not recursive:
                raise self._missing(parent)
            self.create("map_node", parent, recursive=True, ignore_existing=True)
        self.nodes[path] = {"type": type, "attrs": {}, "data": [] if type == "table" else b""}

    def list(self, path: str) -> list[str]:
        if path not in self.nodes:
            raise self._missing(path)
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self.nodes
                       if p.startswith(prefix)})

    def remove(self, path: str, recursive: bool = False, force: bool = False) -> None:
        for p in [p for p in self.nodes if p == path or p.startswith(path + "/")]:
            del self.nodes[p]

    def write_file(self, path: str, data: bytes) -> None:
        self.calls.append(f"write_file {path}")
        self.nodes.setdefault(path, {"type": "file", "attrs": {}, "data": b""})["data"] = data

    def read_file(self, path: str) -> FakeStream:
        if path not in self.nodes:
            raise self._missing(path)
        return FakeStream(self.nodes[path]["data"])

    def read_table(self, path: str, format: str | None = None) -> list[dict[str, Any]]:
        if path not in self.nodes:
            raise self._missing(path)
        return list(self.nodes[path]["data"])

    # -- operations -------------------------------------------------------------------------

    def forget_mutations(self) -> None:
        """YTsaurus keeps a mutation's answer for a while only: here, until this call."""
        for op in self.operations.values():
            op.mutation_id = None

    def run_operation(self, spec_builder: Any, sync: bool = True,
                      run_operation_mutation_id: str | None = None) -> FakeOperation:
        assert sync is False, "the backend must not wait for the operation"
        spec = spec_builder.build(client=self._builder_client)
        with self._lock:
            for op in self.operations.values():
                if run_operation_mutation_id and op.mutation_id == run_operation_mutation_id:
                    return op  # the cluster answers a repeated mutation with its first result
                if spec.get("alias") and op.alias == spec["alias"] and \
                        op.state not in ("completed", "failed", "aborted"):
                    raise YtError(f"Operation with alias {spec['alias']} is running", code=1)
            op = FakeOperation(f"op-{len(self.operations) + 1}", spec, spec.get("alias"),
                               run_operation_mutation_id)
            self.operations[op.id] = op
            self.specs.append(spec)
        if self.execute:
            self._start_job(op)
        return op

    def _start_job(self, op: FakeOperation) -> None:
        [(_, task)] = op.spec["tasks"].items()
        sandbox = Path(self._tmp.name) / op.id
        sandbox.mkdir()
        for path in task.get("file_paths", []):
            data = self.nodes[str(path)]["data"]
            (sandbox / str(path).rsplit("/", 1)[1]).write_bytes(data)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.extra_env,
               **{str(k): str(v) for k, v in task.get("environment", {}).items()}}
        table = open(sandbox / "_table", "wb")  # noqa: SIM115 - handed to the child
        stderr = open(sandbox / "_stderr", "wb")  # noqa: SIM115
        op.sandbox, op.job_id = sandbox, f"{op.id}-job-1"
        op.proc = subprocess.Popen(["bash", "-c", str(task["command"])], cwd=sandbox, env=env,
                                   stdin=subprocess.DEVNULL, stdout=table, stderr=stderr,
                                   start_new_session=True)
        table.close()
        stderr.close()
        threading.Thread(target=self._wait_job, args=(op,), daemon=True).start()

    def _wait_job(self, op: FakeOperation) -> None:
        assert op.proc is not None and op.sandbox is not None
        code = op.proc.wait()
        with self._lock:
            if op.state != "running":
                return
            if code == 0:
                rows = [json.loads(line) for line in
                        (op.sandbox / "_table").read_text().splitlines() if line.strip()]
                for path in op.spec["tasks"]["notebook"].get("output_table_paths", []):
                    self.nodes[str(path)]["data"] = rows
                op.state = "completed"
            else:
                op.state = "failed"
                op.error = {"message": "Operation has failed", "inner_errors": [
                    {"message": f"Process exited with code {code}"}]}

    def get_operation(self, operation_id: str | None = None, operation_alias: str | None = None,
                      attributes: list[str] | None = None) -> dict[str, Any]:
        found = [op for op in self.operations.values()
                 if op.id == operation_id or (operation_alias and op.alias == operation_alias)]
        if not found:
            raise YtError("No such operation", code=1915)
        op = found[-1]
        return {"id": op.id, "state": op.state,
                "result": {"error": op.error} if op.error else {}}

    def list_jobs(self, operation_id: str, job_state: str | None = None) -> dict[str, Any]:
        op = self.operations[operation_id]
        if not op.job_id:
            return {"jobs": []}
        running = op.proc is not None and op.proc.poll() is None
        if job_state == "running" and not running:
            return {"jobs": []}
        return {"jobs": [{"id": op.job_id, "state": "running" if running else "completed"}]}

    def get_job_stderr(self, operation_id: str, job_id: str) -> FakeStream:
        self.calls.append(f"get_job_stderr {operation_id} {job_id}")
        op = self.operations[operation_id]
        assert op.sandbox is not None and job_id == op.job_id
        return FakeStream((op.sandbox / "_stderr").read_bytes())

    def abort_job(self, job_id: str, interrupt_timeout: int | None = None) -> None:
        [op] = [o for o in self.operations.values() if o.job_id == job_id]
        op.aborts.append((job_id, interrupt_timeout))
        sig = getattr(signal, str(op.spec["tasks"]["notebook"].get("interruption_signal")))
        assert op.proc is not None
        os.killpg(op.proc.pid, sig)

        def later() -> None:
            time.sleep((interrupt_timeout or 0) / 1000)
            if op.proc is not None and op.proc.poll() is None:
                self._abort_now(op, "failed" if op.spec.get("fail_on_job_restart")
                                else "aborted", "Job interrupted and aborted")

        threading.Thread(target=later, daemon=True).start()

    def _abort_now(self, op: FakeOperation, state: str, message: str) -> None:
        with self._lock:
            if op.state in ("completed", "failed", "aborted"):
                raise YtError(f"Operation {op.id} is in {op.state} state", code=1)
            op.state, op.error = state, {"message": message}
        if op.proc is not None and op.proc.poll() is None:
            os.killpg(op.proc.pid, signal.SIGKILL)
            op.proc.wait()

    def abort_operation(self, operation: str, reason: str | None = None) -> None:
        self.calls.append(f"abort_operation {operation}")
        if operation not in self.operations:
            raise YtError("No such operation", code=1915)
        self._abort_now(self.operations[operation], "aborted", reason or "aborted")

    def close(self) -> None:
        for op in self.operations.values():
            if op.proc is not None and op.proc.poll() is None:
                os.killpg(op.proc.pid, signal.SIGKILL)
                op.proc.wait()
        self._tmp.cleanup()

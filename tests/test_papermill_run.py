"""One attempt run by ``backends/papermill_run.py`` itself, with a real kernel."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import nbformat
import pytest

from jupyter_gpushare.backends.papermill_run import run

REPORT = """
import json, os
from ipykernel import get_connection_info
info = get_connection_info(unpack=True)
json.dump({"transport": info["transport"], "ip": info["ip"]}, open(os.environ["OUT"], "w"))
"""


def test_the_kernel_talks_over_unix_sockets_and_leaves_none_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No TCP ports for the kernel: a port picked by the manager can be taken by another
    process before the kernel binds it (seen in CI: 'Address already in use', the kernel
    died before it answered, the job failed)."""
    report = tmp_path / "report.json"
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    attempt = tmp_path / "attempt-1"
    attempt.mkdir()
    nbformat.write(nb, attempt / "input.ipynb")
    spec = {"job_id": "job-t", "attempt": 1, "output_path": str(tmp_path / "out.ipynb")}
    (attempt / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setenv("OUT", str(report))
    code = run(attempt)
    status = json.loads((attempt / "status.json").read_text())
    assert code == 0, status
    seen = json.loads(report.read_text())
    assert seen["transport"] == "ipc", seen
    sockets = Path(seen["ip"]).parent  # (other jobs' folders may exist meanwhile)
    assert sockets.name.startswith("gpushare-kernel-")
    assert sockets.parent == Path(tempfile.gettempdir())
    assert not sockets.exists()  # removed after the run
    assert (tmp_path / "out.ipynb").exists()

"""The core decides and does no I/O: importing it loads no framework, driver or database."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).parents[1] / "jupyter_gpushare" / "core"
ALLOWED = {
    "__future__", "bisect", "collections", "dataclasses", "enum", "functools", "heapq",
    "itertools", "math", "typing", "weakref", "datetime", "collections.abc",
    # pure text handling, no I/O: job parameters and names are checked in the core
    "json", "re", "keyword", "unicodedata",
}


def test_core_modules_import_only_the_standard_library_and_each_other() -> None:
    for path in CORE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: another core module
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name in ALLOWED, f"{path.name} imports {name}"


def test_importing_the_core_loads_no_framework() -> None:
    code = (
        "import sys, jupyter_gpushare.core.admission, jupyter_gpushare.core.ledger;"
        "bad = [m for m in ('tornado', 'jupyter_server', 'jupyterhub', 'sqlalchemy', 'yaml',"
        " 'pynvml', 'traitlets') if m in sys.modules]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

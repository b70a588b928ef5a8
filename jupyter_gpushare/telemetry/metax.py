"""MetaX sampler: the vendor's ``mx-smi`` command-line output, parsed.

``mx-smi`` (installed with MetaX's driver and MACA software) prints, like ``nvidia-smi``, a
table with two rows per GPU and, below it, the processes using the GPUs::

    | GPU         NAME                   | Bus-id              | GPU-Util             |
    | Temp        Pwr:Usage/Cap          | Memory-Usage        |                      |
    |====================================+=====================+======================|
    | 0           MetaX C500             | 0000:0f:00.0        | 35%                  |
    | 36C         53W / 350W             | 858/65536 MiB       |                      |

    |  GPU                    PID         Process Name                 GPU Memory     |
    |  0                      4242        python                       16384          |

:func:`parse_mx_smi` reads that text (a pure function, tested against recorded outputs in
``tests/data/vendors/``); :class:`MetaXSMISampler` runs ``mx-smi`` once per interval in the
sampler's thread, never on the event loop and never at import time. A GPU is named
``MetaX-<bus id>`` (the table has no UUID); figures the table leaves out are ``None``.

Not run on MetaX hardware here: the recorded outputs are written from the layout above,
which MetaX documents for ``mx-smi`` and public collectors parse (e.g. SwanLab's MetaX
collector reads the name, the ``used/total MiB`` cell and the driver line the same way).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import GPUSample, ProcessSample, Sample
from .sampler import DEFAULT_HISTORY_S, DEFAULT_INTERVAL_S, Sampler

VENDOR = "MetaX"
COMMAND = "mx-smi"

_BUS = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_PCT = re.compile(r"^(\d+(?:\.\d+)?)\s*%$")
_TEMP = re.compile(r"^(\d+(?:\.\d+)?)\s*C$", re.IGNORECASE)
_POWER = re.compile(r"^(\d+(?:\.\d+)?|N/A)\s*W?\s*/\s*(\d+(?:\.\d+)?|N/A)\s*W?$", re.IGNORECASE)
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s*MiB$", re.IGNORECASE)
_PROC = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+(\S(?:.*\S)?)\s+(\d+(?:\.\d+)?)\s*(?:MiB)?\s*\|$")
_VERSION = re.compile(r"mx-smi\s+version:\s*(\S+)", re.IGNORECASE)


class MXSMIUnavailable(RuntimeError):
    """``mx-smi`` is not installed, fails, or lists no GPU."""


@dataclass(frozen=True)
class MXSMITable:
    """What one ``mx-smi`` run says."""

    version: str
    gpus: tuple[GPUSample, ...]
    processes: tuple[ProcessSample, ...]


def _cells(line: str) -> list[str]:
    """The cells of a table row ``| a | b |`` (empty for any other line)."""
    text = line.strip()
    if not text.startswith("|"):
        return []
    return [c.strip() for c in text.strip("|").split("|")]


def _float(pattern: re.Pattern[str], text: str, group: int = 1) -> float | None:
    m = pattern.match(text.strip())
    if not m or m.group(group).upper() == "N/A":
        return None
    return float(m.group(group))


def parse_mx_smi(text: str) -> MXSMITable:
    """Parse the default ``mx-smi`` output: GPUs (two table rows each) and processes."""
    version_match = _VERSION.search(text)
    version = version_match.group(1) if version_match else ""
    lines = text.splitlines()
    gpus: list[GPUSample] = []
    processes: list[ProcessSample] = []
    in_processes = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.search(r"\bprocess", line, re.IGNORECASE) and "|" in line:
            in_processes = True
        cells = _cells(line)
        if in_processes:
            m = _PROC.match(line.strip())
            if m:
                index = int(m.group(1))
                uuid = gpus[index].uuid if index < len(gpus) else f"MetaX-{index}"
                processes.append(ProcessSample(int(m.group(2)), uuid, float(m.group(4))))
            i += 1
            continue
        first = cells[0].split(None, 1) if cells else []
        if (len(cells) >= 3 and len(first) == 2 and first[0].isdigit()
                and _BUS.match(cells[1]) and i + 1 < len(lines)):
            index, name = int(first[0]), first[1].strip()
            below = _cells(lines[i + 1])
            gpus.append(_gpu(index, name, cells, below))
            i += 2
            continue
        i += 1
    return MXSMITable(version, tuple(gpus), tuple(processes))


def _gpu(index: int, name: str, row: list[str], below: list[str]) -> GPUSample:
    util = _float(_PCT, row[2]) if len(row) > 2 else None
    temp = power = limit = None
    used, total = 0.0, 0.0
    if below:
        parts = below[0].split(None, 1)
        temp = _float(_TEMP, parts[0]) if parts else None
        if len(parts) > 1:
            power = _float(_POWER, parts[1], 1)
            limit = _float(_POWER, parts[1], 2)
    if len(below) > 1:
        m = _MEMORY.match(below[1])
        if m:
            used, total = float(m.group(1)), float(m.group(2))
    if not name.lower().startswith("metax"):
        name = f"MetaX {name}"
    return GPUSample(
        index=index,
        uuid=f"MetaX-{row[1].lower()}",
        name=name,
        memory_used_mib=used,
        memory_total_mib=total,
        utilization_pct=util,
        memory_bandwidth_pct=None,
        temperature_c=temp,
        power_w=power,
        power_limit_w=limit,
        vendor=VENDOR,
    )


Runner = Callable[[Sequence[str]], str]


def run_mx_smi(args: Sequence[str], command: str = COMMAND, timeout_s: float = 5.0) -> str:
    """Run ``mx-smi`` with ``args`` and return its standard output (blocking)."""
    path = shutil.which(command)
    if path is None:
        raise MXSMIUnavailable(f"{command} is not on PATH")
    try:
        done = subprocess.run([path, *args], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MXSMIUnavailable(f"{command} failed: {exc}") from exc
    if done.returncode != 0:
        raise MXSMIUnavailable(f"{command} exited {done.returncode}: "
                               f"{(done.stderr or done.stdout).strip()[:200]}")
    return done.stdout


class MetaXSMISampler(Sampler):
    """Reads every MetaX GPU through ``mx-smi``, once per interval."""

    source = "mx-smi"

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        history_s: float = DEFAULT_HISTORY_S,
        runner: Runner | None = None,
    ) -> None:
        super().__init__(interval_s, history_s)
        self._runner: Runner = runner or run_mx_smi
        self.version = ""

    def setup(self) -> None:
        table = parse_mx_smi(self._runner(()))
        if not table.gpus:
            raise MXSMIUnavailable("mx-smi lists no GPU")
        self.version = table.version

    def describe(self) -> dict[str, object]:
        d = super().describe()
        d["mx_smi_version"] = self.version
        return d

    def collect(self) -> Sample:
        table = parse_mx_smi(self._runner(()))
        return Sample(ts=time.time(), gpus=table.gpus, processes=table.processes,
                      simulated=False, source=self.source)

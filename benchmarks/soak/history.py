"""A soak run's history: one JSON document a developer can keep and re-audit (``--replay``).

``events`` are what the harness saw as it happened (client calls and their final status,
faults, the hub's snapshots of running servers, recoveries); ``rows`` are the broker's stored
history read directly from its database at the end; ``policy`` is what the audit needs of the
policy file (capacities, quotas, profiles); ``figures`` are what the broker and its report
said (compared to the audit's own recomputation, never trusted); ``backend`` is what the
batch backend left in the job folders (the checkpointing notebooks' attempt records).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "gpushare-soak-history/1"


@dataclass
class History:
    seed: int = 0
    started: float = 0.0
    ended: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"t": fields.pop("t", None) or time.time(), "kind": kind, **fields}
        with self._lock:
            self.events.append(event)
        return event

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            events = sorted(self.events, key=lambda e: e["t"])
        return {
            "format": FORMAT,
            "seed": self.seed,
            "started": self.started,
            "ended": self.ended,
            "settings": self.settings,
            "policy": self.policy,
            "events": events,
            "rows": self.rows,
            "figures": self.figures,
            "backend": self.backend,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1, default=str))
        return path


def load(path: str | Path) -> History:
    """A history saved by :meth:`History.save`; a clear error naming the file otherwise."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a soak history: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SystemExit(f"{path}: format: expected {FORMAT!r}")
    return History(
        seed=int(doc["seed"]),
        started=float(doc["started"]),
        ended=float(doc["ended"]),
        settings=doc["settings"],
        policy=doc["policy"],
        events=doc["events"],
        rows=doc["rows"],
        figures=doc["figures"],
        backend=doc["backend"],
    )

"""``benchmarks/broker.py`` runs end to end (tiny sizes): both arms of ``--baseline`` on
copies of one seeded database, the broker-side figures of the lag probe, the ratios."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_broker_benchmark_with_a_baseline_prints_both_arms_and_ratios(tmp_path: Path) -> None:
    cmd = [
        sys.executable, str(REPO / "benchmarks" / "broker.py"), "--db", "sqlite",
        "--grants", "60", "--nodes", "20", "--seconds", "0.6", "--clients", "4",
        "--rate", "40", "--baseline", str(REPO), "--keep", str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = {line[:45].strip(): line[45:].split() for line in done.stdout.splitlines()}
    header = done.stdout.splitlines()
    assert any("sqlite base" in h and "sqlite now" in h and "now/base" in h for h in header)
    # the broker's own records came back: admissions timed inside it, and the commits
    served = lines["in the broker: request time p50 (ms)"]
    assert len(served) == 3 and all(float(x) > 0 for x in served[:2]), served
    assert float(lines["submit CPU mean / p99 (ms)"][0]) > 0
    # the probe was on during the reconcile pass too (its on/off survives close signals)
    assert all(float(x) > 0 for x in lines["probe wake-ups during it"][:2])
    # each arm ran on its own copy of the seeded database
    assert (tmp_path / "sqlite-base.sqlite").exists() and (tmp_path / "sqlite-now.sqlite").exists()

"""The JupyterLab extension never reaches the broker (issue 24: "the lab talks only to the
server extension"): every URL it builds under the server's base URL names the server extension
(``gpushare/api``), the server's own contents and nbconvert APIs, or jupyter-resource-usage's
endpoint. The one exception is "switch hardware" (``switch.ts``), which stops and restarts
the user's own server through the hub, as the hub's own pages do (``home`` for the session's
XSRF token, ``api`` for the user's server, ``spawn-pending``). Nothing names the hub's
services, the broker's API or its port.

TypeScript has no import-linter: this reads the sources, as the contract would read imports.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "labextension" / "src"

# what a URL the lab builds may start with, after the server's base URL
ALLOWED_ROOTS = {"gpushare/api", "api/contents", "nbconvert/html", "api/metrics/v1"}
# under the hub's prefix, from the switch-hardware dialog only
HUB_ROOTS = {"switch.ts": {"home", "api", "spawn-pending"}}
JOIN = re.compile(r"URLExt\.join\(\s*([\w.]+)\s*,\s*(?:'([^']*)'|(\w+))")
CONST = re.compile(r"const\s+(\w+)\s*=\s*'([^']*)'")
FORBIDDEN = re.compile(r"services/|hub/api|/api/v1/|10101|broker_url")


def roots_of(text: str) -> list[tuple[str, str]]:
    """``(base, first path part)`` of each ``URLExt.join(base, <part>, ...)`` (a constant
    named there is read from its ``const`` line)."""
    consts = dict(CONST.findall(text))
    return [(base, literal or consts.get(name, f"<{name}>"))
            for base, literal, name in JOIN.findall(text)]


def test_every_url_the_lab_builds_is_its_servers_own() -> None:
    files = sorted(SRC.glob("*.ts"))
    assert len(files) > 10
    seen: dict[str, set[str]] = {}
    for path in files:
        text = path.read_text()
        for base, root in roots_of(text):
            if base == "prefix":  # the hub's prefix (switch.ts reads it from PageConfig)
                assert root in HUB_ROOTS.get(path.name, set()), (path.name, root)
                continue
            seen.setdefault(root, set()).add(path.name)
        assert not FORBIDDEN.search(text), (path.name, FORBIDDEN.search(text))
    assert set(seen) <= ALLOWED_ROOTS, {r: f for r, f in seen.items() if r not in ALLOWED_ROOTS}
    assert "gpushare/api" in seen  # the reader finds the extension's own calls


def test_the_reader_catches_a_url_to_the_hub_or_the_broker() -> None:
    planted = (
        "const B = 'services/gpushare/api/v1';\n"
        "const u = URLExt.join(s.baseUrl, B, 'grants');\n"
        "const v = URLExt.join(settings.baseUrl, 'hub/api', 'users');\n"
    )
    assert roots_of(planted) == [("s.baseUrl", "services/gpushare/api/v1"),
                                 ("settings.baseUrl", "hub/api")]
    assert FORBIDDEN.search(planted)

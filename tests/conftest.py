"""Suite-wide test order: the files with the most slow or real-hub tests run first.

With several workers (``scripts/test.sh`` runs pytest-xdist, one file per worker at a time),
a long file that starts last makes the whole run wait for it alone; starting the long ones
first lets the many short files fill the gaps. A file's own tests keep their order.
"""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    weight: Counter[str] = Counter()
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        path = str(item.path)
        first.setdefault(path, i)
        if item.get_closest_marker("slow") or item.get_closest_marker("hub"):
            weight[path] += 1
    items.sort(key=lambda item: (-weight[str(item.path)], first[str(item.path)]))

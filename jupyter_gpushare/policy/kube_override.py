"""A profile's ``kubespawner_override``: KubeSpawner trait names and their values.

The policy reads only the shape here (a mapping whose keys look like trait names, values
plain YAML), so it stays free of the spawner and of KubeSpawner. Which names are
KubeSpawner traits, and which values would undo the grant's GPU enforcement, is checked
by the Kubernetes spawner when the hub starts (:mod:`jupyter_gpushare.spawner.kube_guard`),
with messages that name the profile and the key.
"""

from __future__ import annotations

import re
from typing import Any

from ..policy_units import UnitError
from .yamlread import show

TRAIT_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,63}$"
"""A KubeSpawner trait name (``image``, ``node_selector``, ``extra_pod_config`` ...)."""
_TRAIT_NAME = re.compile(TRAIT_NAME_PATTERN)
MAX_OVERRIDE_KEYS = 64
EXPECTED = "a mapping of KubeSpawner trait names (such as image or tolerations) to values"


def _plain(value: object) -> Any:
    """``value`` as plain dicts, lists and scalars (the reader's line-keeping types dropped)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def kubespawner_override(value: object) -> tuple[tuple[str, Any], ...]:
    """The override as ``(trait name, value)`` pairs in file order; UnitError if malformed."""
    if not isinstance(value, dict):
        raise UnitError(EXPECTED)
    if len(value) > MAX_OVERRIDE_KEYS:
        raise UnitError(f"at most {MAX_OVERRIDE_KEYS} KubeSpawner trait names")
    for key in value:
        if not isinstance(key, str) or not _TRAIT_NAME.match(key):
            raise UnitError(
                f"{EXPECTED}; {show(key)} is not a trait name (lower-case letters, digits and _)"
            )
    return tuple((str(k), _plain(v)) for k, v in value.items())


OVERRIDE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"pattern": TRAIT_NAME_PATTERN},
    "maxProperties": MAX_OVERRIDE_KEYS,
}

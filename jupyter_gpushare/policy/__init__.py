"""The policy file (YAML) and its loader: policy file -> :class:`core.model.Policy`.

This is an adapter: it reads text and files, the core never imports it. Every
problem is collected (not just the first) as a :class:`PolicyIssue` that names
the file, the line, the dotted field path and what was expected, so an admin can
fix a whole file in one go. Errors make :func:`load_policy` / :func:`parse_policy`
raise :class:`PolicyError`; warnings (a pool with no nodes, guarantees that
oversubscribe a pool, ...) are returned by :func:`check_policy` and logged.

The modules, one concern each:

* :mod:`.yamlread` - YAML with the line of every key and item;
* :mod:`.schema` - the schema of every section, as data (also the JSON Schema);
* :mod:`.fields` - reading one mapping against its section, with line numbers;
* :mod:`.inventory`, :mod:`.sections`, :mod:`.profiles` - the sections;
* :mod:`.crossref` - checks across sections; :mod:`.loader` - the whole file;
* :mod:`.summary` - the overview ``check-policy`` prints.

The schema is documented, with an example, in ``hub_config/gpushare.yaml``.
Inventories that are *discovered* (``source: nvml`` or ``kubernetes``) need an
adapter: pass ``discover=`` a callable that takes the :class:`DiscoverySpec` and
returns the nodes. Without one, capacity checks are skipped (with a warning).
"""

from __future__ import annotations

from .inventory import Discover, DiscoverySpec, simulated_nodes
from .issues import PolicyCheck, PolicyError, PolicyIssue
from .loader import check_policy, check_policy_file, load_policy, parse_policy, read_policy_text
from .schema import DISCOVERED_SOURCES, INVENTORY_SOURCES, MAX_HEADROOM, json_schema
from .summary import summarize
from .yamlread import YList, YMap

__all__ = [
    "DISCOVERED_SOURCES",
    "INVENTORY_SOURCES",
    "MAX_HEADROOM",
    "Discover",
    "DiscoverySpec",
    "PolicyCheck",
    "PolicyError",
    "PolicyIssue",
    "YList",
    "YMap",
    "check_policy",
    "check_policy_file",
    "json_schema",
    "load_policy",
    "parse_policy",
    "read_policy_text",
    "simulated_nodes",
    "summarize",
]

"""The package's import graph (issue 24): no import cycles between modules but the known ones,
and every import-linter contract of ``pyproject.toml`` holds and can break.

The graph is grimp's, the one ``lint-imports`` (run by scripts/test.sh after mypy) checks.
Imports inside functions and under ``if TYPE_CHECKING:`` count: both are dependencies a
reader has to follow, and a cycle through a lazy import is still a cycle in the design.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import grimp
import pytest
from importlinter import configuration
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: mypy's dependency
    import tomli as tomllib

ROOT = Path(__file__).parents[1]
PACKAGE = "jupyter_gpushare"

KNOWN_CYCLES: set[frozenset[str]] = set()
"""Module cycles accepted for now (none): a new one fails the test below."""

CONTRACT_TYPES: dict[str, type[Contract]] = {
    "forbidden": ForbiddenContract,
    "layers": LayersContract,
}

# one import per contract that must break it (contract id -> importer, imported)
BREAKERS: dict[str, tuple[str, str]] = {
    "core-pure": ("jupyter_gpushare.core.model", "jupyter_gpushare.userfiles"),
    "policy-below-runtime": ("jupyter_gpushare.policy.loader", "jupyter_gpushare.broker.app"),
    "broker-client-alone": ("jupyter_gpushare.broker.client",
                            "jupyter_gpushare.broker.service.broker"),
    "backends-no-broker-server": ("jupyter_gpushare.backends.local",
                                  "jupyter_gpushare.broker.api.handlers"),
    "serverextension-over-http": ("jupyter_gpushare.serverextension.jobs",
                                  "jupyter_gpushare.broker.client"),
    "scheduler-over-http": ("jupyter_gpushare.scheduler.scheduler",
                            "jupyter_gpushare.serverextension.jobs"),
    "telemetry-alone": ("jupyter_gpushare.telemetry.sampler", "jupyter_gpushare.spawner.local"),
    "broker-rooms": ("jupyter_gpushare.broker.store.serial",
                     "jupyter_gpushare.broker.service.views"),
    "broker-shared-modules": ("jupyter_gpushare.broker.errors",
                              "jupyter_gpushare.broker.service.limits"),
    "layers": ("jupyter_gpushare.policy_units", "jupyter_gpushare.policy.loader"),
}


def import_cycles(graph: grimp.ImportGraph) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for start in sorted(graph.modules):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, [])]
        while work:
            module, todo = work[-1]
            if module not in index:  # entered for the first time
                index[module] = low[module] = len(index)
                stack.append(module)
                todo.extend(sorted(graph.find_modules_directly_imported_by(module)))
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    work.append((nxt, []))
                elif nxt in stack:
                    low[module] = min(low[module], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                cut = stack.index(module)
                component, stack[cut:] = frozenset(stack[cut:]), []
                if len(component) > 1:
                    found.add(component)
    return found


def describe(graph: grimp.ImportGraph, cycle: frozenset[str]) -> str:
    """Each import of the cycle with its line, so the message says where to cut."""
    lines = []
    for importer in sorted(cycle):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & cycle):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer}:{detail['line_number']} "
                             f"{detail['line_contents']}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    configuration.configure()  # import-linter's settings, as lint-imports sets them
    return grimp.build_graph(PACKAGE, cache_dir=None)


def contracts() -> list[dict[str, Any]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, Any]] = data["tool"]["importlinter"]["contracts"]
    return found


def make_contract(options: dict[str, Any]) -> Contract:
    rest = {k: v for k, v in options.items() if k not in ("id", "name", "type")}
    return CONTRACT_TYPES[options["type"]](
        name=options["name"], session_options={"root_packages": [PACKAGE]},
        contract_options=rest,
    )


def test_no_import_cycles_but_the_known_ones(graph: grimp.ImportGraph) -> None:
    cycles = import_cycles(graph)
    new = cycles - KNOWN_CYCLES
    assert not new, "new import cycles:\n" + "\n\n".join(describe(graph, c) for c in new)
    gone = KNOWN_CYCLES - cycles
    assert not gone, f"cycles no longer there, remove them from KNOWN_CYCLES: {gone}"


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import() -> None:
    g = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c", "p.d"):
        g.add_module(module)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    g.add_import(importer="p.c", imported="p.a")  # a -> b -> c -> a
    g.add_import(importer="p.c", imported="p.d")
    assert import_cycles(g) == {frozenset({"p.a", "p.b", "p.c"})}


def edges(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    return {(m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)}


def test_the_graph_counts_imports_under_type_checking(graph: grimp.ImportGraph) -> None:
    # lint-imports builds the same graph (no exclude_type_checking_imports in pyproject.toml)
    without = grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)
    assert edges(without) < edges(graph)


def test_every_contract_has_an_id_and_a_breaker() -> None:
    ids = [c.get("id") for c in contracts()]
    assert sorted(ids) == sorted(BREAKERS), "give each contract an id and a breaker here"


@pytest.mark.parametrize("contract_id", sorted(BREAKERS))
def test_the_contract_holds_and_one_import_breaks_it(
    graph: grimp.ImportGraph, contract_id: str,
) -> None:
    (options,) = [c for c in contracts() if c.get("id") == contract_id]
    assert make_contract(options).check(copy.deepcopy(graph), verbose=False).kept, options["name"]
    broken = copy.deepcopy(graph)
    importer, imported = BREAKERS[contract_id]
    assert importer in broken.modules and imported in broken.modules
    broken.add_import(importer=importer, imported=imported, line_number=1,
                      line_contents=f"import {imported}")
    assert not make_contract(options).check(broken, verbose=False).kept, options["name"]

"""Applies a gpushare grant's memory cap to PyTorch in every Python process of a server.

The spawner puts this folder first on ``PYTHONPATH`` when a grant holds a fraction of a
GPU and sets ``GPUSHARE_TORCH_MEMORY_FRACTION``. When (and only when) ``torch`` is
imported, a call to ``torch.cuda.set_per_process_memory_fraction`` is queued for CUDA's
lazy initialisation, so importing torch stays cheap and CUDA is not initialised early
(which would break fork-based data loaders). Over the cap, allocations fail with
PyTorch's out-of-memory error: they are never silently slowed down.

Any other ``sitecustomize`` further down ``sys.path`` still runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


def _apply(torch) -> None:  # type: ignore[no-untyped-def]
    frac = float(os.environ.get("GPUSHARE_TORCH_MEMORY_FRACTION", "0") or 0)
    if not 0 < frac < 1:
        return

    def cap() -> None:
        for index in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(frac, index)

    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None and not torch.cuda.is_initialized():
        lazy_call(cap)
    elif torch.cuda.is_available():
        cap()


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Runs :func:`_apply` right after ``torch`` has been imported."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            pass
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module  # type: ignore[attr-defined]

        def exec_module(module):  # type: ignore[no-untyped-def]
            original(module)
            try:
                _apply(module)
            except Exception as exc:  # never break the user's import
                print(f"gpushare: could not cap PyTorch memory: {exc}", file=sys.stderr)

        loader.exec_module = exec_module  # type: ignore[attr-defined,method-assign]
        return spec


def _install() -> None:
    if os.environ.get("GPUSHARE_TORCH_MEMORY_FRACTION"):
        if "torch" in sys.modules:
            _apply(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _TorchFinder())


def _chain() -> None:
    """Run the next ``sitecustomize`` on sys.path, which this module shadows."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_gpushare_next_sitecustomize", candidate)
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                try:
                    spec.loader.exec_module(module)
                except Exception as exc:
                    print(f"gpushare: {candidate} failed: {exc}", file=sys.stderr)
            return


try:
    _install()
finally:
    _chain()

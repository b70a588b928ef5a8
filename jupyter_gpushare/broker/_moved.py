"""Old module paths of the broker, from before its modules moved into rooms (``api/``,
``service/``, ``store/``, ``jobs/``, ``ops/``), kept importable for what a site may name in its
configuration (``c.BrokerApp.authenticator_class = "jupyter_gpushare.broker.auth...."``) or in a
service command (``python -m jupyter_gpushare.broker.supervisor``).

Importing an old path gives the module at its new path (the same object, never a second copy)
and warns with a :class:`FutureWarning` that names the new path. The finder sits last on
``sys.meta_path``, so it is asked only for names nothing else can find. ``service`` and ``jobs``
are now packages: their old contents are re-exported lazily by the packages themselves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

PACKAGE = "jupyter_gpushare.broker"

# old module (under PACKAGE) -> its new path (under PACKAGE)
MOVED: dict[str, str] = {
    "handler_base": "api.handler_base",
    "handlers": "api.handlers",
    "admin_handlers": "api.admin_handlers",
    "job_handlers": "api.job_handlers",
    "pages": "api.pages",
    "admin_page": "api.admin_page",
    "report_page": "api.report_page",
    "auth": "api.auth",
    "fields": "service.fields",
    "ratelimit": "service.ratelimit",
    "base": "service.base",
    "lifecycle": "service.lifecycle",
    "views": "service.views",
    "ledger": "service.ledger",
    "ledger_month": "service.ledger_month",
    "heartbeats": "service.heartbeats",
    "consistency": "service.consistency",
    "preempt": "service.preempt",
    "waiting": "service.waiting",
    "effects": "service.effects",
    "usage": "service.usage",
    "limits": "service.limits",
    "ids": "service.ids",
    "db": "store.db",
    "fastsql": "store.fastsql",
    "commitpipe": "store.commitpipe",
    "commitasync": "store.commitasync",
    "commitloop": "store.commitloop",
    "serial": "store.serial",
    "livegrants": "store.livegrants",
    "job_runner": "jobs.runner",
    "job_spec": "jobs.spec",
    "job_outcome": "jobs.outcome",
    "job_settings": "jobs.settings",
    "job_submit": "jobs.submit",
    "supervisor": "ops.supervisor",
    "metrics": "ops.metrics",
    "culler": "ops.culler",
    "reconcile": "ops.reconcile",
    "reload": "ops.reload",
    "node_return": "jobs.node_return",
    "gcpace": "ops.gcpace",
    "retention": "ops.retention",
}


def moved_warning(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated: the module moved to {new}; import it from there",
        FutureWarning,
        stacklevel=3,
    )


class _AliasSpec(importlib.machinery.ModuleSpec):
    """The spec of an old name: ``parent`` is the new module's package, so that code run
    through it (``python -m`` an old name) resolves its relative imports where it lives."""

    def __init__(self, name: str, loader: _AliasLoader, real: importlib.machinery.ModuleSpec):
        super().__init__(name, loader, origin=real.origin)
        self.has_location = real.has_location
        self._real_parent = real.parent

    @property
    def parent(self) -> str:  # type: ignore[override]
        return self._real_parent or ""


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str, real: importlib.machinery.ModuleSpec) -> None:
        self.new = new
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.real  # the import machinery set the alias's spec on it

    def get_code(self, fullname: str) -> CodeType | None:  # for python -m <old name>
        loader = self.real.loader
        get_code = getattr(loader, "get_code", None)
        return get_code(self.new) if get_code is not None else None


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED` (and nothing else)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PACKAGE + "."):
            return None
        moved = MOVED.get(fullname[len(PACKAGE) + 1 :])
        if moved is None:
            return None
        new = f"{PACKAGE}.{moved}"
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        moved_warning(fullname, new)
        return _AliasSpec(fullname, _AliasLoader(new, real), real)


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())

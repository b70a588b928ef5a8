"""The broker's old module paths (before its modules moved into rooms, issue 24) keep working
for what a site may name in its configuration or service command, with a warning that names
the new path; and importing the broker package imports none of its rooms."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from traitlets.config import Config

from jupyter_gpushare.broker import _moved


def test_every_old_path_is_the_same_module_as_its_new_path_with_a_warning() -> None:
    for old, new in _moved.MOVED.items():
        old_name, new_name = f"jupyter_gpushare.broker.{old}", f"jupyter_gpushare.broker.{new}"
        sys.modules.pop(old_name, None)
        with pytest.warns(FutureWarning, match=new_name.replace(".", r"\.")):
            aliased = importlib.import_module(old_name)
        real = importlib.import_module(new_name)
        assert aliased is real, old
        assert real.__name__ == new_name and real.__spec__ is not None
        assert real.__spec__.name == new_name  # the alias did not take the module's spec


def test_an_old_class_path_in_a_site_config_loads_the_class_at_its_new_path() -> None:
    from jupyter_gpushare.broker.api.auth import TokenAuthenticator
    from jupyter_gpushare.broker.app import BrokerApp

    config = Config()
    config.BrokerApp.authenticator_class = "jupyter_gpushare.broker.auth.TokenAuthenticator"
    sys.modules.pop("jupyter_gpushare.broker.auth", None)
    with pytest.warns(FutureWarning):
        app = BrokerApp(config=config)
        assert app.authenticator_class is TokenAuthenticator


def test_python_dash_m_of_an_old_path_runs_the_new_module_in_its_own_package() -> None:
    code = (
        "import runpy, warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    ran = runpy.run_module('jupyter_gpushare.broker.ledger_month',\n"
        "                           run_name='__main__', alter_sys=True)\n"
        "print(ran['__package__'], ran['__spec__'].parent, ran['MonthLedger'].__name__)\n"
        "print(*[str(w.message) for w in seen if w.category is FutureWarning])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ran, warned = out.stdout.splitlines()
    # its relative imports (``from ...core.model import``) resolved from where it lives now
    assert ran == "jupyter_gpushare.broker.service jupyter_gpushare.broker.service MonthLedger"
    assert "moved to jupyter_gpushare.broker.service.ledger_month" in warned


def test_the_old_service_and_jobs_modules_names_are_still_found_in_their_packages() -> None:
    from jupyter_gpushare.broker.jobs.store import JobStore
    from jupyter_gpushare.broker.service.broker import Broker

    with pytest.warns(FutureWarning, match="service.broker"):
        from jupyter_gpushare.broker.service import Broker as old_broker
    with pytest.warns(FutureWarning, match="jobs.store"):
        from jupyter_gpushare.broker.jobs import JobStore as old_store
    assert old_broker is Broker and old_store is JobStore
    with pytest.raises(ImportError):
        from jupyter_gpushare.broker.service import NoSuchThing  # noqa: F401


def test_an_unknown_name_under_the_broker_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jupyter_gpushare.broker.no_such_module")


def test_importing_the_broker_package_imports_none_of_its_rooms() -> None:
    code = (
        "import sys, jupyter_gpushare.broker.client\n"
        "rooms = [m for m in sys.modules if m.startswith('jupyter_gpushare.broker.')\n"
        "         and m.rsplit('.', 1)[1] not in ('client', '_moved')]\n"
        "print(rooms)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

"""The wheel installs like its peers: licence, classifiers, versions and the lab extension.

Builds the real wheel with pip (hatchling, the project's own build hook) into a temporary
folder and reads what a package index and JupyterLab's extension manager would read.
"""

from __future__ import annotations

import email
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import jupyter_gpushare
from jupyter_gpushare import serverextension

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    if not (ROOT / "jupyter_gpushare/labextension/static/style.js").exists():
        pytest.fail("the lab extension is not built (scripts/test.sh builds it)")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=600,
    )
    (built,) = out.glob("jupyter_gpushare-*.whl")
    return zipfile.ZipFile(built)


def metadata(whl: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(whl.read(name))


def test_the_wheel_carries_its_licence(wheel: zipfile.ZipFile) -> None:
    meta = metadata(wheel)
    assert meta["License-Expression"] == "BSD-3-Clause"
    (lic,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert b"BSD 3-Clause License" in wheel.read(lic)
    assert "Redistribution and use" in (ROOT / "LICENSE").read_text()


def test_the_extension_manager_can_find_it(wheel: zipfile.ZipFile) -> None:
    classifiers = metadata(wheel).get_all("Classifier") or []
    # JupyterLab's PyPI extension manager lists packages by this classifier
    assert "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in classifiers
    assert "Framework :: Jupyter :: JupyterLab :: 4" in classifiers
    assert f"Programming Language :: Python :: 3.{sys.version_info.minor}" in classifiers


def test_versions_agree_everywhere(wheel: zipfile.ZipFile) -> None:
    version = metadata(wheel)["Version"]
    assert jupyter_gpushare.__version__ == version
    assert serverextension.__version__ == version
    lab = json.loads(
        wheel.read(
            next(
                n
                for n in wheel.namelist()
                if n.endswith("share/jupyter/labextensions/jupyter-gpushare/package.json")
            )
        )
    )
    assert lab["name"] == "jupyter-gpushare"
    assert lab["jupyterlab"]["_build"]["load"], "the prebuilt extension has no entry point"


def test_the_server_extension_is_enabled_on_install(wheel: zipfile.ZipFile) -> None:
    (conf,) = [
        n for n in wheel.namelist() if n.endswith("etc/jupyter/jupyter_server_config.d/"
                                                   "jupyter_gpushare.json")
    ]
    enabled = json.loads(wheel.read(conf))["ServerApp"]["jpserver_extensions"]
    assert enabled == {"jupyter_gpushare.serverextension": True}


def test_vendored_kueue_crds_ship_with_their_licence() -> None:
    text = (ROOT / "tests/data/kueue/LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_grafana_dashboard_is_in_the_wheel(wheel: zipfile.ZipFile) -> None:
    shipped = wheel.read("jupyter_gpushare/grafana/gpushare-dashboard.json")
    assert shipped == (ROOT / "jupyter_gpushare/grafana/gpushare-dashboard.json").read_bytes()
    assert json.loads(shipped)["templating"]["list"], "a dashboard without its variables"

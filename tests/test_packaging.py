"""The wheel installs like its peers: licence, classifiers, versions and the lab extension.

Builds the sdist and, from it, the wheel with ``python -m build`` (hatchling, the project's
own build hook), as a release would, into a temporary folder, and reads what a package index
and JupyterLab's extension manager would read. The slow test installs that wheel into a
fresh virtual environment (no site packages of this one: its dependencies come from the
package index) and runs what a site would run there: ``jupyter labextension list``,
``jupyter server extension list``, ``jupyter-gpushare dashboard``.
"""

from __future__ import annotations

import email
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

import jupyter_gpushare
from jupyter_gpushare import serverextension

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist, then the wheel built from the unpacked sdist."""
    if not (ROOT / "jupyter_gpushare/labextension/static/style.js").exists():
        pytest.fail("the lab extension is not built (scripts/test.sh builds it)")
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                   check=True, timeout=900, capture_output=True)
    (sdist,) = out.glob("jupyter_gpushare-*.tar.gz")
    (whl,) = out.glob("jupyter_gpushare-*.whl")
    return sdist, whl


@pytest.fixture(scope="module")
def wheel(dists: tuple[Path, Path]) -> zipfile.ZipFile:
    return zipfile.ZipFile(dists[1])


@pytest.fixture(scope="module")
def sdist(dists: tuple[Path, Path]) -> dict[str, bytes]:
    """The sdist's files by path below its top folder."""
    with tarfile.open(dists[0]) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile() and "/" in m.name}


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


def test_the_sdist_carries_the_licence_and_each_vendored_schema_its_own(
    sdist: dict[str, bytes], wheel: zipfile.ZipFile
) -> None:
    assert sdist["LICENSE"] == (ROOT / "LICENSE").read_bytes()
    assert email.message_from_bytes(sdist["PKG-INFO"])["License-Expression"] == "BSD-3-Clause"
    crds = [n for n in sdist if re.search(r"kueue\.x-k8s\.io_\w+\.yaml$", n)]
    assert len(crds) == 5, crds
    for folder in {n.rsplit("/", 1)[0] for n in crds}:  # the Apache text beside them
        text = sdist[f"{folder}/LICENSE"].decode()
        assert "Apache License" in text and "Version 2.0, January 2004" in text, folder
    # the wheel ships no vendored CRD, so it needs no Apache text
    assert not [n for n in wheel.namelist() if "kueue.x-k8s.io_" in n]


def test_the_sdist_holds_no_build_output_caches_or_demo_data(sdist: dict[str, bytes]) -> None:
    junk = [n for n in sdist if n.startswith((".venv/", ".import_linter_cache/",
                                              "hub_config/.demo/", "gpushare-jobs/"))
            or "/node_modules/" in f"/{n}" or "__pycache__" in n]
    assert junk == []
    assert "jupyter_gpushare/labextension/package.json" in sdist  # the prebuilt extension


def test_the_project_urls_point_at_one_repository_and_its_docs(wheel: zipfile.ZipFile) -> None:
    urls = dict(u.split(", ", 1) for u in metadata(wheel).get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Source", "Documentation", "Issues"}, urls
    source = urls["Source"]
    assert urls["Documentation"] == f"{source}/tree/main/docs"
    assert urls["Issues"] == f"{source}/issues" and urls["Homepage"] == source
    assert (ROOT / "docs").is_dir()


def run_in(venv: Path, *argv: str, env: dict[str, str], timeout: float = 300
           ) -> subprocess.CompletedProcess[str]:
    """``argv`` from the venv's bin, in its own home folder (never this checkout, which
    ``python -c`` would put first on ``sys.path``)."""
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], env=env, cwd=env["HOME"],
                          capture_output=True, text=True, timeout=timeout, check=True)


def said(done: subprocess.CompletedProcess[str]) -> str:
    """What a jupyter command printed (both streams), without its colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)


@pytest.fixture(scope="module")
def fresh(dists: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, dict[str, str]]:
    """A new venv (none of this one's packages) with the wheel and its dependencies from
    the package index; its own Jupyter config and data folders, no user-wide ones."""
    tmp = tmp_path_factory.mktemp("fresh")
    venv = tmp / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JUPYTER", "VIRTUAL_ENV", "PYTHON", "GPUSHARE_"))}
    env.update(HOME=str(tmp / "home"), JUPYTER_CONFIG_DIR=str(tmp / "home/.jupyter"),
               JUPYTER_DATA_DIR=str(tmp / "home/.local/share/jupyter"),
               PATH=f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    (tmp / "home").mkdir()
    run_in(venv, "pip", "install", "-q", str(dists[1]), env=env, timeout=1200)
    print(f"fresh venv with the wheel and its dependencies: {time.monotonic() - started:.0f} s")
    return venv, env


@pytest.mark.slow
@pytest.mark.benchmark  # about 2.5 to 4.5 min here: pip installs every dependency
def test_a_fresh_environment_lists_both_extensions_enabled(
    fresh: tuple[Path, dict[str, str]], wheel: zipfile.ZipFile
) -> None:
    venv, env = fresh
    version = metadata(wheel)["Version"]
    lab = said(run_in(venv, "jupyter", "labextension", "list", env=env))
    assert f"{venv}/share/jupyter/labextensions" in lab, lab
    assert re.search(rf"jupyter-gpushare v{re.escape(version)} enabled OK", lab), lab
    server = said(run_in(venv, "jupyter", "server", "extension", "list", env=env))
    assert "jupyter_gpushare.serverextension enabled" in server, server
    assert f"jupyter_gpushare.serverextension {version} OK" in server, server


@pytest.mark.slow
@pytest.mark.benchmark  # about 2.5 to 4.5 min here: pip installs every dependency
def test_a_fresh_environment_has_versions_licence_and_the_dashboard(
    fresh: tuple[Path, dict[str, str]], wheel: zipfile.ZipFile
) -> None:
    venv, env = fresh
    version = metadata(wheel)["Version"]
    probe = run_in(venv, "python", "-c", (
        "import importlib.metadata as m, jupyter_gpushare, jupyter_gpushare.serverextension as s\n"
        "d = m.distribution('jupyter-gpushare')\n"
        "print(jupyter_gpushare.__file__)\n"
        "print(jupyter_gpushare.__version__, s.__version__)\n"
        "print(next(str(f) for f in d.files if str(f).endswith('licenses/LICENSE')))\n"
        "print(d.read_text('licenses/LICENSE').splitlines()[0])"), env=env)
    where, versions, licence, first = probe.stdout.splitlines()
    assert where.startswith(str(venv)), where  # the installed wheel, not this checkout
    assert versions == f"{version} {version}"
    assert licence.endswith(".dist-info/licenses/LICENSE") and first == "BSD 3-Clause License"
    shown = run_in(venv, "jupyter-gpushare", "dashboard", env=env)
    assert json.loads(shown.stdout) == json.loads(
        (ROOT / "jupyter_gpushare/grafana/gpushare-dashboard.json").read_text())

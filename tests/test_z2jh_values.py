"""The shipped z2jh values: valid for the chart (its own values.schema.json, vendored with its
licence), their hub.extraConfig runs and checks the profileList at hub start, and the RBAC for
GPU discovery passes kubernetes-validate strictly and covers every call discovery makes."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config import kube_config
from traitlets.config import Config
from z2jhkit import K8S_VERSIONS, ROOT, policy_doc, validate_all, values, write_policy

from jupyter_gpushare.discovery import fetch_kubernetes_nodes, nodes_from_kubernetes
from jupyter_gpushare.spawner.kube import KubeProfileError

CHART = ROOT / "tests" / "data" / "z2jh"
RBAC = ROOT / "hub_config" / "z2jh-discovery-rbac.yaml"


def helm_merge(defaults: dict, user: dict) -> dict:
    """Helm's coalescing of ``-f`` values over the chart's: maps merge, a null deletes,
    anything else replaces."""
    out = dict(defaults)
    for key, value in user.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = value
    return out


def chart_errors(user: dict) -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    merged = helm_merge(yaml.safe_load((CHART / "values.yaml").read_text()), user)
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(merged)]


def test_the_values_pass_the_charts_schema():
    assert chart_errors(values()) == []


def test_the_charts_schema_catches_a_mistake():
    bad = values()
    bad["singleuser"]["profileLists"] = bad["singleuser"].pop("profileList")
    assert any("profileLists" in e for e in chart_errors(bad))
    bad = values()
    bad["singleuser"]["profileList"] = {"debug-eighth": {}}  # a list in the chart
    assert any(e.startswith("singleuser.profileList") for e in chart_errors(bad))


def test_the_vendored_schema_carries_its_licence():
    assert "BSD 3-Clause" in (CHART / "LICENSE").read_text()
    assert "48ea50e34daddde55d76e30df6ecd47e4abd4d8e" in (CHART / "README.md").read_text()


def rbac_objects() -> list[dict]:
    return [d for d in yaml.safe_load_all(RBAC.read_text()) if d]


def test_the_rbac_objects_pass_kubernetes_validate_strictly():
    objs = rbac_objects()
    assert [o["kind"] for o in objs] == ["ClusterRole", "ClusterRoleBinding"]
    for obj in objs:
        validate_all(obj)
    broken = dict(objs[0], rules=[dict(objs[0]["rules"][0], verb=["list"])])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def test_the_binding_names_the_hubs_service_account_and_the_role():
    role, binding = rbac_objects()
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    # z2jh names the hub's service account "hub" (hub.serviceAccount.name unset); the
    # namespace is the release's, as in the values' KubeJobsBackend.namespace
    assert values()["hub"].get("serviceAccount", {}).get("name") in (None, "hub")
    jobs_ns = [
        line
        for line in values()["hub"]["extraFiles"]["gpushare-broker-config"][
            "stringData"
        ].splitlines()
        if "KubeJobsBackend.namespace" in line
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": "jhub"}]
    assert '"jhub"' in jobs_ns[0]


NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-a",
        "labels": {
            "nvidia.com/gpu.present": "true",
            "gpushare.jupyter.org/pool": "train",
            "nvidia.com/gpu.product": "H200",
            "nvidia.com/gpu.memory": "144384",
            "nvidia.com/gpu.count": "8",
        },
    },
    "status": {
        "allocatable": {"cpu": "112", "memory": "2Ti", "nvidia.com/gpu": "8"},
        "capacity": {"cpu": "112", "memory": "2Ti", "nvidia.com/gpu": "8"},
    },
}


class _APIServer(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict]] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        self.seen.append(("GET", url.path, parse_qs(url.query)))
        if url.path != "/api/v1/nodes":
            self.send_error(403, "forbidden by this test: not in the ClusterRole")
            return
        body = json.dumps(
            {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [NODE]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _rbac_request(method: str, path: str, query: dict) -> tuple[str, str, str]:
    """(API group, resource, verb) of a core-API request, as the API server authorizes it."""
    parts = path.strip("/").split("/")
    assert parts[:2] == ["api", "v1"], path
    resource, name = parts[2], (parts[3] if len(parts) > 3 else None)
    if method == "GET":
        verb = "watch" if query.get("watch") == ["true"] else ("get" if name else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return "", resource, verb


def test_the_cluster_role_allows_every_call_discovery_makes(tmp_path, monkeypatch):
    _APIServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _APIServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "t",
        "clusters": [
            {"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
        ],
        "users": [{"name": "t", "user": {"token": "hub-sa-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    # read when kubernetes_asyncio is imported: KUBECONFIG set now would be too late
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.setattr(Configuration, "_default", Configuration.get_default_copy())
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    options = yaml.safe_load(values()["hub"]["extraFiles"]["gpushare-policy"]["stringData"])[
        "inventory"
    ]["discovery"]
    try:
        nodes = nodes_from_kubernetes(fetch_kubernetes_nodes(options), options)
    finally:
        server.shutdown()
    assert [n.name for n in nodes] == ["gpu-a"]
    assert _APIServer.seen, "discovery made no call"
    role = rbac_objects()[0]
    for method, url, query in _APIServer.seen:
        group, resource, verb = _rbac_request(method, url, query)
        assert any(
            group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
            for r in role["rules"]
        ), f"{verb} {resource}: not in the ClusterRole"
    assert _APIServer.seen[0][2].get("labelSelector") == [options["label_selector"]]


def _run_extra_config(tmp_path: Path, monkeypatch, profile_list: list) -> Config:
    """The values' hub.extraConfig as the chart's jupyterhub_config.py runs it: after it set
    c.KubeSpawner.profile_list from singleuser.profileList."""
    monkeypatch.setenv("GPUSHARE_POLICY", write_policy(tmp_path, policy_doc()))
    monkeypatch.setenv("GPUSHARE_DATA_DIR", str(tmp_path / "data"))
    c = Config()
    c.KubeSpawner.profile_list = profile_list
    code = values()["hub"]["extraConfig"]["gpushare"]
    exec(compile(code, "hub.extraConfig.gpushare", "exec"), {"c": c})  # noqa: S102
    return c


def test_the_extra_config_checks_the_profile_list_at_hub_start(tmp_path, monkeypatch):
    c = _run_extra_config(tmp_path, monkeypatch, values()["singleuser"]["profileList"])
    assert c.KubeGPUShareSpawner.gpu_backend == "hami"
    bad = values()["singleuser"]["profileList"]
    bad[0]["kubespawner_override"]["extra_resource_limits"] = {"nvidia.com/gpucores": 100}
    with pytest.raises(KubeProfileError) as e:
        _run_extra_config(tmp_path, monkeypatch, bad)
    assert "profile_list entry 'debug-eighth'" in str(e.value)
    assert "extra_resource_limits.nvidia.com/gpucores" in str(e.value)

"""The little of the Kubernetes API the batch backend uses, behind one small interface.

:class:`KubeClient` is what :class:`~jupyter_gpushare.backends.kube.KubeJobsBackend` calls
(synchronously, from the broker's worker threads): create, get and delete Jobs and
ConfigMaps, list and delete pods, read a pod's log and its events, list Kueue Workloads.
Objects go in and come out as plain dicts in the API's own JSON form (camelCase).

:class:`AsyncKubeClient` is the real one, on ``kubernetes_asyncio`` (installed with
KubeSpawner): it runs its own event loop in a thread of its own, and each call is a
coroutine handed to that loop, so the broker's event loop never waits on the API server.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API: {status} {message}")
        self.status = status


class NotFound(KubeError):
    pass


class AlreadyExists(KubeError):
    pass


class KubeClient(abc.ABC):
    """The calls the batch backend makes (all synchronous; dicts in the API's JSON form)."""

    @abc.abstractmethod
    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Raises :class:`AlreadyExists` when a Job of that name exists."""

    @abc.abstractmethod
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    @abc.abstractmethod
    def delete_job(self, namespace: str, name: str, *, propagation: str = "Foreground",
                   grace_s: int | None = None) -> None:
        """Delete a Job and (``propagation``) its pods; no error when it is gone."""

    @abc.abstractmethod
    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Raises :class:`AlreadyExists` when a ConfigMap of that name exists."""

    @abc.abstractmethod
    def delete_configmap(self, namespace: str, name: str) -> None: ...

    @abc.abstractmethod
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    @abc.abstractmethod
    def delete_pod(self, namespace: str, name: str, grace_s: int) -> None:
        """Delete a pod: SIGTERM, then SIGKILL after ``grace_s``; no error when it is gone."""

    @abc.abstractmethod
    def read_pod_log(self, namespace: str, name: str, container: str) -> str:
        """The container's log; raises :class:`NotFound` when the pod is gone."""

    @abc.abstractmethod
    def list_workloads(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Kueue Workloads (``kueue.x-k8s.io``); empty where Kueue is not installed."""

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        """Core ``v1`` Events (e.g. ``involvedObject.name=<pod>``): why a pod waits in
        ``ContainerCreating`` is only said there (a client without them says nothing)."""
        return []

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


class AsyncKubeClient(KubeClient):
    """:class:`KubeClient` on ``kubernetes_asyncio``, with an event loop in its own thread.

    ``configuration``: a ``kubernetes_asyncio.client.Configuration``; by default the
    in-cluster service account (the hub pod), else ``$KUBECONFIG`` / ``~/.kube/config``.
    """

    def __init__(self, configuration: Any = None, timeout_s: float = 30.0) -> None:
        self._configuration = configuration
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._api: Any = None
        self._lock = threading.Lock()

    # -- the loop ---------------------------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="gpushare-kube",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._start()
        return asyncio.run_coroutine_threadsafe(coro, loop).result(self.timeout_s + 5)

    async def _client(self) -> Any:
        if self._api is None:
            from kubernetes_asyncio import client, config

            conf = self._configuration
            if conf is None:
                conf = client.Configuration()
                try:
                    config.load_incluster_config(client_configuration=conf)
                except config.ConfigException:
                    await config.load_kube_config(client_configuration=conf)
            self._api = client.ApiClient(configuration=conf)
        return self._api

    async def _call(self, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
        from kubernetes_asyncio import client

        api_client = await self._client()
        target = getattr(getattr(client, api)(api_client), method)
        try:
            result = await target(*args, _request_timeout=self.timeout_s, **kwargs)
        except client.ApiException as exc:
            status = int(exc.status or 0)
            body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
            text = f"{exc.reason}: {body}"[:2000] if body else str(exc.reason)
            if status == 404:
                raise NotFound(status, text) from exc
            if status == 409:
                raise AlreadyExists(status, text) from exc
            raise KubeError(status, text) from exc
        except (OSError, asyncio.TimeoutError) as exc:
            raise KubeError(0, f"{type(exc).__name__}: {exc}") from exc
        if isinstance(result, str | dict | list) or result is None:
            return result
        return api_client.sanitize_for_serialization(result)

    # -- the calls --------------------------------------------------------------------------

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._run(self._call("BatchV1Api", "create_namespaced_job", namespace, body))

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._run(self._call("BatchV1Api", "read_namespaced_job", name, namespace))
        except NotFound:
            return None

    def delete_job(self, namespace: str, name: str, *, propagation: str = "Foreground",
                   grace_s: int | None = None) -> None:
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if grace_s is not None:
            body["gracePeriodSeconds"] = int(grace_s)
        with contextlib.suppress(NotFound):
            self._run(self._call("BatchV1Api", "delete_namespaced_job", name, namespace,
                                 body=body))

    def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = self._run(self._call("BatchV1Api", "list_namespaced_job", namespace,
                                   label_selector=selector))
        return list(out.get("items") or [])

    def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._run(self._call("CoreV1Api", "create_namespaced_config_map", namespace,
                                    body))

    def delete_configmap(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            self._run(self._call("CoreV1Api", "delete_namespaced_config_map", name, namespace))

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = self._run(self._call("CoreV1Api", "list_namespaced_pod", namespace,
                                   label_selector=selector))
        return list(out.get("items") or [])

    def delete_pod(self, namespace: str, name: str, grace_s: int) -> None:
        with contextlib.suppress(NotFound):
            self._run(self._call("CoreV1Api", "delete_namespaced_pod", name, namespace,
                                 body={"gracePeriodSeconds": int(grace_s)}))

    def read_pod_log(self, namespace: str, name: str, container: str) -> str:
        return str(self._run(self._call("CoreV1Api", "read_namespaced_pod_log", name,
                                        namespace, container=container)) or "")

    def list_workloads(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        try:
            out = self._run(self._call(
                "CustomObjectsApi", "list_namespaced_custom_object", KUEUE_GROUP,
                KUEUE_VERSION, namespace, "workloads", label_selector=selector))
        except NotFound:  # Kueue (or this API version) is not installed
            return []
        return list(out.get("items") or [])

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        out = self._run(self._call("CoreV1Api", "list_namespaced_event", namespace,
                                   field_selector=field_selector))
        return list(out.get("items") or [])

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None:
            return
        if self._api is not None:
            api, self._api = self._api, None
            with contextlib.suppress(Exception):  # closing: nothing more to do
                asyncio.run_coroutine_threadsafe(api.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(10)
        loop.close()
        self._loop = self._thread = None

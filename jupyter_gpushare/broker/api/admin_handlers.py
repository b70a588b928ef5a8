"""Admin-only REST handlers of the broker (drain and resume a node, reconcile now, the whole
queue, the policy in force and its reload) and ``/metrics`` for Prometheus."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..ops.reconcile import reconcile
from ..service.broker import BrokerError
from ..service.fields import BadField
from .handler_base import BaseHandler


class AdminNodeHandler(BaseHandler):
    def post(self, node: str, action: str) -> None:
        self.require(self.identity.admin, "admin only")
        self.send(self.ctx.broker.set_cordon(node, action == "drain"))


class AdminReconcileHandler(BaseHandler):
    async def post(self) -> None:
        self.require(self.identity.admin, "admin only")
        result = await reconcile(self.ctx.broker, self.ctx.checker, self.ctx.reconcile_min_age_s)
        self.send(result)


class AdminQueueHandler(BaseHandler):
    def get(self) -> None:
        self.require(self.identity.admin, "admin only")
        broker = self.ctx.broker
        limit = self._int_arg("limit", 500, 10_000)
        offset = self._int_arg("offset", 0, 10**9)
        self.send(
            {
                "queue": broker.queue_view(limit=limit, offset=offset),
                "total": len(broker.queue) + len(broker.pending),
                "queued": len(broker.queue),
                "preempting": len(broker.pending),
                "limit": limit,
                "offset": offset,
            }
        )

    def _int_arg(self, name: str, default: int, maximum: int) -> int:
        raw = self.arg(name)
        if raw is None:
            return default
        if not raw.isdigit() or len(raw) > 10 or int(raw) > maximum:
            raise BadField(name, f"{name} must be a whole number from 0 to {maximum}")
        return int(raw)


class AdminPolicyHandler(BaseHandler):
    """``GET /admin/policy``: the version in force, when it was loaded, the last error."""

    def get(self) -> None:
        self.require(self.identity.admin, "admin only")
        reloader = self.ctx.reloader
        if reloader is None:
            self.send({"path": None, "version": self.ctx.broker.policy_version,
                       "last_result": "loaded", "last_error": None})
            return
        self.send(reloader.status())


class AdminPolicyReloadHandler(BaseHandler):
    """``POST /admin/policy/reload``: read the policy file again (the last good policy stays
    in force if it has errors: ``last_result`` says ``error`` and ``last_error`` why)."""

    async def post(self) -> None:
        self.require(self.identity.admin, "admin only")
        if self.ctx.reloader is None:
            raise BrokerError(409, "the broker's policy was not read from a file")
        status = await self.ctx.reloader.reload("POST /admin/policy/reload")
        self.send(status, 200 if status["last_result"] != "error" else 422)


class MetricsHandler(BaseHandler):
    def get(self) -> None:
        self.require(
            self.identity.metrics, "needs custom:gpushare:metrics or custom:gpushare:admin"
        )
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.ctx.metrics.registry))

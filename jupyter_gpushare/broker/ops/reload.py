"""Reloading the policy in a running broker: on SIGHUP, ``POST /admin/policy/reload`` and
when the file changes, keeping the last good policy when the new text has errors.

One policy version is then in force everywhere: the version is a hash of the file's text
(``GET /admin/policy``, ``policy_version`` in the broker's answers, which the spawner
shows), and the hub reads the same file.

* The file is read and parsed in a worker thread (a discovered inventory may call NVML);
  only the swap of the policy runs on the event loop (:meth:`~.service.Broker.replace_policy`).
* A text with errors changes nothing: the broker keeps deciding with the last good policy
  and says so in its log, in ``GET /admin/policy`` (``last_error``) and in the metrics
  ``gpushare_policy_reloads_total{result="error"}`` and ``gpushare_policy_reload_failing``.
* What happens to live grants the new policy no longer allows is described in
  ``docs/policy-reload.md`` (in short: they keep running as borrowed, preemptible capacity,
  with a notice to their holder; grants on hardware that left the inventory are released).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from traitlets import Float
from traitlets.config import LoggingConfigurable

from ..store.serial import iso

if TYPE_CHECKING:
    from ...core.model import Policy
    from ..service.broker import Broker

log = logging.getLogger("gpushare.broker.policy")

MAX_ERROR = 4000  # characters of a parse error kept and shown


def text_version(text: str) -> str:
    """The policy version: the first 12 hex digits of the SHA-256 of the file's text (as
    the admin page shows it)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _read_and_parse(path: str) -> tuple[str, Policy]:
    from ...discovery import discover
    from ...policy import parse_policy
    from ...policy.loader import read_policy_text

    text = read_policy_text(path)
    return text, parse_policy(text, path, discover)


class PolicyReloader(LoggingConfigurable):
    """Reloads the broker's policy from its file; see the module's docstring."""

    check_interval_s = Float(
        5.0,
        config=True,
        help="Seconds between looks at the policy file's modification time and size; a "
        "change reloads the policy (0: only SIGHUP and POST /admin/policy/reload).",
    )

    def __init__(
        self, broker: Broker, path: str, registry: CollectorRegistry | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.broker = broker
        self.path = path
        self.version = ""
        self.loaded_at: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_result = "loaded"
        self.last_changes: list[dict[str, Any]] = []
        self._stat: tuple[int, int] | None = None
        self._lock = asyncio.Lock()
        self.reloads = Counter(
            "gpushare_policy_reloads",
            "Policy reloads by result (ok, unchanged, error).",
            ["result"],
            registry=registry,
        )
        self.failing = Gauge(
            "gpushare_policy_reload_failing",
            "1 while the policy file has errors and the last good policy stays in force.",
            registry=registry,
        )
        self.loaded_ts = Gauge(
            "gpushare_policy_loaded_timestamp_seconds",
            "When the policy in force was loaded (seconds since the epoch).",
            registry=registry,
        )

    def started(self) -> None:
        """Record the version of the policy the broker started with (read at start)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
            self._stat = self._file_stat()
        except OSError:
            text = ""
        self.version = text_version(text)
        self.loaded_at = time.time()
        self.loaded_ts.set(self.loaded_at)
        self.broker.policy_version = self.version

    def _file_stat(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def status(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "version": self.version,
            "loaded_at": iso(self.loaded_at),
            "last_result": self.last_result,
            "last_error": self.last_error,
            "last_error_at": iso(self.last_error_at),
            "changes": self.last_changes,
            "check_interval_s": self.check_interval_s,
        }

    async def reload(self, trigger: str) -> dict[str, Any]:
        """Read, parse and (if good and new) put the file's policy in force."""
        async with self._lock:
            self._stat = self._file_stat()
            loop = asyncio.get_running_loop()
            try:
                text, policy = await loop.run_in_executor(None, _read_and_parse, self.path)
            except Exception as exc:  # PolicyError, or a failed discovery
                message = str(exc)
                if len(message) > MAX_ERROR:
                    message = message[:MAX_ERROR] + "…"
                self.last_error, self.last_error_at = message, time.time()
                self.last_result = "error"
                self.reloads.labels("error").inc()
                self.failing.set(1)
                log.error(
                    "policy reload (%s) failed; the policy %s stays in force:\n%s",
                    trigger,
                    self.version,
                    message,
                )
                return self.status()
            version = text_version(text)
            self.last_error = self.last_error_at = None
            self.failing.set(0)
            if version == self.version:
                self.last_result = "unchanged"
                self.reloads.labels("unchanged").inc()
                return self.status()
            changes = self.broker.replace_policy(policy, version)
            self.version, self.loaded_at = version, time.time()
            self.loaded_ts.set(self.loaded_at)
            self.last_result, self.last_changes = "ok", changes
            self.reloads.labels("ok").inc()
            log.warning(
                "policy reloaded (%s): version %s, %d grant(s) changed",
                trigger,
                version,
                len(changes),
            )
            return self.status()

    async def watch(self) -> None:
        """Reload when the file's modification time or size changes."""
        if self.check_interval_s <= 0:
            return
        while True:
            await asyncio.sleep(self.check_interval_s)
            stat = self._file_stat()
            if stat is not None and stat != self._stat:
                try:
                    await self.reload("file changed")
                except Exception:
                    log.exception("policy reload failed")

"""The profile a user starts, in the hub: the policy file, the spawn form, the options.

:class:`ProfileChoiceMixin` is the part of :class:`~.mixin.GPUShareSpawner` that knows the
profiles: which ones the user's groups may pick (from ``policy_file``, else the broker's
list), the spawn form with each profile's availability, queue and team GPU-hours left
(asked of the broker for at most ``form_broker_timeout`` seconds), the options checked
against the policy (:meth:`~ProfileChoiceMixin.resolve_profile`: a bad one is a
SpawnException that names it), and the CPU and memory of the profile chosen
(:meth:`~ProfileChoiceMixin.apply_profile`). The rules themselves are in :mod:`.form`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from jupyterhub.spawner import Spawner
from traitlets import Float, Unicode, default
from traitlets.config import LoggingConfigurable

from jupyter_gpushare.broker.client import BrokerError
from jupyter_gpushare.core.model import Policy, Profile
from jupyter_gpushare.spawner import form as formlib
from jupyter_gpushare.spawner.errors import spawn_error

if TYPE_CHECKING:
    from jupyter_gpushare.broker.client import BrokerClient

    _SpawnerPart: TypeAlias = Spawner  # what it is mixed into: mypy checks its attributes
else:
    # not a Spawner subclass at run time: JupyterHub refuses one without its own start,
    # stop and poll; a configurable, so its traits and defaults join GPUShareSpawner's
    _SpawnerPart = LoggingConfigurable

@dataclass
class _PolicyRead:
    """What the hub last read from one policy file."""

    stamp: tuple[int, int] | None  # (mtime_ns, size) of the file when read
    policy: Policy | None  # the last good policy (None: never a good one)
    loaded_at: float = 0.0
    failing: bool = False  # the file had errors when last read


_POLICY_CACHE: dict[str, _PolicyRead] = {}
_SHOWN_ERRORS = 20  # lines of a bad file's errors in the hub's log

log = logging.getLogger("jupyter_gpushare.spawner")

_LAST_CHOICE: dict[str, str] = {}
"""user name -> the profile last picked in the form. JupyterHub renders the form again
after a refusal with the user's *default* spawner (named servers included), so the pick
lives here, not on one spawner. One short string per hub user: bounded by the users."""


def _stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _problems(exc: Exception) -> list[str]:
    """The errors of a policy that failed to load, one ``FILE:LINE`` line each."""
    from jupyter_gpushare.policy import PolicyError
    from jupyter_gpushare.policy.issues import one_line
    from jupyter_gpushare.policy.yamlread import shorten

    if isinstance(exc, PolicyError):
        lines = [str(issue) for issue in exc.errors]
    else:  # the loader's own failure: still one line, no traceback
        lines = [one_line(f"{type(exc).__name__}: {shorten(str(exc), 200)}")]
    if len(lines) > _SHOWN_ERRORS:
        lines = [*lines[:_SHOWN_ERRORS], f"... and {len(lines) - _SHOWN_ERRORS} more"]
    return lines


def load_policy_cached(path: str, logger: logging.Logger | logging.LoggerAdapter[Any] = log
                       ) -> Policy | None:
    """The policy of ``path``, read again only when the file changed (time or size).

    Like the broker, the hub keeps the last good policy when the file turns bad (errors,
    unreadable, gone): it logs one warning with every ``FILE:LINE`` error when it notices
    the change, not on each page view, and goes on with the last good policy. ``None``
    when the file has never been good here (the form then shows the broker's profiles).
    """
    from jupyter_gpushare.discovery import discover
    from jupyter_gpushare.policy import load_policy

    stamp = _stamp(path)
    hit = _POLICY_CACHE.get(path)
    if hit is not None and hit.stamp == stamp:
        return hit.policy
    try:
        policy = load_policy(path, discover)
    except Exception as exc:  # PolicyError, or the loader's own failure
        kept = hit.policy if hit is not None else None
        _POLICY_CACHE[path] = _PolicyRead(stamp, kept, hit.loaded_at if hit else 0.0, True)
        what = ("the last good policy stays in force" if kept is not None else
                "no good policy was read yet: the form lists the broker's profiles")
        logger.warning("gpushare: the policy file %s has errors; %s:\n  %s", path, what,
                       "\n  ".join(_problems(exc)))
        return kept
    if hit is not None and hit.failing:
        logger.warning("gpushare: the policy file %s is good again and in force", path)
    _POLICY_CACHE[path] = _PolicyRead(stamp, policy, time.time())
    return policy


async def _render_form(spawner: ProfileChoiceMixin) -> str:
    return await spawner.render_gpushare_form()


def _apply_options_hook(spawner: ProfileChoiceMixin, user_options: dict[str, Any]) -> Any:
    return spawner.resolve_profile(user_options)


class ProfileChoiceMixin(_SpawnerPart):
    """The profiles a user may pick, the spawn form, and the options checked against them."""

    policy_file = Unicode(
        os.environ.get("GPUSHARE_POLICY", ""),
        config=True,
        help="""The gpushare policy file. Read in the hub to build the spawn form and to
        check user options; the broker alone decides grants. Empty: ask the broker.""",
    )
    form_broker_timeout = Float(
        3.0, config=True, help="Seconds the spawn form waits for the broker's availability."
    )

    @default("options_form")
    def _default_options_form(self) -> Any:
        return _render_form

    @default("apply_user_options")
    def _default_apply_user_options(self) -> Any:
        return _apply_options_hook

    if TYPE_CHECKING:
        gpushare_profile: str | None  # the running server's profile (spawner state)

        @property
        def broker(self) -> BrokerClient: ...

    def user_groups(self) -> list[str]:
        return sorted(g.name for g in getattr(self.user, "groups", []) or [])

    def gpushare_policy(self) -> Policy | None:
        """The policy of ``policy_file``: the last good one when the file has turned bad
        (see :func:`load_policy_cached`); ``None`` without a file or a good read."""
        if not self.policy_file:
            return None
        return load_policy_cached(self.policy_file, self.log)

    async def allowed_choices(self) -> list[formlib.ProfileChoice]:
        """Profiles the user may pick, with availability when the broker answers in time."""
        policy = self.gpushare_policy()
        choices = formlib.choices_for(policy, self.user_groups()) if policy else []
        try:
            info = await asyncio.wait_for(
                self.broker.profiles(self.user.name), self.form_broker_timeout
            )
        except (BrokerError, asyncio.TimeoutError) as exc:
            self.log.warning("gpushare: no availability from the broker for the form: %s", exc)
            return choices
        if not choices:  # no policy file here: the broker's list is the list
            choices = [
                formlib.ProfileChoice(
                    slug=str(p["slug"]),
                    display_name=str(p.get("display_name") or p["slug"]),
                    description=str(p.get("description") or ""),
                    pool=str(p.get("pool") or ""),
                    share=str((p.get("gpu") or {}).get("describe") or ""),
                    units=float((p.get("gpu") or {}).get("count") or 0)
                    or float((p.get("gpu") or {}).get("fraction") or 0),
                    max_lifetime_s=int(p["max_lifetime_s"])
                    if isinstance(p.get("max_lifetime_s"), (int, float))
                    else None,
                )
                for p in info
                if p.get("slug")
            ]
        queued: dict[tuple[str, str], int] = {}
        hours_left: dict[tuple[str, str], float] = {}
        for team in {c.team for c in choices if c.team}:
            try:
                usage = await asyncio.wait_for(
                    self.broker.team_usage(team), self.form_broker_timeout
                )
            except (BrokerError, asyncio.TimeoutError):
                continue
            for pool, row in (usage.get("pools") or {}).items():
                if not isinstance(row, dict):
                    continue
                if row.get("queued"):
                    queued[(team, pool)] = int(row["queued"])
                budget, used = row.get("gpu_hours_budget"), row.get("gpu_hours_month")
                if isinstance(budget, (int, float)) and isinstance(used, (int, float)):
                    hours_left[(team, pool)] = round(max(0.0, budget - used), 1)
        return formlib.with_availability(choices, info, queued, hours_left)

    async def render_gpushare_form(self) -> str:
        choices = await self.allowed_choices()
        selected = (
            _LAST_CHOICE.get(self.user.name)
            or (self.user_options or {}).get("profile")
            or self.gpushare_profile
        )
        return formlib.render_form(choices, selected, simulated=self.inventory_simulated())

    def inventory_simulated(self) -> bool:
        """Whether the policy's GPUs are simulated (the form says so)."""
        policy = self.gpushare_policy()
        if policy is None:
            return False
        return policy.inventory_source == "simulated" or any(
            g.simulated for n in policy.nodes for g in n.gpus
        )

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        options = formlib.options_from_form(formdata)
        slug = options.get("profile")
        if isinstance(slug, str) and slug and len(slug) <= 200:
            _LAST_CHOICE[self.user.name] = slug  # the form shows it again after a refusal
        return options

    def resolve_profile(self, user_options: dict[str, Any] | None = None) -> str:
        """The profile slug to start, checked against the policy; SpawnException if not."""
        options = self.user_options if user_options is None else user_options
        policy = self.gpushare_policy()
        if policy is None:
            # nothing to check against here: only the option names; the broker decides
            try:
                extra = sorted(str(k) for k in set(options or {}) - formlib.ALLOWED_KEYS)
                if extra:
                    raise formlib.OptionsError(
                        f"option(s) not offered: {formlib.clip(', '.join(extra))}")
                slug = (options or {}).get("profile")
                if not isinstance(slug, str) or not slug:
                    raise formlib.OptionsError("choose a profile (option 'profile')")
            except formlib.OptionsError as exc:
                raise spawn_error(
                    exc.message, reason="invalid-options", status_code=exc.status
                ) from None
            return slug
        allowed = [c.slug for c in formlib.choices_for(policy, self.user_groups())]
        try:
            slug = formlib.validate_options(options, allowed, [p.slug for p in policy.profiles])
        except formlib.OptionsError as exc:
            raise spawn_error(
                exc.message, reason="invalid-options", status_code=exc.status
            ) from None
        return slug

    def apply_profile(self, profile: Profile) -> None:
        """CPU and memory of the profile (guarantees where the spawner knows them)."""
        if profile.cpu_milli:
            self.cpu_limit = profile.cpu_milli / 1000
            self.cpu_guarantee = profile.cpu_milli / 1000
        if profile.memory_mib:
            self.mem_limit = profile.memory_mib * 1024 * 1024
            self.mem_guarantee = profile.memory_mib * 1024 * 1024

"""KubeGPUShareSpawner: KubeSpawner with GPU shares granted by the gpushare broker.

One traitlet, :attr:`KubeGPUShareSpawner.gpu_backend`, chooses how a grant is enforced on
the cluster: ``whole`` (``nvidia.com/gpu``), ``mig`` (``nvidia.com/mig-<profile>``, mixed
strategy), ``hami`` (``nvidia.com/gpu`` / ``gpumem`` / ``gpucores`` with the HAMi scheduler,
pinned to the granted GPUs), ``hami-metax`` (MetaX sGPUs through HAMi:
``metax-tech.com/sgpu`` / ``vcore`` / ``vmemory``), ``kai`` (KAI scheduler queue and
``gpu-fraction`` / ``gpu-memory`` annotations, non-preemptible ``build`` priority) or ``timeslice``
(``nvidia.com/gpu.shared``, no memory isolation). The pod fragment comes from the pure
:func:`jupyter_gpushare.spawner.enforcement.pod_fragment`; this class only maps it onto
KubeSpawner's traits, so KubeSpawner builds the pod as usual.

KubeSpawner's ``profile_list`` (a z2jh ``singleuser.profileList``) and a policy profile's
``kubespawner_override`` set everything that is not GPU (:mod:`.kube_profiles`); an override
that would touch what the grant sets is refused, at hub start
(:func:`check_kube_profiles`) and at each spawn, naming the profile and the key.
"""

from __future__ import annotations

import copy
from typing import Any

from kubespawner import KubeSpawner
from traitlets import Bool, CaselessStrEnum, Unicode
from traitlets.config import Config, Configurable

from jupyter_gpushare.broker.client import GrantInfo
from jupyter_gpushare.core.model import Profile
from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner import form as formlib
from jupyter_gpushare.spawner.errors import spawn_error
from jupyter_gpushare.spawner.kube_guard import gpu_conflicts
from jupyter_gpushare.spawner.kube_options_form import render_options, site_options_from_form
from jupyter_gpushare.spawner.kube_profiles import Entry, KubeProfileError, SiteProfilesMixin
from jupyter_gpushare.spawner.mixin import GPUShareSpawner

__all__ = ["KubeGPUShareSpawner", "KubeProfileError", "check_kube_profiles"]

_OVERRIDDEN = (
    "extra_resource_limits",
    "extra_labels",
    "extra_annotations",
    "node_selector",
    "environment",
    "scheduler_name",
    "priority_class_name",
)
_PROFILE_TRAITS = ("image", "cpu_limit", "cpu_guarantee", "mem_limit", "mem_guarantee")


class KubeGPUShareSpawner(GPUShareSpawner, SiteProfilesMixin, KubeSpawner):
    """KubeSpawner whose pods get exactly the GPU share the broker granted."""

    gpu_backend = CaselessStrEnum(
        list(enforcement.KUBE_BACKENDS),
        "whole",
        config=True,
        help="""How GPU shares are enforced on the cluster: whole | mig | hami | hami-metax |
        kai | timeslice. 'hami-metax' shares MetaX cards through HAMi (metax-tech.com/sgpu,
        vcore, vmemory). 'timeslice' and 'kai' do not isolate GPU memory (only framework
        caps apply).""",
    )
    pin_to_grant = Bool(
        True,
        config=True,
        help="Put the pod on the grant's node (and, with HAMi, on its GPUs).",
    )
    kai_queue_template = Unicode(
        "{team}",
        config=True,
        help="KAI scheduler queue (label kai.scheduler/queue); {team} and {pool} expand.",
    )
    kai_priority_class = Unicode(
        "build",
        config=True,
        help="KAI priority class for notebooks; must be non-preemptible (KAI's 'build').",
    )
    mig_profile = Unicode(
        "",
        config=True,
        help="MIG profile (e.g. 1g.10gb) when the GPU models of a MIG pool do not name it.",
    )

    def _check_backend(self) -> None:
        if self.gpu_backend == "timeslice":
            self.log.warning("gpushare: %s", enforcement.TIMESLICE_WARNING)

    def apply_profile(self, profile: Profile) -> None:
        """The policy's CPU, memory and image, then the site's ``profile_list`` entry (and its
        option choices) of the same slug, then the policy profile's own overrides; each
        spawn starts again from the configured values."""
        self._restore_configured()
        super().apply_profile(profile)
        if profile.image:
            self.image = profile.image
        entries = self.__dict__.get("_gpushare_site_list") or []
        entry = self.site_entry(profile.slug, entries)
        if entry is not None:
            self._load_profile(profile.slug, entries)  # KubeSpawner's: entry, then options
        if profile.kubespawner_override:
            self._apply_overrides(copy.deepcopy(dict(profile.kubespawner_override)))

    def _restore_configured(self) -> None:
        """Put back the configured values of every trait a previous spawn changed."""
        saved: dict[str, Any] = self.__dict__.setdefault("_gpushare_configured", {})
        for name in (*_OVERRIDDEN, *_PROFILE_TRAITS):
            saved.setdefault(name, copy.deepcopy(getattr(self, name)))
        for name, value in saved.items():
            setattr(self, name, copy.deepcopy(value))
        self.__dict__.pop("_gpushare_base", None)  # the grant merges into this spawn's values

    def _apply_overrides(self, spawner_override: dict[str, Any]) -> None:
        """KubeSpawner's, after resolving callables and refusing what the grant sets."""
        saved: dict[str, Any] = self.__dict__.setdefault("_gpushare_configured", {})
        resolved = {k: (v(self) if callable(v) else v) for k, v in spawner_override.items()}
        enforced = self.gpushare_enforced()
        problems = [p for k, v in resolved.items() for p in gpu_conflicts(k, v, enforced)]
        if problems:
            raise spawn_error(
                f"The server's profile sets what its GPU grant sets ({'; '.join(problems)}); "
                "ask your hub admin to remove it from kubespawner_override",
                reason="gpushare-override-conflict",
                status_code=500,
            )
        for name in resolved:
            saved.setdefault(name, copy.deepcopy(getattr(self, name)))
        super()._apply_overrides(resolved)

    def apply_grant(self, grant: GrantInfo, profile: Profile | None) -> None:
        frag = enforcement.pod_fragment(
            grant,
            self.gpu_backend,
            broker_url=self.singleuser_broker_url(),
            pin=self.pin_to_grant,
            kai_queue=self.kai_queue_template.format(team=grant.team, pool=grant.pool),
            kai_priority_class=self.kai_priority_class,
            mig_profile=self.mig_profile or None,
            gpu_total_mib=self.gpu_memory_map(),
        )
        for warning in frag.warnings:
            self.log.warning("gpushare %s: %s", self._log_name, warning)
        # remember the configured values once, so a second spawn does not stack grants
        base = self.__dict__.setdefault(
            "_gpushare_base", {name: getattr(self, name) for name in _OVERRIDDEN}
        )
        for name, value in enforcement.kube_overrides(frag, base).items():
            setattr(self, name, value)

    def apply_no_gpu(self, profile: Profile) -> None:
        """No GPU resources, and the NVIDIA runtime exposes none to the pod."""
        base = self.__dict__.setdefault(
            "_gpushare_base", {name: getattr(self, name) for name in _OVERRIDDEN}
        )
        for name in _OVERRIDDEN:
            setattr(self, name, base[name])
        self.environment = {**(base["environment"] or {}), **enforcement.no_gpu_env(profile.slug)}

    async def load_user_options(self) -> None:
        """Done in :meth:`apply_profile` (before the grant), not in KubeSpawner's start."""
        return None

    # ------------------------------------------------------------ user options and form

    def resolve_profile(self, user_options: dict[str, Any] | None = None) -> str:
        """The policy checks the profile; the site entry of that slug checks its options."""
        options = dict(self.user_options if user_options is None else user_options or {})
        entries = self.__dict__.get("_gpushare_site_list") or self.static_profile_list()
        slug_option = options.get("profile")
        entry = (
            self.site_entry(slug_option, entries or []) if isinstance(slug_option, str) else None
        )
        offered = self.option_keys(entry)
        if entries is None:  # a callable profile_list, not evaluated yet: start checks them
            offered = set(options) - formlib.ALLOWED_KEYS
        site = {k: v for k, v in options.items() if k in offered}
        slug = super().resolve_profile({k: v for k, v in options.items() if k not in offered})
        if entry is not None and site:
            problem = self.option_problem(entry, site)
            if problem:
                raise spawn_error(
                    f"Profile {slug!r}: {problem}", reason="invalid-options", status_code=400
                )
        return slug

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, Any]:
        rest, site = site_options_from_form(formdata)
        options = super().options_from_form(rest)
        slug = options.get("profile")
        if isinstance(slug, str):
            options.update(site.get(slug, {}))
        return options

    async def render_gpushare_form(self) -> str:
        page = await super().render_gpushare_form()
        entries = await self.site_profile_list()
        policy = self.gpushare_policy()
        slugs = (
            {c.slug for c in formlib.choices_for(policy, self.user_groups())} if policy else set()
        )
        return page + render_options(
            [e for e in entries if e.get("slug") in slugs], self.user_options or {}
        )

    # ------------------------------------------------------------ start

    async def _load_site_profiles(self) -> list[Entry]:
        entries = await self.site_profile_list()
        try:
            self.check_site_profiles(entries, self.gpushare_policy())
        except KubeProfileError as exc:
            self.log.error("%s", exc)
            raise spawn_error(
                "This hub's profile configuration sets what a GPU grant sets; "
                "the hub's log names the profile and key. Ask your hub admin",
                reason="gpushare-override-conflict",
                status_code=500,
            ) from None
        self.__dict__["_gpushare_site_list"] = entries
        return entries

    async def start(self) -> Any:  # type: ignore[override]
        self._check_backend()
        await self._load_site_profiles()
        return await GPUShareSpawner.start(self)


def check_kube_profiles(config: Config) -> list[str]:
    """Check the hub's KubeGPUShareSpawner configuration when the hub starts.

    Call it at the end of ``jupyterhub_config.py`` (z2jh: ``hub.extraConfig``) with ``c``:
    raises :class:`KubeProfileError` naming each profile and key whose override is not a
    KubeSpawner trait or sets what the grant sets; logs (and returns) a warning per
    ``profile_list`` entry that no policy profile maps. A callable ``profile_list`` is
    checked at each spawn instead."""
    # the traits as this config sets them, without KubeSpawner's __init__ (which loads the
    # cluster's credentials and opens an API client: not needed to read the configuration)
    spawner = KubeGPUShareSpawner.__new__(KubeGPUShareSpawner)
    Configurable.__init__(spawner, config=config)
    entries = spawner.static_profile_list()
    return spawner.check_site_profiles(entries or [], spawner.gpushare_policy())

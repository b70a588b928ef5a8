"""KubeSpawner's ``profile_list`` under gpushare: the site's overrides, the grant's GPUs.

A site running zero-to-jupyterhub has a ``singleuser.profileList`` (KubeSpawner's
``profile_list``): images, volumes, environment, node selectors, tolerations, CPU and memory
per profile, with ``profile_options`` whose choices carry overrides of their own. Under
:class:`~.kube.KubeGPUShareSpawner` the policy still decides which profiles a user may start
and what GPU share they get; a ``profile_list`` entry whose slug is a policy profile's slug
adds its ``kubespawner_override`` (and its options') to that profile. An entry with no policy
profile is named in a warning when the hub starts and is not offered.

The overrides are applied by KubeSpawner's own code (``_get_initialized_profile_list``,
``_validate_user_options``, ``_load_profile``, ``_apply_overrides``), in this order when a
server starts: the policy profile's CPU, memory and image, the site entry and its option
choices, the policy profile's own ``kubespawner_override``, then the grant. Nothing in an
override may set what the grant's enforcement sets (:mod:`.kube_guard`): such an override
is refused when the hub starts (:func:`~.kube.check_kube_profiles`) and again at each
spawn, with a message naming the profile and the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

from jupyter_gpushare.core.model import Policy, Profile
from jupyter_gpushare.spawner.kube_guard import Enforced, override_problems

if TYPE_CHECKING:
    from kubespawner import KubeSpawner

    _KubePart: TypeAlias = KubeSpawner
else:
    _KubePart = object

__all__ = ["KubeProfileError", "SiteProfilesMixin", "profile_list_problems"]

Entry: TypeAlias = dict[str, Any]


class KubeProfileError(ValueError):
    """Overrides that are not KubeSpawner traits or would undo the grant; one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("gpushare: refusing kubespawner_override(s):\n  " + "\n  ".join(problems))
        self.problems = problems


def _option_overrides(slug: str, entry: Entry) -> Iterable[tuple[str, Mapping[str, Any]]]:
    """(owner, override) of each choice and unlisted choice of the entry's options."""
    for name, option in (entry.get("profile_options") or {}).items():
        for choice, spec in (option.get("choices") or {}).items():
            yield (
                f"profile_list entry {slug!r} option {name!r} choice {choice!r}",
                spec.get("kubespawner_override") or {},
            )
        unlisted = option.get("unlisted_choice") or {}
        yield (
            f"profile_list entry {slug!r} option {name!r} unlisted_choice",
            unlisted.get("kubespawner_override") or {},
        )


def _guarantee_warnings(owner: str, override: Mapping[str, Any], profile: Profile) -> list[str]:
    """Guarantees above the policy profile's: the broker placed the grant by the policy's
    CPU and memory, so a pod pinned to that node may not fit there."""
    from jupyterhub.traitlets import ByteSpecification
    from traitlets import TraitError

    out = []
    cpu = override.get("cpu_guarantee")
    if isinstance(cpu, (int, float)) and cpu * 1000 > profile.cpu_milli:
        out.append(
            f"{owner}: cpu_guarantee {cpu:g} is more than policy profile "
            f"{profile.slug!r}'s {profile.cpu_milli / 1000:g} CPU, by which the broker "
            "places the server: the pod may not fit the granted node"
        )
    mem = override.get("mem_guarantee")
    try:
        mem_mib = ByteSpecification().validate(None, mem) / 2**20 if mem is not None else 0
    except TraitError:  # KubeSpawner refuses it when the server starts, saying why
        mem_mib = 0
    if mem_mib > profile.memory_mib:
        out.append(
            f"{owner}: mem_guarantee {mem} ({mem_mib:.0f} MiB) is more than policy "
            f"profile {profile.slug!r}'s {profile.memory_mib} MiB, by which the broker "
            "places the server: the pod may not fit the granted node"
        )
    return out


def profile_list_problems(
    entries: list[Entry], policy: Policy | None, traits: set[str], enforced: Enforced
) -> tuple[list[str], list[str]]:
    """(errors, warnings) of an initialized ``profile_list`` and the policy's overrides."""
    errors: list[str] = []
    warnings: list[str] = []
    slugs = {p.slug for p in policy.profiles} if policy is not None else None
    for entry in entries:
        slug = str(entry.get("slug"))
        owner = f"profile_list entry {slug!r}"
        errors += override_problems(
            owner, entry.get("kubespawner_override") or {}, traits, enforced
        )
        for who, override in _option_overrides(slug, entry):
            errors += override_problems(who, override, traits, enforced)
        profile = policy.profile(slug) if policy is not None else None
        if profile is not None and not profile.gpu.is_empty:
            warnings += _guarantee_warnings(owner, entry.get("kubespawner_override") or {}, profile)
            for who, override in _option_overrides(slug, entry):
                warnings += _guarantee_warnings(who, override, profile)
        if slugs is not None and slug not in slugs:
            warnings.append(
                f"{owner} ({entry.get('display_name') or slug}) has no policy profile with "
                f"that slug, so it is not offered; give a policy profile the slug {slug!r} "
                f"to offer it (policy profiles: {', '.join(sorted(slugs)) or 'none'})"
            )
    for profile in policy.profiles if policy is not None else ():
        errors += override_problems(
            f"policy profile {profile.slug!r}", profile.kubespawner_override, traits, enforced
        )
    return errors, warnings


def kube_trait_names(cls: type) -> set[str]:
    """The configurable traits of a KubeSpawner class (what an override may name)."""
    return set(cls.class_trait_names(config=True))  # type: ignore[attr-defined]


class SiteProfilesMixin(_KubePart):
    """The ``profile_list`` part of :class:`~.kube.KubeGPUShareSpawner`."""

    def gpushare_enforced(self) -> Enforced:
        return Enforced(
            str(getattr(self, "gpu_backend", "whole")), bool(getattr(self, "pin_to_grant", True))
        )

    async def site_profile_list(self) -> list[Entry]:
        """The site's ``profile_list``, initialized as KubeSpawner does (slugs, defaults)."""
        raw = self._sorted_dict_values(self.profile_list)
        if callable(raw):
            from jupyterhub.utils import maybe_future

            raw = await maybe_future(raw(self))
        return list(self._get_initialized_profile_list(raw or []))

    def static_profile_list(self) -> list[Entry] | None:
        """The initialized ``profile_list`` when it is a list (None: a callable)."""
        raw = self._sorted_dict_values(self.profile_list)
        if callable(raw):
            return None
        return list(self._get_initialized_profile_list(raw or []))

    @staticmethod
    def site_entry(slug: str, entries: list[Entry]) -> Entry | None:
        return next((e for e in entries if e.get("slug") == slug), None)

    def check_site_profiles(self, entries: list[Entry], policy: Policy | None) -> list[str]:
        """Refuse bad overrides (KubeProfileError); the warnings about entries no policy
        profile maps, each logged once by this hub."""
        errors, warnings = profile_list_problems(
            entries, policy, kube_trait_names(type(self)), self.gpushare_enforced()
        )
        if errors:
            raise KubeProfileError(errors)
        for line in warnings:
            if line not in _WARNED:
                _WARNED.add(line)
                self.log.warning("gpushare: %s", line)
        return warnings

    def option_keys(self, entry: Entry | None) -> set[str]:
        """User option names the entry's ``profile_options`` offer."""
        names = set((entry or {}).get("profile_options") or {})
        return names | {f"{n}--unlisted-choice" for n in names}

    def option_problem(self, entry: Entry, options: Mapping[str, Any]) -> str | None:
        """Why ``options`` (the entry's option choices) cannot be used; None when they can."""
        for name, option in (entry.get("profile_options") or {}).items():
            choice = options.get(name)
            if choice and choice not in (option.get("choices") or {}):
                from jupyter_gpushare.spawner.form import clip

                return (
                    f"option {name!r}: no choice {clip(repr(choice))} (choices: "
                    f"{', '.join(option.get('choices') or {}) or 'none'})"
                )
        saved = self.user_options  # type: ignore[has-type]
        self.user_options = {"profile": entry["slug"], **options}
        try:
            self._validate_user_options([entry])  # KubeSpawner's: unlisted choices, regex
        except ValueError as exc:
            return str(exc)
        finally:
            self.user_options = saved
        return None


_WARNED: set[str] = set()
"""Warnings already logged by this hub (each once)."""

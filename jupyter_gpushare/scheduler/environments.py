"""jupyter-scheduler's environment list as the user's gpushare profiles.

The list comes from the broker's ``GET /jobs/options`` (the same call the gpushare submit
dialog makes), so it holds only profiles with a GPU that one of the user's teams may use;
each profile's "compute types" are the priorities those teams may use it at, its default
the profile's own priority.
"""

from __future__ import annotations

from typing import Any

from jupyter_scheduler.environments import EnvironmentManager, EnvironmentRetrievalError
from jupyter_scheduler.models import RuntimeEnvironment

from .broker_http import call_broker
from .form import CHECKPOINT_PARAM, MAX_RUNTIME_PARAM

OUTPUT_FORMATS = {"ipynb": "Notebook", "html": "HTML", "log": "Log"}


def hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h"


def priorities_of(profile: dict[str, Any], order: list[str]) -> list[str]:
    """The priorities any of the user's teams may use the profile at, in the policy's order."""
    allowed = {p for names in (profile.get("priorities") or {}).values() for p in names}
    return [p for p in order if p in allowed] or sorted(allowed)


def describe(profile: dict[str, Any], limits: dict[str, Any]) -> str:
    shown = profile.get("display_name") or profile["slug"]
    gpu = (profile.get("gpu") or {}).get("describe") or "GPU"
    longest = profile.get("max_lifetime_s") or limits.get("max_runtime")
    default = limits.get("default_max_runtime")
    runtime = f"; runtime up to {hours(longest)}" if longest else ""
    if default and longest:
        runtime += f" (default {hours(min(default, longest))})"
    return (
        f"{shown}: {gpu} in pool {profile.get('pool')}{runtime}. Priority: compute type; "
        f"runtime: parameter {MAX_RUNTIME_PARAM} (e.g. 2h); checkpointing: parameter "
        f"{CHECKPOINT_PARAM}=true"
    )


def environment_of(
    profile: dict[str, Any], order: list[str], limits: dict[str, Any]
) -> RuntimeEnvironment:
    priorities = priorities_of(profile, order)
    default = profile.get("priority")
    return RuntimeEnvironment(
        name=profile["slug"],
        # jupyter-scheduler's form shows ``name`` but selects by ``label``: keep them equal
        label=profile["slug"],
        description=describe(profile, limits),
        file_extensions=["ipynb"],
        output_formats=list(OUTPUT_FORMATS),
        metadata={
            "pool": str(profile.get("pool")),
            "max_runtime_s": str(profile.get("max_lifetime_s") or ""),
        },
        compute_types=priorities,
        default_compute_type=default if default in priorities else None,
        utc_only=False,
    )


def environments_of(options: dict[str, Any]) -> list[RuntimeEnvironment]:
    """The environments of a ``/jobs/options`` answer."""
    order = [p["name"] for p in options.get("priorities") or [] if "name" in p]
    limits = options.get("limits") or {}
    return [environment_of(p, order, limits) for p in options.get("profiles") or []]


class GPUShareEnvironmentManager(EnvironmentManager):
    """The profiles the user may submit jobs with, from the gpushare broker."""

    async def list_environments(self) -> list[RuntimeEnvironment]:  # type: ignore[override]
        answer = await call_broker("GET", "/jobs/options")
        if answer.status != 200:
            why = answer.json()
            reason = why.get("error") if isinstance(why, dict) else why
            raise EnvironmentRetrievalError(
                f"the gpushare broker did not list your profiles ({answer.status}): {reason}"
            )
        return environments_of(answer.json())

    def manage_environments_command(self) -> str:
        return ""

    def output_formats_mapping(self) -> dict[str, str]:
        return dict(OUTPUT_FORMATS)

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
"""

from __future__ import annotations

from typing import Any

from kubespawner import KubeSpawner
from traitlets import Bool, CaselessStrEnum, Unicode

from jupyter_gpushare.broker.client import GrantInfo
from jupyter_gpushare.core.model import Profile
from jupyter_gpushare.spawner import enforcement
from jupyter_gpushare.spawner.mixin import GPUShareSpawner

__all__ = ["KubeGPUShareSpawner"]

_OVERRIDDEN = (
    "extra_resource_limits",
    "extra_labels",
    "extra_annotations",
    "node_selector",
    "environment",
    "scheduler_name",
    "priority_class_name",
)


class KubeGPUShareSpawner(GPUShareSpawner, KubeSpawner):
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
        super().apply_profile(profile)
        if profile.image:
            self.image = profile.image

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
        """Profiles are gpushare's (checked in start); KubeSpawner's profile_list is unused."""
        return None

    def start(self) -> Any:  # type: ignore[override]
        self._check_backend()
        return GPUShareSpawner.start(self)

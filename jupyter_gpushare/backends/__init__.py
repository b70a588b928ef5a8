"""Batch backends behind one interface (:mod:`.base`); the local one is the default."""

from .base import Capabilities, JobBackend, RunHandle, RunSpec, RunStatus

__all__ = ["Capabilities", "JobBackend", "RunHandle", "RunSpec", "RunStatus"]

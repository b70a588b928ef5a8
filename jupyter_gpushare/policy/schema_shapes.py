"""The structure of the policy file's schema: a :class:`Section` (a mapping with a fixed set
of keys), :class:`MapOf` (names to sections), :class:`ListOf`, :class:`Either` (one of several
shapes) and the :class:`Key` of a section, around the :class:`~.schema_value.Value` fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from .schema_value import Value


@dataclass(frozen=True)
class Section:
    """A mapping with a fixed set of keys."""

    title: str
    keys: tuple[Key, ...]
    description: str = ""
    _by_name: dict[str, Key] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({k.name: k for k in self.keys})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.keys)

    def key(self, name: str) -> Key:
        return self._by_name[name]


@dataclass(frozen=True)
class MapOf:
    """A mapping of names (of pools, teams, ...) to sections of one kind; each name must
    match :data:`NAME_PATTERN`."""

    item: Section
    description: str = ""


@dataclass(frozen=True)
class ListOf:
    """A list of sections of one kind."""

    item: Section
    description: str = ""


@dataclass(frozen=True)
class Either:
    """One of several shapes (e.g. ``gpu: 2``, ``gpu: 1/4`` or ``gpu: {fraction: ...}``)."""

    options: tuple[Shape, ...]
    description: str = ""


Shape: TypeAlias = Value | Section | MapOf | ListOf | Either


@dataclass(frozen=True)
class Key:
    """One key of a section: its shape, whether it must be there, its help text."""

    name: str
    shape: Shape
    help: str = ""
    required: bool = False
    default: object = None


def _k(
    name: str, shape: Shape, help: str = "", *, required: bool = False, default: object = None
) -> Key:
    return Key(name, shape, help, required, default)

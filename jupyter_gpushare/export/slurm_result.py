"""The result of ``export slurm``: the header, slurm.conf, gres.conf and ``sacctmgr`` lines,
and their text for each ``--format``. Pure (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..policy.issues import one_line

FORMATS = ("conf", "sacctmgr", "all")


@dataclass
class SlurmExport:
    """The three parts of the export, each a list of lines (comments included)."""

    header: list[str] = field(default_factory=list)
    slurm_conf: list[str] = field(default_factory=list)
    gres_conf: list[str] = field(default_factory=list)
    sacctmgr: list[str] = field(default_factory=list)

    def commands(self) -> list[str]:
        """The ``sacctmgr`` command lines, without comments or blank lines."""
        return [line for line in self.sacctmgr if line.strip() and not line.startswith("#")]

    def render(self, fmt: str = "all") -> str:
        """The text for ``--format`` ``conf`` (slurm.conf and gres.conf), ``sacctmgr``
        (a shell script) or ``all`` (both, in sections)."""
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
        out = list(self.header)
        if fmt in ("conf", "all"):
            out += ["", "# " + "=" * 30 + " slurm.conf (add these lines)", *self.slurm_conf]
            out += ["", "# " + "=" * 30 + " gres.conf", *self.gres_conf]
        if fmt in ("sacctmgr", "all"):
            out += ["", "# " + "=" * 30 + " sacctmgr commands (sh; needs slurmdbd)", *self.sacctmgr]
        if fmt == "sacctmgr":
            out.insert(0, "#!/bin/sh")
        # every line stays one line whatever a name holds (comments included)
        return "\n".join(one_line(line) for line in out) + "\n"

"""Hostile policy files: generate many, run every reader on each, count what went wrong.

    .venv/bin/python benchmarks/hostile_policies.py                 # 1,000 files, seed 23
    .venv/bin/python benchmarks/hostile_policies.py --files 200 --seed 7 --keep /tmp/hostile

Each file is the example policy (``hub_config/gpushare.yaml``) with one or more hostile
changes: huge numbers (10^17, 10^400, ``"1e400"``, 5,000 digits), non-finite ones (inf, nan),
negatives, deep nesting (flow and block, up to 10,000 levels), huge documents (over the
reader's 8 MiB), odd names (newlines, quotes, ``$(...)``, ``;``, unicode, 1 MB long), duplicate
keys, wrong types, YAML tags, alias bombs ("billion laughs"), bytes that are not UTF-8,
control characters and cut-off files.

Every file goes through what an admin or the services run on it:

* ``check-policy FILE`` (``cli.main``, in process, stdout and stderr captured);
* ``export kueue|slurm|ytsaurus FILE`` (the same, each target; slurm as ``--format all``);
* the broker's reload path (:func:`jupyter_gpushare.broker.ops.reload._read_and_parse`, what
  ``PolicyReloader.reload`` runs in its worker thread);
* the spawner's hold on the policy (``load_policy_cached`` with a last good policy).

Printed: files, tracebacks (an exception out of any of them, or "Traceback"/"internal
error" in their output: must be 0), errors without ``FILE:LINE`` (an issue line that does
not start with the file and a line number >= 1: must be 0), injected lines (a line of a
``sacctmgr`` script that is neither a comment nor a ``sacctmgr`` command, or a kueue/yt
comment header broken: must be 0), exits (0 / 2 / other), and the time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import random
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "hub_config" / "gpushare.yaml"
TARGETS = ("kueue", "slurm", "ytsaurus")

HUGE_NUMBERS: list[Any] = [
    10**17, 10**18, 2**31, 2**63, 2**64, 10**40, -1, -(10**17), 0, 0.0, 1e308,
    float("inf"), float("-inf"), float("nan"), "1e400", "-1e400", "1e-400", "10^17", "1/0",
    "0/0", "-1/4", "1e400%", "99999999999999999999w", "1e400GiB", "9" * 400 + "G",
    "1" + "0" * 300 + "%", "NaN", "inf", "-0", "0x10", "1_000_000",
]
ODD_NAMES: list[str] = [
    "", " ", "a b", "a\nsacctmgr -i delete account root", "a\r\nb", "x\n#\nsacctmgr -i "
    "add account evil", "$(rm -rf /)", "`id`", "a;b", "a&&b", "a|b", "'\"", "\"", "'",
    "Ωmega", "ümlaut", "\u202eevil", "a\u2028b", "a\tb", "-", "_", "-a", "a-", "a" * 64,
    "A" * 200, "x" * 1_000_000, "${HOME}", "--flag", "#comment", "a=b", "a,b", "a/b",
    "../../etc/passwd", "{{x}}", "%s%n", "a\x00b", "a\x1bb", "日本語", "🙂", "a.b", "NUL",
    "Vision", "VISION", "root", "gpushare", "1", "0",
]
WRONG_TYPES: list[Any] = [None, True, False, [], {}, [[1]], {"a": 1}, [None], {"": None},
                          ["a", ["b"]], {"x": [{"y": {}}]}, 3.5, -7]
TAGS = ["!!python/object/apply:os.system ['id']", "!!binary aGVsbG8=", "!!timestamp 2020-13-45",
        "!!set {a, b}", "!!omap [a: 1]", "!!float nan", "!!int 1" + "0" * 5000, "!!str",
        "!!null", "!foo bar", "!!python/name:os.system", "!!merge <<", "2020-13-45",
        "!!int 0x", "!!float 1e99999"]


# ------------------------------------------------------------------- generating


def _paths(node: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a parsed document (keys of mappings, items of lists)."""
    yield where
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*where, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*where, i))


def _parent(doc: Any, where: tuple[Any, ...]) -> Any:
    for step in where[:-1]:
        doc = doc[step]
    return doc


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100)


def _set_value(rng: random.Random, doc: Any, pool: list[Any]) -> str:
    places = [p for p in _paths(doc) if p]
    where = rng.choice(places)
    _parent(doc, where)[where[-1]] = rng.choice(pool)
    return _dump(doc)


def _node_entries(doc: Any) -> list[Any]:
    inventory = doc["inventory"]
    groups = inventory.get("nodes") or inventory.get("simulated") or []
    return groups if isinstance(groups, list) else [groups]


def _rename(rng: random.Random, doc: Any) -> str:
    """Give a team, pool, priority class, profile, node or group an odd name."""
    name = rng.choice(ODD_NAMES)
    kind = rng.choice(["teams", "pools", "priority_classes", "slug", "node", "groups",
                       "admins", "model", "quota_pool"])
    if kind in ("teams", "pools", "priority_classes"):
        section = doc[kind]
        old = rng.choice(list(section))
        doc[kind] = {(name if k == old else k): v for k, v in section.items()}
    elif kind == "slug":
        rng.choice(doc["profiles"])["slug"] = name
    elif kind == "node":  # a node, or a simulated group's name prefix
        rng.choice(_node_entries(doc))["name"] = name
    elif kind in ("groups", "admins"):
        team = rng.choice(list(doc["teams"].values()))
        team[kind] = [name]
    elif kind == "model":
        node = rng.choice(_node_entries(doc))
        target = rng.choice(node["gpus"]) if node.get("gpus") else node
        target["model"] = name
    else:
        team = rng.choice(list(doc["teams"].values()))
        quotas = team["quotas"]
        old = rng.choice(list(quotas))
        team["quotas"] = {(name if k == old else k): v for k, v in quotas.items()}
    return _dump(doc)


def _numeric_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines())
            if re.search(r":\s*[-+]?[\d./%]+[A-Za-z]*\s*[,}]?\s*$", line)
            or re.search(r"\{[^}]*\d", line)]


def _replace_number(rng: random.Random, text: str, new: str) -> str:
    lines = text.splitlines()
    candidates = _numeric_lines(text)
    i = rng.choice(candidates)
    lines[i] = re.sub(r"(?<=: )[-+]?\d[\d./%]*[A-Za-z]*", lambda m: new, lines[i], count=1)
    return "\n".join(lines) + "\n"


def _deep(rng: random.Random, text: str) -> str:
    depth = rng.choice([33, 64, 500, 5000, 10000])
    style = rng.choice(["flow-list", "flow-map", "block"])
    if style == "flow-list":
        value = "[" * depth + "]" * depth
    elif style == "flow-map":
        value = "{a: " * depth + "1" + "}" * depth
    else:
        depth = min(depth, 600)  # block nesting grows as depth^2 characters
        value = "\n" + "".join("  " * (i + 1) + "- \n" for i in range(depth))
    lines = text.splitlines()
    i = rng.choice([j for j, line in enumerate(lines) if re.match(r"^\s*\w+:\s*\S", line)])
    key = lines[i].split(":", 1)[0]
    lines[i] = f"{key}: {value}"
    return "\n".join(lines) + "\n"


def _laughs(rng: random.Random, text: str) -> str:
    levels, width = rng.choice([(9, 10), (20, 2), (5, 40), (30, 2)])
    out = ["lol0: &l0 [lol]"]
    for i in range(1, levels + 1):
        out.append(f"lol{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    bomb = "\n".join(out)
    where = rng.choice(["top", "discovery", "labels"])
    if where == "top":
        return text + "\n" + bomb + "\n"
    if where == "discovery":
        inner = "\n".join("    " + line for line in out)
        return text.replace("inventory:\n", f"inventory:\n  discovery:\n{inner}\n", 1)
    anchors = "\n".join(out)
    return anchors + "\n" + text.replace("labels: {zone: a}", f"labels: {{zone: *l{levels}}}", 1)


def _duplicate(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    keyed = [i for i, line in enumerate(lines) if re.match(r"^\s*\w+:", line)]
    i = rng.choice(keyed)
    lines.insert(i + 1, lines[i])
    return "\n".join(lines) + "\n"


def _tagged(rng: random.Random, text: str) -> str:
    return _replace_number(rng, text, rng.choice(TAGS))


def _cut(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(len(text))]


def _big(rng: random.Random, text: str) -> str:
    size = 8 * 1024 * 1024 + rng.randrange(1, 1024 * 1024)
    if rng.random() < 0.5:
        return text + "# " + "x" * size + "\n"
    return text.replace("description: Planned training",
                        "description: " + "y" * size, 1)


def _control(rng: random.Random, text: str) -> str:
    char = rng.choice(["\x00", "\x07", "\x1b", "\ufffe", "\x85", "\u2028", "\t", "\r"])
    at = rng.randrange(len(text))
    return text[:at] + char + text[at:]


def _many(rng: random.Random, text: str) -> str:
    """Thousands of teams, nodes or profiles (a large but legal shape)."""
    n = rng.choice([200, 1000])
    kind = rng.choice(["teams", "simulated"])
    if kind == "teams":
        extra = "".join(f"  t{i}:\n    quotas: {{debug: {{guaranteed: 0}}}}\n" for i in range(n))
        return text.replace("teams:\n", "teams:\n" + extra, 1)
    return text.replace("inventory:\n", "inventory:\n  source: simulated\n  simulated: "
                        f"{{pool: train, nodes: {n}, gpus_per_node: 1024}}\n", 1)


@dataclass
class Case:
    """One hostile file: its bytes and what was done to it."""

    name: str
    data: bytes
    kinds: list[str] = field(default_factory=list)


def _parsed(text: str, fallback: Any) -> Any:
    """``text`` parsed when it is still a mapping with every section (an earlier change may
    have broken it), else a copy of the example."""
    import copy

    try:
        doc = yaml.safe_load(text)
    except Exception:
        doc = None
    sections = ("inventory", "pools", "priority_classes", "teams", "profiles")
    if isinstance(doc, dict) and all(isinstance(doc.get(k), (dict, list)) for k in sections):
        if sum(1 for _ in itertools.islice(_paths(doc), 100_001)) > 100_000:
            return copy.deepcopy(fallback)  # an alias bomb: walking it would never end
        try:
            _dump(doc)
            _rename(random.Random(0), copy.deepcopy(doc))
            return doc
        except Exception:
            pass
    return copy.deepcopy(fallback)


def _one(rng: random.Random, base_text: str, base_doc: Any) -> tuple[str, bytes | str]:
    kind = rng.choices(
        ["number", "number-text", "digits", "name", "type", "deep", "laughs", "duplicate",
         "tag", "cut", "big", "control", "not-utf8", "many"],
        weights=[16, 12, 3, 20, 10, 8, 5, 5, 5, 4, 1, 5, 3, 3])[0]
    doc = _parsed(base_text, base_doc)
    if kind == "number":
        return kind, _set_value(rng, doc, HUGE_NUMBERS)
    if kind == "number-text":
        return kind, _replace_number(rng, base_text, rng.choice(
            ["1e400", "1.0e+400", ".inf", "-.inf", ".nan", "-1", "100000000000000000",
             "1" + "0" * 400, '"1e400"', "99999999999h", "-5%", "1e400GiB"]))
    if kind == "digits":
        return kind, _replace_number(rng, base_text, "9" * rng.choice([4000, 4400, 5000]))
    if kind == "name":
        return kind, _rename(rng, doc)
    if kind == "type":
        return kind, _set_value(rng, doc, WRONG_TYPES)
    if kind == "deep":
        return kind, _deep(rng, base_text)
    if kind == "laughs":
        return kind, _laughs(rng, base_text)
    if kind == "duplicate":
        return kind, _duplicate(rng, base_text)
    if kind == "tag":
        return kind, _tagged(rng, base_text)
    if kind == "cut":
        return kind, _cut(rng, base_text)
    if kind == "big":
        return kind, _big(rng, base_text)
    if kind == "control":
        return kind, _control(rng, base_text)
    if kind == "many":
        return kind, _many(rng, base_text)
    raw = base_text.encode()
    at = rng.randrange(len(raw))
    return kind, raw[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xfe\xff"]) \
        + raw[at:]


def generate(count: int, seed: int = 23, base: Path = EXAMPLE,
             skip: frozenset[str] = frozenset()) -> Iterator[Case]:
    """``count`` hostile files (the same ones for the same seed), made one at a time; files
    that got a mutation of a kind in ``skip`` are left out (still counted in the seed)."""
    rng = random.Random(seed)
    base_text = base.read_text(encoding="utf-8")
    base_doc = yaml.safe_load(base_text)
    for i in range(count):
        kinds: list[str] = []
        text: bytes | str = base_text
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            try:
                kind, text = _one(rng, text if isinstance(text, str) else base_text, base_doc)
            except (KeyError, IndexError, TypeError, AttributeError, ValueError):
                kind, text = _one(rng, base_text, base_doc)  # an earlier change broke the shape
            kinds.append(kind)
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
        if not skip.intersection(kinds):
            yield Case(f"hostile-{i:04d}.yaml", data, kinds)


# --------------------------------------------------------------------- running


@dataclass
class Tally:
    """What went wrong over all files (each list holds short descriptions)."""

    files: int = 0
    loaded: int = 0  # files the loader accepted
    tracebacks: list[str] = field(default_factory=list)
    no_line: list[str] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    exits: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.tracebacks or self.no_line or self.injected)


def _run_cli(argv: list[str]) -> tuple[str, str, str]:
    """(exit, stdout, stderr) of ``jupyter-gpushare ARGV`` in process; an exception out of
    it comes back as exit ``"exception"`` with the traceback as stderr."""
    from jupyter_gpushare import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: object = cli.main(argv)
        except SystemExit as exc:  # an export's own refusal ("cannot express ...")
            code = exc.code if isinstance(exc.code, int) else f"exit:{exc.code}"
        except Exception:
            return "exception", out.getvalue(), traceback.format_exc()
    return str(code), out.getvalue(), err.getvalue()


def _issue_lines(path: str, stderr: str) -> list[str]:
    """The issue lines of ``check-policy``/``export`` output (indented under the header)."""
    return [line[2:] for line in stderr.splitlines() if line.startswith("  ")]


def _check_lines(tally: Tally, what: str, path: str, stderr: str) -> None:
    pattern = re.compile(re.escape(path) + r":([1-9]\d*): ")
    for line in _issue_lines(path, stderr):
        if not pattern.match(line):
            tally.no_line.append(f"{what}: {line[:200]}")


def _check_output(tally: Tally, what: str, target: str, stdout: str) -> None:
    """No line was injected into what an export wrote."""
    if target == "slurm":
        for line in stdout.splitlines():
            if line and not line.startswith("#") and not line.startswith("sacctmgr ") \
                    and not re.match(r"^[A-Za-z]+=", line):
                tally.injected.append(f"{what}: {line[:200]}")
    elif target == "kueue":
        head = stdout.split("\n---\n", 1)[0]
        bad = [line for line in head.splitlines() if not line.startswith("#")]
        if bad:
            tally.injected.append(f"{what}: {bad[0][:200]}")
        try:
            list(yaml.safe_load_all(stdout))
        except yaml.YAMLError as exc:
            tally.injected.append(f"{what}: not YAML: {str(exc)[:200]}")
    else:
        for line in stdout.splitlines():
            if line and not line.startswith("#") and not line.startswith("yt ") \
                    and line != "set -e":
                tally.injected.append(f"{what}: {line[:200]}")


def _bad_output(text: str) -> bool:
    return "Traceback (most recent call last)" in text or "internal error" in text


def run_file(tally: Tally, path: Path, last_good: Any) -> None:
    """Every reader on one file; what went wrong is added to ``tally``."""
    from jupyter_gpushare.broker.ops.reload import _read_and_parse
    from jupyter_gpushare.policy import PolicyError
    from jupyter_gpushare.spawner import profile_choice

    name = str(path)
    code, out, err = _run_cli(["check-policy", "-q", name])
    tally.exits[f"check-policy:{code}"] += 1
    if code == "exception" or _bad_output(err):
        tally.tracebacks.append(f"check-policy {path.name}: {err[-300:]}")
    _check_lines(tally, f"check-policy {path.name}", name, err)
    if code == "0":
        tally.loaded += 1
    for target in TARGETS:
        code, out, err = _run_cli(["export", target, name])
        tally.exits[f"export {target}:{code}"] += 1
        what = f"export {target} {path.name}"
        if code == "exception" or _bad_output(err):
            tally.tracebacks.append(f"{what}: {err[-300:]}")
        _check_lines(tally, what, name, err)
        if code == "0":
            _check_output(tally, what, target, out)
    try:
        _read_and_parse(name)
    except PolicyError as exc:
        for issue in exc.errors:
            if issue.line < 1 or issue.file != name or "\n" in str(issue):
                tally.no_line.append(f"reload {path.name}: {str(issue)[:200]}")
    except Exception:
        tally.tracebacks.append(f"reload {path.name}: {traceback.format_exc()[-300:]}")
    try:
        if hasattr(profile_choice, "_PolicyRead"):
            profile_choice._POLICY_CACHE[name] = profile_choice._PolicyRead(None, last_good)
            held = profile_choice.load_policy_cached(name, _QUIET)
        else:  # the spawner before issue 23 (to measure it): (mtime, policy), no logger
            profile_choice._POLICY_CACHE[name] = (0.0, last_good)
            held = profile_choice.load_policy_cached(name)
        if held is None:
            tally.tracebacks.append(f"spawner {path.name}: the last good policy was dropped")
    except Exception:
        tally.tracebacks.append(f"spawner {path.name}: {traceback.format_exc()[-300:]}")
    finally:
        profile_choice._POLICY_CACHE.pop(name, None)


class _Quiet:
    """A logger that drops what the spawner's cache says (one warning per file)."""

    def warning(self, *args: object, **kwargs: object) -> None:
        pass


_QUIET: Any = _Quiet()


def run(count: int, seed: int = 23, keep: Path | None = None,
        progress: Callable[[int], None] | None = None,
        skip: frozenset[str] = frozenset()) -> Tally:
    """Generate ``count`` files and run every reader on each (see the module docstring)."""
    import logging

    from jupyter_gpushare.policy import load_policy

    logging.getLogger("jupyter_gpushare.policy").setLevel(logging.ERROR)  # warnings: noise
    last_good = load_policy(EXAMPLE)
    tally = Tally()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for i, case in enumerate(generate(count, seed, skip=skip)):
            path = folder / case.name
            path.write_bytes(case.data)
            tally.files += 1
            tally.kinds.update(case.kinds)
            run_file(tally, path, last_good)
            if keep is None:
                path.unlink()
            if progress is not None:
                progress(i + 1)
    tally.seconds = time.perf_counter() - started
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1000, help="how many files (1000)")
    parser.add_argument("--seed", type=int, default=23, help="random seed (23)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the files here and keep them (default: a temporary folder)")
    parser.add_argument("--skip", action="append", default=[], metavar="KIND",
                        help="leave out files with a mutation of this kind (e.g. many, laughs: "
                             "to run code without the reader's bounds, which they exhaust)")
    args = parser.parse_args(argv)

    def progress(done: int) -> None:
        if done % 100 == 0:
            print(f"  {done} files ...", file=sys.stderr, flush=True)

    tally = run(args.files, args.seed, args.keep, progress, frozenset(args.skip))
    print(f"files:                     {tally.files}")
    print(f"accepted by check-policy:  {tally.loaded}")
    print(f"tracebacks:                {len(tally.tracebacks)}   (must be 0)")
    if tally.tracebacks:
        readers = Counter(" ".join(t.split(" ")[:-1]).split(":")[0].rsplit(" ", 1)[0]
                          for t in tally.tracebacks)
        print("  by reader:               " + ", ".join(f"{k} {v}" for k, v in
                                                        sorted(readers.items())))
    print(f"errors without FILE:LINE:  {len(tally.no_line)}   (must be 0)")
    print(f"injected export lines:     {len(tally.injected)}   (must be 0)")
    print(f"time:                      {tally.seconds:.1f} s "
          f"({tally.seconds / max(1, tally.files) * 1000:.0f} ms a file: making it, then "
          "6 readers)")
    print("mutations:                 " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(tally.kinds.items())))
    print("exit codes:                " + ", ".join(f"{k} {v}" for k, v in
                                                    sorted(tally.exits.items())))
    for label, items in (("traceback", tally.tracebacks), ("no line", tally.no_line),
                         ("injected", tally.injected)):
        for item in items[:10]:
            print(f"{label}: {item}")
    return 0 if tally.ok else 1


if __name__ == "__main__":
    sys.exit(main())

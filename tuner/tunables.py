"""Host tunables as get / set / verify triples (tuned style), defined as data.

The definitions live in ``playbooks/remediations/tunables.toml`` (name, host
paths, accepted values, desired value and why). This module turns one into
functions over a :class:`~tuner.host.Host`:

- :func:`instances` (get): every path the tunable lives at on this host, each
  with its current value read through the host root;
- :func:`set_value` (set): writes one value through an injected
  :data:`Writer` (the kernel's files on the live host; a test tree otherwise);
- :func:`verify`: reads the path back and says whether it now holds the value.

Nothing here decides *whether* to change a value beyond the definition's
``when`` condition; the journal, apply and revert live in :mod:`tuner.tune`.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.data import load_toml, toml_files
from tuner.errors import UsageError
from tuner.host import Host, Reading, State

Writer = Callable[[Path, str], None]
"""Writes a value (the text a person would ``echo`` into the file) to a real path; raises OSError."""

_VALUE_LIMIT = 64 << 10  # bytes read from a value file; sysfs values are at most a page
_BRACKETED = re.compile(r"\[([^\]\s]+)\]")


@dataclass(frozen=True)
class TunableDef:
    """One ``[[tunable]]`` of ``playbooks/remediations/tunables.toml``."""

    name: str  # as users know it: a sysctl key (vm.swappiness) or cpu.governor, thp.enabled
    title: str
    kind: str  # "sysctl" (persisted in /etc/sysctl.d) | "sysfs" (persisted in /etc/tmpfiles.d)
    paths: tuple[str, ...]  # host paths; one component may be a glob (cpu[0-9]*)
    type: str  # "int" | "choice"
    format: str  # "plain" | "bracketed" (`always [madvise] never`: the bracketed one is current)
    desired: str
    accept: str  # "equal" | "at_least" | "at_most" | "one_of"
    when: str  # condition id in CONDITIONS
    why: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    choices_from: str | None = None  # a file beside each instance listing its accepted choices
    acceptable: tuple[str, ...] = ()
    covers: tuple[str, ...] = ()  # doctor check ids this tunable answers
    doc: str | None = None

    @property
    def allowed(self) -> str:
        """The accepted values, in words, for usage messages."""
        if self.type == "int":
            return f"an integer from {self.minimum} to {self.maximum}"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        return f"one of the values listed in {self.choices_from} on this host"


def load_defs() -> dict[str, TunableDef]:
    """Every shipped tunable, by name, in file order."""
    out: dict[str, TunableDef] = {}
    for path in toml_files("playbooks", "remediations"):
        for raw in load_toml(path).get("tunable", []):
            d = _def_from(raw)
            out[d.name] = d
    return out


def _def_from(raw: dict[str, Any]) -> TunableDef:
    kind, typ, fmt = raw["kind"], raw["type"], raw.get("format", "plain")
    if kind not in ("sysctl", "sysfs") or typ not in ("int", "choice") or fmt not in ("plain", "bracketed"):
        raise ValueError(f"tunable {raw.get('name')!r}: bad kind/type/format")
    if raw.get("when", "always") not in CONDITIONS:
        raise ValueError(f"tunable {raw['name']!r}: unknown condition {raw.get('when')!r}")
    return TunableDef(
        name=raw["name"],
        title=raw.get("title", raw["name"]),
        kind=kind,
        paths=tuple(raw["paths"]),
        type=typ,
        format=fmt,
        desired=str(raw["desired"]),
        accept=raw.get("accept", "equal"),
        when=raw.get("when", "always"),
        why=" ".join(raw.get("why", "").split()),
        minimum=raw.get("min"),
        maximum=raw.get("max"),
        choices=tuple(raw.get("choices", ())),
        choices_from=raw.get("choices_from"),
        acceptable=tuple(str(v) for v in raw.get("acceptable", ())),
        covers=tuple(raw.get("covers", ())),
        doc=raw.get("doc"),
    )


# --------------------------------------------------------------------------------------------------
# get
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instance:
    """One place a tunable lives on this host (cpu.governor has one per CPU policy)."""

    path: str  # host path after links are resolved: what is written and journaled
    label: str  # what distinguishes it to a person ("cpu0,cpu1"), "" when there is one
    current: Reading[str]  # the current value: the stripped text, or the bracketed choice
    choices: tuple[str, ...]  # what this instance accepts (from choices_from / the bracketed list)


def parse(d: TunableDef, text: str) -> str:
    """The current value in a file's text: the bracketed choice, or the stripped text."""
    if d.format == "bracketed":
        m = _BRACKETED.search(text)
        if m:
            return m.group(1)
    return text.strip()


def _expand(host: Host, pattern: str) -> list[str]:
    """Host paths matching ``pattern`` (globs allowed in path components), sorted naturally."""
    parts = [p for p in pattern.split("/") if p]
    found = [""]
    for part in parts:
        nxt: list[str] = []
        for base in found:
            if any(ch in part for ch in "*?["):
                names = host.listdir(base or "/")
                if names.ok and names.value is not None:
                    nxt.extend(f"{base}/{n}" for n in names.value if fnmatch.fnmatchcase(n, part))
            else:
                nxt.append(f"{base}/{part}")
        found = nxt
    return sorted(found, key=_natural)


def _natural(path: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def instances(d: TunableDef, host: Host) -> list[Instance]:
    """Get: every existing instance of ``d`` with its current value (empty: not on this host)."""
    by_path: dict[str, tuple[list[str], Reading[str], tuple[str, ...]]] = {}
    for pattern in d.paths:
        for hostpath in _expand(host, pattern):
            try:
                real = host.resolve(hostpath)
            except OSError:
                real = hostpath
            raw = host.read_text(real, limit=_VALUE_LIMIT)
            if raw.state is State.ABSENT:
                continue
            if raw.ok and raw.value is not None and (len(raw.value) >= _VALUE_LIMIT or "\ufffd" in raw.value):
                # no kernel value is this big or binary; it could not be journaled faithfully: leave it alone
                raw = Reading.missing(State.ERROR, f"{real}: not a value (binary, or {_VALUE_LIMIT}+ bytes)")
            label = _label(pattern, hostpath)
            if real in by_path:
                by_path[real][0].append(label)
                continue
            current: Reading[str] = (
                Reading.of(parse(d, raw.value)) if raw.ok and raw.value is not None else raw
            )
            by_path[real] = ([label] if label else [], current, _choices(d, host, real, raw))
    return [
        Instance(path, ",".join(labels), current, choices)
        for path, (labels, current, choices) in by_path.items()
    ]


def _label(pattern: str, hostpath: str) -> str:
    """The path components a glob matched (cpu3), so a person can tell instances apart."""
    got = [h for p, h in zip(pattern.split("/"), hostpath.split("/"), strict=False) if p != h]
    return "/".join(got)


def _choices(d: TunableDef, host: Host, real: str, raw: Reading[str]) -> tuple[str, ...]:
    if d.choices_from:
        listed = host.read_value(real.rsplit("/", 1)[0] + "/" + d.choices_from)
        if listed.ok and listed.value:
            return tuple(listed.value.split())
        return ()
    if d.format == "bracketed" and raw.ok and raw.value:
        return tuple(t.strip("[]") for t in raw.value.split())
    return d.choices


# --------------------------------------------------------------------------------------------------
# values: validation and "is it already fine"
# --------------------------------------------------------------------------------------------------
def validate(d: TunableDef, value: str, choices: tuple[str, ...] = ()) -> str:
    """The normalised value if ``d`` accepts it; else a usage error naming what it accepts."""
    value = value.strip()
    if d.type == "int":
        try:
            number = int(value, 10)
        except ValueError:
            number = None
        lo = d.minimum if d.minimum is not None else -(2**63)
        hi = d.maximum if d.maximum is not None else 2**63 - 1
        if number is None or not lo <= number <= hi:
            raise UsageError(f"{d.name}={value}: not accepted", f"{d.name} takes {d.allowed}")
        return str(number)
    offered = choices or d.choices
    if value not in offered:
        where = "this host offers" if choices else "it takes"
        raise UsageError(
            f"{d.name}={value}: not accepted",
            f"{d.name}: {where} " + (", ".join(offered) if offered else "no values (not available here)"),
        )
    return value


def same(d: TunableDef, a: str | None, b: str | None) -> bool:
    """Do two values mean the same setting (``010`` == ``10`` for integers)?"""
    if a is None or b is None:
        return False
    if d.type == "int":
        try:
            return int(a) == int(b)
        except ValueError:
            return a.strip() == b.strip()
    return a.strip() == b.strip()


def acceptable(d: TunableDef, current: str) -> bool:
    """Is ``current`` already fine, so that the recommendation leaves it alone?"""
    if d.accept == "one_of":
        return current in (d.acceptable or (d.desired,))
    if d.accept in ("at_least", "at_most") and d.type == "int":
        try:
            cur, want = int(current), int(d.desired)
        except ValueError:
            return False
        return cur >= want if d.accept == "at_least" else cur <= want
    return same(d, current, d.desired)


# --------------------------------------------------------------------------------------------------
# conditions: when gputune recommends a tunable (an explicit --set ignores them)
# --------------------------------------------------------------------------------------------------
Condition = Callable[[Host, list[Instance], TunableDef], str | None]
"""Returns None when the recommendation applies here, else the reason it does not."""


def numa_nodes(host: Host) -> int:
    """How many NUMA nodes the kernel reports (the numa probe's reading; 0 on kernels without NUMA)."""
    from tuner.probes.numa import read_nodes

    return len(read_nodes(host)[0])


def swap_areas(host: Host) -> list[str]:
    """Swap areas in use (the swap probe's parser of /proc/swaps)."""
    from tuner.probes.swap import parse_swaps

    text = host.read_text("/proc/swaps")
    if not text.ok or text.value is None:
        return []
    return [e.filename for e in parse_swaps(text.value)]


def _always(host: Host, inst: list[Instance], d: TunableDef) -> str | None:
    return None


def _multi_numa(host: Host, inst: list[Instance], d: TunableDef) -> str | None:
    nodes = numa_nodes(host)
    if nodes > 1:
        return None
    return f"{nodes or 1} NUMA node here: launches are not bound to a node, so nothing to change"


def _swap_configured(host: Host, inst: list[Instance], d: TunableDef) -> str | None:
    if swap_areas(host):
        return None
    return "no swap area is in use (/proc/swaps), so swappiness has no effect until swap is added"


def _performance_offered(host: Host, inst: list[Instance], d: TunableDef) -> str | None:
    lacking = [i.label or i.path for i in inst if d.desired not in i.choices]
    if not lacking:
        return None
    offered = sorted({c for i in inst for c in i.choices})
    return (
        f"the cpufreq driver does not offer `{d.desired}` on {', '.join(lacking)}"
        f" (offered: {', '.join(offered) or 'nothing'})"
    )


CONDITIONS: dict[str, Condition] = {
    "always": _always,
    "multi_numa": _multi_numa,
    "swap_configured": _swap_configured,
    "performance_offered": _performance_offered,
}


def not_here_reason(d: TunableDef, host: Host) -> str:
    """Why a tunable has no instance on this host, in words."""
    if d.name == "cpu.governor":
        return (
            "no cpufreq here (a VM, or no cpufreq driver loaded):"
            " the hypervisor or firmware sets CPU frequency"
        )
    why = "this kernel was built without it" if host.live else "not in this host tree"
    return f"{', '.join(d.paths)} does not exist ({why})"


def covers(d: TunableDef, check_id: str, text: str) -> bool:
    """Does a doctor finding of ``check_id`` (its remediation command and summary in ``text``)
    ask for what this tunable sets? See ``covers`` in tunables.toml."""
    for c in d.covers:
        cid, _, word = c.partition(":")
        if cid == check_id and (not word or word in text):
            return True
    return False


# --------------------------------------------------------------------------------------------------
# set / verify
# --------------------------------------------------------------------------------------------------
def kernel_writer(real: Path, value: str) -> None:
    """Write like ``echo VALUE > FILE`` into procfs/sysfs; never creates a file."""
    fd = os.open(real, os.O_WRONLY)
    try:
        os.write(fd, (value + "\n").encode())
    finally:
        os.close(fd)


def tree_writer(real: Path, value: str) -> None:
    """Write into a host tree made of regular files, showing what the kernel would show afterwards.

    A file listing choices with the current one bracketed (``always [madvise] never``) gets the
    bracket moved; any other file gets its value replaced, its surrounding whitespace kept.
    Like the kernel, it never creates a file.
    """
    fd = os.open(real, os.O_RDWR)
    try:
        old = b""
        while chunk := os.read(fd, 1 << 16):
            old += chunk
        text = old.decode("utf-8", errors="surrogateescape")
        tokens = [t.strip("[]") for t in text.split()]
        if _BRACKETED.search(text) and value in tokens:
            new = _BRACKETED.sub(lambda m: m.group(1), text)
            new = re.sub(rf"(?<!\S){re.escape(value)}(?!\S)", f"[{value}]", new, count=1)
        elif text.strip():
            start = len(text) - len(text.lstrip())
            end = len(text.rstrip())
            new = text[:start] + value + text[end:]
        else:
            new = value + "\n"
        data = new.encode("utf-8", errors="surrogateescape")
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
    finally:
        os.close(fd)


def default_writer(host: Host) -> Writer:
    return kernel_writer if host.live else tree_writer


def set_value(host: Host, path: str, value: str, writer: Writer) -> None:
    """Set: write ``value`` to the instance at host path ``path``. Raises OSError as the kernel does."""
    writer(host.path(path), value)


def verify(d: TunableDef, host: Host, path: str, value: str) -> Reading[str]:
    """Verify: read ``path`` back; OK with the value read when it holds ``value``, ERROR otherwise."""
    raw = host.read_text(path, limit=_VALUE_LIMIT)
    if not raw.ok or raw.value is None:
        return raw
    now = parse(d, raw.value)
    if same(d, now, value):
        return Reading.of(now)
    return Reading(State.ERROR, now, f"read back {now!r} after writing {value!r}")


def write_error(exc: OSError) -> str:
    """Why the kernel refused a write, classified by errno."""
    reasons = {
        errno.EPERM: "the kernel refused the write (EPERM: not permitted here, e.g. inside a container)",
        errno.EACCES: "permission denied (EACCES)",
        errno.EINVAL: "the kernel rejected the value (EINVAL: not supported by this kernel or driver)",
        errno.EROFS: "read-only file system (EROFS: mounted read-only, e.g. inside a container)",
        errno.ENOENT: "the file vanished (ENOENT)",
        errno.EBUSY: "the device is busy (EBUSY)",
    }
    return reasons.get(exc.errno or 0, f"write failed: {exc.strerror or exc} (errno {exc.errno})")

"""`gputune tune`: fix what software can fix on the host, and always be able to put it back.

Flow (tuned's get / set / verify / undo):

1. **Plan** (shared by dry run and apply): for each tunable of
   ``playbooks/remediations/tunables.toml`` (or each ``--set``), read the current
   value through the host root, decide the new one and say why.
2. **Apply** (root only): for each change, the old value goes into the journal
   (``<root>/var/lib/gputune/journal.json``, written atomically and fsync'd)
   *before* the new value is written; then the value is read back and a
   mismatch is reported. A write the kernel refuses is reported per tunable
   (classified by errno) and the others still run.
3. **Revert**: the journal is replayed in reverse order; each restored entry
   leaves the journal, which is removed once empty. A journal whose apply never
   finished (a crash, a kill) is reported by the next run with the command
   that restores it.

``--persist`` writes ``/etc/sysctl.d/90-gputune.conf`` and
``/etc/tmpfiles.d/gputune.conf`` under the host root, journaled like the values
(a replaced file is restored byte for byte, a created one removed).

GPU settings and hardware/firmware fixes are never applied: GPU commands are
printed for the operator, and the doctor's findings that need the BIOS or a
person (PCIe slot, swap device) are printed as manual steps with evidence.

Exit codes: 0 done (or nothing to do); 1 a tunable could not be set or
verified, a revert is incomplete, or not root; 2 usage (unknown tunable, bad
value); 3 internal error.

``--format json`` prints one object: ``schema_version`` (1), ``mode``
(dry-run | apply | revert), ``root``, ``changes`` (per tunable: name, current,
new, status = would change | changed | ok | skip | failed | mismatch, why,
survives_reboot, paths with old/new/status/reason per instance), ``persist``
(path, action, status, content), ``reverted`` (per journal entry restored),
``operator_steps`` (kind gpu | manual, commands, steps, evidence),
``journal``, ``notices`` and ``exit_code``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import errno
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import tunables as tn
from tuner.errors import BadAnswer, ExitCode, UsageError
from tuner.host import Host, State

SCHEMA_VERSION = 1
JOURNAL = "/var/lib/gputune/journal.json"
SYSCTL_FILE = "/etc/sysctl.d/90-gputune.conf"
TMPFILES_FILE = "/etc/tmpfiles.d/gputune.conf"
_FILE_HEADER = "# Written by `gputune tune --persist`; `gputune tune --revert` removes it.\n"

# Statuses of one tunable in a run.
WOULD_CHANGE, CHANGED, OK, SKIP, FAILED, MISMATCH = (
    "would change",
    "changed",
    "ok",
    "skip",
    "failed",
    "mismatch",
)


# --------------------------------------------------------------------------------------------------
# files written atomically
# --------------------------------------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(real: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``real`` so that a crash leaves either the old file or the new one."""
    tmp = real.with_name(f".{real.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, real)
    _fsync_dir(real.parent)


def _make_dirs(host: Host, hostdir: str) -> list[str]:
    """Create ``hostdir`` under the root; return the host paths created, outermost first."""
    made: list[str] = []
    cur = ""
    for part in [p for p in hostdir.split("/") if p]:
        cur += "/" + part
        real = host.path(cur)
        if not real.is_dir():
            real.mkdir(mode=0o755)
            made.append(cur)
    return made


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------------
# the journal
# --------------------------------------------------------------------------------------------------
class Journal:
    """Old values saved before each write, replayed in reverse by ``--revert``.

    ``state`` is ``applying`` while an apply runs and ``complete`` after it; an
    ``applying`` journal found by a later run means that apply was interrupted.
    """

    def __init__(self, host: Host) -> None:
        self.host = host
        self.real = host.path(JOURNAL)
        self.data: dict[str, Any] | None = None

    @classmethod
    def load(cls, host: Host) -> Journal:
        j = cls(host)
        try:
            text = j.real.read_bytes()
        except FileNotFoundError:
            return j
        except OSError as exc:
            denied = exc.errno in (errno.EACCES, errno.EPERM)
            hint = "run as root" if denied else "move it aside and look at it"
            raise BadAnswer(f"cannot read the journal {j.real}: {exc.strerror}", hint) from exc
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
                raise ValueError("no entries list")
        except ValueError as exc:
            raise BadAnswer(
                f"the journal {j.real} is damaged ({exc})",
                "its old values cannot be trusted: restore them by hand from the file, then delete it",
            ) from exc
        j.data = data
        return j

    @property
    def exists(self) -> bool:
        return self.data is not None

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self.data["entries"]) if self.data else []

    @property
    def interrupted(self) -> bool:
        return bool(self.data) and self.data.get("state") == "applying"  # type: ignore[union-attr]

    def begin(self) -> None:
        if self.data is None:
            made = _make_dirs(self.host, JOURNAL.rsplit("/", 1)[0])
            self.data = {
                "schema_version": SCHEMA_VERSION,
                "tool": "gputune tune",
                "started": _now(),
                "made_dirs": made,
                "entries": [],
            }
        self.data["state"] = "applying"
        self.data["pid"] = os.getpid()
        self.save()

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Save ``entry`` (with the old value) durably; only then may the new value be written."""
        assert self.data is not None
        entry = {
            "seq": max((e.get("seq", 0) for e in self.data["entries"]), default=0) + 1,
            "at": _now(),
            **entry,
        }
        self.data["entries"].append(entry)
        self.save()
        return entry

    def drop(self, entry: dict[str, Any]) -> None:
        assert self.data is not None
        self.data["entries"] = [e for e in self.data["entries"] if e.get("seq") != entry.get("seq")]
        self.save()

    def finish(self) -> None:
        assert self.data is not None
        if not self.data["entries"]:
            self.remove()
            return
        self.data["state"] = "complete"
        self.data["finished"] = _now()
        self.save()

    def save(self) -> None:
        assert self.data is not None
        # readable by all: a dry run by any user reports it; it holds old settings, nothing secret
        atomic_write(self.real, (json.dumps(self.data, indent=2) + "\n").encode(), 0o644)

    def remove(self) -> None:
        """Delete the journal, and the folders made for it when they are empty."""
        made = list(self.data.get("made_dirs", [])) if self.data else []
        self.real.unlink(missing_ok=True)
        for stale in self.real.parent.glob(f".{self.real.name}.tmp-*"):  # left by a crash mid-save
            stale.unlink(missing_ok=True)
        _fsync_dir(self.real.parent)
        for d in reversed(made):
            try:
                self.host.path(d).rmdir()
            except OSError:
                break
        self.data = None

    def describe(self) -> str:
        if not self.data:
            return "no journal"
        n = len(self.data["entries"])
        return f"{n} saved value{'s' if n != 1 else ''}, started {self.data.get('started', '?')}"


# --------------------------------------------------------------------------------------------------
# the plan: one Item per tunable in this run
# --------------------------------------------------------------------------------------------------
@dataclass
class PathResult:
    path: str
    label: str
    old: str | None
    new: str
    status: str
    reason: str = ""


@dataclass
class Item:
    d: tn.TunableDef
    insts: list[tn.Instance]
    target: str | None
    status: str  # WOULD_CHANGE | OK | SKIP | FAILED (explicit --set that cannot happen here)
    reason: str  # why the change, or why none
    explicit: bool
    todo: list[tn.Instance] = field(default_factory=list)  # instances whose value changes
    results: list[PathResult] = field(default_factory=list)
    note: str = ""  # e.g. a later sysctl.d file that overrides the persisted value

    @property
    def current(self) -> str:
        return _current_text(self.insts)

    def to_dict(self, persist: bool) -> dict[str, Any]:
        return {
            "name": self.d.name,
            "title": self.d.title,
            "kind": self.d.kind,
            "current": self.current,
            "new": self.target if self.status in (WOULD_CHANGE, CHANGED, MISMATCH, FAILED) else None,
            "status": self.status,
            "why": self.reason,
            "explicit": self.explicit,
            "survives_reboot": _survives(self, persist),
            "paths": [
                {
                    "path": r.path,
                    "label": r.label,
                    "old": r.old,
                    "new": r.new,
                    "status": r.status,
                    "reason": r.reason,
                }
                for r in self.results
            ]
            or [
                {"path": i.path, "label": i.label, "old": i.current.value, "new": self.target}
                for i in (self.todo or self.insts)
            ],
            "note": self.note or None,
        }


def _current_text(insts: list[tn.Instance]) -> str:
    if not insts:
        return "-"
    groups: dict[str, list[str]] = {}
    for i in insts:
        key = (
            i.current.value if i.current.ok and i.current.value is not None else f"<{i.current.state.value}>"
        )
        groups.setdefault(key, []).append(i.label)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{v} ({','.join(labels)})" for v, labels in groups.items())


def _survives(item: Item, persist: bool) -> str:
    if item.status in (SKIP,) or (item.status == OK and not item.explicit):
        return "-"
    if persist:
        return "yes: " + (SYSCTL_FILE if item.d.kind == "sysctl" else TMPFILES_FILE)
    return "no: until reboot (add --persist)"


def parse_sets(sets: list[str], defs: dict[str, tn.TunableDef]) -> dict[str, str]:
    """``--set NAME=VALUE`` pairs, names checked (values are checked against the host later)."""
    out: dict[str, str] = {}
    for s in sets:
        name, eq, value = s.partition("=")
        name = name.strip()
        if not eq or not name or not value.strip():
            raise UsageError(f"--set {s!r}: expected NAME=VALUE", "for example --set vm.swappiness=10")
        if name not in defs:
            raise UsageError(f"--set {name}: unknown tunable", "known tunables: " + ", ".join(defs))
        out[name] = value.strip()
    return out


def build_plan(
    host: Host, defs: dict[str, tn.TunableDef], sets: dict[str, str], only: list[str]
) -> list[Item]:
    """Decide every change of this run; reads only. Shared by dry run and apply."""
    for name in only:
        if name not in defs:
            raise UsageError(f"--only {name}: unknown tunable", "known tunables: " + ", ".join(defs))
    names = [n for n in defs if (n in only or n in sets)] if (only or sets) else list(defs)
    items: list[Item] = []
    for name in names:
        d = defs[name]
        explicit = name in sets
        insts = tn.instances(d, host)
        if not insts:
            items.append(
                Item(d, [], None, FAILED if explicit else SKIP, tn.not_here_reason(d, host), explicit)
            )
            continue
        unreadable = [i for i in insts if not i.current.ok]
        if explicit:
            common = _common_choices(insts) if d.type == "choice" else ()
            if d.type == "choice" and not common:
                common = d.choices
            target = tn.validate(d, sets[name], common)
            todo = [i for i in insts if not tn.same(d, i.current.value, target)]
            why = f"set explicitly (--set {name}={target})"
        else:
            not_here = tn.CONDITIONS[d.when](host, insts, d)
            if not_here:
                items.append(Item(d, insts, None, SKIP, not_here, explicit))
                continue
            target = d.desired
            # an unreadable instance is left alone here (it could not be restored); an explicit
            # --set still tries it and reports it as failed
            todo = [i for i in insts if i.current.ok and not tn.acceptable(d, i.current.value or "")]
            lacking = [i for i in todo if d.type == "choice" and i.choices and target not in i.choices]
            if lacking:
                offered = ", ".join(lacking[0].choices)
                items.append(
                    Item(d, insts, None, SKIP, f"this host does not offer {target} (offers {offered})", False)
                )
                continue
            why = d.why
        if unreadable and len(unreadable) == len(insts):
            r = unreadable[0].current
            status = FAILED if explicit else SKIP
            items.append(
                Item(d, insts, target, status, f"cannot read the current value: {r.reason}", explicit)
            )
            continue
        status = WOULD_CHANGE if todo else OK
        reason = why if todo else f"already {_current_text(insts)}" + ("" if explicit else f" ({_fine(d)})")
        if unreadable and not explicit:
            reason += f" [left alone, unreadable: {', '.join(i.label or i.path for i in unreadable)}]"
        items.append(Item(d, insts, target, status, reason, explicit, todo))
    return items


def _common_choices(insts: list[tn.Instance]) -> tuple[str, ...]:
    sets = [set(i.choices) for i in insts if i.choices]
    if not sets:
        return ()
    common = set.intersection(*sets)
    return tuple(c for c in insts[0].choices if c in common)


def _fine(d: tn.TunableDef) -> str:
    if d.accept == "at_least":
        return f"at least {d.desired} is fine"
    if d.accept == "at_most":
        return f"at most {d.desired} is fine"
    if d.accept == "one_of":
        return "fine: " + ", ".join(d.acceptable)
    return "as recommended"


# --------------------------------------------------------------------------------------------------
# apply
# --------------------------------------------------------------------------------------------------
def apply_plan(host: Host, items: list[Item], journal: Journal, writer: tn.Writer) -> None:
    """Set every planned change: journal the old value, write, read back. Never stops at one failure."""
    for item in items:
        if item.status != WOULD_CHANGE or item.target is None:
            continue
        item.status = CHANGED
        for inst in item.todo:
            old = inst.current.value
            if not inst.current.ok or old is None:
                item.results.append(
                    PathResult(
                        inst.path,
                        inst.label,
                        None,
                        item.target,
                        FAILED,
                        f"current value unreadable ({inst.current.reason}); left alone",
                    )
                )
                continue
            entry = journal.record(
                {
                    "kind": "value",
                    "tunable": item.d.name,
                    "path": inst.path,
                    "label": inst.label,
                    "old": old,
                    "new": item.target,
                }
            )
            try:
                tn.set_value(host, inst.path, item.target, writer)
            except OSError as exc:
                item.results.append(
                    PathResult(inst.path, inst.label, old, item.target, FAILED, tn.write_error(exc))
                )
                back = host.read_text(inst.path)
                if back.ok and back.value is not None and tn.same(item.d, tn.parse(item.d, back.value), old):
                    journal.drop(entry)  # nothing changed: nothing to restore
                continue
            got = tn.verify(item.d, host, inst.path, item.target)
            if got.ok:
                item.results.append(PathResult(inst.path, inst.label, old, item.target, CHANGED))
            else:
                item.results.append(PathResult(inst.path, inst.label, old, item.target, MISMATCH, got.reason))
        statuses = {r.status for r in item.results}
        if FAILED in statuses:
            item.status = FAILED
            item.reason = "; ".join(
                sorted(
                    {
                        f"{r.label + ': ' if r.label else ''}{r.reason}"
                        for r in item.results
                        if r.status == FAILED
                    }
                )
            )
        elif MISMATCH in statuses:
            item.status = MISMATCH
            item.reason = "; ".join(r.reason for r in item.results if r.status == MISMATCH)


# --------------------------------------------------------------------------------------------------
# persist
# --------------------------------------------------------------------------------------------------
@dataclass
class PersistFile:
    path: str
    content: str
    action: str  # "create" | "replace" | "unchanged"
    status: str = "planned"  # planned | written | failed
    reason: str = ""


def persist_plan(host: Host, items: list[Item]) -> list[PersistFile]:
    """The sysctl.d and tmpfiles.d files that make this run's values survive reboot."""
    chosen = [
        i
        for i in items
        if i.target is not None and (i.status in (WOULD_CHANGE, CHANGED) or (i.status == OK and i.explicit))
    ]
    out: list[PersistFile] = []
    sysctls = {i.d.name: i.target for i in chosen if i.d.kind == "sysctl" and i.target is not None}
    if sysctls:
        lines = _merge(host, SYSCTL_FILE, {k: f"{k} = {v}" for k, v in sysctls.items()}, _sysctl_key)
        out.append(_persist_file(host, SYSCTL_FILE, lines))
        for i in chosen:
            if i.d.kind == "sysctl":
                i.note = _overridden(host, i.d.name) or ""
    sysfs = {p: f"w {p} - - - - {i.target}" for i in chosen if i.d.kind == "sysfs" for p in i.d.paths}
    if sysfs:
        lines = _merge(host, TMPFILES_FILE, sysfs, _tmpfiles_key)
        out.append(_persist_file(host, TMPFILES_FILE, lines))
    return out


def _sysctl_key(line: str) -> str | None:
    key, eq, _ = line.partition("=")
    return key.strip().replace("/", ".") if eq and not line.lstrip().startswith(("#", ";")) else None


def _tmpfiles_key(line: str) -> str | None:
    parts = line.split()
    return parts[1] if len(parts) >= 2 and parts[0].startswith("w") else None


def _merge(host: Host, hostpath: str, ours: dict[str, str], key_of: Callable[[str], str | None]) -> list[str]:
    """Our lines, plus the lines of an earlier gputune file for keys this run does not touch."""
    kept: list[str] = []
    old = host.read_text(hostpath)
    if old.ok and old.value is not None:
        for line in old.value.splitlines():
            k = key_of(line)
            if k is not None and k not in ours:
                kept.append(line)
    return kept + list(ours.values())


def _persist_file(host: Host, hostpath: str, lines: list[str]) -> PersistFile:
    content = _FILE_HEADER + "".join(line + "\n" for line in lines)
    old = host.read_text(hostpath)
    action = ("unchanged" if old.value == content else "replace") if old.ok else "create"
    return PersistFile(hostpath, content, action)


def _overridden(host: Host, key: str) -> str | None:
    """A sysctl file read after 90-gputune.conf that sets the same key wins at boot: say so."""
    later: list[str] = []
    names = host.listdir("/etc/sysctl.d")
    if names.ok and names.value is not None:
        later = [f"/etc/sysctl.d/{n}" for n in names.value if n.endswith(".conf") and n > "90-gputune.conf"]
    for path in [*later, "/etc/sysctl.conf"]:
        text = host.read_text(path)
        if not text.ok or text.value is None:
            continue
        for line in text.value.splitlines():
            if _sysctl_key(line) == key:
                return f"{path} also sets {key} and is read later at boot: its value wins ({line.strip()})"
    return None


def write_persist(host: Host, files: list[PersistFile], journal: Journal) -> None:
    for f in files:
        if f.action == "unchanged":
            f.status = "written"
            continue
        real = host.path(f.path)
        try:
            made = _make_dirs(host, f.path.rsplit("/", 1)[0])
            for d in made:
                journal.record({"kind": "dir", "path": d})
            old: bytes | None = real.read_bytes() if real.exists() else None
            mode = real.stat().st_mode & 0o7777 if old is not None else None
            data = f.content.encode()
            journal.record(
                {
                    "kind": "file",
                    "path": f.path,
                    "old": base64.b64encode(old).decode() if old is not None else None,
                    "mode": mode,
                    "new_sha256": hashlib.sha256(data).hexdigest(),
                }
            )
            atomic_write(real, data, mode if mode is not None else 0o644)
            f.status = "written"
        except OSError as exc:
            f.status, f.reason = "failed", tn.write_error(exc)


# --------------------------------------------------------------------------------------------------
# revert
# --------------------------------------------------------------------------------------------------
@dataclass
class Restored:
    kind: str
    path: str
    tunable: str
    value: str | None  # the value (or file state) restored
    status: str  # restored | failed | kept
    reason: str = ""


def revert(host: Host, journal: Journal, defs: dict[str, tn.TunableDef], writer: tn.Writer) -> list[Restored]:
    """Replay the journal newest first; drop each restored entry; keep the rest (a partial revert)."""
    done: list[Restored] = []
    blocked: set[str] = set()  # a path whose newer entry failed: its older entries must wait
    for entry in reversed(journal.entries):
        kind, path = entry.get("kind"), str(entry.get("path", ""))
        name = str(entry.get("tunable", kind))
        if path in blocked:
            done.append(
                Restored(str(kind), path, name, None, "kept", "a newer change of this path was not restored")
            )
            continue
        try:
            if kind == "value":
                res = _revert_value(host, entry, defs, writer)
            elif kind == "file":
                res = _revert_file(host, entry)
            elif kind == "dir":
                res = _revert_dir(host, entry)
            else:
                res = Restored(str(kind), path, name, None, "failed", f"unknown journal entry kind {kind!r}")
        except OSError as exc:
            res = Restored(str(kind), path, name, None, "failed", tn.write_error(exc))
        done.append(res)
        if res.status == "failed":
            blocked.add(path)
        else:
            journal.drop(entry)
    if not journal.entries:
        journal.remove()
    return done


def _revert_value(
    host: Host, e: dict[str, Any], defs: dict[str, tn.TunableDef], writer: tn.Writer
) -> Restored:
    name, path, old = str(e["tunable"]), str(e["path"]), str(e["old"])
    d = defs.get(name)
    note = ""
    if d is not None:
        now = host.read_text(path)
        if now.ok and now.value is not None and not tn.same(d, tn.parse(d, now.value), str(e.get("new"))):
            note = f"changed since gputune set {e.get('new')!r} (it was {tn.parse(d, now.value)!r})"
    tn.set_value(host, path, old, writer)
    if d is not None:
        got = tn.verify(d, host, path, old)
        if not got.ok:
            return Restored("value", path, name, old, "failed", got.reason)
    return Restored("value", path, name, old, "restored", note)


def _revert_file(host: Host, e: dict[str, Any]) -> Restored:
    path = str(e["path"])
    real = host.path(path)
    if real.exists() and e.get("new_sha256"):
        now = hashlib.sha256(real.read_bytes()).hexdigest()
        if now != e["new_sha256"]:
            return Restored(
                "file",
                path,
                "persist",
                None,
                "failed",
                "the file changed since gputune wrote it; left in place (merge it by hand)",
            )
    if e.get("old") is None:
        real.unlink(missing_ok=True)
        _fsync_dir(real.parent)
        return Restored("file", path, "persist", "removed (gputune had created it)", "restored")
    atomic_write(real, base64.b64decode(e["old"]), int(e.get("mode") or 0o644))
    return Restored("file", path, "persist", "previous content put back", "restored")


def _revert_dir(host: Host, e: dict[str, Any]) -> Restored:
    path = str(e["path"])
    try:
        host.path(path).rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return Restored("dir", path, "persist", None, "kept", "not empty: other files live there now")
    return Restored("dir", path, "persist", "folder removed (gputune had created it)", "restored")


# --------------------------------------------------------------------------------------------------
# what tune never does itself: GPU commands and manual steps
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    kind: str  # "gpu" (a command for the operator) | "manual" (hardware, firmware, a person)
    id: str
    title: str
    subject: str | None
    commands: tuple[str, ...]
    steps: tuple[str, ...]
    evidence: dict[str, Any]
    needs_bios: bool = False
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "title": self.title,
            "subject": self.subject,
            "commands": list(self.commands),
            "steps": list(self.steps),
            "evidence": self.evidence,
            "needs_bios": self.needs_bios,
            "why": self.why,
        }


GPU_CONDITIONS: dict[str, Callable[[Any], bool]] = {
    "persistence_off": lambda gpu: getattr(gpu, "persistence_mode", None) is False,
}


def _playbooks() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    from tuner.data import load_toml, toml_files

    manual: dict[str, dict[str, Any]] = {}
    gpu: list[dict[str, Any]] = []
    for path in toml_files("playbooks", "remediations"):
        data = load_toml(path)
        for m in data.get("manual", []):
            manual[m["check"]] = m
        gpu.extend(data.get("gpu", []))
    return manual, gpu


def doctor_findings(host: Host) -> tuple[list[Any], str | None]:
    """The doctor's findings on this host root, or the reason there are none."""
    try:
        from tuner.checks import load_defs, run_checks
        from tuner.probes import Facts

        defs = load_defs()
        if not defs:
            return [], "the doctor has no checks installed"
        return run_checks(Facts(host), defs), None
    except Exception as exc:  # the doctor is advice here; its failure must not stop tune
        return [], f"the doctor's checks could not run ({type(exc).__name__}: {exc})"


def operator_steps(defs: dict[str, tn.TunableDef], findings: list[Any], gpus: list[Any]) -> list[Step]:
    """GPU commands (from the GPUs' state and the doctor's findings) and manual remediations
    (the doctor's warn/fail findings that need the BIOS, hardware or a person), with evidence."""
    manual, gpu_books = _playbooks()
    steps: list[Step] = []
    commands_seen: set[str] = set()
    finding_ids = {getattr(f, "id", None) for f in findings}
    for gbook in gpu_books:
        cond = GPU_CONDITIONS.get(gbook.get("when", ""))
        if gbook["id"] in finding_ids:
            continue  # the doctor judged this one itself: its finding (below) carries the command
        for gpu in gpus:
            if cond is not None and cond(gpu):
                cmd = str(gbook["command"]).format(index=gpu.index)
                commands_seen.add(cmd)
                steps.append(
                    Step(
                        "gpu",
                        gbook["id"],
                        gbook.get("title", gbook["id"]),
                        f"gpu{gpu.index}",
                        (cmd,),
                        (),
                        {"gpu": gpu.name, "pci_bus_id": gpu.pci_bus_id},
                        False,
                        gbook.get("why", ""),
                    )
                )
    for f in findings:
        status = getattr(getattr(f, "status", None), "value", "")
        rem = getattr(f, "remediation", None)
        command = getattr(rem, "command", None)
        text = f"{command or ''} {getattr(rem, 'summary', '')}"
        if status not in ("warn", "fail") or any(tn.covers(d, f.id, text) for d in defs.values()):
            continue
        if command and "nvidia-smi" in command:
            if command not in commands_seen:
                commands_seen.add(command)
                steps.append(
                    Step(
                        "gpu",
                        f.id,
                        f.title or f.id,
                        f.subject,
                        (command,),
                        (),
                        f.evidence,
                        False,
                        rem.summary if rem else f.summary,
                    )
                )
            continue
        book: dict[str, Any] | None = manual.get(f.id)
        if book is None and not (rem is not None and (rem.needs_bios or rem.command is None)):
            continue
        # the finding's own advice first (it is specific to what was seen), then the playbook's how-to
        lines = ((rem.summary,) if rem else ()) + (tuple(book["steps"]) if book else ())
        steps.append(
            Step(
                "manual",
                f.id,
                (book or {}).get("title", f.title or f.id),
                f.subject,
                (command,) if command else (),
                lines,
                {"status": status, "finding": f.summary, **(f.evidence or {})},
                bool((book or {}).get("needs_bios")) or bool(rem and rem.needs_bios),
            )
        )
    return steps


def _gpus(host: Host) -> list[Any]:
    try:
        from tuner import gpu as gpu_mod

        read = getattr(gpu_mod, "read_gpus", None)
        if read is None:
            return []
        inv = read(host)
        return list(inv.gpus) if inv.state is State.OK else []
    except Exception:  # no GPU stack here is the common case, not an error of tune's
        return []


# --------------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------------
@dataclass
class Report:
    mode: str  # dry-run | apply | revert
    root: str
    items: list[Item] = field(default_factory=list)
    persist: list[PersistFile] = field(default_factory=list)
    restored: list[Restored] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    journal: dict[str, Any] = field(default_factory=dict)
    persist_requested: bool = False
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "tune",
            "mode": self.mode,
            "root": self.root,
            "changes": [i.to_dict(self.persist_requested) for i in self.items],
            "persist": [
                {
                    "path": f.path,
                    "action": f.action,
                    "status": f.status,
                    "reason": f.reason or None,
                    "content": f.content,
                }
                for f in self.persist
            ],
            "reverted": [
                {
                    "kind": r.kind,
                    "path": r.path,
                    "tunable": r.tunable,
                    "value": r.value,
                    "status": r.status,
                    "reason": r.reason or None,
                }
                for r in self.restored
            ],
            "operator_steps": [s.to_dict() for s in self.steps],
            "journal": self.journal,
            "notices": self.notices,
            "exit_code": self.exit_code,
        }


def render(report: Report, fmt: str, out: Any = None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    if out.isatty():
        _render_rich(report, out)
    else:
        _render_plain(report, out)


def _rows(report: Report) -> list[tuple[str, str, str, str, str, str]]:
    rows = []
    for i in report.items:
        new = (
            i.target
            if i.status in (WOULD_CHANGE, CHANGED, MISMATCH, FAILED) and i.target is not None
            else "-"
        )
        rows.append(
            (
                i.d.name,
                i.current,
                new,
                i.status,
                _survives(i, report.persist_requested),
                i.reason + (f" [note: {i.note}]" if i.note else ""),
            )
        )
    return rows


def _evidence_line(evidence: dict[str, Any], limit: int = 8) -> str:
    """The finding and its first few plain facts; the full evidence is in --format json."""
    head = str(evidence.get("finding", ""))
    facts = [
        f"{k}={v}"
        for k, v in evidence.items()
        if k not in ("finding", "status") and isinstance(v, str | int | float | bool) and v is not None
    ][:limit]
    return "; ".join(x for x in [head, ", ".join(facts)] if x)


def _render_plain(report: Report, out: Any) -> None:
    w = out.write
    if report.items:
        header = ("TUNABLE", "CURRENT", "NEW", "STATUS", "SURVIVES REBOOT")
        rows = _rows(report)
        widths = [max(len(header[c]), *(len(r[c]) for r in rows)) for c in range(5)]
        w("  ".join(h.ljust(widths[c]) for c, h in enumerate(header)).rstrip() + "\n")
        for r in rows:
            w("  ".join(r[c].ljust(widths[c]) for c in range(5)).rstrip() + "\n")
            w(f"    why: {r[5]}\n")
    for f in report.persist:
        w(f"persist: {f.path}: {f.action} ({f.status}{': ' + f.reason if f.reason else ''})\n")
        for line in f.content.splitlines():
            w(f"    {line}\n")
    for rr in report.restored:
        w(
            f"revert: {rr.tunable} {rr.path}: {rr.status}"
            f"{' -> ' + rr.value if rr.value else ''}{' (' + rr.reason + ')' if rr.reason else ''}\n"
        )
    for s in report.steps:
        label = "run yourself" if s.kind == "gpu" else ("manual, BIOS" if s.needs_bios else "manual")
        w(f"[{label}] {s.title}{' (' + s.subject + ')' if s.subject else ''}\n")
        for c in s.commands:
            w(f"    $ {c}\n")
        for line in s.steps:
            w(f"    - {line}\n")
        if s.why:
            w(f"    why: {s.why}\n")
        if s.evidence:
            w(f"    evidence: {_evidence_line(s.evidence)}\n")


def _render_rich(report: Report, out: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(file=out)
    colour = {
        WOULD_CHANGE: "yellow",
        CHANGED: "green",
        OK: "green",
        SKIP: "dim",
        FAILED: "red",
        MISMATCH: "red",
    }
    if report.items:
        t = Table(title=f"gputune tune ({report.mode})", show_lines=False)
        for col in ("tunable", "current", "new", "status", "survives reboot", "why"):
            t.add_column(col, overflow="fold")
        for i, row in zip(report.items, _rows(report), strict=True):
            st = colour.get(i.status, "")
            t.add_row(row[0], row[1], row[2], f"[{st}]{row[3]}[/]" if st else row[3], row[4], row[5])
        con.print(t)
    for f in report.persist:
        con.print(
            f"[bold]persist[/] {f.path}: {f.action} ({f.status}{': ' + f.reason if f.reason else ''})",
            highlight=False,
        )
        con.print(f.content.rstrip(), markup=False, highlight=False)
    for r in report.restored:
        st = "green" if r.status == "restored" else "red"
        con.print(
            f"revert {r.tunable} {r.path}: [{st}]{r.status}[/]"
            f"{' -> ' + r.value if r.value else ''}{' (' + r.reason + ')' if r.reason else ''}",
            highlight=False,
        )
    for s in report.steps:
        label = "run yourself" if s.kind == "gpu" else ("manual, BIOS" if s.needs_bios else "manual")
        con.print(
            f"[bold]\\[{label}][/] {s.title}{' (' + s.subject + ')' if s.subject else ''}", highlight=False
        )
        for c in s.commands:
            con.print(f"    $ {c}", markup=False, highlight=False)
        for line in s.steps:
            con.print(f"    - {line}", markup=False, highlight=False)
        if s.why:
            con.print(f"    why: {s.why}", markup=False, highlight=False)
        if s.evidence:
            con.print(f"    evidence: {_evidence_line(s.evidence)}", markup=False, highlight=False)


def _say(msg: str) -> None:
    print(f"gputune tune: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------------------
def main(
    apply: bool,
    revert: bool,
    sets: list[str],
    only: list[str],
    persist: bool,
    root: Path | None,
    fmt: str,
) -> int:
    """`gputune tune` as the command line calls it."""
    return run(apply=apply, revert=revert, sets=sets, only=only, persist=persist, root=root, fmt=fmt)


def run(
    *,
    apply: bool = False,
    revert: bool = False,
    sets: list[str] | None = None,
    only: list[str] | None = None,
    persist: bool = False,
    root: Path | None = None,
    fmt: str = "table",
    writer: tn.Writer | None = None,
    euid: Callable[[], int] = os.geteuid,
    doctor: bool = True,
    out: Any = None,
) -> int:
    """The whole command, with its seams injectable: the value writer (a kernel refusing a write,
    a crash between two writes), the effective uid, and whether to run the doctor's checks."""
    sets, only = list(sets or []), list(only or [])
    if apply and revert:
        raise UsageError("--apply and --revert do opposite things", "give one of them")
    if revert and (sets or only or persist):
        raise UsageError(
            "--revert restores the whole journal; --set/--only/--persist do not go with it",
            "run `gputune tune --revert` alone",
        )
    defs = tn.load_defs()
    wanted = parse_sets(sets, defs)
    host = _open_host(root, writable=apply or revert)
    lock = _lock(host)
    try:
        if lock is None and (apply or revert):
            raise BadAnswer(
                f"another `gputune tune --apply/--revert` is running on {host.root}",
                "wait for it to finish, then run this again",
            )
        journal = Journal.load(host)
        report = Report(
            "revert" if revert else "apply" if apply else "dry-run", str(host.root), persist_requested=persist
        )
        revert_cmd = "sudo gputune tune --revert" + (f" --root {host.root}" if not host.live else "")
        if lock is None:
            report.notices.append(
                "another `gputune tune --apply/--revert` is running now; this plan may be stale"
            )
        elif journal.interrupted and not revert:
            report.notices.append(
                f"an earlier `gputune tune --apply` did not finish (journal {JOURNAL} under {host.root}:"
                f" {journal.describe()}); restore what it changed with `{revert_cmd}`"
            )
        elif journal.exists and not revert:
            report.notices.append(
                f"changes of an earlier apply are in effect ({journal.describe()});"
                f" `{revert_cmd}` undoes them"
            )
        for n in report.notices:
            _say(n)

        if revert:
            return _do_revert(host, journal, defs, writer, euid, report, fmt, out)

        report.items = build_plan(host, defs, wanted, only)
        if apply and euid() != 0:
            _say("--apply changes kernel settings and must run as root: `sudo gputune tune --apply`")
            report.notices.append("not root: nothing was changed")
            return _finish_early(report, fmt, out)
        if apply and journal.interrupted:
            _say(f"refusing to apply on top of an unfinished journal; run `{revert_cmd}` first")
            return _finish_early(report, fmt, out)
        if persist:
            report.persist = persist_plan(host, report.items)
        if not sets and not only:
            findings, why_not = doctor_findings(host) if doctor else ([], None)
            if why_not:
                report.notices.append(why_not)
            report.steps = operator_steps(defs, findings, _gpus(host) if doctor else [])

        if apply:
            journal.begin()
            apply_plan(host, report.items, journal, writer or tn.default_writer(host))
            if persist:
                report.persist = persist_plan(host, report.items)
                write_persist(host, report.persist, journal)
            journal.finish()
        report.journal = {
            "path": JOURNAL,
            "exists": journal.exists,
            "entries": len(journal.entries),
            "state": (journal.data or {}).get("state"),
        }
        bad = [i for i in report.items if i.status in (FAILED, MISMATCH)] if apply else []
        bad_files = [f for f in report.persist if f.status == "failed"]
        for i in bad:
            _say(f"{i.d.name}: {i.status}: {i.reason}")
        for f in bad_files:
            _say(f"{f.path}: {f.reason}")
        if apply and journal.exists:
            _say(f"old values saved in {host.path(JOURNAL)}; `{revert_cmd}` restores them")
        report.exit_code = int(ExitCode.BAD_ANSWER if (bad or bad_files) else ExitCode.OK)
        render(report, fmt, out)
        return report.exit_code
    finally:
        if lock is not None and lock >= 0:
            os.close(lock)
        host.close()


def _finish_early(report: Report, fmt: str, out: Any) -> int:
    """Nothing was changed and the answer is bad; JSON readers still get a report."""
    report.exit_code = int(ExitCode.BAD_ANSWER)
    if fmt == "json":
        render(report, fmt, out)
    return report.exit_code


def _lock(host: Host) -> int | None:
    """An exclusive lock on the host root folder (no file is created, so test trees stay as they
    were): one apply or revert at a time. None when another holder has it."""
    import fcntl

    try:
        fd = os.open(host.root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return -1  # nothing to lock (an archive): nothing will be written either
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _do_revert(
    host: Host,
    journal: Journal,
    defs: dict[str, tn.TunableDef],
    writer: tn.Writer | None,
    euid: Callable[[], int],
    report: Report,
    fmt: str,
    out: Any,
) -> int:
    if not journal.exists:
        _say(f"nothing to revert: no journal at {host.path(JOURNAL)}")
        render(report, fmt, out)
        return int(ExitCode.OK)
    if euid() != 0:
        _say("--revert changes kernel settings and must run as root: `sudo gputune tune --revert`")
        return int(ExitCode.BAD_ANSWER)
    report.restored = revert(host, journal, defs, writer or tn.default_writer(host))
    left = len(journal.entries)
    report.journal = {"path": JOURNAL, "exists": journal.exists, "entries": left}
    if left:
        _say(
            f"revert incomplete: {left} saved value(s) kept in {host.path(JOURNAL)};"
            " fix the cause and run it again"
        )
        report.exit_code = int(ExitCode.BAD_ANSWER)
    else:
        _say("reverted: every saved value is restored and the journal removed")
    render(report, fmt, out)
    return report.exit_code


def _open_host(root: Path | None, writable: bool) -> Host:
    if root is None or Path(root).resolve() == Path("/"):
        return Host.live_host()
    host = Host.at(root)
    if writable and not Path(root).is_dir():
        host.close()
        raise UsageError(
            f"--root {root}: --apply/--revert need a writable folder, not an archive",
            "unpack the snapshot into a folder first",
        )
    return host

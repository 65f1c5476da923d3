"""The host root: every path gputune reads goes through one of these.

Like node_exporter's ``--path.sysfs``/``--path.procfs``/``--path.rootfs``, one
seam lets the same probes run on the live machine (root ``/``), on a snapshot
(a directory or a ``.tar.gz`` made by ``gputune snapshot``) and on test trees.

Paths are given as host paths ("/sys/class/..." or "sys/class/..."); nothing
outside this module builds a literal absolute path to read.

Snapshots may store a symbolic link as a small regular file whose text is the
link target (archives and copies that drop links do this); :meth:`Host.readlink`
and :meth:`Host.resolve` treat such a file as the link it stood for.

Reads return :class:`Reading` values that keep *absent*, *denied* and *error*
apart, so a VM without cpufreq is "not applicable here", not a failure.
"""

from __future__ import annotations

import enum
import errno
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from tuner.errors import UsageError

if TYPE_CHECKING:
    import tempfile  # imported where a tarball is opened: the live doctor never needs it

T = TypeVar("T")

# Files that only snapshots carry, at the snapshot's top level.
NVIDIA_SMI_XML = "nvidia-smi.xml"  # output of `nvidia-smi -q -x`; absent = no GPU
PIP_FREEZE = "pip-freeze.txt"  # output of `pip freeze`
DMESG = "dmesg.txt"  # kernel log tail
NVML_JSON = "nvml.json"  # NVML readings taken by `gputune snapshot`
SNAPSHOT_META = "gputune-snapshot.json"  # who made the snapshot, when, with what

_LINK_FILE_MAX = 512  # a "link file" is a one-line relative path, never bigger


class State(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of members
    """Why a value is (not) there. Only OK carries a value."""

    OK = "ok"
    ABSENT = "absent"  # the file/device/feature does not exist here (a VM without cpufreq)
    DENIED = "denied"  # it exists but we may not read it (not root)
    UNSUPPORTED = "unsupported"  # the driver/device says it does not support this
    ERROR = "error"  # it exists and reading or parsing it broke


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A value with the reason it may be missing (psutil's AccessDenied, node_exporter's ErrNoData)."""

    state: State
    value: T | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.state is State.OK

    @staticmethod
    def of(value: T) -> Reading[T]:
        return Reading(State.OK, value)

    @staticmethod
    def missing(state: State, reason: str) -> Reading[T]:
        return Reading(state, None, reason)

    def as_int(self) -> int | None:
        """The value read as a whole number (a sysfs/procfs count or setting); None when the value is
        missing or not one."""
        if self.state is not State.OK or not isinstance(self.value, str):
            return None
        try:
            return int(self.value.strip())
        except ValueError:
            return None

    def map(self, fn: Callable[[T], object]) -> Reading[object]:
        """Apply a parser; a parser that raises turns the reading into ERROR with the reason."""
        if self.state is not State.OK or self.value is None:
            return Reading(self.state, None, self.reason)
        try:
            return Reading.of(fn(self.value))
        except (ValueError, KeyError, IndexError, TypeError, ArithmeticError) as exc:
            return Reading.missing(State.ERROR, f"could not parse: {exc}")


def state_of_oserror(exc: OSError) -> State:
    """Classify an OSError by errno, never by its text."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.ENXIO):
        return State.ABSENT
    if exc.errno in (errno.EACCES, errno.EPERM):
        return State.DENIED
    if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
        return State.UNSUPPORTED
    return State.ERROR


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], CommandResult]
"""Runs a command with a timeout in seconds; injected so tests never patch subprocess."""


def run_command(argv: Sequence[str], timeout: float = 10.0) -> CommandResult:
    """The live runner. A missing program or a timeout is a result, not an exception."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False, errors="replace"
        )
    except FileNotFoundError:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not found")
    except PermissionError as exc:
        return CommandResult(tuple(argv), 126, "", f"{argv[0]}: {exc.strerror}")
    except subprocess.TimeoutExpired:
        return CommandResult(tuple(argv), 124, "", f"{argv[0]}: timed out after {timeout:g} s")
    return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def _no_commands(argv: Sequence[str], timeout: float = 10.0) -> CommandResult:
    return CommandResult(tuple(argv), 127, "", "commands are not run against a snapshot")


class Host:
    """A host root. ``Host.live()`` is this machine; ``Host.at(path)`` a snapshot or test tree."""

    def __init__(self, root: str | os.PathLike[str], *, live: bool, runner: Runner | None = None) -> None:
        self.root = Path(root)
        self.live = live
        self.run: Runner = runner or (run_command if live else _no_commands)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def live_host(cls, runner: Runner | None = None) -> Host:
        return cls("/", live=True, runner=runner)

    @classmethod
    def at(cls, path: str | os.PathLike[str], runner: Runner | None = None) -> Host:
        """A snapshot directory, a snapshot tarball (.tar.gz/.tgz/.tar) or a test tree."""
        p = Path(path)
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory", "give a snapshot folder or .tar.gz")
        if p.is_dir():
            return cls(p, live=False, runner=runner)
        if not p.is_file():  # a device or a pipe: reading it as an archive may never end
            raise UsageError(f"{p}: not a folder or a regular file", "give a snapshot folder or .tar.gz")
        import tarfile
        import tempfile

        host = cls(p, live=False, runner=runner)
        host._tmp = tempfile.TemporaryDirectory(prefix="gputune-snap-")
        try:
            with tarfile.open(p) as tar:
                tar.extractall(host._tmp.name, filter="data")
        except (tarfile.TarError, OSError, EOFError) as exc:
            host.close()
            raise UsageError(
                f"{p}: not a readable snapshot archive ({exc})",
                "make one with `gputune snapshot -o FILE.tar.gz`",
            ) from exc
        top = Path(host._tmp.name)
        entries = [e for e in top.iterdir() if e.name not in (".", "..")]
        # `tar czf x.tgz snapdir/` puts everything one level down: accept that too.
        if len(entries) == 1 and entries[0].is_dir() and not (top / "proc").exists():
            top = entries[0]
        host.root = top
        return host

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Host({str(self.root)!r}, live={self.live})"

    # -- paths ----------------------------------------------------------------------------------
    def path(self, hostpath: str) -> Path:
        """The real path of a host path under this root (no link resolution)."""
        return self.root / hostpath.lstrip("/")

    def extra(self, name: str) -> Path:
        """A snapshot-only top-level file (``nvidia-smi.xml``, ``pip-freeze.txt``, ...)."""
        return self.root / name

    def exists(self, hostpath: str) -> bool:
        return self.resolve_path(hostpath).exists()

    # -- reading --------------------------------------------------------------------------------
    def read_text(self, hostpath: str, limit: int = 4 << 20) -> Reading[str]:
        """Read a (small) text file; at most ``limit`` bytes. Never raises for OS errors."""
        try:
            with self.resolve_path(hostpath).open("rb") as fh:
                data = fh.read(limit)
        except OSError as exc:
            return Reading.missing(state_of_oserror(exc), f"{hostpath}: {exc.strerror or exc}")
        return Reading.of(data.decode("utf-8", errors="replace"))

    def read_value(self, hostpath: str) -> Reading[str]:
        """A one-value sysfs/procfs file, stripped."""
        r = self.read_text(hostpath, limit=64 << 10)
        if not r.ok or r.value is None:
            return r
        return Reading.of(r.value.strip())

    def listdir(self, hostpath: str) -> Reading[list[str]]:
        try:
            return Reading.of(sorted(os.listdir(self.resolve_path(hostpath))))
        except OSError as exc:
            return Reading.missing(state_of_oserror(exc), f"{hostpath}: {exc.strerror or exc}")

    def readlink(self, hostpath: str) -> str | None:
        """The target of a link (a real symlink, or a snapshot's link file), else None."""
        real = self.path(hostpath)
        try:
            if real.is_symlink():
                return os.readlink(real)
            # Only sysfs is made of links; a procfs or /etc file is never read as one.
            if self.live or not hostpath.lstrip("/").startswith("sys/"):
                return None
            if not real.is_file() or real.stat().st_size > _LINK_FILE_MAX:
                return None
            text = real.read_text(errors="replace").strip()
        except OSError:
            return None
        if text and "\n" not in text and (text.startswith("../") or text.startswith("/")) and " " not in text:
            return text
        return None

    def resolve(self, hostpath: str) -> str:
        """Resolve links component by component, staying inside the root; returns a host path."""
        parts = [p for p in hostpath.split("/") if p]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if done:
                    done.pop()
                continue
            cur = "/" + "/".join([*done, part])
            target = self.readlink(cur) if (parts or self._is_link_like(cur)) else None
            if target is None:
                done.append(part)
                continue
            hops += 1
            if hops > 40:
                raise OSError(errno.ELOOP, "too many levels of links", cur)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
        return "/" + "/".join(done)

    def _is_link_like(self, hostpath: str) -> bool:
        return self.path(hostpath).is_symlink() or self.readlink(hostpath) is not None

    def resolve_path(self, hostpath: str) -> Path:
        """The real filesystem path to open for a host path, links resolved inside the root."""
        if self.live:
            return self.path(hostpath)
        try:
            return self.path(self.resolve(hostpath))
        except OSError:
            return self.path(hostpath)

    def which(self, program: str) -> str | None:
        """A program on PATH (live host only)."""
        return shutil.which(program) if self.live else None

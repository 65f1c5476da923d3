"""Host memory facts: RAM, /dev/shm, the memlock limit, the cgroup limit, THP, swappiness, overcommit.

Sources (all through the host root):
- ``/proc/meminfo``: MemTotal, MemAvailable, SwapTotal, SwapFree;
- ``/dev/shm``: ``statvfs`` on the live host; the ``size=`` option of its tmpfs line in
  ``/proc/self/mountinfo`` or ``/proc/mounts`` in a snapshot (tmpfs without ``size=`` is half of RAM);
- ``RLIMIT_MEMLOCK``: ``resource.getrlimit`` live, "Max locked memory" of ``/proc/self/limits``;
- ``/proc/self/cgroup`` then ``/sys/fs/cgroup/<path>/memory.max`` (v2) or
  ``/sys/fs/cgroup/memory/<path>/memory.limit_in_bytes`` (v1); inside a container the
  cgroup's own files sit at the cgroup root;
- ``/sys/kernel/mm/transparent_hugepage/{enabled,defrag}``;
- ``/proc/sys/vm/{swappiness,overcommit_memory}``;
- ``/sys/class/infiniband``: RDMA devices (the memlock limit matters for them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.host import Host, State

if TYPE_CHECKING:
    from tuner.probes import Facts

UNLIMITED = -1  # RLIMIT_INFINITY, "unlimited" in /proc/self/limits
_CGROUP_NO_LIMIT = 1 << 62  # v1 writes PAGE_COUNTER_MAX (~2^63) for "no limit"


@dataclass(frozen=True)
class Mount:
    device: str  # source: /dev/nvme0n1p2, tmpfs, ...
    mount_point: str  # where it is mounted (octal escapes undone)
    fstype: str
    options: tuple[str, ...]  # mount options, super-block options appended for mountinfo
    major: int | None = None  # st_dev major:minor, from mountinfo only
    minor: int | None = None

    def option(self, name: str) -> str | None:
        for opt in self.options:
            key, eq, value = opt.partition("=")
            if key == name:
                return value if eq else ""
        return None


@dataclass(frozen=True)
class MemoryFacts:
    mem_total: int | None  # bytes, /proc/meminfo MemTotal
    mem_available: int | None  # bytes, /proc/meminfo MemAvailable
    swap_total: int | None  # bytes, /proc/meminfo SwapTotal
    swap_free: int | None  # bytes, /proc/meminfo SwapFree
    meminfo_reason: str  # why the numbers are missing, "" when read
    shm_size: int | None  # bytes, /dev/shm capacity
    shm_free: int | None  # bytes, live host only
    shm_source: str  # "statvfs" | "mountinfo" | "mounts" | ""
    shm_reason: str  # why shm_size is missing
    memlock_soft: int | None  # bytes; UNLIMITED (-1) for unlimited
    memlock_hard: int | None
    memlock_source: str  # "getrlimit" | "/proc/self/limits" | ""
    cgroup_version: int | None  # 1 or 2
    cgroup_path: str | None  # the process's memory cgroup, /proc/self/cgroup
    cgroup_limit: int | None  # bytes; None = no limit set (or unknown, see cgroup_reason)
    cgroup_limit_file: str | None  # the file the limit was read from
    cgroup_reason: str  # why the limit is unknown, "" when known
    thp_enabled: str | None  # the [selected] word of transparent_hugepage/enabled
    thp_defrag: str | None  # the [selected] word of transparent_hugepage/defrag
    swappiness: int | None  # /proc/sys/vm/swappiness
    overcommit_memory: int | None  # /proc/sys/vm/overcommit_memory (0 heuristic, 1 always, 2 strict)
    rdma_devices: tuple[str, ...]  # /sys/class/infiniband entries


# -- pure parsers -------------------------------------------------------------------------------
def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` (or a node's meminfo, "Node 0 MemTotal: ...") -> bytes (or counts).

    Lines that do not parse are left out; a value with a ``kB`` unit is turned into bytes.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(":")
        if not sep:
            continue
        words = left.split()
        fields = right.split()
        if not words or not fields:
            continue
        try:
            value = int(fields[0])
        except ValueError:
            continue
        if len(fields) > 1 and fields[1].lower() == "kb":
            value *= 1024
        out[words[-1]] = value
    return out


def unescape_mount_field(field: str) -> str:
    """Undo the octal escapes (``\\040`` = space) the kernel puts in mount tables."""
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """``/proc/PID/mountinfo``: "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw"."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 6 or len(fields) < sep + 3:
            continue
        major_s, _, minor_s = fields[2].partition(":")
        try:
            major, minor = int(major_s), int(minor_s)
        except ValueError:
            major = minor = None  # type: ignore[assignment]
        opts = tuple(fields[5].split(",")) + tuple(
            fields[sep + 3].split(",") if len(fields) > sep + 3 else ()
        )
        mounts.append(
            Mount(
                unescape_mount_field(fields[sep + 2]),
                unescape_mount_field(fields[4]),
                fields[sep + 1],
                opts,
                major,
                minor,
            )
        )
    return mounts


def parse_mounts(text: str) -> list[Mount]:
    """``/proc/mounts``: "tmpfs /dev/shm tmpfs rw,size=65536k 0 0"."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        mounts.append(
            Mount(
                unescape_mount_field(fields[0]),
                unescape_mount_field(fields[1]),
                fields[2],
                tuple(fields[3].split(",")),
            )
        )
    return mounts


def read_mounts(host: Host) -> tuple[list[Mount], str]:
    """The mount table as the host root shows it: mountinfo first, /proc/mounts otherwise."""
    for path, parser in (("/proc/self/mountinfo", parse_mountinfo), ("/proc/mounts", parse_mounts)):
        r = host.read_text(path)
        if r.ok and r.value is not None:
            mounts = parser(r.value)
            if mounts:
                return mounts, path.rsplit("/", 1)[-1]
    return [], ""


def mount_for(mounts: list[Mount], path: str) -> Mount | None:
    """The mount a path lives on: the longest mount point that is a prefix of it (the last one wins)."""
    best: Mount | None = None
    best_len = -1
    for m in mounts:
        mp = m.mount_point.rstrip("/") or "/"
        if (mp == "/" or path == mp or path.startswith(mp + "/")) and len(mp) >= best_len:
            best, best_len = m, len(mp)
    return best


def parse_size(text: str) -> int:
    """A tmpfs ``size=`` value: bytes, or with a k/m/g/t suffix (powers of 1024); ``%`` is not handled."""
    text = text.strip().lower()
    mult = 1
    if text and text[-1] in "kmgt":
        mult = 1024 ** ("kmgt".index(text[-1]) + 1)
        text = text[:-1]
    value = int(text)
    if value < 0:
        raise ValueError("negative size")
    return value * mult


def _limit_value(word: str) -> int:
    if word == "unlimited":
        return UNLIMITED
    value = int(word)
    # some kernels print RLIM_INFINITY minus a page or so instead of "unlimited"
    return UNLIMITED if value >= (1 << 63) - (1 << 24) else value


def parse_limits(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/PID/limits`` -> {"Max locked memory": (soft, hard)}, UNLIMITED for unlimited."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[1:]:
        words = line.split()
        # The name is free text; soft and hard are the first two value-like words after it.
        values = [i for i, w in enumerate(words) if w == "unlimited" or w.isdigit()]
        if len(values) < 2:
            continue
        name = " ".join(words[: values[0]])
        out[name] = (_limit_value(words[values[0]]), _limit_value(words[values[1]]))
    return out


def parse_ulimit_memlock(text: str) -> int | None:
    """The "max locked memory (kbytes, -l) 8192" line of `ulimit -a` -> bytes (UNLIMITED, None if absent)."""
    for line in text.splitlines():
        if "(kbytes, -l)" in line or line.lower().startswith("max locked memory"):
            word = line.split()[-1] if line.split() else ""
            if word == "unlimited":
                return UNLIMITED
            if word.isdigit():
                return int(word) * 1024
    return None


def parse_selected(text: str) -> str | None:
    """The bracketed choice of a sysfs selector: "always [madvise] never" -> "madvise"."""
    start, end = text.find("["), text.find("]")
    if start < 0 or end <= start:
        word = text.strip()
        return word if word and " " not in word else None
    return text[start + 1 : end].strip() or None


def parse_proc_cgroup(text: str) -> tuple[int | None, str | None]:
    """``/proc/self/cgroup`` -> (version, path of the memory cgroup)."""
    v2: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if "memory" in controllers.split(","):
            return 1, path.strip() or "/"
        if hid == "0" and controllers == "":
            v2 = path.strip() or "/"
    return (2, v2) if v2 is not None else (None, None)


def parse_cgroup_limit(text: str) -> int | None:
    """``memory.max`` ("max" or bytes) / ``memory.limit_in_bytes``: None = no limit."""
    text = text.strip()
    if text == "max":
        return None
    value = int(text)
    if value < 0:
        raise ValueError("negative limit")
    return None if value >= _CGROUP_NO_LIMIT else value


# -- reading ------------------------------------------------------------------------------------
def read_meminfo(host: Host) -> tuple[dict[str, int], str]:
    r = host.read_text("/proc/meminfo", limit=256 << 10)
    if not r.ok or r.value is None:
        return {}, r.reason or "/proc/meminfo unreadable"
    info = parse_meminfo(r.value)
    return info, "" if "MemTotal" in info else "/proc/meminfo has no MemTotal line"


def _read_shm(host: Host, mem_total: int | None) -> tuple[int | None, int | None, str, str]:
    if host.live:
        try:
            st = os.statvfs(host.path("/dev/shm"))
        except OSError as exc:
            return None, None, "", f"/dev/shm: {exc.strerror or exc}"
        return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, "statvfs", ""
    mounts, source = read_mounts(host)
    if not source:
        return None, None, "", "the snapshot has no mount table (/proc/self/mountinfo, /proc/mounts)"
    shm = [m for m in mounts if m.mount_point == "/dev/shm"]
    if not shm:
        return None, None, source, "nothing is mounted on /dev/shm"
    size = shm[-1].option("size")
    if size is None or size.endswith("%"):
        if mem_total is None:
            return None, None, source, "/dev/shm has no size= option and MemTotal is unknown"
        pct = 50
        if size:
            try:
                pct = int(size[:-1])
            except ValueError:
                pct = 50
        return mem_total * pct // 100, None, source, ""
    try:
        return parse_size(size), None, source, ""
    except ValueError:
        return None, None, source, f"/dev/shm size={size!r} does not parse"


def _read_memlock(host: Host) -> tuple[int | None, int | None, str]:
    if host.live:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        inf = resource.RLIM_INFINITY
        return (UNLIMITED if soft == inf else soft), (UNLIMITED if hard == inf else hard), "getrlimit"
    r = host.read_text("/proc/self/limits", limit=64 << 10)
    if r.ok and r.value is not None:
        lim = parse_limits(r.value).get("Max locked memory")
        if lim is not None:
            return lim[0], lim[1], "/proc/self/limits"
    # `ulimit -a` output kept beside a snapshot (soft limit only)
    for name in ("ulimit.txt", "extra/ulimit.txt"):
        path = host.extra(name)
        try:
            ulimit = path.read_text(errors="replace")[: 64 << 10] if path.is_file() else None
        except OSError:
            ulimit = None
        if ulimit is not None:
            ul_soft = parse_ulimit_memlock(ulimit)
            if ul_soft is not None:
                return ul_soft, None, name
    return None, None, ""


def _read_cgroup(host: Host) -> tuple[int | None, str | None, int | None, str | None, str]:
    r = host.read_text("/proc/self/cgroup", limit=64 << 10)
    if not r.ok or r.value is None:
        return None, None, None, None, r.reason or "/proc/self/cgroup unreadable"
    version, path = parse_proc_cgroup(r.value)
    if version is None or path is None:
        return None, None, None, None, "no memory cgroup in /proc/self/cgroup"
    rel = path.strip("/")
    if version == 2:
        candidates = [f"/sys/fs/cgroup/{rel}/memory.max" if rel else "", "/sys/fs/cgroup/memory.max"]
    else:
        candidates = [
            f"/sys/fs/cgroup/memory/{rel}/memory.limit_in_bytes" if rel else "",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ]
    reason = "no cgroup memory limit file is readable"
    for cand in [c for c in candidates if c]:
        lim = host.read_value(cand)
        if lim.state is State.ABSENT:
            continue
        if not lim.ok or lim.value is None:
            reason = lim.reason
            continue
        try:
            return version, path, parse_cgroup_limit(lim.value), cand, ""
        except ValueError:
            reason = f"{cand}: {lim.value[:40]!r} is not a limit"
    return version, path, None, None, reason


def probe(facts: Facts) -> MemoryFacts:
    host = facts.host
    info, mreason = read_meminfo(host)
    mem_total = info.get("MemTotal")
    shm_size, shm_free, shm_source, shm_reason = _read_shm(host, mem_total)
    ml_soft, ml_hard, ml_source = _read_memlock(host)
    cg_version, cg_path, cg_limit, cg_file, cg_reason = _read_cgroup(host)
    thp = host.read_value("/sys/kernel/mm/transparent_hugepage/enabled")
    defrag = host.read_value("/sys/kernel/mm/transparent_hugepage/defrag")
    ib = host.listdir("/sys/class/infiniband")
    return MemoryFacts(
        mem_total=mem_total,
        mem_available=info.get("MemAvailable"),
        swap_total=info.get("SwapTotal"),
        swap_free=info.get("SwapFree"),
        meminfo_reason=mreason,
        shm_size=shm_size,
        shm_free=shm_free,
        shm_source=shm_source,
        shm_reason=shm_reason,
        memlock_soft=ml_soft,
        memlock_hard=ml_hard,
        memlock_source=ml_source,
        cgroup_version=cg_version,
        cgroup_path=cg_path,
        cgroup_limit=cg_limit,
        cgroup_limit_file=cg_file,
        cgroup_reason=cg_reason,
        thp_enabled=parse_selected(thp.value) if thp.ok and thp.value else None,
        thp_defrag=parse_selected(defrag.value) if defrag.ok and defrag.value else None,
        swappiness=host.read_value("/proc/sys/vm/swappiness").as_int(),
        overcommit_memory=host.read_value("/proc/sys/vm/overcommit_memory").as_int(),
        rdma_devices=tuple(ib.value or ()) if ib.ok else (),
    )


def fmt_bytes(n: int | None) -> str:
    """Bytes for people: 1536 MiB -> "1.5 GiB"; None -> "unknown"."""
    if n is None:
        return "unknown"
    if n < 0:
        return "unlimited"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"

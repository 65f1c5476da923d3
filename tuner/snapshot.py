"""`gputune snapshot`: capture what the doctor reads into one tarball, secrets redacted.

Layout of the archive (the same a person can assemble by hand for ``gputune doctor --from``):

- the host's files at their own paths: ``proc/...``, ``sys/...``, ``etc/os-release``; sysfs
  symbolic links are stored as links (``sys/bus/pci/devices/X -> ../../../devices/...``),
  ``/proc/self/*`` as the files of the snapshotting process;
- ``nvidia-smi.xml`` (``nvidia-smi -q -x``, when nvidia-smi exists), ``nvml.json`` (the NVML
  inventory), ``pip-freeze.txt`` and ``packages.json`` (installed distributions with their
  requirements, from importlib.metadata), ``dmesg.txt`` (kernel log tail);
- ``gputune-snapshot.json``: when, by which gputune, on which host, what was skipped and why.

What is captured is driven by what the probes read: :data:`CAPTURE_GLOBS` below plus the
``CAPTURE`` tuple a probe module may declare (``tuner/probes/<name>.py``). A file that cannot be
read is listed in the meta and skipped; nothing aborts the capture.
"""

from __future__ import annotations

import glob
import importlib
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import UsageError
from tuner.host import DMESG, NVIDIA_SMI_XML, NVML_JSON, PIP_FREEZE, SNAPSHOT_META, Host

SCHEMA_VERSION = 1
MAX_FILE = 16 << 20

# Host paths (globs) the probes read. Keep in step with tuner/probes/*.py; a probe module may also
# declare its own ``CAPTURE`` tuple, which is added to these.
CAPTURE_GLOBS: tuple[str, ...] = (
    "/etc/os-release",
    # cpu
    "/proc/cpuinfo",
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/cpu/possible",
    "/sys/devices/system/cpu/present",
    "/sys/devices/system/cpu/*_pstate/status",
    "/sys/devices/system/cpu/cpufreq/policy*/scaling_governor",
    "/sys/devices/system/cpu/cpufreq/policy*/scaling_driver",
    "/sys/devices/system/cpu/cpufreq/policy*/scaling_available_governors",
    "/sys/devices/system/cpu/cpufreq/policy*/affected_cpus",
    "/sys/devices/system/cpu/cpufreq/policy*/related_cpus",
    "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor",
    "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_driver",
    "/sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id",
    # numa
    "/sys/devices/system/node/online",
    "/sys/devices/system/node/possible",
    "/sys/devices/system/node/node[0-9]*/cpulist",
    "/sys/devices/system/node/node[0-9]*/meminfo",
    "/sys/devices/system/node/node[0-9]*/distance",
    "/proc/sys/kernel/numa_balancing",
    # memory, swap
    "/proc/meminfo",
    "/proc/swaps",
    "/proc/mounts",
    "/proc/pressure/memory",
    "/proc/sys/vm/swappiness",
    "/proc/sys/vm/overcommit_memory",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/class/infiniband/*",
    "/sys/fs/cgroup/memory.max",
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    "/sys/block/*/size",
    "/sys/block/*/removable",
    "/sys/block/*/queue/rotational",
    "/sys/block/*/queue/scheduler",
    "/sys/block/*/device/model",
    "/sys/block/*/device/transport",
    "/sys/block/*/dm/name",
    "/sys/block/*/slaves/*",
    "/sys/block/*/*/partition",
    "/sys/class/block/*/partition",
    "/sys/class/block/*/uevent",
    "/sys/dev/block/*/uevent",
    # the snapshotting process (resolved: stored at proc/self/...)
    "/proc/self/status",
    "/proc/self/limits",
    "/proc/self/cgroup",
    "/proc/self/mountinfo",
    # host identity, network listeners, the driver
    "/proc/sys/kernel/hostname",
    "/proc/sys/kernel/osrelease",
    "/proc/net/tcp",
    "/proc/net/tcp6",
    "/proc/driver/nvidia/version",
)


def capture_globs() -> list[str]:
    """:data:`CAPTURE_GLOBS` plus every probe module's ``CAPTURE``, without duplicates."""
    from tuner.probes import Facts

    out = list(CAPTURE_GLOBS)
    for name in Facts.PROBES:
        try:
            mod = importlib.import_module(f"tuner.probes.{name}")
        except ImportError:
            continue
        out += [g for g in getattr(mod, "CAPTURE", ()) if isinstance(g, str)]
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------------
# Redaction
# ------------------------------------------------------------------------------------------------
REDACTED = "***REDACTED***"
_SECRET_NAME = (
    r"[A-Z0-9_]*(?:TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)[A-Z0-9_]*"
)
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # NAME=value / NAME: value for secret-looking upper-case names (environment, configs, logs)
    (re.compile(rf"\b({_SECRET_NAME})(\s*(?:=|:\s)\s*)(['\"]?)([^\s'\"\x00]+)"), rf"\1\2\3{REDACTED}"),
    # --api-key VALUE / --api-key=VALUE on command lines (NUL-separated in /proc/PID/cmdline)
    (
        re.compile(
            r"(--(?:api[-_]key|hf[-_]token|token|password|secret|access[-_]key|secret[-_]key)(?:=|[\s\x00]+))"
            r"([^\s\x00]+)",
            re.I,
        ),
        rf"\1{REDACTED}",
    ),
    (re.compile(r"\bhf_[A-Za-z0-9]{8,}"), f"hf_{REDACTED}"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), f"sk-{REDACTED}"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), f"gh_{REDACTED}"),
    (re.compile(r"\b((?:Bearer|Basic|token)\s+)[A-Za-z0-9._~+/=-]{8,}", re.I), rf"\1{REDACTED}"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), f"AKIA{REDACTED}"),
    (re.compile(r"(?i)(aws_secret_access_key\s*[=:]\s*)\S+"), rf"\1{REDACTED}"),
    (re.compile(r"(://)[^/\s:@]+:[^/\s@]+@"), rf"\1{REDACTED}@"),
)


def redact(text: str) -> str:
    """Remove secrets: tokens (hf_, sk-, gh*_), Bearer values, AWS keys, URL passwords, secret-named
    variables (HF_TOKEN=, *_API_KEY=) and --api-key style arguments."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


_ENV_PREFIXES = (
    "CUDA_",
    "NVIDIA_",
    "VLLM_",
    "NCCL_",
    "PYTORCH_",
    "TORCH_",
    "HF_",
    "HUGGING_FACE_",
    "OMP_",
    "TRANSFORMERS_",
    "TRITON_",
)


def relevant_env(environ: dict[str, str]) -> dict[str, str]:
    """Environment variables that change how CUDA, NCCL, torch and vLLM behave; secret values removed."""
    out: dict[str, str] = {}
    for key in sorted(environ):
        if key.startswith(_ENV_PREFIXES) or key == "LD_LIBRARY_PATH":
            secret = re.fullmatch(_SECRET_NAME, key) is not None
            out[key] = REDACTED if secret else redact(environ[key])
    return out


# ------------------------------------------------------------------------------------------------
# Capture
# ------------------------------------------------------------------------------------------------
@dataclass
class _Archive:
    """Members in memory until written: path -> bytes, or path -> symlink target."""

    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def add_text(self, name: str, text: str) -> None:
        self.files[name.lstrip("/")] = redact(text).encode()

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append({"path": path, "reason": reason})

    def write(self, out: Path) -> None:
        now = time.time()
        with tarfile.open(out, "w:gz", compresslevel=6) as tar:
            for name, target in sorted(self.links.items()):
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = target
                info.mtime = int(now)
                info.mode = 0o777
                tar.addfile(info)
            for name, data in sorted(self.files.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = int(now)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))


def _expand(host: Host, pattern: str) -> list[str]:
    """Host paths matching a glob under the host root."""
    root = str(host.root).rstrip("/")
    hits = glob.glob(root + pattern) if pattern.startswith("/") else []
    return sorted("/" + os.path.relpath(h, root or "/") for h in hits)


def _record_links(host: Host, hostpath: str, arc: _Archive) -> None:
    """Store every symlink on the way to ``hostpath`` (sysfs only) as a link member, relative and inside."""
    parts = [p for p in hostpath.split("/") if p]
    for i in range(2, len(parts) + 1):
        prefix = "/" + "/".join(parts[:i])
        real = host.path(prefix)
        if not real.is_symlink():
            continue
        target = os.readlink(real)
        if target.startswith("/"):
            target = os.path.relpath(target, os.path.dirname(prefix))
        landing = os.path.normpath(os.path.join(os.path.dirname(prefix), target))
        if landing.startswith("/sys/"):  # stays inside the archive
            arc.links[prefix.lstrip("/")] = target
        # keep walking the resolved path: nested links are recorded on their own
        resolved = host.resolve(prefix)
        rest = "/".join(parts[i:])
        if rest:
            _record_links(host, f"{resolved}/{rest}", arc)
        return


def _capture_path(host: Host, hostpath: str, arc: _Archive) -> None:
    real = host.path(hostpath)
    if real.is_dir() and not real.is_symlink():
        return
    if hostpath.startswith("/sys/"):
        _record_links(host, hostpath, arc)
        stored = host.resolve(hostpath)
        if real.is_symlink() and not host.path(stored).is_file():
            return  # a link to a directory (sys/class/infiniband/mlx5_0): the link itself is the fact
    else:
        stored = hostpath  # /proc/self/* and /proc/mounts: the content at the literal path
    # sysctl files fail with ENOMEM when asked for a huge read: they hold one short value
    r = host.read_text(hostpath, limit=64 << 10 if hostpath.startswith("/proc/sys/") else MAX_FILE)
    if not r.ok or r.value is None:
        arc.skip(hostpath, f"{r.state.value}: {r.reason}")
        return
    arc.add_text(stored, r.value)


def _process_files(host: Host, pids: Iterable[int], arc: _Archive) -> None:
    """cmdline and comm of the processes that matter (GPU holders, vLLM servers), redacted."""
    for pid in sorted(set(pids)):
        for name in ("cmdline", "comm"):
            r = host.read_text(f"/proc/{pid}/{name}", limit=256 << 10)
            if r.ok and r.value is not None:
                arc.add_text(f"proc/{pid}/{name}", r.value)


def _vllm_pids(host: Host) -> list[int]:
    pids: list[int] = []
    for entry in host.listdir("/proc").value or []:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        r = host.read_text(f"/proc/{entry}/cmdline", limit=64 << 10)
        if r.ok and r.value and "vllm" in r.value:
            pids.append(int(entry))
    return pids


def _cgroup_files(host: Host) -> list[str]:
    """The memory cgroup limit files of this process's cgroup (paths come from /proc/self/cgroup)."""
    r = host.read_text("/proc/self/cgroup", limit=64 << 10)
    out: list[str] = []
    for line in (r.value or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        rel = fields[2].strip("/")
        if not rel:
            continue
        if fields[0] == "0":
            out.append(f"/sys/fs/cgroup/{rel}/memory.max")
        elif "memory" in fields[1].split(","):
            out.append(f"/sys/fs/cgroup/memory/{rel}/memory.limit_in_bytes")
    return out


def _packages_json(host: Host) -> tuple[str, str]:
    """pip-freeze.txt and packages.json from importlib.metadata (never a pip subprocess)."""
    from tuner.probes import software

    packages = software.all_live_packages()
    freeze = "".join(f"{p.name}=={p.version}\n" for p in packages)
    _, version_py = software.live_packages()
    torch_cuda: str | None = None
    if version_py:
        cuda, _cpu = software.cuda_of_version_text(version_py)
        torch_cuda = f"{cuda[0]}.{cuda[1]}" if cuda else None
    data: dict[str, Any] = {
        "schema": 1,
        "source": "importlib.metadata",
        "python": sys.version.split()[0],
        "marker_environment": software.marker_environment(),
        "packages": [
            {"name": p.name, "version": p.version, "requires": list(p.requires or ())} for p in packages
        ],
    }
    if version_py is not None:
        data["torch_cuda"] = torch_cuda  # None = a CPU build of torch
    return freeze, json.dumps(data, indent=1, sort_keys=True)


def capture(host: Host) -> tuple[_Archive, dict[str, Any]]:
    """Everything the doctor reads, from ``host`` (normally the live host), in memory."""
    from tuner import __version__
    from tuner.gpu import inventory_to_json, read_gpus
    from tuner.probes.kernel import read_kernel_log

    t0 = time.perf_counter()
    arc = _Archive()
    commands: dict[str, Any] = {}
    for pattern in [*capture_globs(), *_cgroup_files(host)]:
        for path in _expand(host, pattern):
            try:
                _capture_path(host, path, arc)
            except OSError as exc:
                arc.skip(path, exc.strerror or str(exc))

    inv = read_gpus(host)
    arc.add_text(NVML_JSON, json.dumps(inventory_to_json(inv), indent=1))
    _process_files(host, [p.pid for g in inv.gpus for p in g.processes] + _vllm_pids(host), arc)
    if host.which("nvidia-smi"):
        t = time.perf_counter()
        res = host.run(["nvidia-smi", "-q", "-x"], 30.0)
        commands["nvidia-smi -q -x"] = {
            "returncode": res.returncode,
            "seconds": round(time.perf_counter() - t, 3),
        }
        if res.returncode == 0 and res.stdout.strip():
            arc.add_text(NVIDIA_SMI_XML, res.stdout)
        else:
            arc.skip(NVIDIA_SMI_XML, f"nvidia-smi -q -x exited {res.returncode}: {res.stderr.strip()[:300]}")
    else:
        arc.skip(NVIDIA_SMI_XML, "nvidia-smi not found: no NVIDIA driver tools on this host")

    log, source = read_kernel_log(host)
    if log.ok and log.value is not None:
        tail = "\n".join(log.value.splitlines()[-5000:]) + "\n"
        arc.add_text(DMESG, tail)
        commands["kernel log"] = {"source": source}
    else:
        arc.skip(DMESG, log.reason)

    try:
        freeze, packages = _packages_json(host)
        arc.add_text(PIP_FREEZE, freeze)
        arc.add_text("packages.json", packages)
    except Exception as exc:  # package metadata of a broken environment must not stop the capture
        arc.skip(PIP_FREEZE, f"{type(exc).__name__}: {exc}")

    uname = os.uname()
    meta = {
        "schema_version": SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gputune_version": __version__,
        "hostname": uname.nodename,
        "kernel": uname.release,
        "machine": uname.machine,
        "python": sys.version.split()[0],
        "gpu": {"state": inv.state.value, "reason": inv.reason, "count": len(inv.gpus)},
        "env": relevant_env(dict(os.environ)),
        "commands": commands,
        "files": len(arc.files) + 1,
        "links": len(arc.links),
        "skipped": arc.skipped,
        "redaction": "tokens (hf_, sk-, gh*_), Bearer values, AWS keys, URL passwords, secret-named variables"
        " and api-key/token command-line arguments are replaced by " + REDACTED,
        "capture_seconds": round(time.perf_counter() - t0, 3),
    }
    arc.add_text(SNAPSHOT_META, json.dumps(meta, indent=1))
    return arc, meta


def main(output: Path) -> int:
    """Write the snapshot tarball to ``output``; print its path on stdout."""
    output = Path(output)
    if output.is_dir():
        raise UsageError(f"{output} is a directory", "give a file name, e.g. -o snapshot.tar.gz")
    if output.exists() and not output.is_file():
        # the tarball is renamed into place: that would replace a device node or a pipe
        raise UsageError(
            f"{output} is not a regular file (a device, pipe or socket)",
            "give a file name, e.g. -o snapshot.tar.gz",
        )
    if not output.parent.is_dir():
        raise UsageError(f"{output.parent}: no such directory", "create it first, or choose another -o")
    host = Host.live_host()
    arc, meta = capture(host)
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        arc.write(tmp)
        os.replace(tmp, output)
    except OSError as exc:
        raise UsageError(
            f"cannot write {output}: {exc.strerror or exc}", "choose a writable -o path"
        ) from exc
    finally:  # also on Ctrl-C: no half-written temporary file is left beside the output
        tmp.unlink(missing_ok=True)
    size = output.stat().st_size
    print(
        f"gputune: snapshot of {meta['hostname']}: {meta['files']} files, {meta['links']} links,"
        f" {len(meta['skipped'])} skipped, {size / 1024:.0f} KiB in {meta['capture_seconds']:.2f} s",
        file=sys.stderr,
    )
    print(output)
    return 0

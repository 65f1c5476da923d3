"""PCIe probe: each NVIDIA GPU's link, current vs maximum, from NVML and from sysfs.

Sources, per GPU:
- NVML (live) or ``nvidia-smi.xml`` (snapshot): current/max generation and width,
  and the generation the GPU itself supports (``nvmlDeviceGetGpuMaxPcieLinkGeneration``);
- sysfs ``/sys/bus/pci/devices/<bus id>/{current,max}_link_{speed,width}`` of the GPU,
  and ``max_link_speed``/``max_link_width`` of the bridge port above it (the slot).

Links drop speed when the GPU idles, so the probe also records utilisation and
clocks. With ``--under-load`` (``facts.options["under_load"]``) on the live host, a
GPU found below its maximum generation gets ~1 s of matmuls and host->device copies
in a child process (only when torch or cupy is importable there) and its link is
read again while the load runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuner.gpu import GpuInfo, GpuInventory, PcieLink, read_pcie_nvml
from tuner.host import Host, State
from tuner.probes import Facts

CAPTURE = tuple(
    f"/sys/bus/pci/devices/*/{name}"
    for name in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
)

# sysfs speed strings (drivers/pci/probe.c, pci_speed_string) -> PCIe generation.
_GT_PER_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def gen_of_speed(text: str | None) -> int | None:
    """ "32.0 GT/s PCIe" (or older kernels' "8 GT/s") -> 5; "Unknown" or garbage -> None."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text or "")
    return _GT_PER_GEN.get(float(m.group(1))) if m else None


@dataclass(frozen=True)
class SysfsLink:
    """A PCI device's link from sysfs (``/sys/bus/pci/devices/<bus id>/...``)."""

    speed_current: str | None  # current_link_speed, raw ("32.0 GT/s PCIe")
    speed_max: str | None  # max_link_speed: what the GPU's port supports
    gen_current: int | None
    gen_max: int | None
    width_current: int | None  # current_link_width
    width_max: int | None  # max_link_width
    slot_gen_max: int | None = None  # max_link_speed of the upstream bridge port (the slot)
    slot_width_max: int | None = None  # max_link_width of the upstream bridge port


@dataclass(frozen=True)
class LoadRetest:
    """The link read again while a short load ran on the GPU (``--under-load``)."""

    ran: bool
    tool: str | None  # "torch" | "cupy"
    reason: str  # why it did not run, or what the load was
    nvml: PcieLink | None = None
    sysfs: SysfsLink | None = None


@dataclass(frozen=True)
class GpuLink:
    index: int
    name: str
    pci_bus_id: str
    nvml: PcieLink | None  # NVML / nvidia-smi.xml reading
    sysfs: SysfsLink | None
    utilization_gpu: int | None  # percent, nvmlDeviceGetUtilizationRates.gpu
    clock_sm_mhz: int | None
    clock_sm_max_mhz: int | None
    idle_reason_active: bool  # clocks event reason "gpu_idle" active
    under_load: LoadRetest | None = None


@dataclass(frozen=True)
class PcieFacts:
    state: State  # the GPU inventory's state: links exist only when it is OK
    reason: str
    links: tuple[GpuLink, ...]
    under_load_requested: bool = False


def read_sysfs_link(host: Host, bus_id: str) -> SysfsLink | None:
    """The GPU's link and its slot's maximum from sysfs; None when the device has no link files."""
    base = f"/sys/bus/pci/devices/{bus_id}"
    cur = host.read_value(f"{base}/current_link_speed")
    mx = host.read_value(f"{base}/max_link_speed")
    wcur = host.read_value(f"{base}/current_link_width")
    wmax = host.read_value(f"{base}/max_link_width")
    if not (cur.ok or mx.ok or wcur.ok or wmax.ok):
        return None
    slot_gen = slot_width = None
    try:
        parent = host.resolve(base).rsplit("/", 1)[0]
    except OSError:
        parent = ""
    if parent and parent != base.rsplit("/", 1)[0]:
        slot_gen = gen_of_speed(host.read_value(f"{parent}/max_link_speed").value)
        slot_width = host.read_value(f"{parent}/max_link_width").as_int()
    return SysfsLink(
        speed_current=cur.value,
        speed_max=mx.value,
        gen_current=gen_of_speed(cur.value),
        gen_max=gen_of_speed(mx.value),
        width_current=wcur.as_int(),
        width_max=wmax.as_int(),
        slot_gen_max=slot_gen,
        slot_width_max=slot_width,
    )


def below_max(link: GpuLink) -> bool:
    """Is the current generation below the maximum by either source?"""
    pairs = []
    if link.nvml is not None:
        pairs.append((link.nvml.gen_current, link.nvml.gen_max))
    if link.sysfs is not None:
        pairs.append((link.sysfs.gen_current, link.sysfs.gen_max))
    return any(c is not None and m is not None and c < m for c, m in pairs)


# ------------------------------------------------------------------------------------------------
# --under-load
# ------------------------------------------------------------------------------------------------
_LOAD_SCRIPT = r"""
import sys, time
seconds = float(sys.argv[1]); tool = sys.argv[2]
if tool == "torch":
    import torch
    if not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device")
    devs = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    mats = [(torch.randn(4096, 4096, device=d), torch.randn(4096, 4096, device=d)) for d in devs]
    host = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    print("LOAD", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for d, (a, b) in zip(devs, mats):
            a @ b
            host.to(d, non_blocking=True)
        for d in devs:
            torch.cuda.synchronize(d)
else:
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    mats, hosts = [], []
    for i in range(n):
        with cupy.cuda.Device(i):
            mats.append((cupy.random.rand(4096, 4096, dtype=cupy.float32),
                         cupy.random.rand(4096, 4096, dtype=cupy.float32)))
    import numpy
    host = numpy.ones(256 << 20, dtype=numpy.uint8)
    print("LOAD", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for i, (a, b) in enumerate(mats):
            with cupy.cuda.Device(i):
                a @ b
                cupy.asarray(host)
                cupy.cuda.Device(i).synchronize()
print("DONE", flush=True)
"""

LoadRunner = Callable[[Sequence[GpuInfo], Callable[[], None]], tuple[bool, str | None, str]]
"""Runs a load on the GPUs and calls ``read`` while it runs; returns (ran, tool, reason)."""


def load_tool() -> str | None:
    """torch or cupy, whichever is importable (found without importing it)."""
    for name in ("torch", "cupy"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def run_load(
    gpus: Sequence[GpuInfo], read: Callable[[], None], seconds: float = 1.0, start_timeout: float = 90.0
) -> tuple[bool, str | None, str]:
    """Put ~``seconds`` of matmuls and host->device copies on ``gpus`` in a child process; call ``read``
    once the load is running. The child only sees these GPUs (CUDA_VISIBLE_DEVICES by UUID); a child
    that does not start its load within ``start_timeout`` s (``import torch`` takes seconds) is killed."""
    import tempfile  # only the load re-test needs it

    tool = load_tool()
    if tool is None:
        return False, None, "neither torch nor cupy is importable: no load was put on the GPU"
    env = dict(os.environ)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(g.uuid or str(g.index) for g in gpus)
    with tempfile.TemporaryFile("w+") as err:  # a file, not a pipe: a chatty child can never block on it
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", _LOAD_SCRIPT, str(seconds), tool],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return False, tool, f"could not start the load: {exc.strerror or exc}"
        assert child.stdout is not None
        try:
            ready, _, _ = select.select([child.stdout], [], [], start_timeout)
            first = child.stdout.readline() if ready else ""
            if first.strip() != "LOAD":
                if not ready:
                    child.kill()
                child.wait(timeout=30)
                err.seek(0)
                last = (err.read().strip().splitlines() or [f"no output in {start_timeout:g} s"])[-1]
                return False, tool, f"the {tool} load did not start: {last}"
            time.sleep(min(0.3, seconds / 3))  # let the link retrain to its loaded speed
            read()
            child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            return True, tool, f"{tool} load ran but did not finish in time; it was stopped"
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    return True, tool, f"~{seconds:g} s of {tool} matmuls and host->device copies"


def _retest(facts: Facts, inv: GpuInventory, links: list[GpuLink]) -> list[GpuLink]:
    host = facts.host
    todo = [g for g, link in zip(inv.gpus, links, strict=True) if below_max(link)]
    if not todo:
        return links
    if not host.live:
        why = "--under-load needs the live host; this is a snapshot"
        skipped = LoadRetest(False, None, why)
        return [_with_retest(link, skipped) if below_max(link) else link for link in links]
    readings: dict[int, tuple[PcieLink | None, SysfsLink | None]] = {}

    def read() -> None:
        for g in todo:
            readings[g.index] = (read_pcie_nvml(g.index), read_sysfs_link(host, g.pci_bus_id))

    runner: LoadRunner = facts.options.get("load_runner") or run_load
    ran, tool, reason = runner(todo, read)
    out = []
    for link in links:
        if link.index not in {g.index for g in todo}:
            out.append(link)
            continue
        nvml, sysfs = readings.get(link.index, (None, None))
        out.append(_with_retest(link, LoadRetest(ran and link.index in readings, tool, reason, nvml, sysfs)))
    return out


def _with_retest(link: GpuLink, retest: LoadRetest) -> GpuLink:
    return dataclasses.replace(link, under_load=retest)


def probe(facts: Facts) -> PcieFacts:
    inv: GpuInventory = facts.get("gpu")
    requested = bool(facts.options.get("under_load"))
    if inv.state is not State.OK:
        return PcieFacts(inv.state, inv.reason, (), requested)
    links = [
        GpuLink(
            index=g.index,
            name=g.name,
            pci_bus_id=g.pci_bus_id,
            nvml=g.pcie,
            sysfs=read_sysfs_link(facts.host, g.pci_bus_id),
            utilization_gpu=g.utilization_gpu,
            clock_sm_mhz=g.clock_sm_mhz,
            clock_sm_max_mhz=g.clock_sm_max_mhz,
            idle_reason_active="gpu_idle" in g.throttle_reasons,
        )
        for g in inv.gpus
    ]
    if requested:
        links = _retest(facts, inv, links)
    return PcieFacts(State.OK, "", tuple(links), requested)

"""Telemetry: the dmon parser on real H200 output, the /metrics parser on a real vLLM server's text,
and the recorder driven by NVML readings replayed from a real H200 OOM run."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.gpu import NvmlSampler
from tuner.rundir import TELEMETRY_COLUMNS, EventLog, read_events
from tuner.telemetry import (
    DmonParser,
    Recorder,
    Watch,
    dmon_row,
    parse_dmon,
    parse_metrics,
    parse_prometheus,
)

LOCAL = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------
# nvidia-smi dmon
# ------------------------------------------------------------------------------------------------
def test_dmon_parser_reads_every_line_of_the_real_oom_capture(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "gpu-oom" / "oom-grow-dmon.txt").read_text()
    data_lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    samples = parse_dmon(text)
    assert len(samples) == len(data_lines)
    first = samples[0]
    assert first.gpu == 0
    assert first.raw["date"] == "20261129" and first.raw["time"] == "16:00:57"
    assert first.time is not None
    assert first.values["pwr"] == 79 and first.values["pclk"] == 345
    fb = [s.values["fb"] for s in samples]
    assert max(v for v in fb if v is not None) == 139791  # the card full just before the OOM
    assert samples[1].time is not None and samples[1].time - first.time == 1.0


def test_dmon_row_maps_columns_to_the_telemetry_csv(shared_fixtures: Path) -> None:
    samples = parse_dmon((shared_fixtures / "gpu-oom" / "oom-grow-dmon.txt").read_text())
    peak = max(samples, key=lambda s: s.values["fb"] or 0)
    row = dmon_row(peak, mem_total_mib=143771)
    assert row["mem_used_mib"] == 139791 and row["mem_total_mib"] == 143771
    assert row["power_w"] == 122 and row["temp_c"] == 38 and row["sm_clock_mhz"] == 1980
    assert row["throttle"] == ""
    assert row["gpu"] == 0


def test_dmon_parser_takes_column_names_from_the_header_not_positions() -> None:
    text = (
        "#gpu    fb   pwr\n"
        "#Idx    MB     W\n"
        "    0  1234    77\n"
        "# gpu pwr  fb sm\n"  # another -s: the header repeats, changed
        "    1   80   5   -\n"
    )
    a, b = parse_dmon(text)
    assert a.values["fb"] == 1234 and a.values["pwr"] == 77 and a.time is None
    assert b.gpu == 1 and b.values["fb"] == 5 and b.values["pwr"] == 80 and b.values["sm"] is None


def test_dmon_parser_reads_csv_format_and_marks_na() -> None:
    text = "#Date, Time, gpu, pwr, fb, pviol, tviol\n20261129, 16:00:57, 0, N/A, 42, 12, 1\n"
    (s,) = parse_dmon(text)
    assert s.values["pwr"] is None and s.values["fb"] == 42
    assert dmon_row(s)["throttle"] == "power|thermal"


def test_dmon_parser_skips_partial_last_line_and_garbage(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "gpu-oom" / "oom-spike-dmon.txt").read_text()
    whole = parse_dmon(text)
    cut = text.rstrip("\n")
    cut = cut[: cut.rfind(" 0 ") + 3]  # the last line stops mid-way, as when dmon is killed
    assert len(parse_dmon(cut)) == len(whole) - 1
    parser = DmonParser()
    junk = "\nrandom garbage here\n\x00\x01\n 20261129 16:01:12 0 1\n"
    got = [s for line in (text + junk).splitlines() if (s := parser.feed(line))]
    assert len(got) == len(whole)
    assert parser.skipped == 3


def test_dmon_parser_without_header_yields_nothing() -> None:
    parser = DmonParser()
    assert parser.feed(" 20261129 16:00:57 0 79 36") is None
    assert parser.skipped == 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_dmon_parser_never_raises_on_arbitrary_text(text: str) -> None:
    for s in parse_dmon("#Date Time gpu pwr fb\n#YYYYMMDD HH:MM:SS Idx W MB\n" + text):
        assert set(s.values) <= {"gpu", "pwr", "fb"}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 2000), st.integers(0, 200000)), min_size=1),
    st.integers(0, 60),
)
def test_dmon_parser_roundtrips_lines_and_drops_only_a_cut_one(
    rows: list[tuple[int, int, int]], cut: int
) -> None:
    lines = [
        f" 20261129    16:00:{i % 60:02d}   {g:5d} {p:6d} {fb:6d}\n" for i, (g, p, fb) in enumerate(rows)
    ]
    text = "#Date Time gpu pwr fb\n#YYYYMMDD HH:MM:SS Idx W MB\n" + "".join(lines)
    cut = min(cut, len(lines[-1]))
    got = parse_dmon(text[: len(text) - cut])
    assert len(got) == (len(rows) if cut == 0 else len(rows) - 1)
    for s, (g, p, fb) in zip(got, rows, strict=False):
        assert (s.gpu, s.values["pwr"], s.values["fb"]) == (g, p, fb)


# ------------------------------------------------------------------------------------------------
# vLLM /metrics
# ------------------------------------------------------------------------------------------------
def test_metrics_parser_on_text_from_a_real_vllm_cpu_server_under_load() -> None:
    m = parse_metrics((LOCAL / "vllm-metrics.txt").read_text())
    assert m.running == 6  # captured with six streaming requests in flight
    assert m.waiting == 0
    assert m.preemptions == 0
    assert m.kv_cache_usage is not None and 0 < m.kv_cache_usage < 0.01


def test_metrics_parser_reads_the_older_names_and_sums_engines() -> None:
    text = (
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
        'vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.5\n'
        'vllm:gpu_cache_usage_perc{model_name="m",engine="1"} 0.7\n'
        'vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_running{engine="1"} 3\n'
        'vllm:num_preemptions_total{engine="0",model_name="a}b"} 4 1700000000000\n'
        "garbage line without value\n"
        "vllm:num_requests_waiting NaN\n"
    )
    m = parse_metrics(text)
    assert m.kv_cache_usage == pytest.approx(0.6)
    assert m.running == 5 and m.preemptions == 4 and m.waiting is None


def test_prometheus_parser_keeps_labels_with_escaped_quotes() -> None:
    got = parse_prometheus('x{a="q\\"uote",b="2"} 1.5e3\n')
    assert got == {"x": [({"a": 'q\\"uote', "b": "2"}, 1500.0)]}


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_metrics_parser_never_raises(text: str) -> None:
    parse_metrics(text)


# ------------------------------------------------------------------------------------------------
# warnings
# ------------------------------------------------------------------------------------------------
def test_memory_near_capacity_and_rising_warns_once_per_episode() -> None:
    w = Watch()
    total = 143771.0
    got = []
    for t, used in enumerate([615, 21621, 99445, 140405, 140405, 140405, 615, 120000, 140000]):
        got += w.gpu(float(t), 0, float(used), total, ())
    kinds = [x.kind for x in got]
    assert kinds == ["memory_near_capacity", "memory_near_capacity"]  # once, then again after it fell


def test_full_but_flat_memory_is_not_a_warning() -> None:
    w = Watch()
    assert not [x for t in range(10) for x in w.gpu(float(t), 0, 140000.0, 143771.0, ())]


def test_throttling_warns_on_power_and_thermal_reasons_not_on_idle() -> None:
    w = Watch()
    assert w.gpu(0.0, 0, None, None, ("gpu_idle",)) == []
    got = w.gpu(1.0, 0, None, None, ("sw_power_cap", "gpu_idle"))
    assert [x.kind for x in got] == ["throttling"] and got[0].data["reasons"] == ["sw_power_cap"]
    assert w.gpu(2.0, 0, None, None, ("sw_power_cap",)) == []  # same episode


def test_new_xid_lines_warn_and_old_ones_do_not() -> None:
    w = Watch()
    old = "[ 12.3] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    new = "[ 99.1] NVRM: Xid (PCI:0000:3b:00): 48, pid=2, An uncorrectable double bit error"
    assert w.kernel_log([old], baseline=True) == []
    got = w.kernel_log([old, "unrelated", new])
    assert [x.data["code"] for x in got] == [48]


def test_kv_cache_full_and_preemptions_warn() -> None:
    w = Watch()
    m = parse_metrics("vllm:kv_cache_usage_perc 0.97\nvllm:num_preemptions_total 0\n")
    assert [x.kind for x in w.metrics(m)] == ["kv_cache_full"]
    m2 = parse_metrics("vllm:kv_cache_usage_perc 0.98\nvllm:num_preemptions_total 3\n")
    assert [x.kind for x in w.metrics(m2)] == ["preemptions"]


# ------------------------------------------------------------------------------------------------
# the recorder, with NVML replayed from a real H200 run
# ------------------------------------------------------------------------------------------------
def replay_nvml(nvml_csv: Path, nvml_json: Path) -> types.ModuleType:
    """A stand-in for the pynvml module (no GPU here): memory and utilisation replayed row by row
    from the 10 Hz NVML capture of an H200 OOM, the rest from that H200's NVML readings."""
    rows = [line.split(",") for line in nvml_csv.read_text().splitlines() if line.strip()]
    dev = json.loads(nvml_json.read_text())["devices"][0]
    state = {"i": 0}
    mod = types.ModuleType("fake_pynvml")
    mod.NVMLError = pynvml.NVMLError  # type: ignore[attr-defined]
    mod.NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound  # type: ignore[attr-defined]

    def row() -> list[str]:
        return rows[min(state["i"], len(rows) - 1)]

    def mem(h: Any) -> Any:
        r = row()
        state["i"] += 1
        return types.SimpleNamespace(used=int(r[1]) << 20, total=int(r[2]) << 20, free=0)

    def not_supported(*a: Any) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    funcs = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
        "nvmlDeviceGetMemoryInfo": mem,
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(
            gpu=int(row()[3]), memory=int(row()[4])
        ),
        "nvmlDeviceGetPowerUsage": lambda h: dev["power"],
        "nvmlDeviceGetTemperature": lambda h, s: dev["temp"],
        "nvmlDeviceGetClockInfo": lambda h, c: dev["clocks_sm"],
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: dev["throttle"],
        "nvmlDeviceGetPcieThroughput": lambda h, c: dev["pcie_tx"] if c == 0 else not_supported(),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            types.SimpleNamespace(pid=4242, usedGpuMemory=int(row()[1]) << 20)
        ],
    }
    for name, fn in funcs.items():
        setattr(mod, name, fn)
    mod.rows = len(rows)  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def h200_nvml(shared_fixtures: Path) -> types.ModuleType:
    return replay_nvml(
        shared_fixtures / "gpu-oom" / "oom-grow-nvml.csv",
        shared_fixtures / "hosts" / "h200-vm" / "extra" / "nvml.json",
    )


def test_nvml_sampler_reads_every_field_and_slow_fields_at_most_every_second(h200_nvml: Any) -> None:
    s = NvmlSampler(h200_nvml, slow_every=1.0)
    assert s.open() and s.gpu_count == 1
    (a,) = s.sample(100.0, 10.0)
    assert a.mem_used_mib == 615 and a.mem_total_mib == 143771
    assert a.power_w == pytest.approx(79.086) and a.temp_c == 36 and a.sm_clock_mhz == 345
    assert a.throttle == ("gpu_idle",)
    assert a.pcie_tx_kbs == 1072 and a.pcie_rx_kbs is None  # NotSupported -> empty, not an error
    assert a.processes is not None and a.processes[0].pid == 4242
    (b,) = s.sample(100.1, 10.1)
    assert b.processes is None  # not re-read 0.1 s later
    (c,) = s.sample(101.1, 11.1)
    assert c.processes is not None


def test_recorder_writes_the_replayed_timeline_and_warns_when_memory_fills(
    tmp_path: Path, h200_nvml: Any, shared_fixtures: Path
) -> None:
    events = EventLog(tmp_path / "events.jsonl")
    clock = iter(float(i) * 0.1 for i in range(10_000))
    rec = Recorder(
        tmp_path, events=events, interval=0.005, sampler=NvmlSampler(h200_nvml), clock=lambda: next(clock)
    )
    rec.start()
    import time

    end = time.monotonic() + 30
    while rec.samples < h200_nvml.rows and time.monotonic() < end:
        time.sleep(0.01)
    rec.stop()
    events.close()
    with open(tmp_path / "telemetry.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) >= h200_nvml.rows
    used = [float(r["mem_used_mib"]) for r in rows[: h200_nvml.rows]]
    src = (shared_fixtures / "gpu-oom" / "oom-grow-nvml.csv").read_text().splitlines()
    expected = [float(line.split(",")[1]) for line in src if line.strip()]
    assert expected == used
    assert {r["throttle"] for r in rows} == {"gpu_idle"}
    assert rows[0]["mem_total_mib"] == "143771"
    with open(tmp_path / "gpu-processes.csv") as fh:
        procs = list(csv.DictReader(fh))
    assert procs and procs[0]["pid"] == "4242"
    warnings = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "warning"]
    assert [w["data"]["warning"] for w in warnings] == ["memory_near_capacity"]


def test_recorder_without_a_gpu_says_so_and_writes_headers(tmp_path: Path) -> None:
    class NoGpu:
        reason = "NVML is not available: Driver Not Loaded"

        def open(self) -> bool:
            return False

        def sample(self, now: float, monotonic: float) -> list[Any]:
            raise AssertionError("never sampled")

    events = EventLog(tmp_path / "events.jsonl")
    rec = Recorder(tmp_path, events=events, interval=0.01, sampler=NoGpu())
    rec.start()
    rec.stop()
    events.close()
    assert (tmp_path / "telemetry.csv").read_text().startswith("time,gpu,mem_used_mib,mem_total_mib")
    msgs = [e["message"] for e in read_events(tmp_path / "events.jsonl")]
    assert any("Driver Not Loaded" in m for m in msgs)


# ------------------------------------------------------------------------------------------------
# python -m tuner.telemetry
# ------------------------------------------------------------------------------------------------
def _module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner.telemetry", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_dmon_command_converts_a_capture_to_telemetry_rows(shared_fixtures: Path) -> None:
    res = _module("dmon", str(shared_fixtures / "gpu-oom" / "oom-spike-dmon.txt"))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(res.stdout.splitlines()))
    assert rows and set(rows[0]) == set(TELEMETRY_COLUMNS)
    assert max(float(r["mem_used_mib"]) for r in rows) > 100_000


def test_dmon_command_on_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    res = _module("dmon", str(tmp_path / "nope.txt"))
    assert res.returncode == 2 and "nope.txt" in res.stderr and "Traceback" not in res.stderr


def test_record_command_without_a_gpu_reports_why_and_exits_1(tmp_path: Path) -> None:
    res = _module("record", "--out", str(tmp_path), "--interval", "0.1", "--duration", "0.3")
    if res.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert res.returncode == 1
    summary = json.loads(res.stdout)
    assert summary["samples"] == 0 and summary["nvml"] != "ok"
    assert (tmp_path / "telemetry.csv").is_file()

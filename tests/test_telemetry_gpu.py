"""The recorder's NVML timeline against `nvidia-smi dmon` on a real H200 (bench/gpu/telemetry.sh).

The fixture is what that script packs into telemetry.tgz, placed at tests/fixtures/gpu/telemetry/
(unpacked, or the .tgz itself). The workload allocated and freed GPU memory in 12 GiB steps; both
timelines must show the same steps at the same time, with the same values.
"""

from __future__ import annotations

import bisect
import csv
import json
import tarfile
from pathlib import Path

import pytest

from tuner.telemetry import parse_dmon

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpu" / "telemetry"


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (FIXTURE / "dmon.txt").is_file():
        return FIXTURE
    tgz = FIXTURE / "telemetry.tgz"
    if not tgz.is_file():
        pytest.skip(f"no GPU capture at {FIXTURE} (run bench/gpu/telemetry.sh on a GPU machine)")
    out = tmp_path_factory.mktemp("gpu-telemetry")
    with tarfile.open(tgz) as tar:
        tar.extractall(out, filter="data")
    return out


def recorder_series(path: Path) -> list[tuple[float, float]]:
    with open(path) as fh:
        return [
            (float(r["time"]), float(r["mem_used_mib"]))
            for r in csv.DictReader(fh)
            if r["gpu"] == "0" and r["mem_used_mib"]
        ]


def dmon_series(path: Path) -> list[tuple[float, float]]:
    return [
        (s.time, s.values["fb"])
        for s in parse_dmon(path.read_text(), utc=True)
        if s.gpu == 0 and s.time is not None and s.values.get("fb") is not None
    ]


def value_at(series: list[tuple[float, float]], t: float) -> float:
    """The last value at or before ``t``."""
    times = [x for x, _ in series]
    i = bisect.bisect_right(times, t) - 1
    return series[max(i, 0)][1]


def steps(capture: Path) -> list[dict[str, float | str]]:
    lines = (capture / "workload.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_both_timelines_cover_the_workload(capture: Path) -> None:
    rec, dmon = recorder_series(capture / "rec10" / "telemetry.csv"), dmon_series(capture / "dmon.txt")
    work = steps(capture)
    start, end = float(work[0]["time"]), float(work[-1]["time"])
    assert rec[0][0] <= start and rec[-1][0] >= end - 1
    assert dmon[0][0] <= start + 1 and dmon[-1][0] >= end - 2
    # 10 Hz really is about ten samples a second
    span = rec[-1][0] - rec[0][0]
    assert len(rec) >= 8 * span


def test_memory_steps_appear_in_both_timelines_within_two_seconds(capture: Path) -> None:
    rec, dmon = recorder_series(capture / "rec10" / "telemetry.csv"), dmon_series(capture / "dmon.txt")
    work = [s for s in steps(capture) if str(s["label"]).startswith(("+12GiB", "-12GiB"))]
    assert len(work) == 8
    for step in work:
        t = float(step["time"])
        # the step is seen within two seconds in both (dmon averages over its one-second interval)
        before_rec, after_rec = value_at(rec, t - 1.0), value_at(rec, t + 2.0)
        before_dmon, after_dmon = value_at(dmon, t - 1.0), value_at(dmon, t + 2.0)
        delta = 12288 if str(step["label"]).startswith("+") else -12288
        assert after_rec - before_rec == pytest.approx(delta, abs=600), step
        assert after_dmon - before_dmon == pytest.approx(delta, abs=600), step


def test_values_agree_where_memory_is_steady(capture: Path) -> None:
    rec, dmon = recorder_series(capture / "rec10" / "telemetry.csv"), dmon_series(capture / "dmon.txt")
    change_times = [float(s["time"]) for s in steps(capture)]
    compared = 0
    for t, fb in dmon:
        if any(abs(t - c) < 1.5 for c in change_times):
            continue  # dmon's second-long sample straddles a step
        near = [v for x, v in rec if abs(x - t) <= 0.5]
        if not near:
            continue
        compared += 1
        assert min(abs(v - fb) for v in near) <= max(0.03 * fb, 64), (t, fb, near)
    assert compared >= 8


def test_recorder_at_one_hertz_agrees_with_ten_hertz(capture: Path) -> None:
    fast = recorder_series(capture / "rec10" / "telemetry.csv")
    slow = recorder_series(capture / "rec1" / "telemetry.csv")
    change_times = [float(s["time"]) for s in steps(capture)]
    assert len(slow) >= 30
    compared = 0
    for t, v in slow:
        near = [x for s, x in fast if abs(s - t) <= 0.15]
        if near and not any(abs(t - c) < 1.0 for c in change_times):
            compared += 1
            assert min(abs(x - v) for x in near) <= max(0.03 * v, 64)
    assert compared >= 10

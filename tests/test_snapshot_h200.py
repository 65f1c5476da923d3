"""The snapshot taken by `gputune snapshot` on the real H200 (bench/gpu/doctor.sh), diagnosed offline.

From bench/gpu/doctor.sh's doctor.tgz, committed as:
- tests/fixtures/gpu/h200-snapshot.tar.gz (the snapshot), and
- tests/fixtures/gpu/h200-snapshot.expected.json (`gputune doctor --from` it, run on the H200).
The test is skipped only where those files are absent.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import LOCAL_FIXTURES, run_python

SNAPSHOT = LOCAL_FIXTURES / "gpu" / "h200-snapshot.tar.gz"
EXPECTED = LOCAL_FIXTURES / "gpu" / "h200-snapshot.expected.json"

pytestmark = pytest.mark.skipif(not SNAPSHOT.is_file(), reason=f"{SNAPSHOT.name} not committed yet")


def _doctor_json() -> dict:  # type: ignore[type-arg]
    res = run_python("-m", "tuner", "doctor", "--from", str(SNAPSHOT), "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def test_h200_snapshot_gives_the_report_it_gave_on_the_h200() -> None:
    got = _doctor_json()
    want = json.loads(EXPECTED.read_text())
    key = lambda c: (c["id"], c.get("subject"), c["status"])  # noqa: E731
    assert [key(c) for c in got["checks"]] == [key(c) for c in want["checks"]]
    by_id = {c["id"]: c for c in got["checks"]}
    want_by_id = {c["id"]: c for c in want["checks"]}
    for field in ("driver_version", "driver_cuda", "torch", "torch_cuda"):
        assert by_id["driver.cuda"]["evidence"][field] == want_by_id["driver.cuda"]["evidence"][field]


def test_h200_snapshot_sees_the_gpu_and_its_link() -> None:
    by_id = {c["id"]: c for c in _doctor_json()["checks"]}
    assert by_id["pcie.link"]["subject"] == "gpu0" and by_id["pcie.link"]["status"] in ("pass", "fail")
    assert by_id["pcie.link"]["evidence"]["nvml"]["gen_max"] == 5
    assert by_id["gpu.compute_capability"]["evidence"]["compute_capability"] == "9.0"
    assert by_id["gpu.compute_capability"]["evidence"]["source"] == "nvml.json"

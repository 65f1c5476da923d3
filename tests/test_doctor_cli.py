"""`gputune doctor` end to end: exit codes, selection, output forms (run as `python -m tuner`)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosttree import SATA_PATH, HostTree
from tuner.doctor import Report, exit_code_for
from tuner.findings import Finding, Remediation, Status
from tuner.render.table import render_doctor

REPO = Path(__file__).resolve().parents[1]
HOST_CHECKS = ["numa.affinity", "cpu.governor", "swap.device", "memory", "vllm.exposed"]


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("GPUTUNE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "tuner", "doctor", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=full_env,
        timeout=120,
    )


def only_host(*extra: str) -> list[str]:
    return [a for c in HOST_CHECKS for a in ("--only", c)] + list(extra)


@pytest.fixture
def sata_swap_tree(tmp_path: Path) -> HostTree:
    """A workstation with swap on a SATA SSD (fail) and powersave CPUs (warn)."""
    t = HostTree(tmp_path / "root")
    t.meminfo(64 << 20, 48 << 20, swap_total_kib=8 << 20)
    t.disk("sda", SATA_PATH, rotational=False, partitions=["sda2"])
    t.swaps(("/dev/sda2", "partition", 8 << 20, 0, -2))
    t.cpus(2)
    t.cpufreq(range(2), "powersave")
    t.sysctl("vm.swappiness", 10)
    return t


@pytest.fixture
def warn_only_tree(tmp_path: Path) -> HostTree:
    t = HostTree(tmp_path / "warn")
    t.meminfo(64 << 20, 48 << 20)
    t.swaps()
    t.cpus(2)
    t.cpufreq(range(2), "ondemand")
    return t


def test_json_has_schema_version_host_checks_and_summary(shared_fixtures: Path) -> None:
    r = doctor("--from", str(shared_fixtures / "hosts" / "cpu-vm"), "--format", "json", *only_host())
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1
    assert doc["host"]["source"].endswith("cpu-vm") and doc["host"]["live"] is False
    assert doc["host"]["os"] == "Debian GNU/Linux 12 (bookworm)"
    ids = [c["id"] for c in doc["checks"]]
    assert {"numa.affinity", "cpu.governor", "swap.device", "memory.shm", "vllm.exposed"} <= set(ids)
    for c in doc["checks"]:
        assert {"id", "status", "summary", "evidence", "remediation", "subject", "title"} <= set(c)
        assert c["status"] in {"pass", "warn", "fail", "skip", "error"}
    s = doc["summary"]
    assert s["total"] == len(doc["checks"]) == sum(s[k] for k in ("pass", "warn", "fail", "skip", "error"))
    assert s["exit_code"] == 0 and s["fail_on"] == "fail"
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["cpu.governor"]["status"] == "skip" and "no cpufreq" in by_id["cpu.governor"]["summary"]
    assert by_id["swap.device"]["status"] == "pass" and by_id["swap.device"]["summary"].startswith("no swap")


def test_a_failing_check_exits_1_and_skipping_it_exits_0(sata_swap_tree: HostTree) -> None:
    root = str(sata_swap_tree.root)
    r = doctor("--from", root, "--format", "json", *only_host())
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["fail"] >= 1 and doc["summary"]["exit_code"] == 1
    assert doc["summary"]["worst"] == "fail"
    assert doctor("--from", root, *only_host("--skip", "swap.device")).returncode == 0


def test_fail_on_warn_makes_warnings_exit_1(warn_only_tree: HostTree) -> None:
    root = str(warn_only_tree.root)
    assert doctor("--from", root, "--only", "cpu.governor").returncode == 0
    r = doctor("--from", root, "--only", "cpu.governor", "--fail-on", "warn", "--format", "json")
    assert r.returncode == 1
    assert json.loads(r.stdout)["summary"]["fail_on"] == "warn"


def test_only_and_skip_select_checks_by_id_area_and_comma_list(sata_swap_tree: HostTree) -> None:
    root = str(sata_swap_tree.root)
    doc = json.loads(doctor("--from", root, "--format", "json", "--only", "memory,swap.device").stdout)
    assert {c["id"] for c in doc["checks"]} == {
        "memory.shm",
        "memory.memlock",
        "memory.cgroup",
        "memory.thp",
        "memory.swappiness",
        "swap.device",
    }
    doc = json.loads(
        doctor("--from", root, "--format", "json", "--only", "memory", "--skip", "memory.thp").stdout
    )
    assert "memory.thp" not in {c["id"] for c in doc["checks"]} and len(doc["checks"]) == 4


def test_unknown_check_id_is_a_usage_error(shared_fixtures: Path) -> None:
    r = doctor("--from", str(shared_fixtures / "hosts" / "cpu-vm"), "--only", "no.such.check")
    assert r.returncode == 2
    assert "unknown check 'no.such.check'" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_missing_from_path_is_a_usage_error(tmp_path: Path) -> None:
    r = doctor("--from", str(tmp_path / "nope.tar.gz"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_a_folder_that_is_no_host_root_is_a_usage_error_not_a_clean_report(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a snapshot")
    r = doctor("--from", str(tmp_path))
    assert r.returncode == 2 and "not a host snapshot" in r.stderr and r.stdout == ""


def test_a_garbage_tarball_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "snap.tar.gz"
    bad.write_bytes(b"\x1f\x8b not really gzip")
    r = doctor("--from", str(bad))
    assert r.returncode == 2 and "not a readable snapshot" in r.stderr


def test_bad_fail_on_value_is_a_usage_error() -> None:
    assert doctor("--fail-on", "sometimes").returncode == 2


def test_plain_text_in_a_pipe_shows_status_fix_and_summary(sata_swap_tree: HostTree) -> None:
    r = doctor("--from", str(sata_swap_tree.root), *only_host())
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    fail = next(line for line in lines if line.startswith("FAIL") and "swap.device" in line)
    assert "SATA/SAS SSD" in fail and "[/dev/sda2]" in fail
    assert any(line.strip() == "run: swapoff /dev/sda2" for line in lines)
    assert any("run: cpupower frequency-set -g performance" in line for line in lines)
    assert "\x1b[" not in r.stdout  # no colour codes in a pipe
    assert re.match(r"\d+ findings on ", lines[-1])
    assert "1 fail" in lines[-1] and "(exit 1, --fail-on fail)" in lines[-1]


def test_verbose_shows_evidence_of_passing_checks(warn_only_tree: HostTree) -> None:
    quiet = doctor("--from", str(warn_only_tree.root), "--only", "swap.device").stdout
    loud = doctor("--from", str(warn_only_tree.root), "--only", "swap.device", "--verbose").stdout
    assert "| headroom:" not in quiet
    assert "| headroom: 48.0 GiB of 64.0 GiB available" in loud


def test_json_output_does_not_import_rich(shared_fixtures: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "tuner",
            "doctor",
            "--format",
            "json",
            "--from",
            str(shared_fixtures / "hosts" / "cpu-vm"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert r.returncode in (0, 1), r.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")
    }
    assert "tuner.render.json" in imported
    assert not {m for m in imported if m == "rich" or m.startswith("rich.")}
    assert "torch" not in imported and "vllm" not in imported


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _report(*findings: Finding, fail_on: str = "fail") -> Report:
    return Report({"source": "live", "hostname": "box"}, findings, fail_on, exit_code_for(findings, fail_on))


def test_terminal_output_is_a_rich_table_with_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    rem = Remediation("Move swap to NVMe.", "swapoff /dev/sda2", needs_root=True, persistent=False)
    out = _Tty()
    render_doctor(
        _report(Finding("swap.device", Status.FAIL, "swap on SATA", {"media": "ssd"}, rem, "/dev/sda2")), out
    )
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())
    assert "\x1b[" in out.getvalue()  # coloured on a terminal
    assert "┃" in text or "│" in text  # a table, drawn
    assert "swapoff /dev/sda2" in text and "media: ssd" in text and "[root, not persistent]" in text


@pytest.mark.parametrize(
    ("statuses", "fail_on", "code"),
    [
        ([Status.PASS, Status.SKIP], "fail", 0),
        ([Status.WARN], "fail", 0),
        ([Status.WARN], "warn", 1),
        ([Status.ERROR], "fail", 0),
        ([Status.ERROR], "warn", 0),
        ([Status.ERROR], "error", 1),
        ([Status.WARN], "error", 1),
        ([Status.FAIL, Status.PASS], "fail", 1),
        ([Status.SKIP], "error", 0),
    ],
)
def test_exit_code_follows_fail_on_and_errors_count_only_for_fail_on_error(
    statuses: list[Status], fail_on: str, code: int
) -> None:
    assert exit_code_for([Finding("x.y", s, "s") for s in statuses], fail_on) == code


def test_a_pipe_given_as_snapshot_is_a_usage_error_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "snap.tar.gz"
    os.mkfifo(fifo)
    r = doctor("--from", str(fifo))
    assert r.returncode == 2 and "not a folder or a regular file" in r.stderr

"""`gputune tune` against writable host trees: plan, apply, verify, revert, journal, persist.

Every apply test hashes the whole tree before and after and requires the revert to leave it
byte-identical (files, links, folders, modes). The kernel's refusals and crashes are injected
through the value writer, the one seam between tune and the files it changes.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner import tunables as tn
from tuner import tune
from tuner.errors import BadAnswer, UsageError
from tuner.findings import Finding, Remediation, Status
from tuner.host import Host

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------------
# trees
# --------------------------------------------------------------------------------------------------
def write(root: Path, hostpath: str, text: str) -> None:
    p = root / hostpath.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text.encode("utf-8", errors="surrogateescape"))


def workstation(root: Path, *, cpus: int = 4, governor: str = "powersave", nodes: int = 2) -> Path:
    """A bare-metal two-node workstation: cpufreq, swap on a partition, THP always, NUMA balancing on."""
    write(root, "/proc/sys/vm/swappiness", "60\n")
    write(root, "/proc/sys/vm/max_map_count", "65530\n")
    write(root, "/proc/sys/vm/zone_reclaim_mode", "1\n")
    write(root, "/proc/sys/kernel/numa_balancing", "1\n")
    write(
        root, "/proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme0n1p3 partition 8388604 0 -2\n"
    )
    for n in range(nodes):
        (root / f"sys/devices/system/node/node{n}").mkdir(parents=True)
    for c in range(cpus):
        base = f"/sys/devices/system/cpu/cpu{c}/cpufreq"
        write(root, f"{base}/scaling_governor", f"{governor}\n")
        write(root, f"{base}/scaling_available_governors", "performance powersave\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/defrag", "[always] defer defer+madvise madvise never\n")
    write(root, "/etc/os-release", 'NAME="Ubuntu"\n')
    return root


def digest(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every file (content hash and mode), link (target) and folder (mode) under ``root``."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), stat.S_IMODE(st.st_mode))
    return out


@pytest.fixture(scope="session")
def procfs_tree_template(shared_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """prometheus/procfs' real /proc and /sys trees (cpufreq behind symlinks, two NUMA nodes)."""
    dest = tmp_path_factory.mktemp("procfs")
    subprocess.run(
        [
            sys.executable,
            str(shared_fixtures.parent / "tools" / "ttar.py"),
            str(shared_fixtures / "third_party" / "prometheus-procfs" / "fixtures.ttar"),
            str(dest),
        ],
        check=True,
        capture_output=True,
    )
    return dest / "fixtures"


@pytest.fixture
def procfs_tree(procfs_tree_template: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "procfs"
    # the parts tune reads and writes (the whole capture is thousands of files)
    for part in ("proc/sys", "proc/swaps", "sys/devices/system", "sys/kernel"):
        src = procfs_tree_template / part
        if src.is_dir():
            shutil.copytree(src, dest / part, symlinks=True)
        elif src.exists():
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / part)
    return dest


def run(root: Path, **kw: Any) -> tuple[int, dict[str, Any]]:
    """Run tune in-process as root (euid injected) and return its exit code and JSON report."""
    out = io.StringIO()
    kw.setdefault("euid", lambda: 0)
    kw.setdefault("doctor", False)
    code = tune.run(root=root, fmt="json", out=out, **kw)
    text = out.getvalue()
    return code, (json.loads(text) if text.strip() else {})


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["changes"]}


def journal_of(root: Path) -> dict[str, Any]:
    return json.loads((root / "var/lib/gputune/journal.json").read_text())


# --------------------------------------------------------------------------------------------------
# dry run
# --------------------------------------------------------------------------------------------------
def test_dry_run_lists_changes_with_current_new_why_and_reboot_and_changes_nothing(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    code, rep = run(root)
    assert code == 0
    assert digest(root) == before
    c = by_name(rep)
    assert (c["vm.swappiness"]["current"], c["vm.swappiness"]["new"]) == ("60", "10")
    assert c["vm.swappiness"]["status"] == "would change"
    assert c["vm.swappiness"]["survives_reboot"].startswith("no")
    assert (c["cpu.governor"]["current"], c["cpu.governor"]["new"]) == ("powersave", "performance")
    assert len(c["cpu.governor"]["paths"]) == 4
    assert (c["thp.enabled"]["current"], c["thp.enabled"]["new"]) == ("always", "madvise")
    assert (c["kernel.numa_balancing"]["current"], c["kernel.numa_balancing"]["new"]) == ("1", "0")
    assert "numactl" in c["kernel.numa_balancing"]["why"]
    assert rep["mode"] == "dry-run" and not (root / "var").exists()


def test_plain_output_in_a_pipe_is_a_table_with_why_lines(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    out = io.StringIO()
    assert tune.run(root=root, fmt="table", out=out, doctor=False) == 0
    text = out.getvalue()
    assert text.splitlines()[0].split() == ["TUNABLE", "CURRENT", "NEW", "STATUS", "SURVIVES", "REBOOT"]
    assert any(
        line.startswith("vm.swappiness") and "60" in line and "10" in line for line in text.splitlines()
    )
    assert "\x1b[" not in text  # no colour codes in a pipe


def test_rich_table_on_a_terminal(tmp_path: Path) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    assert tune.run(root=workstation(tmp_path), fmt="table", out=out, doctor=False) == 0
    assert "gputune tune (dry-run)" in out.getvalue() and "┃" in out.getvalue() + "│"


# --------------------------------------------------------------------------------------------------
# apply / verify / revert
# --------------------------------------------------------------------------------------------------
def test_apply_sets_verifies_and_revert_leaves_the_tree_byte_identical(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    code, rep = run(root, apply=True)
    assert code == 0, rep
    c = by_name(rep)
    assert all(
        c[n]["status"] == "changed"
        for n in ("vm.swappiness", "cpu.governor", "thp.enabled", "thp.defrag", "kernel.numa_balancing")
    )
    assert (root / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert (root / "sys/devices/system/cpu/cpu3/cpufreq/scaling_governor").read_text() == "performance\n"
    assert (root / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "always [madvise] never\n"
    assert (root / "proc/sys/kernel/numa_balancing").read_text() == "0\n"
    j = journal_of(root)
    assert j["state"] == "complete"
    olds = {(e["tunable"], e["old"]) for e in j["entries"]}
    assert ("vm.swappiness", "60") in olds and ("thp.enabled", "always") in olds

    code, rep = run(root, revert=True)
    assert code == 0
    assert all(r["status"] == "restored" for r in rep["reverted"])
    assert digest(root) == before  # journal and the folders made for it are gone too


def test_revert_runs_in_reverse_order_across_two_applies(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    assert run(root, apply=True, sets=["vm.swappiness=10"])[0] == 0
    assert run(root, apply=True, sets=["vm.swappiness=5"])[0] == 0
    assert (root / "proc/sys/vm/swappiness").read_text() == "5\n"
    assert [e["old"] for e in journal_of(root)["entries"]] == ["60", "10"]
    assert run(root, revert=True)[0] == 0
    assert digest(root) == before


def test_real_procfs_tree_with_symlinked_cpufreq_round_trips_byte_identical(procfs_tree: Path) -> None:
    before = digest(procfs_tree)
    code, rep = run(procfs_tree, apply=True, persist=True)
    assert code == 0, rep
    gov = by_name(rep)["cpu.governor"]
    # cpu0/cpufreq is a link to ../cpufreq/policy0: written once, at the link's target, inside the tree
    paths = {p["path"] for p in gov["paths"]}
    assert "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor" in paths
    assert (
        procfs_tree / "sys/devices/system/cpu/cpufreq/policy0/scaling_governor"
    ).read_text() == "performance\n"
    assert os.path.islink(procfs_tree / "sys/devices/system/cpu/cpu0/cpufreq")
    assert run(procfs_tree, revert=True)[0] == 0
    assert digest(procfs_tree) == before


def test_dry_run_after_apply_reports_the_journal_and_the_revert_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = workstation(tmp_path)
    run(root, apply=True, sets=["vm.swappiness=10"])
    capsys.readouterr()
    code, rep = run(root)
    assert code == 0
    assert "gputune tune --revert" in capsys.readouterr().err
    assert by_name(rep)["vm.swappiness"]["status"] == "ok"


# --------------------------------------------------------------------------------------------------
# crash, kernel refusal, mismatch, partial revert
# --------------------------------------------------------------------------------------------------
class Crash(BaseException):
    """Stands for the process dying (a kill, a power cut) between two writes."""


def crash_after(n: int) -> Callable[[Path, str], None]:
    done = []

    def writer(real: Path, value: str) -> None:
        if len(done) >= n:
            raise Crash(f"killed before writing {real}")
        tn.tree_writer(real, value)
        done.append(real)

    return writer


def test_crash_between_two_writes_is_found_next_run_and_revert_restores_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    with pytest.raises(Crash):
        run(root, apply=True, writer=crash_after(1))
    j = journal_of(root)
    assert j["state"] == "applying"
    assert len(j["entries"]) == 2  # the second old value was saved before its (never made) write
    assert digest(root) != before
    capsys.readouterr()

    code, rep = run(root)  # the next run, no terminal: reports, never prompts
    err = capsys.readouterr().err
    assert code == 0
    assert "did not finish" in err and "gputune tune --revert" in err
    assert any("did not finish" in n for n in rep["notices"])

    code, _ = run(root, apply=True)  # refuses to pile a new apply on an unfinished one
    assert code == 1
    assert "--revert" in capsys.readouterr().err

    assert run(root, revert=True)[0] == 0
    assert digest(root) == before


def refuse(paths: dict[str, int]) -> Callable[[Path, str], None]:
    """A kernel that refuses writes to some files with the given errno."""

    def writer(real: Path, value: str) -> None:
        for suffix, code in paths.items():
            if str(real).endswith(suffix):
                raise (PermissionError if code == errno.EPERM else OSError)(
                    code, os.strerror(code), str(real)
                )
        tn.tree_writer(real, value)

    return writer


@pytest.mark.parametrize(
    ("code", "word"),
    [(errno.EPERM, "EPERM"), (errno.EINVAL, "EINVAL"), (errno.EROFS, "EROFS"), (errno.EACCES, "EACCES")],
)
def test_a_write_refused_by_the_kernel_is_reported_and_the_rest_are_set(
    tmp_path: Path, code: int, word: str
) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    rc, rep = run(root, apply=True, writer=refuse({"vm/swappiness": code}))
    assert rc == 1
    c = by_name(rep)
    assert c["vm.swappiness"]["status"] == "failed" and word in c["vm.swappiness"]["why"]
    assert c["thp.enabled"]["status"] == "changed" and c["cpu.governor"]["status"] == "changed"
    assert (root / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert "vm.swappiness" not in {e["tunable"] for e in journal_of(root)["entries"]}  # nothing to restore
    assert run(root, revert=True)[0] == 0
    assert digest(root) == before


def test_one_refused_cpu_does_not_stop_the_other_cpus(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    rc, rep = run(
        root, apply=True, only=["cpu.governor"], writer=refuse({"cpu2/cpufreq/scaling_governor": errno.EBUSY})
    )
    assert rc == 1
    results = {p["label"]: p["status"] for p in by_name(rep)["cpu.governor"]["paths"]}
    assert results == {"cpu0": "changed", "cpu1": "changed", "cpu2": "failed", "cpu3": "changed"}


def test_a_value_that_reads_back_different_is_a_mismatch_and_stays_revertible(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    before = digest(root)

    def clamping_kernel(real: Path, value: str) -> None:
        tn.tree_writer(real, "100" if real.name == "swappiness" else value)

    rc, rep = run(root, apply=True, sets=["vm.swappiness=10"], writer=clamping_kernel)
    assert rc == 1
    sw = by_name(rep)["vm.swappiness"]
    assert sw["status"] == "mismatch" and "100" in sw["why"]
    assert run(root, revert=True)[0] == 0
    assert digest(root) == before


def test_revert_restores_a_value_changed_since_apply_and_says_so(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    assert run(root, apply=True, sets=["vm.swappiness=10"])[0] == 0
    write(root, "/proc/sys/vm/swappiness", "30\n")  # someone else changed it afterwards
    code, rep = run(root, revert=True)
    assert code == 0 and (root / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert "changed since" in rep["reverted"][0]["reason"]


def test_partial_revert_keeps_what_is_left_and_a_second_revert_finishes(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    assert run(root, apply=True)[0] == 0
    rc, _ = run(root, revert=True, writer=refuse({"transparent_hugepage/enabled": errno.EBUSY}))
    assert rc == 1
    left = journal_of(root)["entries"]
    assert [e["tunable"] for e in left] == ["thp.enabled"]
    assert (root / "proc/sys/vm/swappiness").read_text() == "60\n"  # the rest was restored
    assert run(root, revert=True)[0] == 0
    assert digest(root) == before


def test_damaged_journal_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    write(root, tune.JOURNAL, "{not json")
    with pytest.raises(BadAnswer, match="damaged"):
        run(root, revert=True)


# --------------------------------------------------------------------------------------------------
# root, --set, --only, not applicable
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["apply", "revert"])
def test_not_root_is_a_clear_message_exit_1_and_nothing_changes(
    tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = workstation(tmp_path)
    if mode == "revert":
        run(root, apply=True)
    before = digest(root)
    code, _ = run(root, euid=lambda: 1000, **{mode: True})
    assert code == 1
    assert "must run as root" in capsys.readouterr().err
    assert digest(root) == before


@pytest.mark.parametrize(
    ("setting", "hint"),
    [
        ("vm.swappiness=300", "0 to 200"),
        ("vm.swappiness=ten", "0 to 200"),
        ("vm.swappiness=-1", "0 to 200"),
        ("thp.enabled=sometimes", "always, madvise, never"),
        ("cpu.governor=turbo", "performance, powersave"),  # what this host's cpufreq offers
        ("kernel.numa_balancing=9", "0 to 3"),
        ("vm.swapiness=10", "vm.swappiness"),  # unknown name lists the known ones
        ("vm.swappiness", "NAME=VALUE"),
    ],
)
def test_set_rejects_what_the_tunable_does_not_accept_with_the_allowed_values(
    tmp_path: Path, setting: str, hint: str
) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    with pytest.raises(UsageError) as err:
        run(root, apply=True, sets=[setting])
    assert hint in f"{err.value.message} {err.value.hint}"
    assert digest(root) == before


def test_set_applies_that_tunable_only(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    code, rep = run(root, apply=True, sets=["vm.swappiness=010"])
    assert code == 0
    assert [c["name"] for c in rep["changes"]] == ["vm.swappiness"]
    assert (root / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert (root / "sys/kernel/mm/transparent_hugepage/enabled").read_text() == "[always] madvise never\n"


def test_only_limits_the_run_and_an_unknown_name_is_a_usage_error(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    code, rep = run(root, only=["thp.enabled", "cpu.governor"])
    assert code == 0 and [c["name"] for c in rep["changes"]] == ["cpu.governor", "thp.enabled"]
    with pytest.raises(UsageError, match="unknown tunable"):
        run(root, only=["thp"])


def test_vm_without_cpufreq_skips_the_governor_with_the_reason(tmp_path: Path) -> None:
    root = workstation(tmp_path, cpus=0)
    code, rep = run(root, apply=True)
    gov = by_name(rep)["cpu.governor"]
    assert code == 0 and gov["status"] == "skip" and "no cpufreq" in gov["why"]
    code, rep = run(root, apply=True, sets=["cpu.governor=performance"])  # asked for explicitly: cannot
    assert code == 1 and by_name(rep)["cpu.governor"]["status"] == "failed"


def test_governor_skipped_when_the_driver_does_not_offer_performance(tmp_path: Path) -> None:
    root = workstation(tmp_path, cpus=2)
    for c in range(2):
        write(root, f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_available_governors", "schedutil\n")
    gov = by_name(run(root)[1])["cpu.governor"]
    assert gov["status"] == "skip" and "does not offer `performance`" in gov["why"]


def test_numa_balancing_is_left_alone_on_one_node(tmp_path: Path) -> None:
    root = workstation(tmp_path, nodes=1)
    nb = by_name(run(root)[1])["kernel.numa_balancing"]
    assert nb["status"] == "skip" and "1 NUMA node" in nb["why"]


def test_an_unreadable_cpu_is_left_alone_and_the_others_are_set(tmp_path: Path) -> None:
    root = workstation(tmp_path, cpus=3)
    write(root, "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "\udcff\udcfe")
    code, rep = run(root, apply=True, only=["cpu.governor"])
    gov = by_name(rep)["cpu.governor"]
    assert code == 0 and gov["status"] == "changed" and "unreadable: cpu1" in gov["why"]
    assert {p["label"] for p in gov["paths"]} == {"cpu0", "cpu2"}


def test_already_good_values_are_ok_not_changed(tmp_path: Path) -> None:
    root = workstation(tmp_path, governor="performance")
    write(root, "/proc/sys/vm/swappiness", "1\n")
    write(root, "/proc/sys/vm/max_map_count", "1048576\n")
    c = by_name(run(root)[1])
    assert c["cpu.governor"]["status"] == "ok"
    assert c["vm.swappiness"]["status"] == "ok"  # at most 10 is fine
    assert c["vm.max_map_count"]["status"] == "ok"  # never lowered


@pytest.mark.parametrize("garbage", ["", "\x00\x01binary", "\udcff\udcfe", "x" * 100_000, "[[[", "1 2 3\n"])
def test_garbage_in_tunable_files_does_not_crash_and_round_trips(tmp_path: Path, garbage: str) -> None:
    root = workstation(tmp_path)
    write(root, "/proc/sys/vm/swappiness", garbage)
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", garbage)
    before = digest(root)
    code, rep = run(root, apply=True)
    assert code in (0, 1) and rep["changes"]
    assert run(root, revert=True)[0] == 0
    if garbage.strip():  # an empty file has no value to write back; every other one comes back as it was
        assert digest(root) == before


# --------------------------------------------------------------------------------------------------
# persist
# --------------------------------------------------------------------------------------------------
def test_persist_writes_sysctl_and_tmpfiles_and_revert_removes_them(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    write(root, "/etc/sysctl.d/99-sysctl.conf", "vm.swappiness = 60\n")
    before = digest(root)
    code, rep = run(root, apply=True, persist=True)
    assert code == 0
    sysctl = (root / "etc/sysctl.d/90-gputune.conf").read_text()
    assert "vm.swappiness = 10\n" in sysctl and "kernel.numa_balancing = 0\n" in sysctl
    tmpfiles = (root / "etc/tmpfiles.d/gputune.conf").read_text()
    assert "w /sys/kernel/mm/transparent_hugepage/enabled - - - - madvise\n" in tmpfiles
    assert "w /sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor - - - - performance\n" in tmpfiles
    sw = by_name(rep)["vm.swappiness"]
    assert sw["survives_reboot"] == "yes: /etc/sysctl.d/90-gputune.conf"
    assert "99-sysctl.conf" in sw["note"]  # read later at boot: it would win
    assert run(root, revert=True)[0] == 0
    assert digest(root) == before  # including /etc/tmpfiles.d, which did not exist


def test_persist_replacing_a_file_restores_it_byte_for_byte(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    write(root, "/etc/sysctl.d/90-gputune.conf", "# mine\nvm.dirty_ratio = 5\n")
    (root / "etc/sysctl.d/90-gputune.conf").chmod(0o640)
    before = digest(root)
    assert run(root, apply=True, persist=True, sets=["vm.swappiness=10"])[0] == 0
    text = (root / "etc/sysctl.d/90-gputune.conf").read_text()
    assert "vm.dirty_ratio = 5" in text and "vm.swappiness = 10" in text  # merged, not clobbered
    assert run(root, revert=True)[0] == 0
    assert digest(root) == before


def test_persist_in_a_dry_run_shows_the_files_and_writes_nothing(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    before = digest(root)
    code, rep = run(root, persist=True)
    assert code == 0 and digest(root) == before
    assert {f["path"]: f["action"] for f in rep["persist"]} == {
        "/etc/sysctl.d/90-gputune.conf": "create",
        "/etc/tmpfiles.d/gputune.conf": "create",
    }


def test_a_persist_file_edited_after_apply_is_not_deleted_by_revert(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    assert run(root, apply=True, persist=True, sets=["vm.swappiness=10"])[0] == 0
    with (root / "etc/sysctl.d/90-gputune.conf").open("a") as fh:
        fh.write("vm.dirty_ratio = 5\n")
    code, _ = run(root, revert=True)
    assert code == 1
    assert (root / "etc/sysctl.d/90-gputune.conf").exists()
    assert (root / "proc/sys/vm/swappiness").read_text() == "60\n"


# --------------------------------------------------------------------------------------------------
# what tune never applies: GPU commands and manual steps
# --------------------------------------------------------------------------------------------------
class _Gpu:
    index, name, pci_bus_id, persistence_mode = 0, "NVIDIA H200", "0000:00:06.0", False


def test_gpu_settings_are_printed_as_commands_and_hardware_fixes_as_manual_steps() -> None:
    defs = tn.load_defs()
    findings = [
        Finding(
            "pcie.link",
            Status.FAIL,
            "GPU 0 at Gen3 x8 under load (max Gen4 x16)",
            {"gen_current": 3, "width_current": 8},
            Remediation("Move the card to a x16 slot", needs_bios=True),
            "gpu0",
            "PCIe link",
        ),
        Finding(
            "cpu.governor",
            Status.WARN,
            "powersave",
            {},
            Remediation("set performance", "cpupower ..."),
            None,
            "CPU governor",
        ),  # tune itself fixes this one
        Finding(
            "gpu.clocks",
            Status.WARN,
            "app clocks low",
            {},
            Remediation("raise", "sudo nvidia-smi -ac 2619,1980"),
            "gpu0",
            "GPU clocks",
        ),
        Finding("swap.device", Status.PASS, "swap on NVMe", {}, None, None, "swap"),
    ]
    steps = tune.operator_steps(defs, findings, [_Gpu()])
    got = {(s.kind, s.id): s for s in steps}
    assert got[("gpu", "gpu.persistence")].commands == ("sudo nvidia-smi -i 0 -pm 1",)
    assert got[("gpu", "gpu.clocks")].commands == ("sudo nvidia-smi -ac 2619,1980",)
    pcie = got[("manual", "pcie.link")]
    assert pcie.needs_bios and pcie.evidence["width_current"] == 8 and any("x16" in s for s in pcie.steps)
    assert ("manual", "cpu.governor") not in got and ("manual", "swap.device") not in got


def test_doctor_findings_tune_fixes_are_not_repeated_but_their_other_remediations_are() -> None:
    defs = tn.load_defs()
    findings = [
        Finding(
            "memory.swappiness",
            Status.WARN,
            "overcommit 2",
            {},
            Remediation("Use heuristic overcommit", "sysctl -w vm.overcommit_memory=0"),
            None,
            "swap",
        ),
        Finding(
            "numa.affinity",
            Status.WARN,
            "balancing on",
            {},
            Remediation("Turn balancing off", "sysctl -w kernel.numa_balancing=0"),
            None,
            "NUMA",
        ),
        Finding(
            "numa.affinity",
            Status.WARN,
            "process on node 0, GPU on node 1",
            {"gpu_node": 1},
            Remediation("Bind to node 1", "numactl --cpunodebind=1 --membind=1 python -m vllm..."),
            "gpu0",
            "NUMA",
        ),
        Finding(
            "gpu.persistence",
            Status.WARN,
            "persistence off",
            {},
            Remediation("Enable persistence mode", "sudo nvidia-smi -pm 1"),
            "gpu0",
            "Persistence mode",
        ),
    ]
    steps = tune.operator_steps(defs, findings, [_Gpu()])
    manual = [s for s in steps if s.kind == "manual"]
    assert [(s.id, s.evidence.get("gpu_node")) for s in manual] == [("numa.affinity", 1)]
    gpu = [s.commands for s in steps if s.kind == "gpu"]
    assert gpu == [("sudo nvidia-smi -pm 1",)]  # the doctor's finding, not a second copy from the playbook


def test_strict_overcommit_is_relaxed_and_heuristic_or_always_is_left_alone(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    for value, status in (("2", "would change"), ("0", "ok"), ("1", "ok")):
        write(root, "/proc/sys/vm/overcommit_memory", f"{value}\n")
        assert by_name(run(root)[1])["vm.overcommit_memory"]["status"] == status


def test_doctor_on_the_same_root_turns_a_sata_swap_into_a_manual_step(tmp_path: Path) -> None:
    from tests.hosttree import SATA_PATH, HostTree

    t = HostTree(tmp_path / "ws")
    t.meminfo(64 << 20, 60 << 20, swap_total_kib=8 << 20, swap_free_kib=8 << 20)
    t.disk("sda", SATA_PATH, rotational=False, partitions=["sda2"])
    t.swaps(("/dev/sda2", "partition", 8 << 20, 0, -2))
    t.cpus(2)
    t.cpufreq([0, 1], "powersave")
    t.sysctl("vm.swappiness", 60)
    before = digest(t.root)
    code, rep = run(t.root, doctor=True)
    assert code == 0 and digest(t.root) == before
    steps = {s["id"]: s for s in rep["operator_steps"]}
    swap = steps["swap.device"]
    assert swap["kind"] == "manual" and any("NVMe" in line for line in swap["steps"])
    assert swap["evidence"]["status"] == "fail" and "swapoff /dev/sda2" in swap["commands"]
    assert "cpu.governor" not in steps  # tune sets the governor itself
    c = by_name(rep)
    assert c["cpu.governor"]["status"] == "would change" and c["vm.swappiness"]["new"] == "10"


def test_shipped_playbooks_load_and_every_recommendation_is_itself_accepted() -> None:
    defs = tn.load_defs()
    assert {"cpu.governor", "kernel.numa_balancing", "vm.swappiness", "thp.enabled"} <= set(defs)
    for d in defs.values():
        assert d.why and d.when in tn.CONDITIONS
        if d.type == "int" or d.choices:
            assert tn.validate(d, d.desired) == d.desired
    manual, gpu = tune._playbooks()
    assert "pcie.link" in manual and "swap.device" in manual and gpu


def test_h200_snapshot_plans_thp_and_skips_what_a_vm_lacks(shared_fixtures: Path, tmp_path: Path) -> None:
    root = tmp_path / "h200"
    shutil.copytree(shared_fixtures / "hosts" / "h200-vm", root, symlinks=True)
    c = by_name(run(root)[1])
    assert c["cpu.governor"]["status"] == "skip"  # a VM: no cpufreq
    assert c["thp.enabled"]["current"] in ("always", "madvise", "never")


# --------------------------------------------------------------------------------------------------
# the kernel-like tree writer and errno classification
# --------------------------------------------------------------------------------------------------
def test_tree_writer_moves_the_bracket_and_keeps_plain_layout(tmp_path: Path) -> None:
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    tn.tree_writer(f, "never")
    assert f.read_text() == "always madvise [never]\n"
    d = tmp_path / "defrag"
    d.write_text("always defer [defer+madvise] madvise never\n")
    tn.tree_writer(d, "madvise")
    assert d.read_text() == "always defer defer+madvise [madvise] never\n"
    p = tmp_path / "swappiness"
    p.write_text("60")
    tn.tree_writer(p, "10")
    assert p.read_text() == "10"
    with pytest.raises(FileNotFoundError):
        tn.tree_writer(tmp_path / "absent", "1")  # like the kernel: never creates a file


_TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz+_0123456789", min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(_TOKEN, min_size=1, max_size=6, unique=True), data=st.data())
def test_tree_writer_round_trips_any_bracketed_choice_file(tokens: list[str], data: st.DataObject) -> None:
    cur = data.draw(st.sampled_from(tokens))
    new = data.draw(st.sampled_from(tokens))
    text = " ".join(f"[{t}]" if t == cur else t for t in tokens) + "\n"
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "choice"
        f.write_text(text)
        tn.tree_writer(f, new)
        assert _BRACKET_OF(f.read_text()) == new
        tn.tree_writer(f, cur)
        assert f.read_text() == text


@settings(max_examples=60, deadline=None)
@given(
    old=_TOKEN,
    new=_TOKEN,
    lead=st.sampled_from(["", " ", "\t"]),
    tail=st.sampled_from(["", "\n", " \n", "\n\n"]),
)
def test_tree_writer_round_trips_any_plain_value_file(old: str, new: str, lead: str, tail: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "value"
        f.write_text(lead + old + tail)
        tn.tree_writer(f, new)
        assert f.read_text().strip() == new
        tn.tree_writer(f, old)
        assert f.read_text() == lead + old + tail


def _BRACKET_OF(text: str) -> str:
    return tn.parse(tn.load_defs()["thp.enabled"], text)


def test_a_recommended_choice_the_host_does_not_offer_is_skipped(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "[always] never\n")
    thp = by_name(run(root)[1])["thp.enabled"]
    assert thp["status"] == "skip" and "does not offer madvise" in thp["why"]


def test_one_apply_at_a_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    root = workstation(tmp_path)
    before = digest(root)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another gputune tune holds the host
        with pytest.raises(BadAnswer, match="another"):
            run(root, apply=True)
        code, rep = run(root)  # a dry run still works, and says its plan may be stale
        assert code == 0 and any("running now" in n for n in rep["notices"])
    finally:
        os.close(fd)
    assert digest(root) == before
    assert run(root, apply=True)[0] == 0  # free again


def test_write_errors_are_classified_by_errno() -> None:
    assert "EPERM" in tn.write_error(PermissionError(errno.EPERM, "x"))
    assert "EINVAL" in tn.write_error(OSError(errno.EINVAL, "x"))
    assert "EROFS" in tn.write_error(OSError(errno.EROFS, "x"))
    assert "errno" in tn.write_error(OSError(errno.EIO, "x"))


def test_host_reads_go_through_the_root(tmp_path: Path) -> None:
    root = workstation(tmp_path)
    d = tn.load_defs()["vm.swappiness"]
    with Host.at(root) as host:
        (inst,) = tn.instances(d, host)
    assert inst.path == "/proc/sys/vm/swappiness" and inst.current.value == "60"

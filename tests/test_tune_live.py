"""`gputune tune` as a real process: exit codes, a real non-root user, and a real apply / verify /
revert round trip of vm.swappiness on this machine's /proc, leaving it as it was."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SWAPPINESS = Path("/proc/sys/vm/swappiness")
LIVE_STATE = Path("/var/lib/gputune")


def gputune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree() -> Iterator[Path]:
    """A small host tree that any user may read (pytest's tmp_path is private to root)."""
    top = Path(tempfile.mkdtemp(prefix="gputune-tune-"))
    top.chmod(0o755)
    for rel, text in {
        "proc/sys/vm/swappiness": "60\n",
        "proc/swaps": "Filename Type Size Used Priority\n/dev/nvme0n1p3 partition 8388604 0 -2\n",
        "sys/kernel/mm/transparent_hugepage/enabled": "[always] madvise never\n",
    }.items():
        p = top / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for dirpath, _, _ in os.walk(top):
        Path(dirpath).chmod(0o755)
    yield top
    import shutil

    shutil.rmtree(top, ignore_errors=True)


def test_exit_0_for_a_dry_run(tree: Path) -> None:
    r = gputune("tune", "--root", str(tree))
    assert r.returncode == 0, r.stderr
    assert "vm.swappiness" in r.stdout and "would change" in r.stdout
    assert (tree / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_exit_0_json_report_for_a_dry_run(tree: Path) -> None:
    r = gputune("tune", "--root", str(tree), "--format", "json", "--only", "vm.swappiness")
    assert r.returncode == 0
    report = json.loads(r.stdout)
    assert report["schema_version"] == 1 and report["mode"] == "dry-run"
    assert report["changes"][0]["name"] == "vm.swappiness" and report["changes"][0]["new"] == "10"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "vm.swappiness=500"], "from 0 to 200"),
        (["--set", "thp.enabled=yes"], "always, madvise, never"),
        (["--only", "nope"], "known tunables"),
        (["--apply", "--revert"], "opposite"),
        (["--revert", "--set", "vm.swappiness=1"], "--revert"),
    ],
)
def test_exit_2_for_usage_errors_with_the_allowed_values(tree: Path, args: list[str], message: str) -> None:
    r = gputune("tune", "--root", str(tree), *args)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert (tree / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_exit_1_for_a_damaged_journal(tree: Path) -> None:
    (tree / "var/lib/gputune").mkdir(parents=True)
    (tree / "var/lib/gputune/journal.json").write_text("{oops")
    r = gputune("tune", "--root", str(tree), "--revert")
    assert r.returncode == 1 and "damaged" in r.stderr and "Traceback" not in r.stderr


def test_exit_1_with_a_clear_message_for_a_user_who_is_not_root(tree: Path) -> None:
    args = ["tune", "--apply", "--set", "vm.swappiness=10", "--root", str(tree)]
    if os.geteuid() != 0:
        r = gputune(*args)
    else:
        # Become a real unprivileged user (nobody) inside the process, after a dry run has imported
        # what lives in root's private Python install, then run the command line.
        dry = [a for a in args if a != "--apply"]
        code = (
            "import os, sys, tuner.cli\n"
            f"sys.argv = ['gputune', *{dry!r}]\n"
            "try:\n    tuner.cli.main()\nexcept SystemExit:\n    pass\n"
            "os.setegid(65534); os.seteuid(65534)\n"
            f"sys.argv = ['gputune', *{args!r}]\n"
            "tuner.cli.main()\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert r.returncode == 1, r.stderr
    assert "must run as root" in r.stderr and "sudo gputune tune --apply" in r.stderr
    assert (tree / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert not (tree / "var").exists()


def test_exit_1_when_the_kernel_refuses_a_write_and_the_rest_still_round_trips(tree: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("--apply needs root")
    thp = tree / "sys/kernel/mm/transparent_hugepage/enabled"
    # An immutable file: the kernel answers EPERM to root as it does for a locked-down sysfs knob.
    if subprocess.run(["chattr", "+i", str(thp)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not available on this file system")
    try:
        r = gputune("tune", "--root", str(tree), "--apply", "--format", "json")
        assert r.returncode == 1
        changes = {c["name"]: c for c in json.loads(r.stdout)["changes"]}
        assert changes["thp.enabled"]["status"] == "failed" and "EPERM" in changes["thp.enabled"]["why"]
        assert changes["vm.swappiness"]["status"] == "changed"
        assert "thp.enabled: failed" in r.stderr
        assert (tree / "proc/sys/vm/swappiness").read_text() == "10\n"
        r = gputune("tune", "--root", str(tree), "--revert")
        assert r.returncode == 0, r.stderr
        assert (tree / "proc/sys/vm/swappiness").read_text() == "60\n" and not (tree / "var").exists()
        assert thp.read_text() == "[always] madvise never\n"
    finally:
        subprocess.run(["chattr", "-i", str(thp)], capture_output=True, check=False)


# --------------------------------------------------------------------------------------------------
# the real machine
# --------------------------------------------------------------------------------------------------
def _why_swappiness_cannot_be_written() -> str | None:
    if os.geteuid() != 0:
        return "not root: the live round trip needs root"
    try:
        current = SWAPPINESS.read_bytes()
        fd = os.open(SWAPPINESS, os.O_WRONLY)
        try:
            os.write(fd, current)  # writing the value it already has changes nothing
        finally:
            os.close(fd)
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, "?")
        return f"/proc/sys/vm/swappiness is not writable here ({name}: {exc.strerror}; a container?)"
    return None


def test_live_apply_verify_revert_of_swappiness_leaves_the_machine_as_it_was() -> None:
    reason = _why_swappiness_cannot_be_written()
    if reason:
        pytest.skip(reason)
    if (LIVE_STATE / "journal.json").exists():
        pytest.skip("this machine already has a gputune journal; the test will not mix with it")
    state_existed = LIVE_STATE.exists()
    before = SWAPPINESS.read_text()
    target = "10" if before.strip() != "10" else "11"
    try:
        r = gputune("tune", "--apply", "--set", f"vm.swappiness={target}", "--format", "json")
        assert r.returncode == 0, r.stderr
        change = json.loads(r.stdout)["changes"][0]
        assert (change["name"], change["status"], change["current"]) == (
            "vm.swappiness",
            "changed",
            before.strip(),
        )
        assert SWAPPINESS.read_text().strip() == target
        assert (LIVE_STATE / "journal.json").exists()

        r = gputune("tune", "--revert")
        assert r.returncode == 0, r.stderr
        assert SWAPPINESS.read_text() == before
        assert not (LIVE_STATE / "journal.json").exists()
        assert LIVE_STATE.exists() == state_existed
    finally:
        if SWAPPINESS.read_text() != before:
            SWAPPINESS.write_text(before)
        if not state_existed and (LIVE_STATE / "journal.json").exists():
            (LIVE_STATE / "journal.json").unlink()

"""`gputune snapshot`: capture on this machine, diagnose the capture, and keep secrets out of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.hosttree import HostTree
from tuner.host import Host
from tuner.snapshot import REDACTED, capture, capture_globs, redact, relevant_env

SECRETS = {
    "HF_TOKEN": "hf_PlantedEnvToken0123456789",
    "OPENAI_API_KEY": "sk-plantedEnvKey0123456789abcdef",
    "VLLM_API_KEY": "plain-vllm-key-without-prefix-42",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "HUGGING_FACE_HUB_TOKEN": "hf_AnotherPlantedToken987654321",
}
CMDLINE_KEY = "sk-plantedCmdlineKey-5550123abc"
CMDLINE_TOKEN = "hf_PlantedCmdlineToken55501234"


def gputune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=REPO,
        timeout=120,
    )


def statuses(report_json: str) -> list[tuple[str, Any, str]]:
    return [(c["id"], c.get("subject"), c["status"]) for c in json.loads(report_json)["checks"]]


def members(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
            elif m.issym():
                out[m.name] = m.linkname.encode()
    return out


# ------------------------------------------------------------------------------------------------
def test_redact_removes_tokens_keys_and_api_key_arguments() -> None:
    text = (
        "HF_TOKEN=hf_abcdefghijklmnop1234 OPENAI_API_KEY='sk-proj-abcdefgh12345678'\n"
        "python -m vllm.entrypoints.openai.api_server\x00--api-key\x00s3cr3t-value\x00--port\x008000\x00"
        "--api-key=other-secret-99 --hf-token hf_xyz12345678\n"
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig\n"
        "AKIAIOSFODNN7EXAMPLE aws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n"
        "pip install https://user:p4ssw0rd@pypi.example.com/simple\n"
        "tokenizers==0.23.2 safetensors==0.6.2 ghp_abcdefghijklmnopqrstuvwx\n"
    )
    out = redact(text)
    for secret in (
        "hf_abcdefghijklmnop1234",
        "sk-proj-abcdefgh12345678",
        "s3cr3t-value",
        "other-secret-99",
        "hf_xyz12345678",
        "eyJhbGciOiJIUzI1NiJ9",
        "AKIAIOSFODNN7EXAMPLE",
        "wJalrXUtnFEMI",
        "p4ssw0rd",
        "ghp_abcdefghijklmnopqrstuvwx",
    ):
        assert secret not in out, secret
    # what is not a secret stays: package pins, ports, the server's module
    assert "tokenizers==0.23.2" in out and "--port\x008000" in out and "vllm.entrypoints" in out
    assert "--api-key\x00" + REDACTED in out


def test_relevant_env_keeps_settings_and_hides_secret_values() -> None:
    env = relevant_env(
        {
            "CUDA_VISIBLE_DEVICES": "0,1",
            "HF_TOKEN": "hf_x1234567890",
            "VLLM_API_KEY": "abc",
            "HOME": "/root",
            "NCCL_DEBUG": "INFO",
        }
    )
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_TOKEN": REDACTED,
        "NCCL_DEBUG": "INFO",
        "VLLM_API_KEY": REDACTED,
    }


def test_capture_list_includes_what_the_gpu_probes_declare() -> None:
    globs = capture_globs()
    assert "/sys/bus/pci/devices/*/current_link_speed" in globs  # tuner/probes/pcie.py CAPTURE
    assert "/sys/bus/pci/devices/*/vendor" in globs  # tuner/probes/gpu.py CAPTURE
    assert len(globs) == len(set(globs))


# ------------------------------------------------------------------------------------------------
def test_snapshot_round_trip_gives_the_live_statuses(tmp_path: Path) -> None:
    out = tmp_path / "x.tar.gz"
    snap = gputune("snapshot", "-o", str(out))
    assert snap.returncode == 0, snap.stderr
    assert snap.stdout.strip() == str(out) and "snapshot of" in snap.stderr
    live = gputune("doctor", "--format", "json")
    offline = gputune("doctor", "--from", str(out), "--format", "json")
    assert live.returncode == offline.returncode == 0, (live.stderr, offline.stderr)
    assert statuses(offline.stdout) == statuses(live.stdout)
    assert len(statuses(live.stdout)) >= 10
    # the layout a person could assemble by hand, and sysfs links kept as links
    with tarfile.open(out) as tar:
        names = {m.name: m for m in tar.getmembers()}
    for name in (
        "etc/os-release",
        "proc/meminfo",
        "proc/cpuinfo",
        "pip-freeze.txt",
        "packages.json",
        "nvml.json",
        "dmesg.txt",
        "gputune-snapshot.json",
        "proc/self/status",
    ):
        assert name in names, name
    assert "nvidia-smi.xml" not in names  # no GPU here: absent = no GPU
    pci_links = [m for n, m in names.items() if n.startswith("sys/bus/pci/devices/")]
    assert pci_links and all(m.issym() for m in pci_links)
    meta = json.loads(members(out)["gputune-snapshot.json"])
    assert meta["gpu"]["reason"] == "no NVIDIA GPU: NVML library not found"
    assert any(s["path"] == "nvidia-smi.xml" for s in meta["skipped"])


def test_secrets_planted_in_env_and_cmdline_do_not_reach_the_tarball(tmp_path: Path) -> None:
    fake_server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "vllm.entrypoints.openai.api_server",
            "--api-key",
            CMDLINE_KEY,
            "--hf-token",
            CMDLINE_TOKEN,
            "--port",
            "8123",
        ],
        env={**os.environ, **SECRETS},
    )
    try:
        deadline = time.monotonic() + 10
        cmdline = Path(f"/proc/{fake_server.pid}/cmdline")
        while CMDLINE_KEY.encode() not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        out = tmp_path / "s.tar.gz"
        snap = gputune("snapshot", "-o", str(out), env=SECRETS)
        assert snap.returncode == 0, snap.stderr
        files = members(out)
    finally:
        fake_server.kill()
        fake_server.wait()
    blob = b"\n".join(files.values())
    for secret in [*SECRETS.values(), CMDLINE_KEY, CMDLINE_TOKEN]:
        assert secret.encode() not in blob, secret
    # the fake server's command line was captured, redacted, not dropped
    captured = files[f"proc/{fake_server.pid}/cmdline"]
    assert b"vllm.entrypoints.openai.api_server" in captured and REDACTED.encode() in captured
    meta = json.loads(files["gputune-snapshot.json"])
    assert meta["env"]["HF_TOKEN"] == REDACTED and meta["env"]["VLLM_API_KEY"] == REDACTED
    assert "redaction" in meta


def test_unreadable_files_are_skipped_and_listed_never_abort(tmp_path: Path) -> None:
    t = HostTree(tmp_path / "root")
    t.write("/proc/meminfo", "MemTotal: 1000 kB\nMemAvailable: 500 kB\n")
    t.link("/proc/cpuinfo", "gone/cpuinfo")  # dangling: exists as a name, cannot be read
    t.nvidia_gpu("0000:01:00.0", current_link_speed="16.0 GT/s PCIe", max_link_speed="16.0 GT/s PCIe")
    arc, meta = capture(Host.at(t.root))
    assert any(s["path"] == "/proc/cpuinfo" and s["reason"].startswith("absent") for s in meta["skipped"])
    assert "proc/meminfo" in arc.files
    assert arc.links["sys/bus/pci/devices/0000:01:00.0"] == "../../../devices/pci0000:01/0000:01:00.0"
    assert arc.files["sys/devices/pci0000:01/0000:01:00.0/current_link_speed"] == b"16.0 GT/s PCIe\n"
    arc.write(tmp_path / "t.tar.gz")
    with Host.at(tmp_path / "t.tar.gz") as host:
        assert host.read_value("/sys/bus/pci/devices/0000:01:00.0/vendor").value == "0x10de"


def test_snapshot_into_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    res = gputune("snapshot", "-o", str(tmp_path / "nope" / "x.tar.gz"))
    assert res.returncode == 2
    assert "no such directory" in res.stderr and "Traceback" not in res.stderr


def test_hand_assembled_snapshot_folder_is_diagnosed(tmp_path: Path, shared_fixtures: Path) -> None:
    root = tmp_path / "by-hand"
    shutil.copytree(shared_fixtures / "hosts" / "h200-vm", root, symlinks=True)
    (root / "pip-freeze.txt").write_text("torch==2.9.0+cu130\nvllm==0.11.0\n")
    (root / "dmesg.txt").write_text(
        "[ 9.9] NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n"
    )
    res = gputune("doctor", "--from", str(root), "--format", "json")
    assert res.returncode == 1, res.stderr  # Xid 79 is a failure
    got = {c["id"]: c for c in json.loads(res.stdout)["checks"]}
    assert got["pcie.link"]["status"] == "pass" and got["kernel.xid"]["status"] == "fail"
    assert got["driver.cuda"]["status"] == "pass"
    assert got["driver.cuda"]["evidence"]["vllm_torch_requirement"].startswith("unknown")


def test_snapshot_onto_a_pipe_is_refused_and_the_pipe_left_alone(tmp_path: Path) -> None:
    fifo = tmp_path / "out.tar.gz"
    os.mkfifo(fifo)
    res = gputune("snapshot", "-o", str(fifo))
    assert res.returncode == 2
    assert "not a regular file" in res.stderr and "Traceback" not in res.stderr
    assert fifo.is_fifo()

"""`gputune triage`: interface, inputs, streaming, and the rules that need several facts at once."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from tuner import triage, triage_scan
from tuner.rundir import TELEMETRY_COLUMNS
from tuner.triage import apply_flag_changes, diagnose, round_down_len
from tuner.triage_inputs import read_telemetry
from tuner.triage_scan import ANCHORS, STAGES, playbook, scan, trigger_of

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"
LABELS = {
    "oom_weights_do_not_fit",
    "kv_cache_too_small_for_max_model_len",
    "no_kv_cache_memory",
    "startup_free_memory_below_target",
    "oom_cudagraph_capture",
    "oom_sampler_warmup_or_profile_run",
    "oom_runtime_under_load",
    "host_ram_oom_killed",
    "host_pinned_memory_swap_space",
    "shm_insufficient",
    "nccl_multi_gpu_comm_failure",
    "cuda_driver_runtime_mismatch",
    "arch_no_kernel_image",
    "quant_or_dtype_unsupported_on_gpu",
    "gpu_hardware_fault",
    "illegal_memory_access_software_bug",
    "config_error_not_resource",
    "unknown",
}
KV_LINE = (
    "ValueError: To serve at least one request with the model's max seq len (65536), (8.0 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.98 GiB). Based on the available memory, "
    "the estimated maximum model length is 8064. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine."
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "tuner", "triage", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )


# ---------------------------------------------------------------------------------------------- data
def test_shipped_playbook_loads_and_every_signature_names_a_label_and_its_source() -> None:
    pb = playbook()
    assert set(pb.causes) == LABELS
    assert set(pb.oom_by_stage) == {*STAGES, "unknown"}
    assert set(pb.oom_by_stage.values()) <= LABELS
    for sig in pb.signatures:
        assert sig.cause in LABELS | {"oom"}, sig.id
        assert sig.source, sig.id
        assert sig.needle.strip(), sig.id
        assert 0 <= sig.weight <= 1, sig.id
        assert sig.stage in (None, *STAGES), sig.id
        assert trigger_of(sig.needle) in sig.needle.lower(), sig.id
        # a cause after loading only makes sense for a stage-mapped OOM, and must be a label
        assert sig.cause_after_load is None or (sig.cause == "oom" and sig.cause_after_load in LABELS), sig.id
    ids = {s.id for s in pb.signatures}
    assert len(ids) == len(pb.signatures)
    for sig in pb.signatures:
        # a message explains other signatures' lines, never its own, and only ones that exist
        assert set(sig.explains) <= ids - {sig.id}, sig.id
    for entry in pb.xid.values():
        assert entry.cause in LABELS


def test_prefilter_anchors_never_match_an_ordinary_serving_line() -> None:
    healthy = (
        "(APIServer pid=8124) INFO 05-01 12:00:10 [loggers.py:123] Engine 000: Avg prompt throughput: 1520.3 "
        "tokens/s, Avg generation throughput: 835.2 tokens/s, Running: 12 reqs, Waiting: 0 reqs, "
        "GPU KV cache "
        'usage: 31.4%, Prefix cache hit rate: 12.0%\n(APIServer pid=8124) INFO:     127.0.0.1:51234 - "POST '
        '/v1/completions HTTP/1.1" 200 OK\n'
    ).lower()
    assert not [a for a in ANCHORS if a in healthy]


def test_the_automaton_and_the_find_fallback_pick_the_same_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyahocorasick is optional: without it one bytes.find pass per trigger word must find the same
    candidate lines, so every corpus log (ASCII, CJK, CRLF, colour codes) scans alike either way."""
    pytest.importorskip("ahocorasick")
    logs = sorted(CORPUS.glob("*.log"))
    assert len(logs) > 1000

    def scan_all() -> list[tuple[object, ...]]:
        out = []
        for log in logs:
            with log.open("rb") as fh:
                res = scan(fh)
            out.append((log.name, [(h.signature.id, h.line_no) for h in res.hits], res.stage, res.exceptions))
        return out

    with_automaton = scan_all()
    monkeypatch.setattr(triage_scan, "ahocorasick", None)  # the matcher is built per scan
    assert scan_all() == with_automaton


def test_automaton_windows_end_at_line_ends_so_no_trigger_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triage_scan, "AUTOMATON_WINDOW", 30)
    text = "abc\nCUDA out of memory here\nxyz nccl error\n" * 3 + "tail without a newline out of memory"
    windows = list(triage_scan._windows(text))
    assert len(windows) > 3
    assert "".join(w for _, w in windows) == text
    assert all(w.endswith("\n") for _, w in windows[:-1])
    assert [base for base, _ in windows] == [sum(len(w) for _, w in windows[:i]) for i in range(len(windows))]
    # a line longer than two windows is cut, each piece starting `overlap` characters before the cut
    monstrous = "x" * 100 + " CUDA out of memory " + "y" * 100 + "\nnext\n"
    pieces = list(triage_scan._windows(monstrous, overlap=5))
    assert all(text_ == monstrous[base : base + len(text_)] for base, text_ in pieces)
    assert pieces[-1][0] + len(pieces[-1][1]) == len(monstrous)
    steps = [b1 + len(t1) - b2 for (b1, t1), (b2, _) in itertools.pairwise(pieces)]
    assert set(steps) == {5, 0}  # pieces cut inside the long line overlap; one ending at its newline does not
    # every trigger word is found with windows this small as with one window, across the cuts too
    pytest.importorskip("ahocorasick")
    pb = playbook()
    matcher = triage_scan._Matcher([s for s in pb.signatures if s.kind != "kernel"], pb.landmarks)
    for sample in (text, monstrous * 3):
        monkeypatch.setattr(triage_scan, "AUTOMATON_WINDOW", 30)
        small = matcher.candidate_lines(sample.lower().encode())
        monkeypatch.setattr(triage_scan, "AUTOMATON_WINDOW", 1 << 20)
        assert small == matcher.candidate_lines(sample.lower().encode())
        assert small


# ---------------------------------------------------------------------------------------------- CLI
def test_json_output_has_the_interface_keys_and_exit_code_0(tmp_path: Path) -> None:
    log = _write(
        tmp_path, "vllm.log", f"(EngineCore_DP0 pid=77) ERROR 05-01 12:00:00 [core.py:1] {KV_LINE}\n"
    )
    proc = _cli(str(log), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("cause", "confidence", "evidence", "remediation", "alternatives", "stage", "fixable_by_args"):
        assert key in doc
    assert doc["cause"] == "kv_cache_too_small_for_max_model_len"
    assert isinstance(doc["evidence"], list) and doc["evidence"][0]["line"] == 1
    assert doc["remediation"]["flag_changes"] == {"--max-model-len": "7936"}
    assert "summary" in doc["remediation"]
    assert all(set(a) == {"cause", "confidence"} for a in doc["alternatives"])


@pytest.mark.parametrize(
    ("text", "code"),
    [("RuntimeError: CUDA error: an illegal memory access was encountered\n", 0), ("nothing failed\n", 1)],
)
def test_a_reader_that_goes_away_leaves_the_exit_code_to_the_diagnosis(
    tmp_path: Path, text: str, code: int
) -> None:
    """`gputune triage run.log | head -1`: the pipe closes before triage writes; the exit code still says
    whether a cause was found (click alone exits 1 on EPIPE, which reads as `unknown`)."""
    log = _write(tmp_path, "vllm.log", text)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "triage", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the interpreter has even started
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == code, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_unknown_cause_exits_1_and_missing_path_exits_2(tmp_path: Path) -> None:
    log = _write(tmp_path, "ok.log", "INFO 05-01 12:00:00 [api_server.py:1] Application startup complete.\n")
    proc = _cli(str(log), "--format", "json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["cause"] == "unknown"
    missing = _cli(str(tmp_path / "nope.log"))
    assert missing.returncode == 2
    assert "no such file" in missing.stderr and "Traceback" not in missing.stderr
    bad_tel = _cli(str(log), "--telemetry", str(tmp_path / "nope.csv"))
    assert bad_tel.returncode == 2


def test_table_output_names_cause_evidence_and_next_arguments(tmp_path: Path) -> None:
    log = _write(tmp_path, "vllm.log", KV_LINE + "\n")
    proc = _cli(str(log))
    assert proc.returncode == 0
    assert "kv_cache_too_small_for_max_model_len" in proc.stdout
    assert "--max-model-len 7936" in proc.stdout
    assert "line 1" in proc.stdout


def test_unreadable_or_logless_input_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    assert triage.main(empty_run, fmt="json") == 2
    log = _write(tmp_path, "locked.log", KV_LINE)
    log.chmod(0)
    try:
        if not os.access(log, os.R_OK):  # root reads it anyway
            assert triage.main(log, fmt="json") == 2
    finally:
        log.chmod(0o644)


def test_empty_log_says_it_is_empty_but_exit_status_and_kernel_log_still_count(tmp_path: Path) -> None:
    log = _write(tmp_path, "vllm.log", "")
    d = diagnose(log)
    assert d.cause == "unknown"
    assert "empty" in d.remediation.summary
    assert any("empty" in e.text for e in d.evidence)
    dmesg = _write(tmp_path, "kern.log", "Out of memory: Killed process 4242 (python3) total-vm:9000kB\n")
    assert diagnose(log, dmesg=dmesg, exit_code=-9).cause == "host_ram_oom_killed"


def test_binary_garbage_is_diagnosed_as_unknown_without_crashing(tmp_path: Path) -> None:
    p = tmp_path / "garbage.log"
    p.write_bytes(bytes(range(256)) * 1000 + b"\xff\xfe" * 5000)
    assert diagnose(p).cause == "unknown"


# ------------------------------------------------------------------------------------- line formats
@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "(APIServer pid=8124) ",
        "(EngineCore_DP0 pid=9000) ERROR 05-01 12:00:00 [core.py:708] ",
        "(VllmWorker rank=0 pid=123) ERROR 05-01 12:00:00 [multiproc_executor.py:470] ",
        "2024-05-01T12:00:00.000Z ",
        "[1,0]<stderr>:",
        "vllm-1  | ",
        "\x1b[1;31mERROR\x1b[0m 05-01 12:00:00 ",
        "[rank0]: ",
    ],
)
def test_wrapper_prefixes_do_not_hide_the_message(tmp_path: Path, prefix: str) -> None:
    log = _write(tmp_path, "x.log", f"{prefix}INFO loading\n{prefix}{KV_LINE}\n")
    d = diagnose(log)
    assert d.cause == "kv_cache_too_small_for_max_model_len"
    assert d.remediation.flag_changes["--max-model-len"] == "7936"


def test_ansi_colours_inside_the_message_are_removed_before_numbers_are_read(tmp_path: Path) -> None:
    line = (
        "\x1b[31mValueError:\x1b[0m Free memory on device (14.2/79.1 GiB) on startup is less than "
        "desired GPU "
        "memory utilization (0.9, 71.19 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
        "other processes."
    )
    d = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert d.cause == "startup_free_memory_below_target"
    # floor((14.2 - 0.791) / 79.1 * 100) / 100 = 0.16
    assert d.remediation.flag_changes == {"--gpu-memory-utilization": "0.16"}


# ------------------------------------------------------------------------------------------ stages
@pytest.mark.parametrize(
    ("landmark", "cause", "stage"),
    [
        ("INFO [gpu_model_runner.py:1] Starting to load model /m...", "oom_weights_do_not_fit", "load"),
        # 'Loading weights took' is logged before process_weights_after_loading (quantized layers repack
        # their weights there: vllm/model_executor/model_loader/base_loader.py), so loading goes on
        ("INFO [default_loader.py:1] Loading weights took 3.1 seconds", "oom_weights_do_not_fit", "load"),
        (
            "INFO [gpu_model_runner.py:1] Model loading took 18.47 GiB memory and 10.99 seconds",
            "oom_sampler_warmup_or_profile_run",
            "memory_profiling",
        ),
        (
            "INFO [gpu_worker.py:1] Available KV cache memory: 12.5 GiB",
            "startup_free_memory_below_target",
            "kv_allocation",
        ),
        (
            "INFO [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 10%",
            "oom_cudagraph_capture",
            "graph_capture",
        ),
        (
            'INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
            "oom_runtime_under_load",
            "serving",
        ),
    ],
)
def test_a_cuda_oom_means_a_different_cause_at_each_stage(
    tmp_path: Path, landmark: str, cause: str, stage: str
) -> None:
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB "
        "memory in use."
    )
    d = diagnose(
        _write(tmp_path, "x.log", f"INFO Initializing a V1 LLM engine (v0.11.0)\n{landmark}\n{oom}\n")
    )
    assert (d.cause, d.stage) == (cause, stage)


def test_graph_capture_oom_suggests_enforce_eager(tmp_path: Path) -> None:
    text = "INFO Capturing CUDA graph shapes: 40%\nRuntimeError: CUDA error: out of memory\n"
    d = diagnose(_write(tmp_path, "x.log", text))
    assert d.cause == "oom_cudagraph_capture"
    assert d.remediation.flag_changes == {"--enforce-eager": ""}


def test_oom_with_another_process_holding_the_card_is_a_startup_free_memory_problem(tmp_path: Path) -> None:
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. "
        "GPU 0 has a total capacity of "
        "79.19 GiB of which 500.00 MiB is free. Process 4242 has 60.00 GiB memory in use. Process 5151 has "
        "18.60 GiB memory in use. Including non-PyTorch memory, this process has 18.60 GiB memory in use."
    )
    head = "INFO [api_server.py:1] vLLM API server version 0.11.0\nINFO Starting to load model m\n"
    d = diagnose(_write(tmp_path, "x.log", f"{head}{oom}\n"))
    assert d.cause == "startup_free_memory_below_target"
    assert "oom_weights_do_not_fit" in dict(d.alternatives)
    assert d.remediation.flag_changes["--gpu-memory-utilization"] == "0.23"
    # the same OOM from a program that is not shown to be vLLM: the cause, but no vLLM flag to pass it
    d = diagnose(_write(tmp_path, "y.log", f"INFO Starting to load model m\n{oom}\n"))
    assert d.cause == "startup_free_memory_below_target"
    assert "--gpu-memory-utilization" not in d.remediation.flag_changes
    assert "60.0 GiB" in d.remediation.summary


# ---------------------------------------------------------------------------------- run directories
def _run_dir(tmp_path: Path) -> Path:
    """The layout of tuner/rundir.py: attempt 1 at the top level, relaunches in attempt-N/."""
    run = tmp_path / "run"
    (run / "attempt-2").mkdir(parents=True)
    (run / "vllm.log").write_text("INFO Application startup complete.\n")
    (run / "attempt-2" / "vllm.log").write_text(KV_LINE + "\n")
    argv = [
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "m",
        "--max-model-len=65536",
        "--port",
        "8000",
    ]
    for d in (run, run / "attempt-2"):
        (d / "command.json").write_text(json.dumps({"argv": argv, "env": {}}))
        (d / "exit.json").write_text(json.dumps({"returncode": 1, "signal": None, "stage": "startup"}))
    return run


def test_run_directory_uses_the_last_attempt_and_its_fix_applies_to_the_command(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    d = diagnose(run)
    assert d.cause == "kv_cache_too_small_for_max_model_len"
    assert d.log is not None and d.log.endswith("attempt-2/vllm.log")
    argv = json.loads((run / "attempt-2" / "command.json").read_text())["argv"]
    new = apply_flag_changes(argv, d.remediation.flag_changes)
    assert new.count("--max-model-len") == 1 and new[new.index("--max-model-len") + 1] == "7936"
    assert "--max-model-len=65536" not in new


def test_no_kv_memory_while_another_process_holds_the_gpu_is_startup_free_memory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "vllm.log").write_text(
        "(EngineCore_DP0 pid=300) INFO Starting to load model m\n"
        "(EngineCore_DP0 pid=300) ERROR ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
    )
    with (run / "gpu-processes.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "gpu", "pid", "name", "used_mib"])
        w.writerow(["1", "0", "999", "other_trainer", "61000"])
        w.writerow(["2", "0", "999", "other_trainer", "61000"])
        w.writerow(["2", "0", "300", "VLLM::EngineCore", "15000"])
    with (run / "telemetry.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TELEMETRY_COLUMNS)
        w.writerow(["1", "0", "61000", "81559", "0", "0", "80", "40", "345", "0", "0", "0"])
        w.writerow(["2", "0", "76000", "81559", "30", "5", "200", "45", "1980", "0", "0", "0"])
    d = diagnose(run)
    assert d.cause == "startup_free_memory_below_target"
    assert any(e.kind == "telemetry" and "other processes held 61000 MiB" in e.text for e in d.evidence)
    assert "no_kv_cache_memory" in dict(d.alternatives)


# --------------------------------------------------------------------------------------- telemetry
def _nvml_to_recorder(nvml: Path, out: Path) -> Path:
    """The recorder's CSV layout filled with the real NVML samples of the H200 OOM trace."""
    with nvml.open() as src, out.open("w", newline="") as dst:
        w = csv.writer(dst)
        w.writerow(
            [
                "time",
                "gpu",
                "mem_used_mib",
                "mem_total_mib",
                "util_gpu",
                "util_mem",
                "power_w",
                "temp_c",
                "sm_clock_mhz",
                "throttle",
                "pcie_tx_kbs",
                "pcie_rx_kbs",
            ]
        )
        for row in csv.reader(src):
            if len(row) == 5:
                w.writerow([row[0], "0", row[1], row[2], row[3], row[4], "", "", "", "", "", ""])
    return out


@pytest.mark.parametrize("kind", ["dmon", "nvml", "recorder"])
def test_telemetry_in_all_three_formats_shows_memory_at_capacity(
    shared_fixtures: Path, tmp_path: Path, kind: str
) -> None:
    base = shared_fixtures / "gpu-oom"
    tel = {
        "dmon": base / "oom-grow-dmon.txt",
        "nvml": base / "oom-grow-nvml.csv",
        "recorder": _nvml_to_recorder(base / "oom-grow-nvml.csv", tmp_path / "telemetry.csv"),
    }[kind]
    summary = read_telemetry(tel)
    assert summary.peak_used_mib is not None and summary.peak_used_mib > 130_000
    d = diagnose(base / "oom-grow-log.txt", telemetry=tel)
    assert d.cause == "oom_runtime_under_load"
    facts = [e for e in d.evidence if e.kind == "telemetry"]
    assert facts and "of 14" in facts[0].text  # "of 143771 MiB" (NVML) or "of 143155 MiB" (from the log)


def test_dmon_parser_reads_named_columns_and_treats_dash_as_missing(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "dmon.txt",
        "#Date Time gpu pwr sm mem fb\n#YYYYMMDD HH:MM:SS Idx W % % MB\n"
        " 20261129 16:00:57 0 79 - - -\n 20261129 16:00:58 0 300 97 40 81000\n",
    )
    s = read_telemetry(p)
    assert (s.format, s.samples, s.peak_used_mib, s.util_peak) == ("nvidia-smi-dmon", 1, 81000.0, 97.0)


def test_run_that_did_not_oom_stays_unknown_even_with_telemetry(shared_fixtures: Path) -> None:
    base = shared_fixtures / "gpu-oom"
    d = diagnose(base / "oom-frag-log.txt", telemetry=base / "oom-frag-dmon.txt", exit_code=0)
    assert d.cause == "unknown"


# ------------------------------------------------------------------------------ exit status + dmesg
def test_sigkill_with_an_oom_killer_line_in_dmesg_is_host_ram(tmp_path: Path) -> None:
    log = _write(tmp_path, "vllm.log", "INFO Loading safetensors checkpoint shards: 40% Completed\n")
    kern = CORPUS / "cpu-host-ram-cgroup-oom.dmesg.txt"
    d = diagnose(log, dmesg=kern, exit_code=-9)
    assert d.cause == "host_ram_oom_killed" and d.confidence >= 0.95
    kinds = {e.kind for e in d.evidence}
    assert {"kernel", "exit"} <= kinds
    assert _cli(str(log), "--dmesg", str(kern), "--exit-code", "137").returncode == 0


def test_a_dataloader_worker_the_oom_killer_ended_is_host_ram_from_the_log_alone() -> None:
    """A real DataLoader whose workers outgrew a cgroup's memory limit (tests/corpus/make_torch_failures.py):
    PyTorch names the worker's signal, SIGKILL, and the kernel log says the OOM killer sent it."""
    log = CORPUS / "cpu-torch-dataloader-worker-oom-killed.log"
    alone = diagnose(log)
    assert alone.cause == "host_ram_oom_killed" and alone.confidence < 0.8  # a SIGKILL: likely, not certain
    assert any("is killed by signal: Killed" in e.text for e in alone.evidence)
    kern = diagnose(log, dmesg=CORPUS / "cpu-torch-dataloader-worker-oom-killed.dmesg.txt")
    assert kern.cause == "host_ram_oom_killed" and kern.confidence > alone.confidence


def test_sigkill_alone_is_only_a_weak_host_ram_guess(tmp_path: Path) -> None:
    log = _write(tmp_path, "vllm.log", "INFO Loading safetensors checkpoint shards: 40% Completed\n")
    d = diagnose(log, exit_code=137)
    assert d.cause == "host_ram_oom_killed" and d.confidence <= 0.6


@pytest.mark.parametrize(
    ("xid", "cause"),
    [
        ("79", "gpu_hardware_fault"),
        ("48", "gpu_hardware_fault"),
        ("119", "gpu_hardware_fault"),
        ("31", "illegal_memory_access_software_bug"),
    ],
)
def test_nvrm_xid_codes_in_the_kernel_log(tmp_path: Path, xid: str, cause: str) -> None:
    log = _write(tmp_path, "vllm.log", "RuntimeError: CUDA error: unspecified launch failure\n")
    kern = _write(
        tmp_path,
        "kern.log",
        f"[ 812.1] NVRM: Xid (PCI:0000:3b:00): {xid}, pid=4242, name=python3, Ch 00000008\n",
    )
    d = diagnose(log, dmesg=kern)
    assert d.cause == cause
    assert any(e.kind == "kernel" for e in d.evidence) or cause == "illegal_memory_access_software_bug"


def test_illegal_memory_access_is_never_a_memory_label(tmp_path: Path) -> None:
    text = (
        "(VllmWorker rank=0 pid=1) ERROR RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[rank0]:[E501 12:00:00.000 ProcessGroupNCCL.cpp:1] [Rank 0] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n"
    )
    d = diagnose(_write(tmp_path, "x.log", text), exit_code=-9)
    assert d.cause == "illegal_memory_access_software_bug"
    assert not d.memory and not d.fixable_by_args


@pytest.mark.parametrize(
    "line",
    [
        "INFO 02-26 09:54:05 executor_base.py:111] # cuda blocks: 0, # CPU blocks: 4681",
        "INFO 04-27 10:13:05 llm_engine.py:275] # GPU blocks: 0, # CPU blocks: 256",
        "INFO 02-26 09:54:05 worker.py:267] model weights take 5.20GiB; non_torch_memory takes 0.03GiB; "
        "PyTorch activation peak memory takes 1.42GiB; the rest of the memory reserved for KV "
        "Cache is -1.05GiB.",
        "INFO 11-20 worker.py:241] Memory profiling results: total_gpu_memory=23.58GiB "
        "initial_memory_usage=15.3GiB "
        "peak_torch_memory=24.1GiB memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB "
        "kv_cache_size=-2.89GiB gpu_memory_utilization=0.90",
    ],
)
def test_v0_zero_kv_blocks_predict_no_kv_memory_when_the_log_stops_before_the_error(
    tmp_path: Path, line: str
) -> None:
    text = f"INFO Loading model weights took 5.2032 GB\n{line}\n[rank0]: Traceback (most recent call last):\n"
    d = diagnose(_write(tmp_path, "x.log", text))
    assert (d.cause, d.stage) == ("no_kv_cache_memory", "kv_allocation")


def test_healthy_v0_block_counts_are_not_a_failure(tmp_path: Path) -> None:
    text = (
        "INFO llm_engine.py:275] # GPU blocks: 1024, # CPU blocks: 2048\n"
        "INFO Avg prompt throughput: 12 tokens/s\n"
    )
    assert diagnose(_write(tmp_path, "x.log", text)).cause == "unknown"


def test_an_oom_while_layers_allocate_their_weights_is_a_load_oom(tmp_path: Path) -> None:
    text = (
        '  File "/venv/lib/python3.9/site-packages/vllm/model_executor/models/llama.py", line '
        "103, in __init__\n"
        "    self.qkv_proj = ColumnParallelLinear(\n"
        "  File "
        '"/venv/lib/python3.9/site-packages/vllm/model_executor/parallel_utils/tensor_parallel/layers.py", '
        "line 272, in __init__\n"
        "    self.weight = Parameter(torch.empty(\n"
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 160.00 MiB (GPU "
        "0; 79.35 GiB total "
        "capacity; 78.58 GiB already allocated; 145.19 MiB free; 78.58 GiB reserved in total by PyTorch)\n"
    )
    d = diagnose(_write(tmp_path, "x.log", text))
    assert (d.cause, d.stage) == ("oom_weights_do_not_fit", "load")


def test_a_retyped_nccl_error_is_still_an_nccl_failure(tmp_path: Path) -> None:
    text = "VllM : NCCLerror: unhandled system error (run withNCCL DEBUG=INFo for details)\n"
    d = diagnose(_write(tmp_path, "x.log", text))
    assert d.cause == "nccl_multi_gpu_comm_failure"
    assert not d.memory
    # a system call failing inside NCCL is most often /dev/shm in a container: offered, never chosen
    assert ("shm_insufficient", 0.35) in d.alternatives
    assert diagnose(_write(tmp_path, "y.log", "RuntimeError: unhandled system error\n")).cause == "unknown"


def test_rays_small_dev_shm_warning_is_only_an_alternative_that_any_failure_outranks(tmp_path: Path) -> None:
    warn = (
        "2023-11-18 03:39:16,283 WARNING services.py:1996 -- WARNING: The object store is "
        "using /tmp instead of "
        "/dev/shm because /dev/shm has only 67108864 bytes available. This will harm performance!\n"
    )
    alone = diagnose(_write(tmp_path, "a.log", warn + "INFO llm_engine.py:72] Initializing an LLM engine\n"))
    # printed in every container with docker's default /dev/shm, failing or not: alone it names no cause
    assert alone.cause == "unknown"
    assert alone.alternatives[0][0] == "shm_insufficient"
    kv = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.\n"
    assert diagnose(_write(tmp_path, "b.log", warn + kv)).cause == "no_kv_cache_memory"


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        (
            "ValueError: Available memory on node 0 (10.5/31.2 GiB) on startup is less than "
            "desired CPU memory "
            "utilization (0.9, 28.1 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
            "controls the "
            "fraction of CPU memory reserved (despite its name).",
            "startup_free_memory_below_target",
        ),
        (
            "ValueError: Externally held weights on device cuda:0 (70.1/79.2 GiB) exceed the "
            "desired GPU memory "
            "utilization (0.8, 63.4 GiB). Increase GPU memory utilization or reduce GPU memory used by other "
            "processes.",
            "startup_free_memory_below_target",
        ),
        (
            "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve "
            "even a single "
            "token. Try increasing `gpu_memory_utilization`.",
            "no_kv_cache_memory",
        ),
        (
            "ValueError: FP8 KV cache is not supported by the Triton attention backend on Tesla T4 (compute "
            "capability 7.5); native FP8 (fp8e4nv) requires SM89+. Re-run with --kv-cache-dtype float16.",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "ValueError: The quantization method moe_wna16 + awq is not supported for the current "
            "GPU. Minimum "
            "capability: 75. Current capability: 70.",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "ERROR 05-01 [pynccl_wrapper.py:385] Failed to load NCCL library from libnccl.so.2. "
            "It is expected if "
            "you are not running on NVIDIA/AMD GPUs.",
            "nccl_multi_gpu_comm_failure",
        ),
    ],
)
def test_vllm_032_resource_messages_found_by_reading_its_source(
    tmp_path: Path, message: str, cause: str
) -> None:
    assert diagnose(_write(tmp_path, "x.log", message + "\n")).cause == cause


# --------------------------------------------------------------------------------------- streaming
def test_a_200_mb_log_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    line = (
        "(APIServer pid=8124) INFO 05-01 12:00:00 [loggers.py:123] Engine 000: Avg prompt throughput: 1520.3 "
        "tokens/s, Avg generation throughput: 835.2 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV "
        "cache usage: 31.4%, Prefix cache hit rate: 12.0%\n"
    )
    block = (line * 4000).encode()
    p = tmp_path / "big.log"
    with p.open("wb") as fh:
        fh.write(b"INFO Application startup complete.\n")
        for _ in range(200 * 2**20 // len(block)):
            fh.write(block)
        fh.write(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.15 GiB.\n")
    tracemalloc.start()
    with p.open("rb") as fh:
        res = scan(fh)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert res.lines > 800_000
    assert {h.line_no for h in res.hits} == {res.lines}
    assert res.stage == "serving"
    assert peak < 48 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_line_numbers_stay_right_across_chunk_boundaries(tmp_path: Path) -> None:
    filler = "INFO " + "x" * 95 + "\n"
    n = (4 << 20) // len(filler) + 7  # past the first chunk
    p = tmp_path / "x.log"
    p.write_text(filler * n + KV_LINE + "\n" + filler * 3)
    d = diagnose(p)
    assert d.evidence[0].line == n + 1


# ------------------------------------------------------------------------------ apply_flag_changes
@pytest.mark.parametrize(
    ("args", "changes", "expected"),
    [
        (
            ["--model", "m", "--max-model-len", "65536"],
            {"--max-model-len": "8064"},
            ["--model", "m", "--max-model-len", "8064"],
        ),
        (
            ["--max-model-len=65536", "--port", "8000"],
            {"--max-model-len": "8064"},
            ["--max-model-len", "8064", "--port", "8000"],
        ),
        (
            ["--max-model-len", "4096", "--port", "1", "--max_model_len", "65536"],
            {"--max-model-len": "2048"},
            ["--port", "1", "--max-model-len", "2048"],
        ),
        (["--model", "m"], {"--enforce-eager": ""}, ["--model", "m", "--enforce-eager"]),
        (["--enforce-eager", "--model", "m"], {"--enforce-eager": ""}, ["--enforce-eager", "--model", "m"]),
        (
            ["--model", "m", "--quantization", "fp8", "--port", "9"],
            {"--quantization": None},
            ["--model", "m", "--port", "9"],
        ),
        (["--cpu-offload-gb=40", "--model", "m"], {"--cpu-offload-gb": None}, ["--model", "m"]),
        (
            ["--model", "m"],
            {"--gpu-memory-utilization": "0.85", "--max-num-seqs": "128"},
            ["--model", "m", "--gpu-memory-utilization", "0.85", "--max-num-seqs", "128"],
        ),
        (
            ["--model", "m", "--", "--max-model-len", "9"],
            {"--max-model-len": "8"},
            ["--model", "m", "--", "--max-model-len", "8"],
        ),
    ],
)
def test_apply_flag_changes(args: list[str], changes: dict[str, str | None], expected: list[str]) -> None:
    assert apply_flag_changes(args, changes) == expected


def test_apply_flag_changes_does_not_modify_its_input() -> None:
    args = ["--max-model-len", "1"]
    apply_flag_changes(args, {"--max-model-len": "2"})
    assert args == ["--max-model-len", "1"]


@pytest.mark.parametrize(
    ("n", "expected"),
    [(8064, 7936), (122080, 121856), (5632, 5632), (1920, 1920), (23648, 23552), (100, 100)],
)
def test_max_model_len_is_rounded_down_to_a_round_number(n: int, expected: int) -> None:
    assert round_down_len(n) == expected
    assert round_down_len(n) <= n


def test_every_message_of_the_kv_check_in_the_installed_vllm_is_matched() -> None:
    """The installed vLLM's own f-strings, rendered with numbers, are what the signatures must match."""
    src = REPO / ".venv/lib/python3.11/site-packages/vllm/v1/core/kv_cache_utils.py"
    if not src.is_file():
        pytest.skip("vLLM (CPU build) not installed in .venv")
    text = src.read_text()
    assert "No available memory for the cache blocks" in text
    assert re.search(r"estimated maximum model length is", text)


# ------------------------------------------------------------------- weights that do not fit: next flags
WEIGHTS_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity "
    "of 80.00 GiB of which 739.81 MiB is free. Including non-PyTorch memory, this process has 79.20 GiB "
    "memory in use."
)


def _weights_run(
    tmp_path: Path, *, count: int, cc: list[int] | None, weights_gib: float, host_gib: float = 512
) -> Path:
    """A run directory whose plan.json records the GPUs and the weights (tuner/plan.py Plan.to_dict)."""
    run = tmp_path / "run"
    run.mkdir(parents=True)
    (run / "vllm.log").write_text(
        "INFO Initializing a V1 LLM engine (v0.11.0) with config: model='m', dtype=torch.bfloat16, "
        "quantization=None, tensor_parallel_size=1\n"
        "INFO [gpu_model_runner.py:1] Starting to load model m...\n" + WEIGHTS_OOM + "\n"
    )
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    (run / "command.json").write_text(json.dumps({"argv": argv, "env": {}}))
    plan = {
        "weights_bytes": int(weights_gib * 2**30),
        "weights_scheme": "bfloat16",
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "host_ram_available": int(host_gib * 2**30),
        "device": {"name": "GPU", "count": count, "total_bytes": 80 * 2**30, "compute_capability": cc},
    }
    (run / "plan.json").write_text(json.dumps(plan))
    return run


def test_weights_oom_ranks_more_gpus_then_fp8_then_offload(tmp_path: Path) -> None:
    d = diagnose(_weights_run(tmp_path, count=2, cc=[9, 0], weights_gib=75))
    assert d.cause == "oom_weights_do_not_fit"
    assert d.remediation.flag_changes == {"--tensor-parallel-size": "2"}
    alts = [a.flag_changes for a in d.remediation.alternatives if a.flag_changes]
    # 75 GiB on a card with 80 x 0.9 = 72 GiB usable: 3 GiB short, plus 2 GiB of KV/activation room
    assert alts[:2] == [{"--quantization": "fp8"}, {"--cpu-offload-gb": "5"}]


def test_weights_oom_proposes_fp8_only_on_gpus_with_fp8_units(tmp_path: Path) -> None:
    ada = diagnose(_weights_run(tmp_path / "a", count=1, cc=[8, 9], weights_gib=75))
    assert ada.remediation.flag_changes == {"--quantization": "fp8"}
    ampere = diagnose(_weights_run(tmp_path / "b", count=1, cc=[8, 6], weights_gib=75))
    assert "--quantization" not in ampere.remediation.flag_changes
    assert ampere.remediation.flag_changes == {"--cpu-offload-gb": "5"}
    assert any("sm_86" in a.summary for a in ampere.remediation.alternatives)


def test_weights_oom_says_when_no_argument_change_is_safe(tmp_path: Path) -> None:
    d = diagnose(_weights_run(tmp_path, count=1, cc=[8, 0], weights_gib=300, host_gib=64))
    assert d.remediation.flag_changes == {}
    assert "No argument change is known to be safe" in d.remediation.summary
    assert d.fixable_by_args  # launch's --auto-fix still stops: it needs flag changes too


def test_weights_oom_without_the_model_proposes_no_offload_from_the_failed_allocation(tmp_path: Path) -> None:
    log = "INFO Starting to load model m\n" + WEIGHTS_OOM.replace("896.00 MiB", "2.50 GiB") + "\n"
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "oom_weights_do_not_fit"
    # 'Tried to allocate' is one layer's tensor, not the model: an offload taken from it only crawls
    assert d.remediation.flag_changes == {}
    assert "No argument change is known to be safe" in d.remediation.summary
    assert any("at least 3 GiB short" in a.summary for a in d.remediation.alternatives)


def _oom_on(total_gib: float) -> str:
    return WEIGHTS_OOM.replace("80.00 GiB", f"{total_gib:.2f} GiB")


def test_weights_oom_counts_a_profile_named_in_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan.json without weights_bytes, command.json --model llama3-8b (a built-in profile, ~15 GiB in
    bf16) on two 16 GiB cards: TP 2 fits, its 32 heads divide by 2."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "vllm.log").write_text("INFO Starting to load model llama3-8b...\n" + _oom_on(16) + "\n")
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "llama3-8b"]
    (run / "command.json").write_text(json.dumps({"argv": argv, "env": {"CUDA_VISIBLE_DEVICES": "0,1"}}))
    plan = {
        "device": {"name": "GPU", "count": 8, "compute_capability": [8, 6]},
        "host_ram_available": 64 * 2**30,
    }
    (run / "plan.json").write_text(json.dumps(plan))
    d = diagnose(run)
    assert d.cause == "oom_weights_do_not_fit"
    assert d.remediation.flag_changes == {"--tensor-parallel-size": "2"}
    assert "profile llama3-8b" in d.remediation.summary and "estimate" not in d.remediation.summary
    assert "32 attention heads" in d.remediation.summary
    offload = [a.flag_changes for a in d.remediation.alternatives if "--cpu-offload-gb" in a.flag_changes]
    assert offload == [{"--cpu-offload-gb": "3"}]  # 14.96 GiB - 14.4 usable + 2, rounded up
    assert any("sm_86" in a.summary for a in d.remediation.alternatives)  # no fp8 on Ampere


def test_weights_oom_reads_the_model_from_the_logged_engine_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No run directory: the V1 engine's config line names a repo id that a profile carries."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    log = (
        "INFO 01-01 [core.py:1] Initializing a V1 LLM engine (v0.11.0) with config: "
        "model='meta-llama/Meta-Llama-3-8B-Instruct', speculative_config=None, dtype=torch.bfloat16, "
        "quantization=None, tensor_parallel_size=1, gpu_memory_utilization=0.9\n"
        "INFO [gpu_model_runner.py:1] Starting to load model meta-llama/Meta-Llama-3-8B-Instruct...\n"
        + _oom_on(16)
        + "\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "oom_weights_do_not_fit"
    assert d.remediation.flag_changes == {"--cpu-offload-gb": "3"}
    text = d.remediation.summary
    assert "profile llama3-8b" in text and "host RAM was not recorded" in text
    assert "decode steps" in text and "PCIe Gen4 x16 assumed" in text
    assert any("4-bit AWQ/GPTQ checkpoint" in a.summary for a in d.remediation.alternatives)


def test_weights_oom_estimates_a_70b_fp16_model_from_its_repo_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 70B fp16 model on one 80 GB card: ~130 GiB of weights, 72 GiB usable: offload ~61 GiB, not 1."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    log = (
        "INFO 01-01 [utils.py:1] non-default args: "
        "{'model': 'meta-llama/Llama-2-70b-hf', 'dtype': 'float16'}\n"
        "INFO [gpu_model_runner.py:1] Starting to load model meta-llama/Llama-2-70b-hf...\n"
        + _oom_on(80)
        + "\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "oom_weights_do_not_fit"
    assert d.remediation.flag_changes == {"--cpu-offload-gb": "61"}
    assert "estimate: 70B parameters (from the name)" in d.remediation.summary
    alts = " | ".join(a.summary for a in d.remediation.alternatives)
    # two cards would hold it, but the log shows only GPU 0
    assert "--tensor-parallel-size 2 needs 2 such GPUs" in alts
    assert "did not record the GPU" in alts  # fp8 needs a known sm_89+ GPU


@pytest.mark.parametrize(("gpu", "fp8"), [("NVIDIA H100 80GB HBM3", True), ("NVIDIA A100-SXM4-80GB", False)])
def test_weights_oom_proposes_fp8_from_the_logged_gpu_name_only_on_sm89_and_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str, fp8: bool
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    log = (
        f"INFO GPU 0: {gpu}\n"
        "INFO non-default args: {'model': 'meta-llama/Llama-2-70b-hf'}\n"
        "INFO [gpu_model_runner.py:1] Starting to load model x...\n" + _oom_on(80) + "\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    if fp8:
        # 70B x 1.05 bytes = 68.4 GiB + 2 GiB room fits in 72
        assert d.remediation.flag_changes == {"--quantization": "fp8"}
    else:
        assert "--quantization" not in d.remediation.flag_changes
        assert d.remediation.flag_changes == {"--cpu-offload-gb": "61"}
        assert any("sm_80" in a.summary for a in d.remediation.alternatives)


@pytest.mark.parametrize(("visible", "expected"), [("0,1", None), ("0,1,2,3", "4")])
def test_weights_oom_shards_only_over_as_many_gpus_as_are_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, visible: str, expected: str | None
) -> None:
    """~130 GiB on 40 GiB cards (36 usable) needs TP 4."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "vllm.log").write_text("INFO Starting to load model x...\n" + _oom_on(40) + "\n")
    argv = ["vllm", "serve", "meta-llama/Llama-2-70b-chat-hf", "--dtype", "float16"]
    (run / "command.json").write_text(json.dumps({"argv": argv, "env": {"CUDA_VISIBLE_DEVICES": visible}}))
    d = diagnose(run)
    assert d.remediation.flag_changes.get("--tensor-parallel-size") == expected
    if expected is None:
        assert any("only 2 visible" in a.summary for a in d.remediation.alternatives)


def test_weights_oom_counts_the_gpus_the_log_shows_through_world_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    log = (
        "INFO non-default args: {'model': 'meta-llama/Llama-2-70b-hf', 'tensor_parallel_size': 2}\n"
        "DEBUG [parallel_state.py:1] world_size=2 rank=0 local_rank=0 distributed_init_method=env:// "
        "backend=nccl\n"
        "INFO Starting to load model x...\n" + _oom_on(40) + "\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert "65.2 GiB per GPU at tensor_parallel_size=2" in d.remediation.summary
    assert "--tensor-parallel-size" not in d.remediation.flag_changes
    assert any("only 2 visible per the log" in a.summary for a in d.remediation.alternatives)


def test_weights_remedies_parse_with_the_installed_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every flag change of the weights remedies, applied to a serve command, passes vLLM's own parser."""
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    parser = arg_utils.EngineArgs.add_cli_args(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    runs = [
        _weights_run(tmp_path / "a", count=2, cc=[9, 0], weights_gib=75),
        _weights_run(tmp_path / "b", count=8, cc=[8, 0], weights_gib=200),
        _write(
            tmp_path,
            "c.log",
            "INFO GPU 0: NVIDIA L40S\nINFO non-default args: {'model': 'Qwen/Qwen2.5-72B-Instruct'}\n"
            "INFO Starting to load model x...\n" + _oom_on(48) + "\n",
        ),
    ]
    seen = 0
    base = ["--model", "m", "--max-model-len", "8192", "--tensor-parallel-size", "1"]
    for run in runs:
        d = diagnose(run)
        assert d.cause == "oom_weights_do_not_fit"
        for changes in [d.remediation.flag_changes] + [a.flag_changes for a in d.remediation.alternatives]:
            if not changes:
                continue
            ns = parser.parse_args(apply_flag_changes(base, changes))
            for flag, value in changes.items():
                got = getattr(ns, flag.lstrip("-").replace("-", "_"))
                assert got == (type(got)(value) if isinstance(got, (int, float)) else value), (flag, got)
            seen += 1
    assert seen >= 4


def test_telemetry_counts_the_gpus_it_sampled(tmp_path: Path) -> None:
    p = tmp_path / "telemetry.csv"
    p.write_text(
        "time,gpu,mem_used_mib,mem_total_mib\n1,0,10,81920\n1,1,10,81920\n2,0,20,81920\n2,1,20,81920\n"
    )
    assert read_telemetry(p).gpus == 2


# ------------------------------------------------------------------- calibration and messages from source
def test_an_oom_line_with_no_stage_landmark_is_a_weak_guess_with_start_up_alternatives(
    tmp_path: Path,
) -> None:
    d = diagnose(_write(tmp_path, "x.log", WEIGHTS_OOM + "\n"))
    assert d.cause == "oom_runtime_under_load" and d.confidence <= 0.65
    assert "oom_weights_do_not_fit" in dict(d.alternatives)
    graphs = WEIGHTS_OOM.replace(
        "Including",
        "Of the allocated memory 70 GiB is allocated by PyTorch, with "
        "76.00 MiB allocated in private pools (e.g., CUDA Graphs), and so on. Including",
    )
    assert diagnose(_write(tmp_path, "y.log", graphs + "\n")).confidence >= 0.9


def test_an_oom_line_that_several_signatures_read_gives_each_explanation_once(tmp_path: Path) -> None:
    """PyTorch's OOM line is read by more than one signature; the stage-free explanations (a request larger
    than the card, nothing freed yet) are evidence about the line, listed once however many read it."""
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 19.05 GiB. GPU 1 has a total capacity "
        "of 10.57 GiB of which 6.31 GiB is free. Process 855628 has 4.24 GiB memory in use. Of the allocated "
        "memory 4.02 GiB is allocated by PyTorch, and 28.52 MiB is reserved by PyTorch but unallocated."
    )
    d = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert d.cause == "oom_sampler_warmup_or_profile_run"
    texts = [e.text for e in d.evidence]
    assert any("more than the whole 10.6 GiB card" in t for t in texts)
    assert len(texts) == len(set(texts)), texts


@pytest.mark.parametrize(
    "line",
    [
        "Feb 24 11:16:31 h systemd[1]: x.service: A process of this unit has been killed by the OOM killer.",
        "Feb 24 11:16:32 host systemd[1]: vllm.service: Failed with result 'oom-kill'.",
        "      Reason:       OOMKilled",
        # Ray's own host-memory monitor (vLLM's Ray executor): its three wordings
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "(raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), "
        "0 Workers crashed due to other reasons at node (ID: 35, IP: 10.0.0.7) over the last time period.",
        "Memory on the node (IP: 10.0.0.7, ID: 70) where the task (actor ID: 0d, name=RayWorker.__init__, "
        "pid=308, memory used=11.15GB) was running was 12.49GB / 13.15GB (0.950003), which exceeds the "
        "memory usage threshold of 0.95. Ray killed this worker (ID: 79) because it was the most recently "
        "scheduled task",
    ],
)
def test_service_manager_and_container_oom_kills_are_host_ram(tmp_path: Path, line: str) -> None:
    assert diagnose(_write(tmp_path, "x.log", line + "\n")).cause == "host_ram_oom_killed"


def test_retyped_lower_case_trust_remote_code_error_is_config_and_the_flag_is_never_added(
    tmp_path: Path,
) -> None:
    line = (
        "valueerror: loading m/ requires you to execute the configuration file in that repo on your local "
        "machine. make sure you have read the code there to avoid malicious use"
    )
    d = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert d.cause == "config_error_not_resource" and not d.memory
    assert d.remediation.flag_changes == {}
    assert {"--trust-remote-code": ""} in [a.flag_changes for a in d.remediation.alternatives]


def test_v0_swap_space_exhausted_doubles_the_swap_space(tmp_path: Path) -> None:
    log = (
        "INFO args: Namespace(swap_space=4, max_num_seqs=256)\n"
        "RuntimeError: Aborted due to the lack of CPU swap space. Please increase the swap space to avoid "
        "this error.\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "host_pinned_memory_swap_space"
    assert d.remediation.flag_changes == {"--swap-space": "8"}


@pytest.mark.parametrize(
    ("rel", "needles"),
    [
        ("transformers/dynamic_module_utils.py", ["contains custom code which must be executed"]),
        (
            "transformers/quantizers/quantizer_fbgemm_fp8.py",
            ["is only supported on GPUs with compute capability >= 9.0"],
        ),
        ("huggingface_hub/utils/_http.py", ["Client Error.", "Cannot access gated repo"]),
        ("vllm/v1/worker/gpu_worker.py", ["check_if_supports_dtype"]),
        (
            "huggingface_hub/utils/_validators.py",
            ["Repo id must be in the form", "Repo id must use alphanumeric"],
        ),
        ("transformers/utils/hub.py", ["does not appear to have a file named"]),
        (
            "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py",
            ["Quantization scheme is not supported for the current GPU. "],
        ),
        ("vllm/model_executor/models/registry.py", ["Error in inspecting model architecture '%s'"]),
        ("torch/include/c10/cuda/driver_api.h", ['"CUDA driver error: "']),
    ],
)
def test_messages_in_the_installed_packages_are_the_ones_the_signatures_match(
    rel: str, needles: list[str]
) -> None:
    src = REPO / ".venv/lib/python3.11/site-packages" / rel
    if not src.is_file():
        pytest.skip(f"{rel} not installed in .venv")
    text = src.read_text()
    sigs = {s.id: s for s in playbook().signatures}
    for needle in needles:
        assert needle in text, needle
    rendered = {
        "transformers/dynamic_module_utils.py": (
            "The repository m contains custom code which must be executed to correctly load the model."
        ),
        "transformers/quantizers/quantizer_fbgemm_fp8.py": (
            "FP8 quantized models is only supported on GPUs with compute capability >= 9.0 (e.g H100)"
        ),
        "huggingface_hub/utils/_http.py": "huggingface_hub.errors.GatedRepoError: 401 Client Error. (x)",
        "vllm/v1/worker/gpu_worker.py": "    current_platform.check_if_supports_dtype(self.model_config)",
        "huggingface_hub/utils/_validators.py": (
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
            "'namespace/repo_name': '/models/x'. Use `repo_type` argument if needed."
        ),
        "transformers/utils/hub.py": (
            "OSError: /models/x does not appear to have a file named config.json. Checkout "
            "'https://huggingface.co//models/x/tree/None' for available files."
        ),
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py": (
            "RuntimeError: Quantization scheme is not supported for the current GPU. Min capability: 80. "
            "Current capability: 75."
        ),
        "vllm/model_executor/models/registry.py": (
            "ERROR 10-23 23:20:26 registry.py:272] Error in inspecting model architecture 'LlamaForCausalLM'"
        ),
        "torch/include/c10/cuda/driver_api.h": "RuntimeError: CUDA driver error: out of memory",
    }[rel]
    hit = [s for s in sigs.values() if (s.needle in (rendered.lower() if s.nocase else rendered))]
    assert any(s.regex is None or s.regex.search(rendered) for s in hit), rendered


# ------------------------------------------------------------------- other servers: their own options
def test_tgi_warmup_oom_advises_tgi_options_not_vllm_flags(tmp_path: Path) -> None:
    log = (
        "2023-09-26T21:48:00.969072Z ERROR text_generation_launcher: Method Warmup encountered an error.\n"
        "RuntimeError: Not enough memory to handle 4096 prefill tokens. You need to decrease "
        "`--max-batch-prefill-tokens`\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert (d.cause, d.stage) == ("oom_sampler_warmup_or_profile_run", "warmup")
    assert d.remediation.flag_changes == {"--max-batch-prefill-tokens": "2048"}


def test_sglang_kv_pool_failure_raises_its_static_memory_fraction(tmp_path: Path) -> None:
    log = (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.8\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "no_kv_cache_memory"
    assert d.remediation.flag_changes == {"--mem-fraction-static": "0.85"}
    assert "--gpu-memory-utilization" not in d.remediation.summary


@pytest.mark.parametrize(
    "line",
    [
        "ERROR:    [Errno 99] error while attempting to bind on address ('::1', 8000, 0, 0): cannot assign "
        "requested address",
        "Exception: data did not match any variant of untagged enum ModelWrapper at line 1251012 column 3",
    ],
)
def test_network_and_tokenizer_file_errors_are_configuration_not_memory(tmp_path: Path, line: str) -> None:
    d = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert d.cause == "config_error_not_resource" and not d.memory


def test_weights_oom_never_shards_over_gpus_the_run_was_not_given(tmp_path: Path) -> None:
    run = _weights_run(tmp_path, count=4, cc=[8, 6], weights_gib=75)
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    (run / "command.json").write_text(json.dumps({"argv": argv, "env": {"CUDA_VISIBLE_DEVICES": "2"}}))
    d = diagnose(run)
    assert "--tensor-parallel-size" not in d.remediation.flag_changes
    assert all("--tensor-parallel-size" not in a.flag_changes for a in d.remediation.alternatives)


# ------------------------------------------------------- traceback shape, model paths, round-3 classes
def _traceback(frames: list[str], last: str) -> str:
    body = "".join(f'  File "{f}", line 10, in fn\n    call()\n' for f in frames)
    return "Traceback (most recent call last):\n" + body + last + "\n"


def test_an_unknown_error_raised_while_vllm_builds_its_config_is_a_config_error_at_medium_confidence(
    tmp_path: Path,
) -> None:
    log = _traceback(
        [
            "/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/api_server.py",
            "/venv/lib/python3.12/site-packages/vllm/engine/arg_utils.py",
            "/venv/lib/python3.12/site-packages/vllm/config/model.py",
        ],
        "(APIServer pid=7) ValueError: rope_scaling must have a 'factor' field with a float value",
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "config_error_not_resource" and not d.memory
    assert 0.5 <= d.confidence < 0.7  # a rule on the traceback's shape, not a known message
    assert any("py.config_validation" in e.detail for e in d.evidence)


def test_the_same_error_raised_in_the_model_runner_is_only_weak_and_about_memory_stays_unknown(
    tmp_path: Path,
) -> None:
    runner = _traceback(
        ["/venv/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py"],
        "ValueError: the 'factor' field must be a float value",
    )
    d = diagnose(_write(tmp_path, "a.log", runner))
    # outside vLLM's configuration code only the last-resort rule reads it, and says so by its confidence
    assert d.cause == "config_error_not_resource"
    assert d.confidence < 0.5
    rule = next(e.detail.split(":")[0] for e in d.evidence if e.kind == "log")
    assert rule == "py.value_error_not_resource"
    memory = _traceback(
        ["/venv/lib/python3.12/site-packages/vllm/config/cache.py"],
        "ValueError: not enough memory for the requested swap space",
    )
    assert diagnose(_write(tmp_path, "b.log", memory)).cause == "unknown"


@pytest.mark.parametrize(
    "line",
    [
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '/app/bge_m3'. Use `repo_type` argument if needed.",
        "OSError: Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start or end "
        "with '-' or '.' and the maximum length is 96: '../models//x'.",
        "huggingface_hub.utils._errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-x)",
        "OSError: /models/llama does not appear to have a file named config.json. Checkout "
        "'https://huggingface.co//models/llama/tree/None' for available files.",
        "LocalEntryNotFoundError: Cannot find the requested files in the disk cache and outgoing traffic has "
        "been disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' to False.",
        "ValueError: The checkpoint you are trying to load has model type `qwen3` but Transformers does not "
        "recognize this architecture. This could be because of an issue with the checkpoint, or because your "
        "version of Transformers is out of date.",
    ],
)
def test_a_model_that_cannot_be_resolved_is_a_path_or_hub_problem_not_memory(
    tmp_path: Path, line: str
) -> None:
    d = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert d.cause == "config_error_not_resource" and not d.memory
    if "does not recognize" not in line:
        assert "path" in d.remediation.summary


@pytest.mark.parametrize(
    "line",
    [
        # vLLM 0.5 .. 0.31: three arguments to RuntimeError, printed as a tuple
        "RuntimeError: ('Quantization scheme is not supported for ', 'the current GPU. Min capability: "
        "80. ', 'Current capability: 75.')",
        # vLLM 0.32: one sentence
        "RuntimeError: Quantization scheme is not supported for the current GPU. Min capability: 80. "
        "Current capability: 75.",
    ],
)
def test_the_quantization_scheme_capability_error_in_both_printed_forms(tmp_path: Path, line: str) -> None:
    d = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert d.cause == "quant_or_dtype_unsupported_on_gpu"
    assert "80" in d.remediation.summary and "75" in d.remediation.summary


def test_shell_killed_glued_to_a_progress_bar_is_a_weak_host_ram_guess(tmp_path: Path) -> None:
    line = "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]Killed\n"
    d = diagnose(_write(tmp_path, "x.log", line))
    assert d.cause == "host_ram_oom_killed" and d.confidence < 0.7
    assert diagnose(_write(tmp_path, "y.log", "INFO: request 12 Killed by its client\n")).cause == "unknown"


def test_nccl_shm_segment_creation_is_shm_but_a_missing_segment_is_not(tmp_path: Path) -> None:
    created = (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:317, unhandled system error\n"
        "Last error:\nError while creating shared memory segment /dev/shm/nccl-F9ffgB (size 9637888)\n"
    )
    assert diagnose(_write(tmp_path, "a.log", created)).cause == "shm_insufficient"
    attach = (
        "host:1:1 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
        "/dev/shm/nccl- (size 192814336), error: No such file or directory (2)\n"
    )
    assert diagnose(_write(tmp_path, "b.log", attach)).cause != "shm_insufficient"
    # the same creation line after NCCL's own reason for it: the segment was made (so /dev/shm had room) and
    # its CUDA registration failed, or shm_open was refused; the reason line explains the creation line
    registered = (
        "[1] misc/shmutils.cc:103 NCCL WARN Cuda failure 'invalid argument'\n"
        "[1] misc/shmutils.cc:114 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-NzwJ7O "
        "(size 9637888)\n"
    )
    denied = (
        "node:9:9 [0] misc/shmutils.cc:72 NCCL WARN Call to shm_open failed : Permission denied\n"
        "node:9:9 [0] misc/shmutils.cc:114 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-Ab12Cd (size 9637888)\n"
    )
    for name, text, cause in (
        ("c.log", registered, "nccl_multi_gpu_comm_failure"),
        ("d.log", denied, "config_error_not_resource"),
    ):
        d = diagnose(_write(tmp_path, name, text))
        assert d.cause == cause
        assert "shm_insufficient" not in dict(d.alternatives)


def test_a_v0_worker_oom_inside_the_profiling_call_is_a_profile_run_oom(tmp_path: Path) -> None:
    log = (
        "INFO 11-05 03:21:41 model_runner.py:1025] Loading model weights took 10.0714 GB\n"
        "(VllmWorkerProcess pid=67) ERROR 11-05 03:21:52 multiproc_worker_utils.py:233] Exception in worker "
        "VllmWorkerProcess while processing method determine_num_available_blocks: CUDA out of memory. Tried "
        "to allocate 1.95 GiB. GPU 1 has a total capacity of 22.09 GiB of which 758.44 MiB is free.\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert (d.cause, d.stage) == ("oom_sampler_warmup_or_profile_run", "memory_profiling")


def test_an_error_that_names_a_vllm_argument_is_a_weak_config_guess_unless_it_speaks_of_memory(
    tmp_path: Path,
) -> None:
    line = "ValueError: max_num_batched_tokens (2048) must be greater than or equal to max_num_seqs (4096).\n"
    d = diagnose(_write(tmp_path, "a.log", line))
    assert d.cause == "config_error_not_resource" and d.confidence < 0.5
    memory = "ValueError: max_num_seqs (1024) needs more memory than the KV cache has.\n"
    assert diagnose(_write(tmp_path, "b.log", memory)).cause == "unknown"


V0_KV_LINE = (
    "ERROR 05-01 10:00:00 engine.py:366] ValueError: The model's max seq len (32768) is larger than the "
    "maximum number of tokens that can be stored in KV cache (20544). Try increasing "
    "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
)
FREE_LINE = (
    "(EngineCore_DP0 pid=7) ValueError: Free memory on device cuda:0 (40.12/79.19 GiB) on startup is less "
    "than desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize(
    ("line", "cause", "flag", "value"),
    [
        (V0_KV_LINE, "kv_cache_too_small_for_max_model_len", "--max-model-len", "20480"),
        (FREE_LINE, "startup_free_memory_below_target", "--gpu-memory-utilization", "0.49"),
    ],
)
def test_a_message_hard_wrapped_at_the_terminal_width_is_read_whole(
    tmp_path: Path, width: int, line: str, cause: str, flag: str, value: str
) -> None:
    # a terminal or `docker logs` in a narrow window cuts lines at a fixed width, mid-word
    wrapped = "\n".join(line[i : i + width] for i in range(0, len(line), width))
    log = _write(tmp_path, "wrapped.log", "INFO 05-01 09:59:00 starting\n" + wrapped + "\nshutting down\n")
    diag = diagnose(log)
    assert diag.cause == cause
    assert diag.remediation.flag_changes.get(flag) == value


def test_a_message_reflowed_at_sentence_ends_keeps_vllms_estimate(tmp_path: Path) -> None:
    reflowed = KV_LINE.replace(" (8.0 GiB", "\n8.0 GiB").replace(" Based on", "\nBased on")
    assert "\n" in reflowed
    diag = diagnose(_write(tmp_path, "reflowed.log", reflowed + "\n"))
    assert diag.cause == "kv_cache_too_small_for_max_model_len"
    assert diag.remediation.flag_changes == {"--max-model-len": str(round_down_len(8064))}


def test_unrelated_neighbouring_lines_are_not_joined_into_a_signature(tmp_path: Path) -> None:
    # each line carries half of a needle's words only by accident of order; nothing may be matched
    text = "INFO request finished: No available memory\nfor the cache of thumbnails was needed\n"
    diag = diagnose(_write(tmp_path, "halves.log", text))
    assert diag.cause == "unknown"


def test_a_log_cut_inside_a_traceback_is_unknown_but_names_the_stage_and_its_usual_failure(
    tmp_path: Path,
) -> None:
    text = (
        "INFO 08-04 16:54:40 model_runner.py:1067] Loading model weights took 38.9 GB\n"
        "ERROR 08-04 16:54:59 multiproc_worker_utils.py:238] Exception in worker VllmWorkerProcess while "
        "processing method determine_num_available_blocks.\n"
    )
    diag = diagnose(_write(tmp_path, "cut.log", text))
    assert diag.cause == "unknown"
    assert diag.stage == "memory_profiling"
    assert ("oom_sampler_warmup_or_profile_run", 0.2) in diag.alternatives
    assert "ends inside a traceback" in diag.remediation.summary
    assert diag.remediation.flag_changes == {}


def test_the_first_line_of_a_short_log_is_part_of_its_tail() -> None:
    import io

    res = scan(io.BytesIO(b"first line\nsecond line\n"))
    assert [t for _, t in res.tail] == ["first line", "second line"]
    assert [n for n, _ in res.tail] == [1, 2]


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "[2024-07-18 10:00:00 +0000] [1] [ERROR] Worker (pid:25134) was sent SIGKILL! "
            "Perhaps out of memory?",
            "host_ram_oom_killed",
        ),
        (
            "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4, please update your "
            "driver to a newer version, or use an earlier cuda container: unknown.",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "ERROR 10-23 23:20:26 registry.py:272] Error in inspecting model architecture 'LlamaForCausalLM'",
            "config_error_not_resource",
        ),
    ],
)
def test_gunicorn_kills_container_cuda_requirements_and_registry_failures(
    tmp_path: Path, line: str, cause: str
) -> None:
    assert diagnose(_write(tmp_path, "x.log", line + "\n")).cause == cause


def test_no_kv_memory_at_full_utilization_stores_the_kv_cache_in_fp8(tmp_path: Path) -> None:
    text = (
        "INFO 01-01 00:00:00 api_server.py:1] args: Namespace(gpu_memory_utilization=0.97, "
        "max_model_len=32768, kv_cache_dtype='auto')\n"
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.\n"
    )
    diag = diagnose(_write(tmp_path, "nokv.log", text))
    assert diag.cause == "no_kv_cache_memory"
    assert diag.remediation.flag_changes == {"--kv-cache-dtype": "fp8"}
    assert any(a.flag_changes == {"--max-model-len": "16384"} for a in diag.remediation.alternatives)


def test_graph_capture_oom_offers_smaller_capture_sizes_on_vllm_that_has_the_flag(tmp_path: Path) -> None:
    text = (
        "INFO 01-01 00:00:00 api_server.py:1] vLLM API server version 0.11.0\n"
        "INFO 01-01 00:00:01 [gpu_model_runner.py:2] Capturing CUDA graphs "
        "(mixed prefill-decode, PIECEWISE)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
        "of 23.55 GiB of which 12.00 MiB is free.\n"
    )
    diag = diagnose(_write(tmp_path, "graphs.log", text))
    assert diag.cause == "oom_cudagraph_capture"
    assert diag.remediation.flag_changes == {"--enforce-eager": ""}
    assert any("--max-cudagraph-capture-size" in a.flag_changes for a in diag.remediation.alternatives)


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
            "before calling NumCudaDevices() that might have already set an error? "
            "Error 802: system not yet initialized",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "RuntimeError: CUDA error: the provided PTX was compiled with an unsupported toolchain.",
            "cuda_driver_runtime_mismatch",
        ),
        ("RuntimeError: Triton Error [CUDA]: device kernel image is invalid", "cuda_driver_runtime_mismatch"),
        ("RuntimeError: No CUDA GPUs are available", "config_error_not_resource"),
        (
            "AssertionError: float16 is required for MoE compressed models. Set dtype=torch.float16",
            "config_error_not_resource",
        ),
    ],
)
def test_cuda_status_codes_that_are_not_memory_failures(tmp_path: Path, line: str, cause: str) -> None:
    diag = diagnose(_write(tmp_path, "x.log", line + "\n"))
    assert diag.cause == cause
    assert not diag.memory


def test_a_driver_api_out_of_memory_is_a_cuda_oom(tmp_path: Path) -> None:
    text = (
        "INFO Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)\n"
        "RuntimeError: CUDA driver error: out of memory\n"
    )
    assert diagnose(_write(tmp_path, "x.log", text)).cause == "oom_cudagraph_capture"


def test_an_oom_while_recent_vllm_profiles_cuda_graph_memory_is_a_graph_capture_oom(tmp_path: Path) -> None:
    # vllm/v1/worker/gpu_worker.py determine_available_memory captures the graphs once to measure them
    text = (
        "INFO [gpu_model_runner.py:4820] Model loading took 18.47 GiB memory and 10.99 seconds\n"
        '  File "/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_worker.py", line 381, in '
        "determine_available_memory\n"
        "    cudagraph_memory_estimate = self.model_runner.profile_cudagraph_memory()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.53 GiB. GPU 0 has a total capacity "
        "of 23.00 GiB of which 1.49 GiB is free.\n"
    )
    diag = diagnose(_write(tmp_path, "cg.log", text))
    assert diag.cause == "oom_cudagraph_capture"
    assert diag.stage == "graph_capture"
    assert diag.remediation.flag_changes == {"--enforce-eager": ""}


V1_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of "
    "23.56 GiB of which 56.88 MiB is free.\n"
)


def _frame(func: str, path: str = "vllm/v1/engine/core.py") -> str:
    return f'  File "/usr/local/lib/python3.12/dist-packages/{path}", line 10, in {func}\n    x()\n'


def test_an_oom_in_the_engine_busy_loop_is_a_serving_oom_even_without_request_logs(tmp_path: Path) -> None:
    # vllm/v1/engine/core.py run_busy_loop/_process_engine_step only run once the engine serves
    text = _frame("run_busy_loop") + _frame("_process_engine_step") + _frame("step_with_batch_queue") + V1_OOM
    d = diagnose(_write(tmp_path, "x.log", text))
    assert (d.cause, d.stage) == ("oom_runtime_under_load", "serving")
    assert d.confidence > 0.8


def test_a_frame_landmark_names_the_whole_function_not_a_prefix(tmp_path: Path) -> None:
    # ', in _warmup' (warm-up) must not match ', in _warmup_and_capture' (CUDA graph capture)
    runner = "vllm/v1/worker/gpu_model_runner.py"
    text = _frame("capture_model", runner) + _frame("_warmup_and_capture", runner) + V1_OOM
    d = diagnose(_write(tmp_path, "x.log", text))
    assert (d.cause, d.stage) == ("oom_cudagraph_capture", "graph_capture")


def test_a_v0_oom_under_initialize_kv_caches_is_the_profile_run_not_kv_allocation(tmp_path: Path) -> None:
    # vllm/engine/llm_engine.py _initialize_kv_caches first profiles (determine_num_available_blocks)
    text = (
        _frame("_initialize_kv_caches", "vllm/engine/llm_engine.py")
        + _frame("determine_num_available_blocks", "vllm/executor/gpu_executor.py")
        + V1_OOM
    )
    d = diagnose(_write(tmp_path, "x.log", text))
    assert (d.cause, d.stage) == ("oom_sampler_warmup_or_profile_run", "memory_profiling")


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("[bug] OOM on container boot\n", "oom_runtime_under_load"),
        ('[Bug]: the issue of "cuda out of memory" arises\n', "oom_runtime_under_load"),
        ("WARNING [gpu_worker.py:796] Lower --gpu-memory-utilization to avoid OOM.\n", "unknown"),
        ("Out of memory: Killed process 4242 (python3) total-vm:98765kB\n", "host_ram_oom_killed"),
        ("UserWarning: the CUDACachingAllocator will raise an OOM error as a result.\n", "unknown"),
    ],
)
def test_a_users_retyped_or_abbreviated_cuda_oom_is_an_oom_but_warnings_and_the_oom_killer_are_not(
    tmp_path: Path, line: str, cause: str
) -> None:
    d = diagnose(_write(tmp_path, "x.log", line))
    assert d.cause == cause
    if cause == "oom_runtime_under_load":
        # no stage landmark: the weak stage-free answer with the start-up OOMs as alternatives
        assert d.confidence <= 0.7
        alternatives = {a for a, _ in d.alternatives}
        assert alternatives >= {"oom_weights_do_not_fit", "oom_sampler_warmup_or_profile_run"}


def test_a_retyped_oom_takes_its_label_from_the_stage_the_log_reached(tmp_path: Path) -> None:
    text = (
        "INFO 09-27 11:18:22 model_runner.py:1025] Loading model weights took 19.9073 GB\n"
        "INFO 09-27 11:18:35 enc_dec_model_runner.py:297] Starting profile run for multi-modal models.\n"
        "[Usage]: Failure to deploy Llama-3.2-11B-Vision Due to OOM\n"
    )
    assert diagnose(_write(tmp_path, "x.log", text)).cause == "oom_sampler_warmup_or_profile_run"


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "cupy_backends.cuda.libs.nccl.NcclError: NCCL_ERROR_SYSTEM_ERROR: unhandled system error\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            "[Bug]: Docker vLLM CUDA error: an illegal memory access, sampled_token_ids.tolist()\n",
            "illegal_memory_access_software_bug",
        ),
        (
            "ValueError: Prompt length of 5016 is longer than the maximum model length of 4096.\n",
            "config_error_not_resource",
        ),
    ],
)
def test_cupy_nccl_errors_shortened_illegal_access_and_long_prompts_are_not_memory(
    tmp_path: Path, line: str, cause: str
) -> None:
    d = diagnose(_write(tmp_path, "x.log", line))
    assert d.cause == cause
    assert not d.memory


def test_the_dev_shm_hint_is_never_the_answer_for_a_line_that_names_an_nccl_failure(tmp_path: Path) -> None:
    # nccl.system_error_shm_hint (0.35) ranks /dev/shm under the NCCL failure; any line it matches must
    # also be read as that NCCL failure, whatever wrapper printed it
    line = "WrapperNcclError: NCCL_SYSTEM failure: unhandled system error (run with NCCL_DEBUG=INFO)\n"
    d = diagnose(_write(tmp_path, "x.log", line))
    assert d.cause == "nccl_multi_gpu_comm_failure"
    assert ("shm_insufficient", 0.35) in d.alternatives


# ------------------------------------------------------------------------- stage stated in words
@pytest.mark.parametrize(
    ("line", "cause"),
    [
        ("CUDA OOM during sampler warmup with a 72B model", "oom_sampler_warmup_or_profile_run"),
        ("got cuda oom when capturing cuda graphs on 2x3090", "oom_cudagraph_capture"),
        ("CUDA out of memory while loading the model weights", "oom_weights_do_not_fit"),
        ("OOM error during inference with long prompts", "oom_runtime_under_load"),
        ("OOM error on an A10", "oom_runtime_under_load"),  # no stage named: the stage-free label
    ],
)
def test_a_person_naming_the_stage_of_an_oom_picks_the_label(tmp_path: Path, line: str, cause: str) -> None:
    d = diagnose(_write(tmp_path, "vllm.log", line + "\n"))
    assert d.cause == cause
    named = any("says where it happened" in e.text for e in d.evidence)
    assert named == (line != "OOM error on an A10")


def test_pytorch_private_pool_clause_is_not_read_as_the_stage(tmp_path: Path) -> None:
    # PyTorch's own line mentions CUDA Graphs whenever graph pools hold memory; it is not a person's words
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 524.00 MiB. GPU 0 has a total "
        "capacity of 15.77 GiB of which 137.12 MiB is free. Of the allocated memory 13.81 GiB is allocated "
        "by PyTorch, with 106.00 MiB allocated in private pools (e.g., CUDA Graphs), and 121.43 MiB is "
        "reserved by PyTorch but unallocated."
    )
    d = diagnose(_write(tmp_path, "vllm.log", line + "\n"))
    assert not any("says where it happened" in e.text for e in d.evidence)


def test_oom_while_allocating_kv_tensors_lowers_the_budget_instead_of_raising_it(tmp_path: Path) -> None:
    log = _write(
        tmp_path,
        "vllm.log",
        '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 6537, in _allocate_kv_cache_tensors\n'
        "    tensor = torch.zeros(\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.94 GiB. GPU 0 has a total capacity "
        "of 79.19 GiB of which 2.56 GiB is free. Of the allocated memory 70.35 GiB is allocated by PyTorch, "
        "and 121.80 MiB is reserved by PyTorch but unallocated.\n",
    )
    d = diagnose(log)
    assert d.stage == "kv_allocation"
    new_u = float(d.remediation.flag_changes["--gpu-memory-utilization"] or 0)
    # 10.4 GiB short + 1 GiB margin of 79 GiB: at least 0.15 below the default 0.9
    assert 0.1 <= new_u <= 0.75


KV_ALLOC_OOM = (
    "INFO 12-15 10:18:11 uniproc_executor.py:64] # GPU blocks: 31207\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 322.00 MiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 249.88 MiB is free.\n"
)


@pytest.mark.parametrize(
    ("command", "utilization"),
    [
        # a script that passes vLLM's engine arguments through: its value is the one to lower
        (
            "VLLM_USE_V1=1 python3 mmmu_bench.py --model OpenGVLab/InternVL2_5-8B --trust-remote-code "
            "--gpu-memory-utilization 0.99\n",
            0.99,
        ),
        # a script whose flags are not vLLM's engine arguments says nothing about them: the default stands
        ("python3 train.py --model llama --lr 0.99\n", 0.9),
    ],
)
def test_a_scripts_engine_arguments_set_the_budget_the_advice_lowers(
    tmp_path: Path, command: str, utilization: float
) -> None:
    d = diagnose(_write(tmp_path, "vllm.log", command + KV_ALLOC_OOM))
    assert d.cause == "startup_free_memory_below_target"
    assert f"gpu_memory_utilization={utilization:g}" in d.remediation.summary
    assert float(d.remediation.flag_changes["--gpu-memory-utilization"] or 0) < utilization


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (
            "ERROR [multiproc_executor.py:316] Worker proc VllmWorker-1 died unexpectedly (exit code: -9)\n",
            "host_ram_oom_killed",
        ),
        ("vllm-1 exited with code 137\n", "host_ram_oom_killed"),
        (
            "subprocess.CalledProcessError: Command '['vllm', 'serve']' returned non-zero exit status 137.\n",
            "host_ram_oom_killed",
        ),
        ("INFO 09-13 10:00:00 took 137 seconds, exit 0 at 2024-09-13\n", "unknown"),
        (
            "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: PytorchStreamReader failed reading zip archive: "
            "failed finding central directory\n",
            "config_error_not_resource",
        ),
        (
            "ERROR [serving_chat.py:198] ValueError: This model's maximum context length is 8192 tokens. "
            "However, you requested 8203 tokens (7691 in the messages, 512 in the completion).\n",
            "config_error_not_resource",
        ),
        (
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f (most recent call first):\n"
            '  File "/usr/lib/python3/dist-packages/vllm/distributed/device_communicators/pynccl.py", '
            "line 99 in __init__\n",
            "nccl_multi_gpu_comm_failure",
        ),
        ("RuntimeError: Unsupported block size: 256\n", "config_error_not_resource"),
        # a GPU guard is not a configuration error: its own signature (flash_attn.arch) names it
        (
            "RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        ("RuntimeError: Unsupported head size on this device: 72\n", "unknown"),
        (
            "(Worker pid=4) Loading safetensors checkpoint shards:  10% Completed | 6/62 "
            "[00:29<05:21,  5.75s/it]\n",
            "host_ram_oom_killed",
        ),
        (
            "Loading safetensors checkpoint shards: 100% Completed | 62/62 [05:29<00:00,  5.75s/it]\n",
            "unknown",
        ),
        # only the bar drawn (0/N), as an excerpt cut at the start of loading shows it: no evidence either way
        ("Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\n", "unknown"),
        (
            "CUDA runtime error: out of memory /opt/lmdeploy/src/turbomind/utils/allocator.h:231\n",
            "oom_runtime_under_load",
        ),
        (
            "400 As of transformers v4.44, default chat template is no longer allowed, so you must provide a "
            "chat template if the tokenizer does not define one.\n",
            "config_error_not_resource",
        ),
        (
            "TRL CLI: error: argument command: invalid choice: 'vllm-serve' (choose from 'chat', 'dpo')\n",
            "config_error_not_resource",
        ),
        ("vllm serve: error: unrecognized arguments: --max-modle-len 4096\n", "config_error_not_resource"),
        (
            "TypeError: EngineArgs.__init__() got an unexpected keyword argument 'worker_extension_cls'\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that "
            "can be stored in KV cache (\n",
            "kv_cache_too_small_for_max_model_len",
        ),
        (
            "(VllmWorkerProcess pid=6) ERROR multiproc_worker_utils.py:226] Exception in worker "
            "VllmWorkerProcess while processing method load_model: CUDA out of memory. "
            "Tried to allocate 32.00 MiB.\n",
            "oom_weights_do_not_fit",
        ),
        (
            "We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it in the "
            "cached files and it looks like THUDM/chatglm3-6b is not the path to a directory containing a "
            "file named tokenization_chatglm.py.\n",
            "config_error_not_resource",
        ),
        (
            "python: Error while finding module specification for 'vllm.entrypoints.openai_server' "
            "(ModuleNotFoundError: No module named 'vllm.entrypoints')\n",
            "config_error_not_resource",
        ),
        (
            "ImportError: cannot import name 'build_regex_from_schema' from 'outlines.fsm.json_schema'\n",
            "config_error_not_resource",
        ),
        # an extension built against another torch (C++ symbols) or a newer glibc is a setup error (round
        # 27); the driver's C symbols are not this
        (
            "ImportError: /x/vllm/_C.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEi\n",
            "config_error_not_resource",
        ),
        # a driver API entry point the installed libcuda lacks: the driver is older than the build's CUDA
        # (HELDOUT.md, label decisions, since round 87)
        (
            "ImportError: /x/vllm/_C.abi3.so: undefined symbol: cuTensorMapEncodeTiled\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.34' not found (required by "
            "/x/vllm/_C.abi3.so)\n",
            "config_error_not_resource",
        ),
        ("AssertionError: Sinks are only supported in FlashAttention 3\n", "arch_no_kernel_image"),
        (
            "ray.exceptions.RayChannelTimeoutError: System error: Timed out waiting for object available to "
            "read. "
            "ObjectID: 007e768e7da845eb\n",
            "nccl_multi_gpu_comm_failure",
        ),
        # round 28
        (
            "Could not start backend: Runtime compute cap 70 is not compatible with compile time compute "
            "cap 80\n",
            "arch_no_kernel_image",
        ),
        ("报错信息：SGlang only supports sm 75 and  above\n", "arch_no_kernel_image"),
        (
            'assert arch // 10 == 10, "FP8 is only supported on SM100 (compute capability 10.x) for FA4 '
            'CuTE".\n',
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "RuntimeError: [TM][ERROR] CUDA runtime error: API call is not supported in the installed CUDA "
            "driver "
            "/lmdeploy/src/turbomind/utils/allocator.h:163\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "ValueError: `num_heads` must be divisible by `num_shards` (got `num_heads`: 71 and "
            "`num_shards`: 2\n",
            "config_error_not_resource",
        ),
        (
            "│ │ input = <repr-error 'CUDA error: no kernel image is available for        │ │\n"
            "│ │         execution on the device\\nCUDA kernel errors might be             │ │\n",
            "arch_no_kernel_image",
        ),
        # an OOM at load whose NVML reading of this process is 0 bytes (a container): PyTorch's own
        # allocations and reserve stand for it, and the other 40 GiB on the card are another job's
        (
            '  File "/usr/local/lib/python3.10/dist-packages/torch/utils/_device.py", line 79, in '
            "__torch_function__\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total "
            "capacity of "
            "79.25 GiB of which 2.27 GiB is free. Including non-PyTorch memory, this process has 0 bytes "
            "memory in "
            "use. Of the allocated memory 36.46 GiB is allocated by PyTorch, and 20.98 MiB is reserved by "
            "PyTorch "
            "but unallocated.\n",
            "startup_free_memory_below_target",
        ),
        # TGI's launcher: a shard that died before it was ready died loading
        (
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB (GPU 0; 15.77 "
            "GiB total "
            "capacity; 15.37 GiB already allocated; 13.62 MiB free; 15.40 GiB reserved in total by PyTorch)\n"
            "Error: ShardCannotStart\n",
            "oom_weights_do_not_fit",
        ),
        # round 29
        (
            "ValueError: Weight input_size_per_partition = 192 is not divisible by weight quantization "
            "block_k = 128.\n",
            "config_error_not_resource",
        ),
        (
            "The decoder prompt contains a(n) image item with length 4641, which exceeds the pre-allocated "
            "encoder "
            "cache size 3721. Please reduce the input size\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: invalid literal for int() with base 10: "
            "'MIG-377e0049-554c-540b-93c6-d0976f8426cb'\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Unexpected error from cudaGetDeviceCount(). Error 807: MPS server is not ready "
            "to accept "
            "new MPS client requests\n",
            "config_error_not_resource",
        ),
        (
            "error: invalid value 'yarn' for '--rope-scaling <ROPE_SCALING>'\n  [possible values: linear, "
            "dynamic]\n",
            "config_error_not_resource",
        ),
        ("AssertionError: CPU tensor must be pinned\n", "host_pinned_memory_swap_space"),
        # free memory went up while vLLM profiled: another process spoiled the measurement; none ran short
        (
            "AssertionError: Error in memory profiling. Initial free memory 40.2 GiB, current free memory "
            "44.9 GiB. "
            "This happens when other processes sharing the same container release GPU memory while vLLM is "
            "profiling during initialization.\n",
            "config_error_not_resource",
        ),
        (
            "[rank1]:[W1101 02:10:34.411642380 TCPStore.cpp:106] [c10d] sendBytes failed on "
            "SocketImpl(fd=79, "
            "addr=localhost:40912, remote=localhost:36055): Broken pipe\n",
            "nccl_multi_gpu_comm_failure",
        ),
        # a Chinese sentence running into the English error ('出现CUDA out of memory')
        ("Llama2-13b-Chat 使用vllm测试在A10上出现CUDA out of memory\n", "oom_runtime_under_load"),
        (
            "RuntimeError: unable to mmap 16933256392 bytes from file </root/model.safetensors>: Cannot "
            "allocate memory (12)\n",
            "host_ram_oom_killed",
        ),
        (
            "Refer to the documentation on how to address the out of memory issue: "
            "https://docs.ray.io/en/latest/ray-core/scheduling/ray-oom-prevention.html.\n",
            "host_ram_oom_killed",
        ),
    ],
)
def test_messages_read_in_their_sources_rounds_8_to_10(tmp_path: Path, text: str, cause: str) -> None:
    assert diagnose(_write(tmp_path, "vllm.log", text)).cause == cause


def test_a_log_that_stops_mid_load_is_not_a_host_oom_when_the_exit_status_says_otherwise(
    tmp_path: Path,
) -> None:
    log = _write(
        tmp_path, "vllm.log", "Loading safetensors checkpoint shards:  10% Completed | 6/62 [00:29<05:21]\n"
    )
    assert diagnose(log, exit_code=-9).cause == "host_ram_oom_killed"
    assert diagnose(log, exit_code=1).cause == "unknown"


# ------------------------------------------------------------------------------------- round 9
def test_jupyter_frames_are_read_as_python_frames(tmp_path: Path) -> None:
    text = (
        "File [~/env/lib/python3.11/site-packages/vllm/worker/cache_engine.py:64](http://h/lab/x#line=63)"
        ", in CacheEngine._allocate_kv_cache(self, num_blocks, device)\n"
        "---> 64         torch.empty(kv_cache_shape,\n"
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 642.00 MiB. GPU\n"
    )
    d = diagnose(_write(tmp_path, "nb.log", text))
    assert d.stage == "kv_allocation"
    # an OOM while the KV cache is allocated: less was free than the budget assumed
    assert d.cause == "startup_free_memory_below_target"
    assert "--gpu-memory-utilization" in d.remediation.flag_changes


def test_a_notebook_traceback_cut_before_its_end_is_read_by_its_header(tmp_path: Path) -> None:
    header = "LocalEntryNotFoundError                   Traceback (most recent call last)\n"
    frames = (
        "Cell In[3], line 1\n"
        "----> 1 llm = LLM(model='facebook/opt-125m')\n"
        "File ~/env/lib/python3.8/site-packages/vllm/entrypoints/llm.py:62, in LLM.__init__(self, model)\n"
        "---> 62 self.llm_engine = LLMEngine.from_engine_args(engine_args)\n"
    )
    d = diagnose(_write(tmp_path, "nb.log", header + frames))
    assert d.cause == "config_error_not_resource"
    assert any("LocalEntryNotFoundError" in e.text for e in d.evidence)
    # without the header the same frames say nothing
    assert diagnose(_write(tmp_path, "nb3.log", frames)).cause == "unknown"
    # a closing line ends the header's traceback: its message is read, not the bare class
    closed = (
        header
        + frames
        + "LocalEntryNotFoundError: Connection error, and we cannot find the requested files.\n"
    )
    assert [e.message for e in scan(io.BytesIO(closed.encode())).exceptions] == [
        "Connection error, and we cannot find the requested files."
    ]


def test_ipython_7_frame_lines_are_read_as_frames(tmp_path: Path) -> None:
    # Colab's IPython 7 prints '/path/x.py in func(args)' with no line number (tests/corpus/
    # ho136-ipynb-ieayvaz-grpo-refmodel-oom.log): trl's create_reference_model there is a load landmark
    frames = (
        "/usr/local/lib/python3.11/dist-packages/trl/models/modeling_base.py in "
        "create_reference_model(model, num_shared_layers, pattern)\n"
        "--> 627     ref_model = deepcopy(model)\n"
        "/usr/local/lib/python3.11/dist-packages/torch/storage.py in clone(self)\n"
    )
    oom = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 28.00 MiB. GPU 0 has a total capacity of "
        "14.74 GiB of which 14.12 MiB is free. Process 3073 has 14.72 GiB memory in use. Of the allocated "
        "memory 14.61 GiB is allocated by PyTorch, and 1.34 MiB is reserved by PyTorch but unallocated.\n"
    )
    res = scan(io.BytesIO((frames + oom).encode()))
    assert res.exceptions[-1].frames[-2:] == (
        "/usr/local/lib/python3.11/dist-packages/trl/models/modeling_base.py in create_reference_model",
        "/usr/local/lib/python3.11/dist-packages/torch/storage.py in clone",
    )
    d = diagnose(_write(tmp_path, "colab.log", frames + oom))
    assert (d.stage, d.cause) == ("load", "oom_weights_do_not_fit")
    # a sentence that names a file and a function is not a frame
    assert (
        triage_scan.clean_line(b"see setup.py in main(argv) for details")
        == "see setup.py in main(argv) for details"
    )


def test_rich_traceback_frames_are_read_as_frames(tmp_path: Path) -> None:
    # rich's boxed tracebacks (DeepSpeed's and typer's pretty errors; tests/corpus/
    # ho142-chatglm2-6b-267-ptuning-quantize-cpm-kernels-no-kernel-image.log) print a frame as
    # '| path.py:216 in func |' between box bars: read as Python's own frame line
    line = (
        "│ /opt/conda/lib/python3.9/site-packages/cpm_kernels/library/cuda.py:216 in checkCUStatus          │"
    )
    assert triage_scan.clean_line(line.encode()) == (
        'File "/opt/conda/lib/python3.9/site-packages/cpm_kernels/library/cuda.py", '
        "line 216, in checkCUStatus"
    )
    # a source line in the box is not a frame
    body = (
        "│   214 def checkCUStatus(error : int) -> None:                                                    │"
    )
    assert triage_scan.clean_line(body.encode()) == body
    # a launcher's rank prefix before the box bar stays for the prefix reader; the frame is still a frame
    ranked = "[rank0]: │ /usr/lib/python3/dist-packages/torch/nn/modules/module.py:1355 in convert        │"
    assert triage_scan.clean_line(ranked.encode()) == (
        '[rank0]: File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 1355, in convert'
    )
    # Module.to's frames as rich prints them put a CUDA OOM at load (tests/corpus/
    # ho170-gh-deepspeed-2672-opt66b-zero3-load-oom.log quotes only their source lines)
    frames = (
        "│ /usr/local/lib/python3.8/dist-packages/torch/nn/modules/module.py:987 in to                   │\n"
        "│ ❱  987 │   │   return self._apply(convert)                                   │\n"
    )
    oom = (
        "RuntimeError: CUDA out of memory. Tried to allocate 162.00 MiB (GPU 2; 79.35 GiB total capacity; "
        "77.00 GiB already allocated; 146.19 MiB free; 77.01 GiB reserved in total by PyTorch)\n"
    )
    d = diagnose(_write(tmp_path, "rich.log", frames + oom))
    assert (d.stage, d.cause) == ("load", "oom_weights_do_not_fit")


def test_weights_larger_than_the_card_make_a_stage_free_oom_a_load_oom(tmp_path: Path) -> None:
    cmd = (
        "CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m vllm.entrypoints.openai.api_server "
        "--model /m/Qwen1.5-72B-Chat\n"
    )
    oom = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 768.00 MiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 752.31 MiB is free. Including non-PyTorch memory, this process has "
        "78.4 GiB memory in use.\n"
    )
    d = diagnose(_write(tmp_path, "a.log", cmd + oom))
    assert (d.cause, d.stage) == ("oom_weights_do_not_fit", "load")
    assert d.remediation.flag_changes == {"--tensor-parallel-size": "2"}
    # the same line for a model that fits the card keeps the stage-free reading
    small = cmd.replace("Qwen1.5-72B-Chat", "Qwen1.5-7B-Chat")
    assert diagnose(_write(tmp_path, "b.log", small + oom)).cause == "oom_runtime_under_load"
    # and with tensor parallelism over four cards the 72B fits: no load verdict from the numbers
    tp4 = cmd.replace("--model", "--tensor-parallel-size 4 --model")
    assert diagnose(_write(tmp_path, "c.log", tp4 + oom)).cause != "oom_weights_do_not_fit"


def test_serve_with_a_model_tag_and_a_different_model_option_is_named(tmp_path: Path) -> None:
    tb = "Traceback (most recent call last):\n"
    text = "$ vllm serve llava1.5-7b --model /mnt/models/ --tensor-parallel-size 2\n" + tb
    d = diagnose(_write(tmp_path, "x.log", text))
    assert d.cause == "config_error_not_resource"
    assert any("replaces --model" in (e.detail or "") for e in d.evidence)
    same = "$ vllm serve /mnt/models/ --model /mnt/models --tensor-parallel-size 2\n" + tb
    assert diagnose(_write(tmp_path, "y.log", same)).cause == "unknown"


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        # cudaGetErrorString texts (CUDA runtime driver_types.h), as PyTorch prints them
        ("invalid device function", "arch_no_kernel_image"),
        ("uncorrectable NVLink error detected during the execution", "gpu_hardware_fault"),
        ("no CUDA-capable device is detected", "config_error_not_resource"),
        ("CUDA-capable device(s) is/are busy or unavailable", "config_error_not_resource"),
        ("uncorrectable ECC error encountered", "gpu_hardware_fault"),
        ("no kernel image is available for execution on the device", "arch_no_kernel_image"),
        ("misaligned address", "illegal_memory_access_software_bug"),
        ("the launch timed out and was terminated", "unknown"),
    ],
)
def test_cuda_runtime_error_strings(tmp_path: Path, error: str, cause: str) -> None:
    d = diagnose(_write(tmp_path, "x.log", f"RuntimeError: CUDA error: {error}\n"))
    assert d.cause == cause


def test_no_nvidia_driver_is_a_driver_problem(tmp_path: Path) -> None:
    text = (
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
        "installed a driver from http://www.nvidia.com/Download/index.aspx\n"
    )
    assert diagnose(_write(tmp_path, "x.log", text)).cause == "cuda_driver_runtime_mismatch"


def test_a_usage_line_is_not_read_as_the_command_that_ran() -> None:
    from tuner.triage_scan import _parse_command_line

    args: dict[str, object] = {}
    assert not _parse_command_line("usage: vllm serve [model_tag] [options]", args)
    assert _parse_command_line(
        "$ vllm serve Qwen/Qwen2-72B-Instruct-GPTQ-Int4 -tp 2 --max-model-len=8192", args
    )
    assert args == {
        "model": "Qwen/Qwen2-72B-Instruct-GPTQ-Int4",
        "model_tag": "Qwen/Qwen2-72B-Instruct-GPTQ-Int4",
        "tensor_parallel_size": 2,
        "max_model_len": 8192,
    }


# ------------------------------------------------------------------------------------- rounds 11-15
@pytest.mark.parametrize(
    ("text", "cause"),
    [
        # verl shortens vLLM's free-memory check to its words, without the numbers
        (
            "vLLMAsyncRollout _loop_forever error: Free memory on device on startup is less than desired GPU "
            "memory utilization (0.8)\n",
            "startup_free_memory_below_target",
        ),
        # V0's block count, the line itself cut after the zero
        ("INFO 10-14 21:40:24 llm_engine.py:205] # GPU blocks: 0,\n", "no_kv_cache_memory"),
        ("INFO 10-14 21:40:24 llm_engine.py:205] # GPU blocks: 0, # CPU blocks: 512\n", "no_kv_cache_memory"),
        (
            "RuntimeError: Found Tesla P40 which is too old to be supported by the triton GPU compiler, "
            "which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, but your "
            "device is of CUDA capability 6.1\n",
            "arch_no_kernel_image",
        ),
        ("[rank0]: AssertionError: 32768 is not divisible by 3\n", "config_error_not_resource"),
        (
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4514.05 MiB on device 0: cudaMalloc "
            "failed: out of memory\n",
            "oom_runtime_under_load",
        ),
        (
            'level=ERROR source=sched.go:455 msg="error loading llama server" error="llama runner process '
            'has terminated: signal: killed"\n',
            "host_ram_oom_killed",
        ),
        ("ValueError: The model's max seq len (32768)\n", "kv_cache_too_small_for_max_model_len"),
        (
            "ValueError: The requested device for vllm (cuda:1) is not available. You are likely using vLLM "
            "without restricting the number of GPUs for training.\n",
            "config_error_not_resource",
        ),
        (
            '  File "/x/vllm/model_executor/models/llama.py", line 414, in load_weights\n'
            "    param = params_dict[name]\n"
            "KeyError: 'layers.62.mlp.down_proj.weight'\n",
            "config_error_not_resource",
        ),
        (
            '  File "/x/vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", '
            "line 626, in get_scheme\n"
            "    self._check_scheme_supported(scheme.get_min_capability())\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # a person's Chinese words on the OOM line name the stage ('exception while loading ...')
        (
            "加载Baichuan2-13B-Chat时出异常，torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 50.00 MiB. GPU\n",
            "oom_weights_do_not_fit",
        ),
        # vLLM's platform probe logs the import it tried on every start: not a failure
        (
            "DEBUG 06-12 19:58:31 [__init__.py:45] TPU platform is not available because: No module named "
            "'libtpu'\n",
            "unknown",
        ),
        # a KeyError in a model's forward pass at run time names no checkpoint tensor
        (
            '  File "/x/vllm/model_executor/models/qwen2_vl.py", line 900, in forward\n'
            "KeyError: 'pixel_values'\n",
            "unknown",
        ),
        # ---- round 13
        (
            "[nvidia-smi(stdout)] Failed to initialize NVML: Driver/library version mismatch\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "pynvml.NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch.\n",
            "cuda_driver_runtime_mismatch",
        ),
        ("Failed to initialize NVML: Driver Not Loaded\n", "cuda_driver_runtime_mismatch"),
        ("pynvml.NVMLError_GPUIsLost: GPU is lost\n", "gpu_hardware_fault"),
        ("pynvml.NVMLError_ResetRequired: GPU requires restart\n", "gpu_hardware_fault"),
        # V0 pins --swap-space GiB per GPU for its CPU blocks; cudaHostAlloc refuses with 'invalid argument'
        (
            '  File "/x/vllm/worker/cache_engine.py", line 66, in __init__\n'
            '    self.cpu_cache = self._allocate_kv_cache(self.num_cpu_blocks, "cpu")\n'
            '  File "/x/vllm/worker/cache_engine.py", line 83, in _allocate_kv_cache\n'
            "    layer_kv_cache = torch.zeros(kv_cache_shape,\n"
            "RuntimeError: CUDA error: invalid argument\n",
            "host_pinned_memory_swap_space",
        ),
        # torch 2.1+ lists two processes (12.8 GiB), but 61 GiB of the 80 are used beyond this process:
        # the rest belongs to processes NVML does not list (other containers)
        (
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 234.00 MiB. GPU 0 has a "
            "total capacty of 80 GiB of which 176.38 MiB is free. Process 4683 has 11.05 GiB memory in use. "
            "Process 16753 has 1.71 GiB memory in use. Including non-PyTorch memory, this process has "
            "18.80 GiB memory in use. Of the allocated memory 18.26 GiB is allocated by PyTorch, and "
            "30.10 MiB is reserved by PyTorch but unallocated.\n",
            "startup_free_memory_below_target",
        ),
        # ---- round 14
        (
            "[rank0]:E0701 14:28:21.083000 911603 torch/_inductor/runtime/triton_heuristics.py:539] "
            "[0/0] ptxas /tmp/tmpmwke15zw.ptx, line 6; error   : PTX .version 8.4 does not support "
            ".target sm_120a\n",
            "arch_no_kernel_image",
        ),
        (
            "RuntimeError: Assertion error (.../deepgemm-src/csrc/apis/hyperconnection.hpp:56): "
            "Unsupported architecture\n",
            "arch_no_kernel_image",
        ),
        (
            "WARNING 09-16 13:18:12 [gpu_worker.py:208] cudaHostRegister failed for rank=0\n",
            "host_pinned_memory_swap_space",
        ),
        (
            "RuntimeError: weight model.layers.0.self_attn.q_proj.weight does not exist\n",
            "config_error_not_resource",
        ),
        ("Error: Download process was signaled to shutdown with signal 7\n", "shm_insufficient"),
        # a log copied out of a web page keeps its HTML entities
        (
            "<pre>ValueError: [address=0.0.0.0:33939, pid=69383] FP8 quantized models is only supported on "
            "GPUs with compute capability &gt;= 8.9 (e.g 4090/H100), actual = `8.6`\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # retyped by a user (a typo, curly quotes): vLLM's numbers still read
        (
            "The model’s max sew len (32768) is larger than the maximum number of tokens that can be stored "
            "in KV cache (18896). Try increasing ‘gpu_memory_utilization’\n",
            "kv_cache_too_small_for_max_model_len",
        ),
        # a process that ends with signal 70 or a SIGBUS-free supervisor line is not a /dev/shm problem
        ("worker exited with signal 70\n", "unknown"),
        # ---- round 15
        (
            "stderr: nvidia-container-cli: initialization error: nvml error: driver/library version "
            "mismatch: unknown\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "[ 7386.259769] NVRM: API mismatch: the client has the version 515.48.07, but\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "[rank1]:[F ProcessGroupNCCL.cpp:1169] [PG 2 Rank 1] ProcessGroupNCCL's watchdog got stuck for "
            "600 seconds without making progress in monitoring enqueued collectives.\n",
            "nccl_multi_gpu_comm_failure",
        ),
        ("RuntimeError: Failed to infer device type\n", "config_error_not_resource"),
        (
            "ValueError: The input size is not aligned with the quantized weight shape. This can be caused "
            "by too large tensor parallel size.\n",
            "config_error_not_resource",
        ),
        # vLLM's sleep-mode allocator: an OOM whose stage the line does not give
        (
            "CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62\n",
            "startup_free_memory_below_target",
        ),
        # ---- vLLM 0.4.3, 0.6.3 and 0.8.5 (their wheels' raise statements, swept like the installed one's)
        (
            "RuntimeError: please set tensor_parallel_size (4) to less than max local gpu count (2)\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: please ensure that world_size (8) is less than than max local gpu count (4)\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: GPU memory utilization must be less than 1.0. Got 90.0.\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: CUDA_VISIBLE_DEVICES is set to empty string, which means GPU support is "
            "disabled.\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: Ray does not allocate any GPUs on the driver node. Consider adjusting the Ray "
            "placement group or running the driver on a GPU node.\n",
            "config_error_not_resource",
        ),
        (
            "NotImplementedError: FlashAttention does not support fp8 kv-cache on this device.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # kernel libraries' architecture gates (FlashInfer 0.7, Triton 3.x, AutoGPTQ 0.7), as raised
        ("RuntimeError: XQA is only supported on SM90, SM100, SM120/SM121 GPUs\n", "arch_no_kernel_image"),
        (
            "RuntimeError: vsa_sm100_blk128 backend requires SM100/SM103/SM107, current device is SM90\n",
            "arch_no_kernel_image",
        ),
        (
            "ValueError: num_ctas > 1 requires NVIDIA SM90+ (Hopper). Current target is sm_80.\n",
            "arch_no_kernel_image",
        ),
        (
            "ValueError: Can not use Marlin int4*fp16 kernel with a device of compute capability 7.5, the "
            "minimum compute capability is 8.0 for Marlin kernel.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # ... but not when a line only warns and falls back
        (
            "WARNING 05-01 12:00:00 [x.py:1] FlashAttention requires SM80+, falling back to XFormers\n",
            "unknown",
        ),
        # a sentence about an OOM that would happen is not one (SGLang 0.5's weight-cache daemon message)
        (
            "RuntimeError: [IpcModelLoader] Weight cache daemon not available at /tmp/x. In daemon mode, "
            "fallback to disk loading is disabled because the daemon process already holds weights on the "
            "same GPU - loading from disk would cause OOM.\n",
            "unknown",
        ),
        # round 17
        (
            "ValueError: Cannot find model module. 'MiniMaxM1ForCausalLM' is not a registered model in "
            "the Transformers library (only relevant if the model is meant to be in Transformers) and "
            "'AutoModel' is not present in the model config's 'auto_map' (relevant if custom).\n",
            "config_error_not_resource",
        ),
        (
            "ValueError : the model's max seq len (32768) is larger than the maxinum number of tokens that "
            "can be stored in KV cache, Try increasing 'gpu_memory_utilization'\n",
            "kv_cache_too_small_for_max_model_len",
        ),
        (
            "/usr/bin/ld: cannot find -lcuda\ncollect2: error: ld returned 1 exit status\n",
            "config_error_not_resource",
        ),
        ("AssertionError: libcuda.so cannot found!\n", "config_error_not_resource"),
        (
            "Not enough memory to handle 16000 total tokens with 2 prefill tokens. You need to decrease "
            "`--max-batch-total-tokens` or `--max-batch-prefill-tokens`\n",
            "oom_sampler_warmup_or_profile_run",
        ),
        ("CUDA OutOfMemory even after warmup phase succeeded\n", "oom_runtime_under_load"),
        ("[Bug]: OutOfMemoryError when server running multi requests\n", "oom_runtime_under_load"),
        ("[Bug]: CUDA OOM with a 32k prompt on two RTX 3090s\n", "oom_runtime_under_load"),
        (
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n",
            "host_ram_oom_killed",
        ),
        ("[Bug]: CompressedTensorsW4A16Fp4 is not support on turing\n", "quant_or_dtype_unsupported_on_gpu"),
        ("Tensor parallelism is not supported on Turing for this model\n", "unknown"),
        (
            "ValueError: Attempted to assign 702 = 702 multimodal tokens to 703 placeholders\n",
            "config_error_not_resource",
        ),
        # round 18
        (
            "Could not import Flash Attention enabled models: "
            "GPU with CUDA capability 7 0 is not supported\n",
            "arch_no_kernel_image",
        ),
        (
            "NotImplementedError: Sharded Llama requires Flash Attention enabled models.\n",
            "arch_no_kernel_image",
        ),
        ("RuntimeError: UVA is not available\n", "config_error_not_resource"),
        (
            "RuntimeError: [TM][ERROR] CUDA runtime error: out of memory "
            "/lmdeploy/src/turbomind/utils/memory_utils.cu:32\n",
            "oom_weights_do_not_fit",
        ),
        (
            "NCCL WARN NCCL cannot be captured in a graph if either it wasn't built with CUDA runtime "
            ">= 11.3 or if the installed CUDA driver < R465.\n",
            "cuda_driver_runtime_mismatch",
        ),
        ("TypeError: 'type' object is not subscriptable\n", "config_error_not_resource"),
        (
            "TypeError: unsupported operand type(s) for |: 'type' and 'NoneType'\n",
            "config_error_not_resource",
        ),
        (
            "ptxas /tmp/compile-ptx-src-b5bf24, line 372; error   : Feature '.bf16' requires .target sm_80 "
            "or higher\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "ptxas /tmp/x.ptx, line 5; error   : Feature 'wgmma.mma_async' requires .target sm_90a\n",
            "arch_no_kernel_image",
        ),
        (
            "ImportError: cannot import name 'RootModel' from 'pydantic' "
            "(/env/lib/python3.9/site-packages/pydantic/__init__.cpython-39-x86_64-linux-gnu.so)\n",
            "config_error_not_resource",
        ),
        (
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n",
            "config_error_not_resource",
        ),
        # the driver's own library is the driver's problem
        (
            "OSError: libcuda.so.1: cannot open shared object file: No such file or directory\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "RuntimeError: unable to open shared memory object </torch_1_2004494542_0> in read-write mode: "
            "Permission denied (13)\n",
            "shm_insufficient",
        ),
        (
            "RuntimeError: unable to open shared memory object </torch_1_2_0> in read-write mode: "
            "Too many open files (24)\n",
            "unknown",
        ),
        # swept from TGI's and LMDeploy's raise statements
        (
            "NotImplementedError: Using quantized Marlin models requires a GPU with CUDA capability 8.0 "
            "or later.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        ("RuntimeError: No enough gpu memory for runtime.\n", "no_kv_cache_memory"),
        (
            "RuntimeError: Your device does not supports bf16(bfloat16), please change to fp16(float16)\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "RuntimeError: Speculative decoding on CUDA requires FlashAttention-3 (FA3), which needs SM80+ "
            "(Ampere and above) with CUDA >= 12.3 and flash-attn installed. Detected: SM7.5\n",
            "arch_no_kernel_image",
        ),
        # CUDA runtime error strings (cudaGetErrorString) as PyTorch prints them
        ("RuntimeError: CUDA error: too many resources requested for launch\n", "arch_no_kernel_image"),
        ("RuntimeError: CUDA error: PTX JIT compiler library not found\n", "cuda_driver_runtime_mismatch"),
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasGemmEx( handle, opa, "
            "opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, "
            "CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        ("RuntimeError: CUDA error: hardware stack error\n", "illegal_memory_access_software_bug"),
        ("RuntimeError: CUDA error: named symbol not found\n", "arch_no_kernel_image"),
        ("qwen3没有vllm引擎，部署qwen2.5-VL-7b爆显存\n", "oom_runtime_under_load"),
        ("加载模型时显存不足\n", "oom_weights_do_not_fit"),
        # round 19
        (
            "[rank8] Warning: Unable to resolve hostname to a (local) address. Using the loopback\n"
            "        address as fallback. Manually set the network interface with GLOO_SOCKET_IFNAME\n"
            "RuntimeError: Gloo connectFullMesh failed ...\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Gloo connectFullMesh failed with "
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            "RuntimeError: Version mismatch: The cluster was started with:\n    Ray: 2.43.0\n",
            "config_error_not_resource",
        ),
        (
            "(autoscaler +13s) Error: No available node types can fulfill resource request "
            "{'node:111.6.168.225': 0.001, 'GPU': 1.0}. Add suitable node types to this cluster.\n",
            "config_error_not_resource",
        ),
        (
            "Value error, Tensor parallel size (16) cannot be larger than the number of available GPUs (8)\n",
            "config_error_not_resource",
        ),
        (
            "  Value error, max_num_batched_tokens (2048) is smaller than max_model_len (32768). "
            "[type=value_error]\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: GGUF quantization hasn't supported tensor parallelism yet.\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: Not enough host memory available. Requesting 40.00 GB but only have 44.87 GB free. "
            "Please reduce the size of the hierarchical cache.\n",
            "host_pinned_memory_swap_space",
        ),
        (
            "[Bug]: The quantization method mxfp4 is not supported for the current GPU SM75\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # PyTorch's allocator asserting on NVML while it builds its OOM message, the C++ allocator, elastic
        (
            'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "../c10/cuda/CUDACachingAllocator.cpp"'
            ":830, please report a bug to PyTorch.\n",
            "oom_runtime_under_load",
        ),
        ("terminate called after throwing an instance of 'std::bad_alloc'\n", "host_ram_oom_killed"),
        ("  exitcode  : -9 (pid: 3303)\n", "host_ram_oom_killed"),
        (
            'RuntimeError: some check INTERNAL ASSERT FAILED at "../aten/src/ATen/native/x.cpp":12\n',
            "unknown",
        ),
        # round 20
        (
            "(EngineCore pid=84) torch._inductor.exc.InductorError: PermissionError: [Errno 13] Permission "
            "denied: '/.triton'\n",
            "config_error_not_resource",
        ),
        ("permissionError: [error 13] Permission denied: '/.cache'\n", "config_error_not_resource"),
        (
            "OSError: [Errno 30] Read-only file system: '/model-cache/models--meta-llama--Llama-3.1-8B'\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: Current node has no GPU available. current_node_resource={'memory': 36000000000.0, "
            "'GPU': 0.05}.\n",
            "config_error_not_resource",
        ),
        (
            "Weight input_size_per_partition = 7392 is not divisible by min_thread_k = 128. "
            "Consider reducing tensor_parallel_size or running with --quantization gptq.\n",
            "config_error_not_resource",
        ),
        (
            "`unsloth/mistral-7b-v0.3-bnb-4bit` with error : ` KeyError: 'layers.0.mlp.down_proj.weight'`\n",
            "config_error_not_resource",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.59 GiB. GPU 0 has a total "
            "capacity of 47.50 GiB of which 590.81 MiB is free. "
            "Process 3075961 has 474.00 MiB memory in use. "
            "Process 4057874 has 20.04 GiB memory in use. Process 4060801 has 26.40 GiB memory in use.\n",
            "startup_free_memory_below_target",
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.59 GiB. GPU 0 has a total "
            "capacity of 47.50 GiB of which 590.81 MiB is free. "
            "Process 3075961 has 474.00 MiB memory in use. "
            "Process 4060801 has 46.40 GiB memory in use.\n",
            "oom_runtime_under_load",
        ),
        # vllm-project/vllm#7793 as posted: the OOM line, then the Marlin repack call's source line and file
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 140.00 MiB. GPU 0 has a total "
            "capacity of 23.67 GiB of which 37.88 MiB is free. Process 258755 has 23.63 GiB memory in use.\n"
            "marlin_qweight = ops.gptq_marlin_repack(b_q_weight=pack_fp8_to_int32(\n"
            '  File "/usr/local/lib/python3.10/dist-packages/vllm/model_executor/layers/quantization/utils/'
            'marlin_utils_fp8.py"\n',
            "oom_weights_do_not_fit",
        ),
        # round 21
        (
            "ValueError: Selected backend AttentionBackendEnum.FLASHINFER is not valid for this "
            "configuration. "
            "Reason: ['head_size not supported']\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: Selected backend AttentionBackendEnum.FLASH_ATTN is not valid for this "
            "configuration. "
            "Reason: ['compute capability not supported']\n",
            "arch_no_kernel_image",
        ),
        (
            "RuntimeError: Failed to load the model config. If the model is a custom model not yet available "
            "in the HuggingFace transformers library, consider setting trust_remote_code=True\n",
            "config_error_not_resource",
        ),
        (
            "This kernel only supports sm120.\ncudaErrorLaunchFailure: unspecified launch failure\n",
            "arch_no_kernel_image",
        ),
        ("WARNING this kernel only supports sm90, falling back to the Triton path\n", "unknown"),
        (
            "error: unknown: failed to verify the compilation unit (error 7: NVVM_ERROR_INVALID_OPTION),\n"
            "libNVVM extra log: libnvvm : error: -arch=compute_ is an unsupported option\n",
            "arch_no_kernel_image",
        ),
        (
            "void cutlass::arch::Mma<cutlass::gemm::GemmShape<16, 8, 32>, 32, cutlass::float_e4m3_t, "
            "cutlass::layout::RowMajor>::operator()(...) const [with Operator_ = "
            "cutlass::arch::OpMultiplyAddFastAccum] not implemented\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "Memory access fault by GPU node-2 (Agent handle: 0x5a0d7202eab0) on address 0x7d35a0c00000. "
            "Reason: Unknown.\n",
            "illegal_memory_access_software_bug",
        ),
        (
            "kernel: NVRM: GPU0 _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 10 "
            "sequence 759!\n",
            "gpu_hardware_fault",
        ),
        (
            "(LLMRayActor pid=90738, ip=172.19.24.110) mlx5: host_unknown: got completion with error:\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            "AttributeError: Qwen2Tokenizer has no attribute all_special_tokens_extended. "
            "Did you mean: 'num_special_tokens_to_add'?\n",
            "config_error_not_resource",
        ),
        ("AttributeError: 'NoneType' object has no attribute 'shape'\n", "unknown"),
        (
            '  File "/x/vllm/v1/attention/backends/flash_attn.py", line 155, in __init__\n'
            "    assert is_fa_version_supported(self.fa_version)\n"
            "AssertionError\n",
            "arch_no_kernel_image",
        ),
        # well-known setup errors closing a traceback
        (
            "FileNotFoundError: [Errno 2] No such file or directory: '/models/Qwen2-72B/config.json'\n",
            "config_error_not_resource",
        ),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/dev/shm/psm_1234'\n", "unknown"),
        (
            "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443): "
            "Max retries exceeded with url\n",
            "config_error_not_resource",
        ),
        (
            "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n",
            "config_error_not_resource",
        ),
        ("RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM:\n", "config_error_not_resource"),
        (
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE\n",
            "config_error_not_resource",
        ),
        ("AssertionError: Torch not compiled with CUDA enabled\n", "config_error_not_resource"),
        # round 22: an executor's attribute missing after a failed __init__ is not a version mismatch
        ("AttributeError: 'MultiprocExecutor' object has no attribute 'io_thread_pool'\n", "unknown"),
        # rounds 24 and 25
        ("*** SIGBUS received at time=1709393443 on cpu 1 ***\n", "shm_insufficient"),
        (
            '  File "chatglm.py", line 53, in __init__\n    assert self.total_num_kv_heads % tp_size == '
            "0\nAssertionError\n",
            "config_error_not_resource",
        ),
        ("RuntimeError: size_n = 2736 is not divisible by tile_n_size = 64\n", "config_error_not_resource"),
        (
            "ValueError: Invalid repository ID or local directory specified: 'Qwen/Qwen-Image-Edit-2509'.\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Worker failed with error 'Cannot re-initialize the input batch when CPU weight "
            "offloading "
            "is enabled. See https://github.com/vllm-project/vllm/pull/18298 for more details.', please "
            "check the "
            "stack trace above for the root cause\n",
            "config_error_not_resource",
        ),
        (
            "[Bug]: Qwen3-32B-AWQ an error message appears: Quantization scheme is not supported\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        ("RuntimeError: Rowwise scaling is not currently supported on your device\n", "arch_no_kernel_image"),
        (
            "ValueError: No valid attention backend found for cuda with "
            "AttentionSelectorConfig(head_size=576, "
            "use_mla=True, use_sparse=True). Reasons: {FLASH_ATTN_MLA: [sparse not supported, compute "
            "capability "
            "not supported], FLASHMLA: [sparse not supported, compute capability not supported, FlashMLA "
            "Sparse is "
            "only supported on Hopper and Blackwell devices.], TRITON_MLA: [sparse not supported], "
            "FLASHMLA_SPARSE: [compute capability not supported]}.\n",
            "arch_no_kernel_image",
        ),
        (
            "ValueError: No valid attention backend found for cuda with "
            "AttentionSelectorConfig(head_size=80). "
            "Reasons: {FLASH_ATTN: [head_size not supported], TRITON_ATTN: [head_size not supported, "
            "compute capability not supported]}.\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: No valid attention backend found for cuda with "
            "AttentionSelectorConfig(head_size=576, dtype=torch\n",
            "arch_no_kernel_image",
        ),
        (
            "ValueError: Backend TORCH_SDPA must be registered before use. Use "
            "register_backend(Backend.TORCH_SDPA, "
            "'your.module.YourClass')\n",
            "config_error_not_resource",
        ),
        ("RuntimeError: Shape mismatch: a.size(1) = 4096, size_k = 8192\n", "config_error_not_resource"),
        (
            "KeyError: 'invalid tool call parser: openai (chose from { hermes, mistral })'\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Worker failed with error 'Could not find nvcc and default "
            "cuda_home='/usr/local/cuda' "
            "doesn't exist', please check the stack trace above for the root cause\n",
            "config_error_not_resource",
        ),
        (
            "VLLM::Worker_TP invoked oom-killer: gfp_mask=0x102cc2(GFP_HIGHUSER), order=0, oom_score_adj=0\n",
            "host_ram_oom_killed",
        ),
        ("RuntimeError: Triton Error [CUDA]: out of memory\n", "oom_runtime_under_load"),
        (
            "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
            "pre_model_load_memory=40.1, local_gpu_memory=78.2\n",
            "startup_free_memory_below_target",
        ),
        (
            "RuntimeError: Sparse Attention Indexer CUDA op requires DeepGEMM to be installed.\n",
            "config_error_not_resource",
        ),
        (
            "ERROR [core.py:844] Search for `cudaErrorNoKernelImageForDevice' in "
            "https://docs.nvidia.com/cuda/"
            "cuda-runtime-api/group__CUDART__TYPES.html for more information.\n",
            "arch_no_kernel_image",
        ),
        (
            "Search for `cudaErrorECCUncorrectable' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
            "group__CUDART__TYPES.html for more information.\n",
            "gpu_hardware_fault",
        ),
        (
            "Search for `cudaErrorInsufficientDriver' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
            "group__CUDART__TYPES.html for more information.\n",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
            "group__CUDART__TYPES.html for more information.\n",
            "illegal_memory_access_software_bug",
        ),
        # the sleep-mode allocator grows only at start-up and wake_up: another job holds the memory
        (
            "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163\n",
            "startup_free_memory_below_target",
        ),
        # round 26
        (
            "RuntimeError: torch.cuda.MemPool doesn't currently support expandable_segments.\n",
            "config_error_not_resource",
        ),
        (
            "torch.cuda.DeferredCudaCallError: CUDA call failed lazily at initialization with error: device "
            ">= 0 && "
            'device < num_gpus INTERNAL ASSERT FAILED at "../aten/src/ATen/cuda/CUDAContext.cpp":49\n',
            "config_error_not_resource",
        ),
        (
            "ValueError: There is no module or parameter named 'lm_head.input_scale' in "
            "Qwen3_5MoeForCausalLM.\n",
            "config_error_not_resource",
        ),
        (
            "Int8 not supported on SM120. Use FP8 quantization instead, or run on older arch (SM < 100).\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "ValueError: Marlin does not support weight_bits = uint8b128. Only types = [] are supported (for "
            "group_size = 128, min_capability = 70, zp = False)\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "ValueError: Marlin does not support weight_bits = uint3b4. Only types = [uint4b8, uint8b128] "
            "are "
            "supported (for group_size = 128, device_capability = 90, zp = False).\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: GGUF model with architecture exaone is not supported yet.\n",
            "config_error_not_resource",
        ),
        ("ValueError: Architecture chatglm not supported\n", "config_error_not_resource"),
        (
            "RuntimeError: The size of tensor a (5120) must match the size of tensor b (4096) at "
            "non-singleton "
            "dimension 1\n",
            "config_error_not_resource",
        ),
        (
            'Error: failed to create containerd task: exec: "vllm": executable file not found in $PATH: '
            "unknown\n",
            "config_error_not_resource",
        ),
        (
            "Unhandled exception: St13runtime_error. what(): NCCL Error 5: invalid usage\n",
            "nccl_multi_gpu_comm_failure",
        ),
        # caret-notation colours as `cat -v` prints them
        (
            "^[[1;36m(EngineCore_DP0 pid=43065)^[[0;0m ERROR 01-04 04:31:09 [core.py:844] ValueError: No "
            "available "
            "memory for the cache blocks.\n",
            "no_kv_cache_memory",
        ),
        # the CUDA driver API's error names (cuda.h CUresult), printed by libraries that check it themselves
        (
            "RuntimeError: Engine core initialization failed.\nCUDA_ERROR_ILLEGAL_ADDRESS\n",
            "illegal_memory_access_software_bug",
        ),
        ("cuda.bindings error: CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU\n", "arch_no_kernel_image"),
        (
            "RuntimeError: CUDA driver call failed: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH\n",
            "cuda_driver_runtime_mismatch",
        ),
        ("DeepEP error: CUDA_ERROR_ECC_UNCORRECTABLE at csrc/kernels/runtime.cu:42\n", "gpu_hardware_fault"),
        # V1's start-up failure names each engine process's exit code: -9 is SIGKILL; {} names none
        (
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
            "{'EngineCore_DP0': -9}\n",
            "host_ram_oom_killed",
        ),
        (
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {}\n",
            "unknown",
        ),
        # a hybrid model with the hybrid KV cache manager off (a KV connector), in two releases' words
        (
            "ValueError: Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one "
            "unified type.\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: Failed to promote local KV cache specs to one unified type.\n",
            "config_error_not_resource",
        ),
        # 0.5's Gemma-2 soft-capping check
        (
            "ValueError: Please use Flashinfer backend for models with logits_soft_cap (i.e., Gemma-2). "
            "Otherwise, the output might be wrong. Set Flashinfer backend by export "
            "VLLM_ATTENTION_BACKEND=FLASHINFER.\n",
            "config_error_not_resource",
        ),
        # Gloo cannot open its transport on an interface the host lacks
        (
            "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != "
            "nullptr. Unable to find address for: eth0\n",
            "nccl_multi_gpu_comm_failure",
        ),
        # a segfault whose faulting instruction abseil names inside NCCL, and one it does not: a bare
        # segfault states no cause (HELDOUT.md, label decisions: a software bug only as the alternative)
        (
            "(RayWorkerWrapper pid=37) *** SIGSEGV received at time=1745722347 on cpu 48 ***\n"
            "(RayWorkerWrapper pid=37) PC: @     0x7f7e7ba49b8a  (unknown)  addProxyOpIfNeeded()\n"
            "(RayWorkerWrapper pid=37) Fatal Python error: Segmentation fault\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            "(RayWorkerWrapper pid=37) PC: @     0x7f7e7ba49b8a  (unknown)  at::native::copy_()\n"
            "(RayWorkerWrapper pid=37) Fatal Python error: Segmentation fault\n",
            "unknown",
        ),
        # cudaErrorOperatingSystem: pinned host memory refused
        (
            "INFO 09-15 12:35:28 llm_engine.py:201] # GPU blocks: 7384, # CPU blocks: 6553\n"
            "RuntimeError: CUDA error: OS call failed or operation not supported on this OS\n",
            "host_pinned_memory_swap_space",
        ),
        # an endpoint the served model's task does not provide
        (
            '{"object":"error","message":"The model does not support Rerank (Score) API"}\n',
            "config_error_not_resource",
        ),
        # 0.5's multimodal placeholder check said 'image tokens'
        (
            "ValueError: Attempted to assign 2160 = 2160 image tokens to 0 placeholders\n",
            "config_error_not_resource",
        ),
        # CPython's unpacking and index errors inside vLLM's model code; the same outside vllm/ says nothing
        (
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/attention/layer.py", line 290, in forward\n'
            "    bsz, q_len, _ = query.size()\n"
            "ValueError: too many values to unpack (expected 3)\n",
            "config_error_not_resource",
        ),
        (
            '  File "/home/u/app/main.py", line 12, in pick\n'
            "    return items[3]\n"
            "IndexError: list index out of range\n",
            "unknown",
        ),
        # round 33: vLLM's own checks, read in their sources
        ("ERROR 08-29 11:24:10 [engine.py:467] CPU backend only supports V1.\n", "config_error_not_resource"),
        (
            "OSError: It looks like the config file at '/models/tinyllama-1.1b-chat-v1.0.Q4_0.gguf' is not a "
            "valid JSON file.\n",
            "config_error_not_resource",
        ),
        (
            "ValueError: Unable to find matching target for model.layers.0.self_attn.q_proj in the "
            "compressed-tensors config.\n",
            "config_error_not_resource",
        ),
        # Ray's placement-group check, wrapped after 'the total' as terminals print it
        (
            "ValueError: The number of required GPUs exceeds the total\nnumber of available GPUs in the "
            "placement group.\n",
            "config_error_not_resource",
        ),
        (
            "[rank0]: ValueError: Either SamplingParams or PoolingParams must be provided.\n",
            "config_error_not_resource",
        ),
        (
            "error: ValueError: Expected hidden_size to be 5120, but found: 2390\n",
            "config_error_not_resource",
        ),
        (
            "[2024-06-13 16:11:51,588 E 13261 13261] core_worker.cc:228: Failed to register worker "
            "01000000ffff to Raylet. IOError: [RayletClient] Unable to register worker with raylet. No such "
            "file or directory\n",
            "config_error_not_resource",
        ),
        (
            "FATAL: kernel `fmha_cutlassF_f16_aligned_64x128_rf_sm80` is for sm80-sm100, but was built for "
            "sm50\n",
            "arch_no_kernel_image",
        ),
        (
            "ValueError: The output size is not aligned with the quantized weight shape. This can be caused "
            "by too large tensor parallel size.\n",
            "config_error_not_resource",
        ),
        # a layer's attention module this rank does not hold (pipeline parallelism the model lacks)
        ("KeyError: 'language_model.model.layers.30.self_attn.attn'\n", "config_error_not_resource"),
        # the socket module's lower-case exception class closes the traceback
        (
            '  File "/usr/lib/python3.10/socket.py", line 955, in getaddrinfo\n'
            "    for res in _socket.getaddrinfo(host, port, family, type, proto, flags):\n"
            "socket.gaierror: [Errno -3] Temporary failure in name resolution\n",
            "config_error_not_resource",
        ),
        (
            "TypeError: LLMatcher.validate_grammar() got some positional-only arguments passed as keyword "
            "arguments: 'tokenizer'\n",
            "config_error_not_resource",
        ),
        # an AttributeError's message alone, with a person's typographic quotes
        (
            "DeciLMConfig object has no attribute ‘num_key_value_heads_per_layer’\n",
            "config_error_not_resource",
        ),
        # round 34
        ("KeyError: 'transformer.h.0.attn.c_attn.g_idx'\n", "config_error_not_resource"),
        (
            "[Bug]: documentation say XLMRobertaForSequenceClassification is supported but logs say "
            "['XLMRobertaForSequenceClassification'] are not supported for now\n",
            "config_error_not_resource",
        ),
        (
            "ERROR 02-23 13:07:13 engine.py:400] The Transformers implementation of XLMRobertaModel is not "
            "compatible with vLLM.\n",
            "config_error_not_resource",
        ),
        (
            "WARNING 02-13 07:19:11 scheduler.py:949] Input prompt (32889 tokens) is too long and exceeds "
            "limit of 2048\n",
            "config_error_not_resource",
        ),
        (
            "ERROR 04-08 07:13:28 [serving_chat.py:198] Error in preprocessing prompt inputs\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Failed to import transformers.models.bloom.modeling_bloom because of the "
            "following error (look up to see its traceback):\n",
            "config_error_not_resource",
        ),
        # ... and the import's own error on the next line decides where it has a rule
        (
            "RuntimeError: Failed to import transformers.models.bloom.modeling_bloom because of the "
            "following error (look up to see its traceback):\nlibcudart.so.12: cannot open shared object "
            "file: No such file or directory\n",
            "config_error_not_resource",
        ),
        (
            "[Bug]: ImportError: vllm/_C.abi3.so: undefined symbol "
            "_ZN3c106ivalue14ConstantString6createENSt7\n",
            "config_error_not_resource",
        ),
        ("[Installation]: RM has detected an NVML/RM version mismatch\n", "cuda_driver_runtime_mismatch"),
        # round 35
        (
            "AttributeError: Model LlavaForConditionalGeneration does not support BitsAndBytes quantization "
            "yet.\n",
            "config_error_not_resource",
        ),
        # exceptions that say a kernel or format needs another GPU architecture (vLLM 0.32's raise sites)
        (
            "ValueError: SparseMQAIndexer requires an SM100-class GPU and DeepGEMM >= 2.8.\n",
            "arch_no_kernel_image",
        ),
        (
            "ValueError: nvfp4_per_token online quantization requires a Blackwell (SM100) GPU.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        ("ValueError: The tokenizer requires a chat template.\n", "config_error_not_resource"),
        # vLLM's own class for a request it refuses (vllm/exceptions.py: a client error)
        (
            "vllm.exceptions.VLLMValidationError: 'top_k' must be -1 (disable) or at least 1, got 0.\n",
            "config_error_not_resource",
        ),
        # a kernel's own assert print, the lines before 'device-side assert triggered'
        (
            "/w/torch/_inductor/runtime/compile_tasks.py:45: <module>: block: [337,0,0], thread: [112,0,0] "
            "Assertion `index out of bounds: 0 <= tmp10 < 4096` failed.\n",
            "illegal_memory_access_software_bug",
        ),
        # V0's MQ engine logs str(e) above the traceback: an AttributeError's message without its class
        (
            "ERROR 05-26 00:17:47 [engine.py:448] 'ColumnParallelLinear' object has no attribute "
            "'input_scale'\n"
            "ERROR 05-26 00:17:47 [engine.py:448] Traceback (most recent call last):\n",
            "config_error_not_resource",
        ),
        # DeepGEMM's FP8 block-scaling recipes exist for arch_major 9 and 10 only (csrc/utils/layout.hpp)
        (
            "RuntimeError: Assertion error (/workspace/.deps/deepgemm-src/csrc/apis/layout.hpp:60): "
            "Unknown SF transformation\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # ... but an assertion on its JIT's cuobjdump run is the image's missing toolkit tools
        (
            "RuntimeError: Assertion error (csrc/apis/../jit_kernels/impls/../../jit/kernel_runtime.hpp:45): "
            "exit_code == 0\n",
            "config_error_not_resource",
        ),
        # vLLM's Turing/Ampere CUTLASS scaled-mm kernels check for int8 inputs first
        (
            "RuntimeError: cutlass_scaled_mm_sm80_epilogue, .../scaled_mm_c2x.cu:89\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        (
            "RuntimeError: vllm._flashmla_C is not available, likely was not compiled due to insufficient "
            "nvcc version or a supported arch was not in the list of target arches to compile for.\n",
            "arch_no_kernel_image",
        ),
        (
            "[rank0]: `cutlassF-pt` is not supported because:\n"
            "[rank0]:     xFormers wasn't build with CUDA support\n",
            "config_error_not_resource",
        ),
        # a wrapper whose guarded 'from vllm import LLM' failed
        ("NameError: name 'LLM' is not defined. Did you mean: 'VLLM'?\n", "config_error_not_resource"),
        # an exception as repr() prints it inside a wrapper's sentence reaches the last-resort rule
        (
            "2025-04-05 10:49:00 - The model could not be loaded. The error was ValueError('Expected a "
            "bool for add_bos_token, got the string yes').\n",
            "config_error_not_resource",
        ),
        # torch 2.1+ lists processes without 'this process has': the one holding what PyTorch holds (4.60 GiB
        # allocated, 17.83 MiB cached, plus a context) is this one, so another job held 26.79 of 31.74 GiB
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 7 has a total "
            "capacity of 31.74 GiB of which 17.12 MiB is free. Process 1192276 has 26.79 GiB memory in use. "
            "Process 3455589 has 4.92 GiB memory in use. Of the allocated memory 4.60 GiB is allocated by "
            "PyTorch, and 17.83 MiB is reserved by PyTorch but unallocated.\n",
            "startup_free_memory_below_target",
        ),
        # ... but when the large figure is what PyTorch holds, it is this process's own: nothing is blamed on
        # another job, and the empty cache reads as loading
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 7 has a total "
            "capacity of 31.74 GiB of which 17.12 MiB is free. Process 1192276 has 26.79 GiB memory in use. "
            "Process 3455589 has 4.92 GiB memory in use. Of the allocated memory 26.00 GiB is allocated by "
            "PyTorch, and 17.83 MiB is reserved by PyTorch but unallocated.\n",
            "oom_weights_do_not_fit",
        ),
        # ---- round 44: PyTorch's NCCL detail, cuda-gdb, retyped bf16, bitsandbytes, the driver's GSP, NVLink
        (
            "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
            "Cuda failure 'invalid argument'\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            'Thread 71 "pt_autograd_0" received signal CUDA_EXCEPTION_14, Warp Illegal Address.\n',
            "illegal_memory_access_software_bug",
        ),
        (
            "valueerror: bfloat16 is only supported on gpus with compute capability of at least 8.0. your "
            "tesla v100-sxm2-32gb gpu has compute capability 7.0.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        ("ERROR: Your GPU does not support Int8 Matmul!\n", "quant_or_dtype_unsupported_on_gpu"),
        (
            "[   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs "
            "812751949 heartbeat 1899482 heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200\n",
            "gpu_hardware_fault",
        ),
        (
            "torch.AcceleratorError: CUDA error: Invalid access of peer GPU memory over nvlink or a hardware "
            "error\n",
            "gpu_hardware_fault",
        ),
        (
            "[2023-03-01 05:13:31,393] [INFO] [utils.py:834:see_memory_usage] CPU Virtual Memory:  used = "
            "502.63 GB, percent = 99.8%\n",
            "host_ram_oom_killed",
        ),
        # ... while a host with room is no evidence at all
        (
            "[2023-03-01 05:13:31,393] [INFO] [utils.py:834:see_memory_usage] CPU Virtual Memory:  used = "
            "50.63 GB, percent = 9.8%\n",
            "unknown",
        ),
        # ---- round 45: cupy's TCP store, vLLM's CUTLASS build and DeepGEMM placeholder, MoE backends,
        # TensorRT
        ("RuntimeError: TCPStore is not available\n", "nccl_multi_gpu_comm_failure"),
        (
            "NotImplementedError: No compiled cutlass_scaled_mm for a compute capability less than CUDA "
            "device capability: 87\n",
            "arch_no_kernel_image",
        ),
        (
            "RuntimeError: DeepGEMM backend is not available or outdated.\nPlease install or update the "
            "`deep_gemm` to a newer version to enable FP8 kernels.\n",
            "config_error_not_resource",
        ),
        (
            "NotImplementedError: No NvFp4 MoE backend supports the deployment configuration.\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # TensorRT's CUDA out-of-memory is an OOM whose stage the log decides (none here: run-time first)
        (
            'E0915 15:27:00.910199 134 logging.cc:40] "[defaultAllocator.cpp::allocateAsync::44] Error Code '
            '1: Cuda Runtime (out of memory)"\n',
            "oom_runtime_under_load",
        ),
        # ---- round 46: TensorRT-LLM and Triton, sandboxes, vLLM's loader, small engines, Metal
        (
            "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out "
            "of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:112)\n",
            "oom_runtime_under_load",
        ),
        # TensorRT's own landmarks: the engine loaded, then an OOM is its weights'
        (
            "[TensorRT-LLM][INFO] Loaded engine size: 13768 MiB\n"
            "[TensorRT-LLM][ERROR] 1: [defaultAllocator.cpp::allocate::20] Error Code 1: Cuda Runtime "
            "(out of memory)\n",
            "oom_weights_do_not_fit",
        ),
        (
            "[TensorRT-LLM][ERROR] CUDA runtime error in cudaDeviceGetDefaultMemPool(&memPool, device): "
            "operation not supported (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/bufferManager.cpp:170)\n",
            "config_error_not_resource",
        ),
        (
            "E0120 08:28:09.425599 2049 model_lifecycle.cc:654] \"failed to load 'tensorrt_llm' version 1: "
            "Invalid argument: unable to find backend library for backend 'tensorrtllm', try specifying "
            'runtime on the model configuration."\n',
            "config_error_not_resource",
        ),
        # CUDA's first call refused by the OS (a user namespace): no pinned memory involved
        (
            "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
            "before calling NumCudaDevices() that might have already set an error? Error 304: OS call failed "
            "or operation not supported on this OS\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Some weights are not initialized from checkpoints: "
            "{'model.layers.3.mlp.gate_up_proj.g_idx_sort_indices'}\n",
            "config_error_not_resource",
        ),
        ("AssertionError: Not enough memory for KV cache，try reducing --num-pages\n", "no_kv_cache_memory"),
        (
            "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command "
            "buffer execution failed: Insufficient Memory "
            "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)\n",
            "oom_runtime_under_load",
        ),
        # V0's MQ engine logs a load_weights KeyError as its key alone
        ("ERROR 11-27 08:34:57 engine.py:366] 'lm_head.weight'\n", "config_error_not_resource"),
        # an exception while a vLLM model class is built, with nothing about resources
        (
            '  File "/x/vllm/model_executor/models/hunyuan_v1.py", line 900, in __init__\n'
            '    raise RuntimeError("No HunYuanMoE layer found in model.layers.")\n'
            "RuntimeError: No HunYuanMoE layer found in model.layers.\n",
            "config_error_not_resource",
        ),
        (
            '  File "/x/vllm/utils.py", line 799, in current_memory_usage\n'
            "    return mem\n"
            "UnboundLocalError: cannot access local variable 'mem' where it is not associated with a value\n",
            "config_error_not_resource",
        ),
        # an OOM that surfaces in torch.cuda's stream helper is an earlier kernel's, not context creation
        (
            '  File "/x/torch/cuda/__init__.py", line 636, in set_stream\n'
            "    _set_stream_by_id(\n"
            '  File "/x/torch/cuda/__init__.py", line 618, in _set_stream_by_id\n'
            "    torch._C._cuda_setStream(\n"
            "RuntimeError: CUDA error: out of memory\n",
            "oom_runtime_under_load",
        ),
        # ... while the same error in _lazy_init is the CUDA context of a full card
        (
            '  File "/x/torch/cuda/__init__.py", line 478, in _lazy_init\n'
            "    torch._C._cuda_init()\n"
            "RuntimeError: CUDA error: out of memory\n",
            "startup_free_memory_below_target",
        ),
        # rich's log handler wraps the OOM message in a column with its source location on the right
        (
            "ERROR    2024-11-28 13:24:44,248 infinity_emb ERROR: CUDA   batch_handler.py:574\n"
            "         out of memory. Tried to allocate 3.88 GiB. GPU 0                       \n"
            "         has a total capacity of 44.42 GiB of which 920.81                      \n",
            "oom_runtime_under_load",
        ),
        # ---- round 47: rendezvous and ZMQ addresses, SGLang's custom all-reduce and KV profile, library
        # symbol versions
        (
            "[E616 02:08:15.931416442 socket.cpp:1023] [c10d] The client socket has timed out after 600000ms "
            "while trying to connect to (172.17.0.9, 50437).\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            "(APIServer pid=396) zmq.error.ZMQError: Cannot assign requested address "
            "(addr='tcp://10.27.91.102:13345')\n",
            "config_error_not_resource",
        ),
        (
            "RuntimeError: Runtime check failed at /sgl-workspace/sglang/python/sglang/jit_kernel/include/"
            "sgl_kernel/distributed/custom_all_reduce.cuh:37: CUDA error: invalid argument\n",
            "nccl_multi_gpu_comm_failure",
        ),
        (
            "[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than the profiled value "
            "-561981. Use the profiled value instead.\n",
            "no_kv_cache_memory",
        ),
        # a positive profiled value is only SGLang lowering the user's number
        (
            "[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than the profiled value 61981. "
            "Use the profiled value instead.\n",
            "unknown",
        ),
        (
            "ImportError: /env/lib/python3.10/site-packages/nvidia/cusparse/lib/libcusparse.so.12: undefined "
            "symbol: __nvJitLinkComplete_12_4, version libnvJitLink.so.12\n",
            "config_error_not_resource",
        ),
        ("ImportError: undefined symbol: _ZN3c104cuda9SetDeviceEa\n", "config_error_not_resource"),
        (
            "[Bug] `fp8e4nv` not supported on A100 (SM80) when serving a FP8 model\n",
            "quant_or_dtype_unsupported_on_gpu",
        ),
        # LightLLM's KV pool is sized by --max_total_token_num: an OOM while it is allocated is the pool's
        (
            "    self.value_buffer = [torch.empty((size, head_num, head_dim), dtype=dtype, "
            'device="cuda") for _ in range(layer_num)]\n'
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.14 GiB (GPU 0; 79.35 GiB "
            "total capacity; 77.83 GiB already allocated; 711.19 MiB free; 77.83 GiB reserved in total by "
            "PyTorch)\n",
            "no_kv_cache_memory",
        ),
        # ... but not a source line of a shown traceback
        ('     29     raise ValueError("max_model_len cannot exceed 8192")\n', "unknown"),
    ],
)
def test_messages_read_in_their_sources(tmp_path: Path, text: str, cause: str) -> None:
    assert diagnose(_write(tmp_path, "vllm.log", text)).cause == cause


OLD_TORCH_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.63 GiB (GPU 0; 44.56 GiB total "
    "capacity; {alloc} GiB already allocated; 565.31 MiB free; {reserved} GiB reserved in total by PyTorch)\n"
)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        # torch <= 2.0: 27.93 GiB reserved by this process, 0.55 GiB free of 44.56: ~16 GiB is someone else's
        (OLD_TORCH_OOM.format(alloc="27.91", reserved="27.93"), "startup_free_memory_below_target"),
        # the same message when this process holds nearly all of the card
        (OLD_TORCH_OOM.format(alloc="42.70", reserved="42.80"), "oom_runtime_under_load"),
        # torch 2.1+: NVML found this process and listed no other, yet 20 GiB are used beyond it
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total "
            "capacity of 79.25 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process "
            "has 58.90 GiB memory in use. Of the allocated memory 57.10 GiB is allocated by PyTorch, and "
            "1.00 GiB is reserved by PyTorch but unallocated.\n",
            "startup_free_memory_below_target",
        ),
        # NVML said 0 bytes for this process (a container, a VM): the remainder means nothing
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.88 GiB. GPU 0 has a total "
            "capacity of 21.96 GiB of which 1.29 GiB is free. Including non-PyTorch memory, this process "
            "has 0 bytes memory in use. Of the allocated memory 19.02 GiB is allocated by PyTorch, and "
            "100.00 MiB is reserved by PyTorch but unallocated.\n",
            "oom_runtime_under_load",
        ),
        # 1.6 GiB beyond this process on an 8 GiB card: a desktop session, not another job (alone, with
        # 19 MiB in the cache, the line reads as a load OOM; its log, ho7-vllm-12529, names the profile run)
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total "
            "capacity of 7.75 GiB of which 1.17 GiB is free. Including non-PyTorch memory, this process has "
            "5.02 GiB memory in use. Of the allocated memory 4.81 GiB is allocated by PyTorch, and 18.97 MiB "
            "is reserved by PyTorch but unallocated.\n",
            "oom_weights_do_not_fit",
        ),
    ],
)
def test_memory_the_oom_message_leaves_unaccounted_is_another_process(
    tmp_path: Path, text: str, cause: str
) -> None:
    assert diagnose(_write(tmp_path, "vllm.log", text)).cause == cause


def _kv_lines(values: dict[str, float]) -> str:
    return "".join(
        f"({who} pid={100 + i}) INFO 12-10 03:24:48 [gpu_worker.py:298] "
        f"Available KV cache memory: {gib} GiB\n"
        for i, (who, gib) in enumerate(values.items())
    )


def test_tensor_parallel_ranks_with_far_apart_kv_budgets_mean_another_process_on_one_gpu(
    tmp_path: Path,
) -> None:
    d = diagnose(_write(tmp_path, "a.log", _kv_lines({"Worker_TP0": 9.90, "Worker_TP1": -3.86})))
    assert d.cause == "startup_free_memory_below_target"
    assert any("Worker_TP1" in e.text and "9.90" in e.text for e in d.evidence)
    # equal ranks, one negative budget: the model is too big for the budget, nobody else is blamed
    d = diagnose(_write(tmp_path, "b.log", _kv_lines({"Worker_TP0": -3.70, "Worker_TP1": -3.86})))
    assert d.cause == "no_kv_cache_memory"
    # pipeline stages hold different layers, so their budgets differ by design
    d = diagnose(_write(tmp_path, "c.log", _kv_lines({"Worker_PP0_TP0": 9.90, "Worker_PP1_TP0": -3.86})))
    assert d.cause == "no_kv_cache_memory"


def test_an_oom_in_vllms_kernel_warmup_frames_is_a_warmup_oom(tmp_path: Path) -> None:
    log = _write(
        tmp_path,
        "vllm.log",
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/v1/worker/gpu/warmup.py", line 240, in warmup_kernels\n'
        '  File "/x/vllm/v1/worker/gpu/warmup.py", line 260, in _warmup_kernels\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 28.44 GiB. GPU 7 has a total capacity "
        "of 178.34 GiB of which 7.38 GiB is free.\n",
    )
    d = diagnose(log)
    assert (d.cause, d.stage) == ("oom_sampler_warmup_or_profile_run", "warmup")


def test_a_person_naming_the_stage_outweighs_the_progress_lines_pasted_after_the_title(
    tmp_path: Path,
) -> None:
    log = _write(
        tmp_path,
        "vllm.log",
        "[Bug] OOM during graph capture at high `--gpu-memory-utilization`\n"
        "INFO  [gpu_worker.py:642]  Available KV cache memory: 2.97 GiB\n"
        "INFO  [model_runner.py]    Graph capturing finished in 1 secs, took 0.46 G\n",
    )
    assert diagnose(log).cause == "oom_cudagraph_capture"


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        (
            "RuntimeError: please set tensor_parallel_size (4) to less than max local gpu count (3)\n",
            {"--tensor-parallel-size": "2"},
        ),
        (
            "ValueError: GPU memory utilization must be less than 1.0. Got 90.0.\n",
            {"--gpu-memory-utilization": "0.90"},
        ),
        ("ValueError: GPU memory utilization must be less than 1.0. Got 250.0.\n", {}),
        ("RuntimeError: Failed to infer device type\n", {}),
        (
            "Value error, Tensor parallel size (16) cannot be larger than the number of available GPUs (8)\n",
            {"--tensor-parallel-size": "8"},
        ),
        ("ValueError: LoRA rank 64 is greater than max_lora_rank 16.\n", {"--max-lora-rank": "64"}),
        ("ValueError: LoRA rank 48 is greater than max_lora_rank 16.\n", {"--max-lora-rank": "64"}),
        (
            "ValueError: torch.bfloat16 is not supported for quantization method awq. Supported dtypes: "
            "[torch.float16]\n",
            {"--dtype": "float16"},
        ),
        (
            "AssertionError: float16 is required for MoE compressed models. Set dtype=torch.float16\n",
            {"--dtype": "float16"},
        ),
    ],
)
def test_configuration_errors_with_a_known_fix_change_only_that_flag(
    tmp_path: Path, text: str, flags: dict[str, str]
) -> None:
    d = diagnose(_write(tmp_path, "vllm.log", text))
    assert d.cause == "config_error_not_resource"
    assert d.remediation.flag_changes == flags


# nvitop's process rows as posted in triton-inference-server/server#7562 (tests/corpus/ho12-triton-7562-*)
_NVITOP_ROWS = (
    "PID USER DEV     TYPE  GPU        GPU MEM    CPU  HOST MEM Command\n"
    "1880122 root   {a}  Compute   0%   5102MiB  33%     1%   5959MiB /opt/tritonserver/backends/python/"
    "triton_python_backend_stub /models_vllm_gemma2B/gemma_2B_1/1/model.py t\n"
    "1894187 root   {b}  Compute   0%   5102MiB  33%     1%   5950MiB /opt/tritonserver/backends/python/"
    "triton_python_backend_stub /models_vllm_gemma2B_2/gemma_2B_1/1/model.py\n"
    "1879648 root   0  Compute   0%    164MiB   1%     1%    420MiB tritonserver --model-repository=/m\n"
)


@pytest.mark.parametrize(
    ("a", "b", "cause"),
    [
        ("0", "0", "startup_free_memory_below_target"),  # two engines on GPU 0
        ("0", "1", "no_kv_cache_memory"),  # one per GPU, as tensor-parallel ranks hold them
    ],
)
def test_a_pasted_process_table_with_two_engines_on_one_gpu_blames_the_other(
    tmp_path: Path, a: str, b: str, cause: str
) -> None:
    log = _write(
        tmp_path,
        "vllm.log",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine.\n" + _NVITOP_ROWS.format(a=a, b=b),
    )
    d = diagnose(log)
    assert d.cause == cause
    if cause == "startup_free_memory_below_target":
        assert any("2 processes holding memory on GPU 0" in e.detail for e in d.evidence)


def test_nvidia_smis_own_process_table_is_read(tmp_path: Path) -> None:
    # captured on an H200 by bench/gpu/process-table.sh while two processes held 20998 and 8710 MiB on GPU 0
    table = (Path(__file__).parent / "fixtures/gpu/process-table/nvidia-smi.txt").read_text()
    error = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`\n"
    d = diagnose(_write(tmp_path, "a.log", table + error))
    assert d.cause == "startup_free_memory_below_target"
    assert any("pid 457 20998 MiB, pid 458 8710 MiB" in e.detail for e in d.evidence)
    # one process on the card (the run's own): the table is no evidence of another
    one = "".join(line for line in table.splitlines(keepends=True) if " 458 " not in line)
    assert diagnose(_write(tmp_path, "b.log", one + error)).cause == "no_kv_cache_memory"


def test_out_of_memory_creating_the_cuda_context_means_the_card_was_already_full(tmp_path: Path) -> None:
    # frames as vLLM 0.6 printed them (vllm-project/vllm#11560); the message is torch's C10_CUDA_CHECK
    prefix = "(VllmWorkerProcess pid=232075) ERROR 12-29 07:45:20 multiproc_worker_utils.py:236] "
    frames = [
        "Exception in worker VllmWorkerProcess while processing method init_device.",
        "Traceback (most recent call last):",
        '  File "/x/site-packages/vllm/worker/worker.py", line 138, in init_device',
        "    torch.cuda.set_device(self.device)",
        '  File "/x/site-packages/torch/cuda/__init__.py", line 478, in set_device',
        "    torch._C._cuda_setDevice(device)",
        "RuntimeError: CUDA error: out of memory",
    ]
    d = diagnose(_write(tmp_path, "a.log", "".join(prefix + f + "\n" for f in frames)))
    assert d.cause == "startup_free_memory_below_target"
    # the same message from a graph capture's frames is an OOM of this process
    frames[2:6] = [
        '  File "/x/site-packages/vllm/worker/model_runner.py", line 1410, in capture',
        '  File "/x/site-packages/torch/cuda/graphs.py", line 82, in capture_end',
    ]
    d = diagnose(_write(tmp_path, "b.log", "".join(prefix + f + "\n" for f in frames)))
    assert d.cause == "oom_cudagraph_capture"


def test_a_command_pasted_over_several_lines_names_the_model_whose_weights_exceed_the_card(
    tmp_path: Path,
) -> None:
    # vllm-project/vllm#2363 as posted: the OOM line, then the command split with backslashes
    log = _write(
        tmp_path,
        "vllm.log",
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 112.00 MiB. GPU 0 has a total "
        "capacty of 39.39 GiB of which 17.94 MiB is free. Including non-PyTorch memory, this process has "
        "39.36 GiB memory in use. Of the allocated memory 38.72 GiB is allocated by PyTorch\n"
        "python -m vllm.entrypoints.openai.api_server \\\n"
        "--model mistralai/Mixtral-8x7B-v0.1\n",
    )
    d = diagnose(log)
    assert d.cause == "oom_weights_do_not_fit"
    assert any("at least 42B parameters" in e.text for e in d.evidence)


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("mistralai/Mixtral-8x7B-v0.1", 42.0),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", 132.0),
        ("x/Llama-70B", 70.0),
    ],
)
def test_parameters_from_a_name_with_a_floor_for_a_mixture_of_experts(name: str, billions: float) -> None:
    from tuner.triage_weights import params_from_name

    assert params_from_name(name) == billions


@pytest.mark.parametrize(
    ("text", "flags", "says"),
    [
        (
            "[2026-08-28 01:41:17] Load weight end. elapsed=0.60 s\n"
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.7. Raise --mem-fraction-static above 0.773 (minimum viable = "
            "1 - available/pre = 0.7722).\n",
            {"--mem-fraction-static": "0.80"},  # a little above SGLang's own floor
            "--mem-fraction-static",
        ),
        (
            '  File "/env/lib/python3.10/site-packages/lmdeploy/pytorch/engine/executor/base.py", line 179, '
            "in _get_num_gpu_blocks\n"
            "RuntimeError: No enough gpu memory for kv cache.\n",
            {},
            "--tp",
        ),
    ],
)
def test_another_servers_no_kv_memory_gets_its_own_options_not_vllms(
    tmp_path: Path, text: str, flags: dict[str, str], says: str
) -> None:
    d = diagnose(_write(tmp_path, "server.log", text))
    assert d.cause == "no_kv_cache_memory"
    assert d.remediation.flag_changes == flags
    assert says in d.remediation.summary and "--gpu-memory-utilization" not in d.remediation.summary
    assert not any("--gpu-memory-utilization" in a.summary for a in d.remediation.alternatives)


def test_the_sigkill_vllm_sends_its_own_process_tree_is_not_a_host_oom(tmp_path: Path) -> None:
    # vLLM 0.7 .. 0.8 (vllm/v1/engine/core_client.py sigusr1_handler) logs this, then SIGKILLs its tree
    tail = (
        "CRITICAL 05-19 22:17:53 [core_client.py:359] Got fatal signal from worker processes, shutting down. "
        "See stack trace above for root cause issue.\n"
        "Killed\n"
    )
    d = diagnose(_write(tmp_path, "a.log", tail), exit_code=137)
    assert d.cause == "unknown"
    # the shell's 'Killed' without vLLM's teardown line stays the OOM killer's
    assert diagnose(_write(tmp_path, "b.log", "Killed\n")).cause == "host_ram_oom_killed"


def test_the_sigkill_sglang_sends_its_own_launcher_is_not_a_host_oom(tmp_path: Path) -> None:
    # SGLang's scheduler answers its own exception with kill_process_tree, which SIGKILLs the launcher
    # (tests/corpus/ho195-sglang-7495-deepgemm-assert.log): the exception is the failure, not host RAM
    frames = (
        "Traceback (most recent call last):\n"
        '  File "/s/python/sglang/srt/managers/scheduler.py", line 2215, in run_scheduler_process\n'
        "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)\n"
        '  File "/s/python/sglang/srt/layers/quantization/fp8_kernel.py", line 76, in deep_gemm_nt\n'
        "    deep_gemm_wrapper.gemm_nt_f8f8bf16((A, As), (B, Bs), C)\n"
        "ValueError: an error of the scheduler\n"
    )
    d = diagnose(_write(tmp_path, "a.log", frames + "Killed\n"))
    assert d.cause != "host_ram_oom_killed"
    sigquit = (
        "[2025-06-24 08:54:27] Received sigquit from a child process. It usually means the child failed.\n"
    )
    assert diagnose(_write(tmp_path, "b.log", sigquit + "Killed\n")).cause != "host_ram_oom_killed"
    # a 'Killed' after another program's traceback stays the OOM killer's
    other = frames.replace("/s/python/sglang/srt/", "/app/train/")
    assert diagnose(_write(tmp_path, "c.log", other + "Killed\n")).cause == "host_ram_oom_killed"


def test_coloured_ipython_7_frames_are_read_as_frames(tmp_path: Path) -> None:
    # a notebook's saved traceback keeps IPython 7's colours ('path.py\x1b[0m in \x1b[0;36mfunc'): the frame
    # is still found (tests/corpus/ho181-nb-bvir-qwen25vl-16bit-t4-oom.log), so resize_token_embeddings
    # right after from_pretrained puts the OOM at load
    frame = (
        "\x1b[0;32m/usr/local/lib/python3.12/dist-packages/transformers/modeling_utils.py\x1b[0m in "
        "\x1b[0;36mresize_token_embeddings\x1b[0;34m(self, new_num_tokens)\x1b[0m\n"
    )
    oom = (
        "\x1b[0;31mOutOfMemoryError\x1b[0m: CUDA out of memory. Tried to allocate 2.03 GiB. GPU 0 has a "
        "total capacity of 14.56 GiB of which 243.81 MiB is free.\n"
    )
    d = diagnose(_write(tmp_path, "nb.log", frame + oom))
    assert (d.stage, d.cause) == ("load", "oom_weights_do_not_fit")


def test_a_bare_assert_takes_its_source_line_as_its_message(tmp_path: Path) -> None:
    # Python prints an assert statement's source line above a bare AssertionError
    # (tests/corpus/ho205-vllm-12899-qwen25vl-bnb-inflight-shape-assert.log): that line states what failed
    frames = (
        "Traceback (most recent call last):\n"
        '  File "/v/vllm/model_executor/layers/linear.py", line 589, in weight_loader\n'
        "    assert param_data.shape == loaded_weight.shape\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "AssertionError\n"
    )
    res = triage_scan.scan(io.BytesIO(frames.encode()))
    assert res.exceptions[-1].message == "assert param_data.shape == loaded_weight.shape"
    assert diagnose(_write(tmp_path, "a.log", frames)).cause == "config_error_not_resource"
    # an assert about something else, or an AssertionError far from any assert line, says nothing
    other = frames.replace("param_data.shape == loaded_weight.shape", "i % chunk_size == 0")
    assert diagnose(_write(tmp_path, "b.log", other)).cause == "unknown"
    far = frames.replace("AssertionError\n", "\n" * 10 + "AssertionError\n")
    assert triage_scan.scan(io.BytesIO(far.encode())).exceptions[-1].message == ""
    # an exception line whose own message begins with 'assert ' (pytest's style) is still an exception line
    stated = "Traceback (most recent call last):\nAssertionError: assert 0 <= idx < 4096\n"
    assert triage_scan.scan(io.BytesIO(stated.encode())).exceptions[-1].message == "assert 0 <= idx < 4096"


def test_a_bus_error_while_the_shards_are_read_is_not_dev_shm(tmp_path: Path) -> None:
    # safetensors memory-maps each shard: a page it cannot read back raises SIGBUS
    # (tests/corpus/ho195-sglang-6083-bus-error-weights.log); the same bus error before loading is /dev/shm
    start = "[2025-05-07 14:42:43 TP0] Init torch distributed ends. mem usage=0.34 GB\n"
    load = (
        "[2025-05-07 14:42:43 TP0] Load weight begin. avail mem=46.93 GB\n"
        "Loading safetensors checkpoint shards:   0% Completed | 0/17 [00:00<?, ?it/s]\n"
    )
    bus = "Fatal Python error: Bus error\n"
    d = diagnose(_write(tmp_path, "a.log", start + load + bus))
    assert d.cause == "unknown"
    assert any("shards were read" in e.text for e in d.evidence)
    assert diagnose(_write(tmp_path, "b.log", start + bus + load)).cause == "shm_insufficient"


# An OOM whose innermost frames are the sampler's, with no other landmark (tests/corpus/ho24-vllm-24436-*):
# the sampler warm-up made those tensors first; the same frames under the serving loop are a run-time OOM.
_SAMPLER_FRAMES = (
    '  File "/v/vllm/v1/sample/ops/topk_topp_sampler.py", line 83, in forward_native\n'
    "    logits = apply_top_k_top_p(logits, k, p)\n"
    '  File "/v/vllm/v1/sample/ops/topk_topp_sampler.py", line 189, in apply_top_k_top_p\n'
    "    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 298.00 MiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 98.25 MiB is free. Including non-PyTorch memory, this process has 23.53 GiB memory "
    "in use. "
    "Of the allocated memory 20.32 GiB is allocated by PyTorch, with 66.00 MiB allocated in private pools "
    "(e.g., "
    "CUDA Graphs), and 74.74 MiB is reserved by PyTorch but unallocated.\n"
)


@pytest.mark.parametrize(
    ("before", "cause", "stage"),
    [
        ("", "oom_sampler_warmup_or_profile_run", "warmup"),
        (
            '  File "/v/vllm/v1/engine/core.py", line 966, in run_busy_loop\n    '
            "self._process_engine_step()\n",
            "oom_runtime_under_load",
            "serving",
        ),
    ],
)
def test_sampler_frames_name_the_warmup_unless_the_serving_loop_is_above_them(
    tmp_path: Path, before: str, cause: str, stage: str
) -> None:
    d = diagnose(
        _write(tmp_path, "vllm.log", "Traceback (most recent call last):\n" + before + _SAMPLER_FRAMES)
    )
    assert (d.cause, d.stage) == (cause, stage)


def test_a_bare_exception_closes_a_shutdown_traceback_after_the_failure(tmp_path: Path) -> None:
    # vllm-project/vllm-omni#541: the failure, then an 'Exception ignored in' traceback at shutdown that ends
    # with a bare 'Exception: test'; the log does not end inside a traceback
    text = (
        "(APIServer pid=48263) ValueError: Invalid repository ID or local directory specified: 'Qwen/X'.\n"
        "(APIServer pid=48263) Exception ignored in: <function AsyncOmni.del at 0x7f14afca9120>\n"
        "(APIServer pid=48263) Traceback (most recent call last):\n"
        '(APIServer pid=48263) File "/w/vllm_omni/entrypoints/async_omni.py", line 197, in del\n'
        "(APIServer pid=48263) Exception: test\n"
    )
    d = diagnose(_write(tmp_path, "vllm.log", text))
    assert d.cause == "config_error_not_resource"
    assert d.evidence[0].line == 1


def test_custom_all_reduce_failure_is_communication_that_one_argument_fixes(tmp_path: Path) -> None:
    # vllm-project/vllm#45604 and #49101: vLLM's own all-reduce (CUDA IPC between the GPUs) failed
    text = "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'\n"
    d = diagnose(_write(tmp_path, "vllm.log", text))
    assert d.cause == "nccl_multi_gpu_comm_failure"
    assert d.remediation.flag_changes == {"--disable-custom-all-reduce": ""}
    assert d.fixable_by_args  # the cause is not, in general; this message's fix is an argument


def test_one_allocation_larger_than_the_card_is_the_profiling_runs_activation(tmp_path: Path) -> None:
    # MoonshotAI/Kimi-VL#51 and #54 (tests/corpus/ho27-kimivl-51-*, ho29-kimivl-54-*): no landmark, and a
    # request for 408 GiB on an 80 GiB card, which no weight tensor is
    text = (
        "RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 408.29 GiB. GPU 0 "
        "has a "
        "total capacity of 79.33 GiB of which 50.72 GiB is free. Process 2555617 has 28.60 GiB memory in "
        "use. Of "
        "the allocated memory 27.40 GiB is allocated by PyTorch, and 170.22 MiB is reserved by PyTorch but "
        "unallocated.', please check the stack trace above for the root cause\n"
    )
    d = diagnose(_write(tmp_path, "vllm.log", text))
    assert d.cause == "oom_sampler_warmup_or_profile_run"
    assert d.alternatives[0][0] == "oom_runtime_under_load"
    # an ordinary request on a full card: the stage stays unknown
    small = text.replace("408.29 GiB", "408.29 MiB").replace("50.72 GiB is free", "50.72 MiB is free")
    assert diagnose(_write(tmp_path, "small.log", small)).cause == "oom_runtime_under_load"
    # the same request with 50 GiB free is no shortage of memory at all
    roomy = text.replace("408.29 GiB", "408.29 MiB")
    d = diagnose(_write(tmp_path, "roomy.log", roomy))
    assert d.cause == "unknown"
    assert any("the card had room" in e.text for e in d.evidence)


def test_a_stage_free_oom_with_nothing_freed_in_the_cache_is_a_load_oom(tmp_path: Path) -> None:
    # tests/corpus/gpu-h200-alloc-*: real H200 OOMs from bench/gpu/allocator_cache.py. Creating weights
    # frees nothing (0 bytes reserved but unallocated); forward passes leave their activations in the cache
    load = Path("tests/corpus/gpu-h200-alloc-load.log").read_text()
    d = diagnose(_write(tmp_path, "load.log", load))
    assert d.cause == "oom_weights_do_not_fit"
    assert d.alternatives[0][0] == "oom_runtime_under_load"
    assert any("nothing freed yet" in e.text for e in d.evidence)
    # the same line with a forward pass's cache (64 MiB and more freed), or with an activation-sized
    # request (4 GiB and more), keeps the run-time reading
    cached = load.replace("and 0 bytes is reserved", "and 64.00 MiB is reserved")
    assert diagnose(_write(tmp_path, "cached.log", cached)).cause == "oom_runtime_under_load"
    big = load.replace("Tried to allocate 128.00 MiB", "Tried to allocate 4.00 GiB")
    assert diagnose(_write(tmp_path, "big.log", big)).cause == "oom_runtime_under_load"
    serving = Path("tests/corpus/gpu-h200-alloc-serving.log").read_text()
    assert diagnose(_write(tmp_path, "serving.log", serving)).cause == "oom_runtime_under_load"


def test_torch_1x_oom_message_gives_the_cache_as_reserved_minus_allocated() -> None:
    # tests/corpus/ho15-vllm-928-*: '(GPU 0; T total capacity; A already allocated; F free; R reserved in
    # total by PyTorch)'
    line = next(
        ln
        for ln in Path("tests/corpus/ho15-vllm-928-baichuan13b-a10-oom.log").read_text().splitlines()
        if "already allocated" in ln
    )
    facts = triage._torch_oom_facts(line)
    assert facts["reserved_unallocated"] == pytest.approx(
        facts["reserved_total"] - facts["already_allocated"]
    )
    assert facts["reserved_unallocated"] < triage.NOTHING_FREED_MIB


def test_remediation_names_each_option_once() -> None:
    # tests/corpus/ho9-qwen3-54-*: the computed alternatives change --gpu-memory-utilization and
    # --kv-cache-dtype; the cause's generic alternatives that name the same options are dropped
    d = diagnose(Path("tests/corpus/ho9-qwen3-54-qwen15-72b-2xa100-kv-too-small-32768.log"))
    assert d.cause == "kv_cache_too_small_for_max_model_len"
    alts = d.remediation.alternatives
    for flag in ("--gpu-memory-utilization", "--kv-cache-dtype"):
        assert sum(flag in a.summary or flag in a.flag_changes for a in alts) == 1


def test_torch_2_11_watchdog_line_alone_is_a_communication_failure(tmp_path: Path) -> None:
    # tests/corpus/gpu-h200-nccl-timeout.log (torch 2.11 on two H200s) without its 'Watchdog caught
    # collective operation timeout' lines: torch 2.7+'s 'failure detected by watchdog at work sequence id'
    # still names the cause
    lines = Path("tests/corpus/gpu-h200-nccl-timeout.log").read_text().splitlines()
    kept = [ln for ln in lines if "Watchdog caught" not in ln]
    assert any("failure detected by watchdog at work" in ln for ln in kept)
    d = diagnose(_write(tmp_path, "cut.log", "\n".join(kept) + "\n"))
    assert d.cause == "nccl_multi_gpu_comm_failure"
    assert any("detected by watchdog" in e.text for e in d.evidence)


def test_an_oom_under_a_per_process_memory_limit_names_the_limit(tmp_path: Path) -> None:
    # tests/fixtures/gpu/allocator/fraction-limit.log: torch 2.11 on an H200 under
    # set_per_process_memory_fraction(0.05): 132.8 GiB free, '6.99 GiB allowed'. The process ran out of
    # its budget, so it is an OOM (of the stage it died in), with the limit as the first thing to change.
    d = diagnose(Path("tests/fixtures/gpu/allocator/fraction-limit.log"))
    assert playbook().causes[d.cause].get("memory")
    assert any("its own limit of 6.99 GiB" in e.text for e in d.evidence)
    assert d.remediation.summary.startswith("The process may use only 6.99 GiB")
    # the same figures without a limit below the card's: the card had room, so no memory label
    text = Path("tests/fixtures/gpu/allocator/fraction-limit.log").read_text()
    assert "6.99 GiB allowed" in text
    d = diagnose(_write(tmp_path, "nolimit.log", text.replace("6.99 GiB allowed", "139.80 GiB allowed")))
    assert d.cause == "unknown"
    assert any("the card had room" in e.text for e in d.evidence)


def test_a_missing_driver_api_symbol_is_the_driver_but_a_mangled_one_is_a_build(tmp_path: Path) -> None:
    # sgl-kernel built for CUDA 12.4+ on an older driver (sgl-project/sglang#8131, tests/corpus/ho82-*)
    driver = (
        "ImportError: /usr/local/lib/python3.10/dist-packages/sgl_kernel/common_ops.abi3.so: undefined "
        "symbol: cuGreenCtxStreamCreate\n"
    )
    d = diagnose(_write(tmp_path, "a.log", driver))
    assert d.cause == "cuda_driver_runtime_mismatch" and not d.memory
    # a C++ symbol of torch's: an extension built against another torch, not the driver
    mangled = (
        "ImportError: /opt/venv/lib/python3.12/site-packages/vllm/_C.abi3.so: undefined symbol: "
        "_ZN3c104cuda9SetDeviceEi\n"
    )
    assert diagnose(_write(tmp_path, "b.log", mangled)).cause == "config_error_not_resource"
    # the runtime's own cuda* names are not driver API entry points
    runtime = "ImportError: libfoo.so: undefined symbol: cudaGetDeviceCount\n"
    assert diagnose(_write(tmp_path, "c.log", runtime)).cause != "cuda_driver_runtime_mismatch"


def test_an_exllamav2_request_larger_than_its_whole_cache_names_the_cache_size(tmp_path: Path) -> None:
    # TabbyAPI relaying ExLlamaV2's dynamic generator (theroyallab/tabbyAPI#119, tests/corpus/ho83-*)
    log = (
        "ERROR:    Traceback (most recent call last):\n"
        '  File "/env/lib/python3.11/site-packages/exllamav2/generator/dynamic_async.py", line 37, '
        "in enqueue\n"
        "exception=AssertionError('Job requires 33 pages (only 32 available) and cannot be enqueued. Total "
        "cache allocated is 32 * 256 = 8192 tokens')>\n"
    )
    d = diagnose(_write(tmp_path, "x.log", log))
    assert d.cause == "kv_cache_too_small_for_max_model_len" and d.stage == "serving"
    assert "8192 tokens" in d.remediation.summary and "cache_size" in d.remediation.summary
    assert not d.remediation.flag_changes  # vLLM's flags do not apply to ExLlamaV2


def test_an_exception_line_pasted_inside_quotes_is_read_as_the_exception(tmp_path: Path) -> None:
    """People paste an error between quotes or backticks ('''ValueError: ...''', "ValueError: ...",
    `KeyError: 'x'`): the class and message are read as from a bare line, and the words after the opening
    quote are the message; a class name inside a sentence without ': ' after it stays prose."""
    pasted = (
        "'''ValueError: Unrecognized configuration class <class 'Gemma3Config'> "
        "for this kind of AutoModel'''\n"
        '"ValueError: No supported config format found in nvidia/Llama-3.1-Nemotron-70B-Instruct"\n'
        "`KeyError: 'model.layers.0.mlp.down_proj.weight'`\n"
    )
    got = [(e.exc, e.message) for e in scan(io.BytesIO(pasted.encode())).exceptions]
    assert [exc for exc, _ in got] == ["ValueError", "ValueError", "KeyError"]
    assert got[0][1].startswith("Unrecognized configuration class")
    assert got[1][1].startswith("No supported config format found in")
    d = diagnose(_write(tmp_path, "pasted.log", pasted.splitlines()[1] + "\n"))
    assert d.cause == "config_error_not_resource"
    prose = scan(io.BytesIO(b'the docs say "ValueError is raised when" the config is bad\n'))
    assert prose.exceptions == []


def test_a_configuration_failure_outside_vllm_is_not_called_vllm_s() -> None:
    """A training job's rendezvous (made here: rank 0 of two started alone) stops on its setup; the
    remediation quotes the message without saying vLLM refused it, as a vLLM log's still does."""
    torch_job = diagnose(CORPUS / "cpu-torch-store-clients-not-joined.log", exit_code=1)
    assert torch_job.cause == "config_error_not_resource"
    assert "1/2 clients joined" in torch_job.remediation.summary
    assert "vLLM" not in torch_job.remediation.summary
    served = diagnose(CORPUS / "ho10-vllm-10481-llamamodel-arch-unsupported.log")
    assert served.cause == "config_error_not_resource"
    assert served.remediation.summary.startswith("vLLM rejected its configuration")


def test_nccl_that_finds_the_card_full_is_an_oom_not_a_communication_failure() -> None:
    """tests/fixtures/gpu/failures-2026-12-02/nccl-oom.log: an H200 filled by the process's own tensors,
    then a one-rank NCCL all_reduce (bench/gpu/capture_failures.py --only nccl-oom; torch 2.11, NCCL
    2.28.9): NCCL's 'Cuda failure 'out of memory'' under ncclUnhandledCudaError and c10d's 'unhandled cuda
    error'. The NCCL lines only wrap the allocation that failed."""
    log = Path("tests/fixtures/gpu/failures-2026-12-02/nccl-oom.log")
    d = diagnose(log, exit_code=int(log.with_suffix(".rc").read_text()))
    assert d.memory and d.cause.startswith("oom_"), (d.cause, d.confidence)
    assert "nccl_multi_gpu_comm_failure" not in {c for c, _ in d.alternatives}
    assert any("Cuda failure 'out of memory'" in e.text for e in d.evidence)


def test_a_message_re_flowed_inside_an_indented_quote_is_read_whole() -> None:
    """A commit message quotes vLLM's start-up refusal indented and re-flowed over two lines, each keeping
    its indent (NovaSky-AI/SkyRL 807bcda): the lines go back together without their indents, and the
    numbers of the one message are read."""
    log = CORPUS / "ho214-skyrl-807bcda-orphan-engine-free-mem.log"
    assert len(log.read_text().splitlines()) == 2
    d = diagnose(log)
    assert d.cause == "startup_free_memory_below_target"
    assert any("is less than desired GPU memory utilization (0.7, 55.43 GiB)" in e.text for e in d.evidence)


def test_sglang_s_scheduler_lines_mark_serving_after_its_graph_capture(tmp_path: Path) -> None:
    """AReaL's evaluation log (inclusionAI/AReaL logs/10242302): SGLang captured its CUDA graphs, served,
    retracted requests when the KV pool filled, then ran out of memory in the LM head of a prefill. The
    scheduler's retraction lines and its event-loop frames are serving landmarks; the same OOM right after
    the capture's progress bar is still read as the capture's."""
    log = CORPUS / "ho214-repo-areal-10242302-sglang-lm-head-runtime-oom.log"
    d = diagnose(log)
    assert (d.cause, d.stage) == ("oom_runtime_under_load", "serving")
    lines = log.read_text().splitlines(keepends=True)
    capture = next(i for i, t in enumerate(lines) if "Capturing batches" in t)
    oom = next(t for t in lines if t.startswith("torch.OutOfMemoryError"))
    cut = diagnose(_write(tmp_path, "cut.log", "".join(lines[: capture + 1]) + oom))
    assert (cut.cause, cut.stage) == ("oom_cudagraph_capture", "graph_capture")


def test_an_undefined_symbol_inside_a_warning_is_not_the_failure(tmp_path: Path) -> None:
    """torchvision warns 'Failed to load image Python extension: ... image.so: undefined symbol: _ZN...'
    and goes on (ho211's evaluation log, whose run then ran out of GPU memory per question): the symbol
    rules do not read a warning, so the OOMs decide, and the warning alone names nothing."""
    log = CORPUS / "ho211-repo-chaincode-hf-generate-oom-per-question.log"
    d = diagnose(log)
    assert d.cause == "oom_runtime_under_load"
    assert not any("undefined_cxx_symbol" in e.detail for e in d.evidence)
    warning = next(t for t in log.read_text().splitlines() if "undefined symbol" in t)
    assert "UserWarning: " in warning
    assert diagnose(_write(tmp_path, "warn.log", warning + "\n")).cause == "unknown"


@pytest.mark.parametrize(
    ("case", "sig", "cause"),
    [
        (
            "ho215-repo-ik-625-undefined-symbol-lib-clash",
            "ld.undefined_c_symbol",
            "config_error_not_resource",
        ),
        (
            "ho214-skyrl-2076-libcudart-stub-undefined-symbol",
            "cuda.libcudart_missing_symbol",
            "config_error_not_resource",
        ),
        (
            "ho213-repo-deepspeed-3634-num-heads-mp-size",
            "generic.must_be_divisible",
            "config_error_not_resource",
        ),
        (
            "ho214-repo-primerl-fp8-load-cuda-init-fork",
            "torch.cuda_driver_init_failed",
            "config_error_not_resource",
        ),
        (
            "ho208-forum-gitcode-695c2a5b-dynamo-h100-error-803",
            "cuda.error_803",
            "cuda_driver_runtime_mismatch",
        ),
        (
            "ho210-hf-mixtral8x7b-13-tgi-flashattn-quant",
            "tgi.model_no_quantization",
            "config_error_not_resource",
        ),
    ],
)
def test_library_and_setting_messages_outside_vllm_name_their_cause(
    case: str, sig: str | None, cause: str
) -> None:
    """Real lines from rounds 187-215: a C symbol another build of a library lacks (ik_llama.cpp's server
    on llama.cpp's libllama), a stub libcudart found first, DeepSpeed's divisibility assert, torch's failed
    CUDA initialisation in a forked engine, CUDA error 803 by its number, TGI's refusal of --quantize."""
    d = diagnose(CORPUS / f"{case}.log")
    assert d.cause == cause, (d.cause, d.confidence)
    assert any(e.detail.startswith(f"{sig}:") for e in d.evidence)


def test_the_generic_symbol_rule_leaves_the_cuda_entry_points_to_their_own() -> None:
    """CUTLASS #2086: 'undefined symbol: cudaGetDriverEntryPointByVersion', code built with CUDA 12.8 on a
    12.2 driver. The CUDA runtime's and the driver's entry points (cuda*, cu*) are not read as a library
    mismatch of the build: the generic rule does not fire, and nothing calls it configuration."""
    d = diagnose(CORPUS / "ho187-repo-cutlass-2086-undefined-symbol-old-driver.log")
    assert not any(e.detail.startswith("ld.undefined_c_symbol:") for e in d.evidence)
    assert d.cause != "config_error_not_resource"


def test_bitsandbytes_without_gpu_support_explains_the_device_map_refusal() -> None:
    """Llama2-Chinese #123: bitsandbytes' CPU-only build warns, then transformers refuses the 8-bit device
    map with 'Make sure you have enough GPU RAM to fit the quantized model' (re-flowed and indented as
    transformers prints it). The build, not the card's memory: the warning explains the refusal."""
    d = diagnose(CORPUS / "ho64-llama-chinese-123-bnb-no-gpu-support-dispatched-cpu.log")
    assert d.cause == "config_error_not_resource" and not d.memory
    assert any(e.detail.startswith("bnb.compiled_without_gpu:") for e in d.evidence)

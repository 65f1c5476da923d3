"""triage's lexicon (tuner/triage_lexicon.py): the last reading of a log no signature explains, from the
words of its failure lines weighed against the labelled corpus of real failures.

The corpus cases below are real logs; each is read with the lexicon trained on the corpus's other sets,
so what it names comes from other threads' words, not from its own."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner import triage_lexicon
from tuner.triage import Diagnosis, diagnose
from tuner.triage_scan import playbook, scan

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"
NOT_MEMORY = [c for c, info in playbook().causes.items() if not info.get("memory") and c != "unknown"]
MEMORY = {c for c, info in playbook().causes.items() if info.get("memory")}
NO_LEXICON = triage_lexicon.Lexicon({"unknown": 1}, {})


@functools.cache
def _loso() -> dict[str, triage_lexicon.Lexicon]:
    return triage_lexicon.leave_one_set_out(triage_lexicon.corpus_cases(CORPUS))


def _diagnose_case(name: str, lexicon: triage_lexicon.Lexicon | None = None) -> Diagnosis:
    lex = lexicon if lexicon is not None else _loso()[triage_lexicon.corpus_set(name)]
    return diagnose(CORPUS / f"{name}.log", lexicon=lex)


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        # LMDeploy's TP=2 on Windows, where PyTorch is built without NCCL
        ("ho37-lmdeploy-4032-windows-tp2-no-nccl", "config_error_not_resource"),
        # koboldcpp's FlashAttention kernel with no device code for the card's sm_75
        ("ho69-koboldcpp-1579-flash-attn-no-device-code-cuda-arch-750", "arch_no_kernel_image"),
        # transformers' config class without the attribute the model code reads (a version mismatch)
        ("ho46-vllm-3323-gemma-lm-head-keyerror", "config_error_not_resource"),
    ],
)
def test_a_log_no_signature_knows_is_read_from_its_words(name: str, cause: str) -> None:
    assert _diagnose_case(name, NO_LEXICON).cause == "unknown"  # the signatures alone
    d = _diagnose_case(name)
    assert d.cause == cause
    assert d.confidence == triage_lexicon.LEXICON_CONFIDENCE
    # a reading proposes no argument, so `launch --auto-fix` stops on it
    assert not d.fixable_by_args
    assert not d.remediation.flag_changes
    assert d.source.startswith("lexicon")
    lexical = [e for e in d.evidence if e.detail.startswith("its words weigh")]
    assert lexical and all(e.line for e in lexical)
    assert "No known message names the cause" in d.remediation.summary


def test_a_healthy_server_log_is_not_read() -> None:
    """No failure line: nothing to read, whatever the words. The log's one exception is quoted by a
    WARNING record (oneDNN's fallback to torch linear), handled, and its shutdown tail holds leak warnings;
    with the lexicon trained without this set those words once read as configuration."""
    for lex in (triage_lexicon.lexicon(), None):
        d = _diagnose_case("cpu-fixture-serve-ok", lex)
        assert d.cause == "unknown", d.evidence


def test_an_exception_a_warning_quotes_is_not_a_failure_line(tmp_path: Path) -> None:
    lines = [
        "(Worker pid=8207) WARNING 11-29 16:05:22 [utils.py:597] Failed to create oneDNN linear, fallback "
        "to torch linear. Exception: could not create a primitive descriptor for the matmul primitive",
        "(APIServer pid=8124) INFO 11-29 16:05:30 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000",
    ]
    log = tmp_path / "ok.log"
    log.write_text("\n".join(lines) + "\n")
    with log.open("rb") as fh:
        res = scan(fh)
    assert res.exceptions, "the scanner still records the quoted exception"
    assert not triage_lexicon._failure_exceptions(res)  # but the lexicon does not count it as the failure
    assert not [f for f, _, _ in triage_lexicon.features(res) if f.startswith("X:")]


def test_a_log_cut_inside_a_traceback_is_not_read(tmp_path: Path) -> None:
    frames = "".join(
        f'  File "/venv/lib/python3.12/site-packages/torch/distributed/{m}.py", line 9, in f\n    x()\n'
        for m in ("distributed_c10d", "rendezvous", "c10d_logger")
    )
    log = tmp_path / "cut.log"
    log.write_text(
        "ERROR 05-01 [core.py:1] EngineCore failed to start.\nTraceback (most recent call last):\n" + frames
    )
    d = diagnose(log)
    assert d.cause == "unknown"
    assert "ends inside a traceback" in d.remediation.summary


def test_a_message_about_memory_is_not_read(tmp_path: Path) -> None:
    """A memory message no signature knows stays unknown: word counts do not name its cause."""
    body = "".join(
        f'  File "/venv/lib/python3.12/site-packages/vllm/config/{m}.py", line 9, in verify\n    check()\n'
        for m in ("cache", "vllm", "model")
    )
    text = (
        "ERROR 05-01 12:00:00 [core.py:1] EngineCore failed to start.\nTraceback (most recent call last):\n"
        + body
        + "ValueError: not enough memory for the requested swap space of the hybrid allocator config\n"
    )
    log = tmp_path / "mem.log"
    log.write_text(text)
    assert diagnose(log).cause == "unknown"


def test_a_missing_or_broken_lexicon_leaves_the_signatures_alone(tmp_path: Path) -> None:
    bad = tmp_path / "lexicon.tsv"
    bad.write_text("word\t0:1\n")
    assert triage_lexicon.lexicon(str(bad)) is None
    assert triage_lexicon.lexicon(str(tmp_path / "absent.tsv")) is None
    bad.write_text(f"# {triage_lexicon.FORMAT}\n#cases\tunknown=2\nword\t7:1\n")
    assert triage_lexicon.lexicon(str(bad)) is None  # a cause index the #cases line does not have


def test_the_file_format_round_trips() -> None:
    cases = triage_lexicon.corpus_cases(CORPUS)[:40]
    lex = triage_lexicon.train_cases(cases)
    again = triage_lexicon.loads(triage_lexicon.dumps(lex, "a note"))
    assert again.cases == lex.cases
    assert again.counts == lex.counts
    assert sum(lex.cases.values()) == 40


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(triage_lexicon.lexicon().counts)), min_size=0, max_size=60))  # type: ignore[union-attr]
def test_a_reading_names_only_the_causes_it_is_allowed(words: list[str]) -> None:
    """Whatever the words, the lexicon's posterior is a distribution and its reading never a memory cause."""
    lex = triage_lexicon.lexicon()
    assert lex is not None
    post = lex.posterior(words)
    assert abs(sum(post.values()) - 1.0) < 1e-9
    res = scan(io.BytesIO(("RuntimeError: " + " ".join(words) + "\n").encode()))
    reading = triage_lexicon.read(res, NOT_MEMORY, lex)
    assert reading is None or (reading.cause in NOT_MEMORY and reading.cause not in MEMORY)
    assert reading is None or reading.posterior >= triage_lexicon.MIN_POSTERIOR


def test_cli_names_a_read_cause_with_exit_0_and_json(tmp_path: Path) -> None:
    """`gputune triage --format json` on a real log the lexicon reads: exit 0 and the cause in the JSON."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    log = CORPUS / "ho39-vllm-29707-awq-compressed-tensors-rtx5000-cc75.log"
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "triage", "--format", "json", str(log)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    doc = json.loads(out.stdout)
    assert out.returncode == 0, out.stderr
    assert doc["cause"] == "quant_or_dtype_unsupported_on_gpu"
    assert doc["confidence"] == triage_lexicon.LEXICON_CONFIDENCE
    assert doc["remediation"]["flag_changes"] == {}
    assert doc["fixable_by_args"] is False


def _train_cli(*args: Path) -> subprocess.CompletedProcess[str]:
    """`python -m tuner.triage_lexicon ARGS...` from this checkout."""
    return subprocess.run(
        [sys.executable, "-m", "tuner.triage_lexicon", *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def test_training_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "lex.tsv"
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = _train_cli(empty, out)
    assert bad.returncode == 2 and "no labelled cases" in bad.stderr
    usage = _train_cli()
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_training_refuses_a_broken_corpus_and_an_unwritable_target(tmp_path: Path) -> None:
    """A .toml that does not parse, or an output folder that does not exist: a message and exit 2, and
    no half-written lexicon left behind."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "x.toml").write_text("label = [unclosed\n")
    (broken / "x.log").write_text("RuntimeError: boom\n")
    out = tmp_path / "lex.tsv"
    bad = _train_cli(broken, out)
    assert bad.returncode == 2 and "cannot read the corpus" in bad.stderr
    assert not out.exists()
    target = tmp_path / "no-such-dir" / "lex.tsv"
    unwritable = _train_cli(CORPUS, target)
    assert unwritable.returncode == 2 and "cannot write the lexicon" in unwritable.stderr
    assert not target.parent.exists()

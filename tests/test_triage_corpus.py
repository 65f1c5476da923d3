"""Triage against the labelled corpus in tests/corpus/: real failures made here (vLLM CPU build), real
H200 OOM traces, and logs users posted in public issue threads (each .toml names its source URL, label
and the evidence for the label).

Held-out accuracy (tests/corpus/HELDOUT.md), first run of each set with the triage that existed when
it was collected: `ho-` 37/49 (75.5%), `ho2-` 7/12, `ho3-` 29/37 (78.4%), `ho4-` 17/20 (85%),
`ho5-` 24/30 (80%),
`ho6-` 24/33 (72.7%), `ho7-` 17/33 (51.5%; 25 of its logs are titles or cut excerpts).
All sets are now part of the corpus, so the overall figure printed below is
coverage of studied failures, not a generalisation estimate."""

from __future__ import annotations

import functools
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tuner import triage_lexicon
from tuner.triage import ENGINE_NAMES, diagnose
from tuner.triage_scan import playbook, scan

CORPUS = Path(__file__).resolve().parent / "corpus"
# the share of logs holding the failure line that the corpus must keep (see the accuracy test)
CORPUS_FLOOR = 0.85


def _cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for toml in sorted(CORPUS.glob("*.toml")):
        with toml.open("rb") as fh:
            meta = tomllib.load(fh)
        out.append((toml.stem, meta))
    return out


CASES = _cases()


@functools.cache
def _corpus_words() -> tuple[triage_lexicon.Case, ...]:
    return tuple(triage_lexicon.corpus_cases(CORPUS))


@functools.cache
def _lexicons() -> dict[str, triage_lexicon.Lexicon]:
    """Each case is read with the lexicon trained on the other sets: the lexicon counted every corpus case,
    and its reading of the very cases it counted would say nothing of the logs it has not seen."""
    return triage_lexicon.leave_one_set_out(_corpus_words())


def _run(name: str, meta: dict[str, Any]) -> Any:
    log = CORPUS / f"{name}.log"
    tel = CORPUS / meta["telemetry"] if "telemetry" in meta else None
    dmesg = CORPUS / meta["dmesg"] if "dmesg" in meta else None
    lex = _lexicons()[triage_lexicon.corpus_set(name)]
    return diagnose(log, telemetry=tel, dmesg=dmesg, exit_code=meta.get("exit_code"), lexicon=lex)


def test_shipped_lexicon_is_what_the_corpus_trains() -> None:
    """playbooks/triage/lexicon.tsv is data made from the corpus: retrain it after changing a case
    (`python -m tuner.triage_lexicon tests/corpus playbooks/triage/lexicon.tsv`)."""
    shipped = triage_lexicon.lexicon()
    assert shipped is not None, "playbooks/triage/lexicon.tsv is missing or unreadable"
    trained = triage_lexicon.train_cases(_corpus_words())
    assert shipped.cases == trained.cases, "retrain playbooks/triage/lexicon.tsv: the corpus's labels changed"
    assert shipped.counts == trained.counts, "retrain playbooks/triage/lexicon.tsv: the corpus's logs changed"


def test_corpus_is_labelled_with_known_causes_and_sources() -> None:
    causes = set(playbook().causes)
    assert len(CASES) >= 40
    for name, meta in CASES:
        assert (CORPUS / f"{name}.log").is_file(), name
        assert meta["label"] in causes, name
        assert meta.get("source"), name
        assert meta.get("evidence"), name


@pytest.mark.parametrize(("name", "meta"), CASES, ids=[n for n, _ in CASES])
def test_corpus_case_gets_its_label(name: str, meta: dict[str, Any]) -> None:
    diag = _run(name, meta)
    if meta.get("known_miss"):
        # A real failure whose log carries no evidence for its true label: it stays labelled truthfully
        # and counts as a miss in the accuracy figures. If triage starts getting it right, say so.
        if diag.cause == meta["label"]:
            pytest.fail(f"{name} is marked known_miss but now gets its label: drop known_miss from its .toml")
        pytest.xfail(f"known miss: {meta['known_miss']}")
    assert diag.cause == meta["label"], f"{name}: {diag.cause} ({diag.confidence}) expected {meta['label']}"
    if meta.get("stage"):
        assert diag.stage == meta["stage"], f"{name}: stage {diag.stage} expected {meta['stage']}"
    for flag, value in meta.get("expect_flags", {}).items():
        assert diag.remediation.flag_changes.get(flag) == value, (name, diag.remediation.flag_changes)


def test_corpus_accuracy_per_label_and_no_memory_label_on_non_memory_failures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    memory = {c for c, info in playbook().causes.items() if info.get("memory")}
    total: Counter[str] = Counter()
    right: Counter[str] = Counter()
    wrong_memory = []
    held = [0, 0]
    complete = [0, 0]  # logs that hold the software's own failure line (not `complete = false`)
    for name, meta in CASES:
        diag = _run(name, meta)
        total[meta["label"]] += 1
        right[meta["label"]] += diag.cause == meta["label"]
        if meta.get("complete", True):
            complete[0] += diag.cause == meta["label"]
            complete[1] += 1
        if meta.get("heldout"):
            held[0] += diag.cause == meta["label"]
            held[1] += 1
        # `memory_failure = true`: labelled `unknown` (no cause supported by the thread) although the log's
        # own lines report memory exhaustion (an OOM error, a death whose report names the OOM killer
        # first) or a death by SIGKILL / SIGBUS whose collector names the OOM killer or /dev/shm as its
        # likely cause, so a memory label there is not one on a failure known not to be about memory
        if meta["label"] not in memory and diag.cause in memory and not meta.get("memory_failure"):
            wrong_memory.append((name, diag.cause))
    with capsys.disabled():
        print("\ntriage accuracy on tests/corpus (label: right/total)")
        for label in sorted(total):
            print(f"  {label:40s} {right[label]:3d}/{total[label]:<3d}")
        overall = sum(right.values()) / sum(total.values())
        print(f"  {'overall':40s} {sum(right.values()):3d}/{sum(total.values()):<3d} = {overall:.1%}")
        print(f"  {'of which held out (collected after)':40s} {held[0]:3d}/{held[1]:<3d}")
        print(f"  {'logs holding the failure line':40s} {complete[0]:3d}/{complete[1]:<3d}")
        print(
            f"  {'excerpts without it (title, cut)':40s} "
            f"{sum(right.values()) - complete[0]:3d}/{sum(total.values()) - complete[1]:<3d}"
        )
    # The target is on crash logs: a title line or a traceback cut before its exception holds no failure
    # line, and its label comes from the thread; those excerpts are counted above, not in the target.
    # The target is 90% on logs triage has not seen; it is not met (tests/corpus/HELDOUT.md: the
    # first runs of rounds 48-75 were 52-64% on such logs, rounds 76-81 81%, rounds 82-87 75%, rounds
    # 105-115 82%, rounds 116-123 83%, rounds 124-131 80%, their late cases 71%, rounds 132-139 73%, rounds
    # 140-147 67%, rounds 148-178 73%, rounds 179-203 69%, rounds 204-207 74%, rounds 208-215 62%). This
    # floor is the share measured on the corpus when rounds 124-131 were added (86.5%, each case read with
    # the lexicon of the other sets; 86.7% with rounds 132-147, 86.6% with rounds 148-178, 86.2% with
    # rounds 179-203, 86.0% with rounds 204-207, 85.8% with rounds 208-215), rounded down: a change that
    # loses studied failures fails here.
    share = complete[0] / complete[1]
    with capsys.disabled():
        met = "met" if share >= 0.90 else "not met"
        print(f"  target 90% on logs holding the failure line: {met} ({share:.1%})")
    assert share >= CORPUS_FLOOR
    assert not wrong_memory, f"memory label on a non-memory failure: {wrong_memory}"


def test_memory_remedies_are_valid_vllm_command_lines() -> None:
    """Every flag change triage proposes for a memory failure in the corpus (the chosen remedy and each
    ranked alternative), applied with apply_flag_changes to a typical serve command, is accepted by the
    installed vLLM's own argument parser (vllm/engine/arg_utils.py EngineArgs.add_cli_args)."""
    arg_utils = pytest.importorskip("vllm.engine.arg_utils")
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older vLLM
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    from tuner.triage import apply_flag_changes

    parser = arg_utils.EngineArgs.add_cli_args(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    base = [
        "--model",
        "m",
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.9",
        "--max-num-seqs",
        "64",
    ]
    # the GPU-memory labels; the host-RAM remedies only lower flags the failing command already had
    # (--swap-space of the V0 engine, --cpu-offload-gb), so they are valid for the vLLM that ran it
    memory = {
        "kv_cache_too_small_for_max_model_len",
        "no_kv_cache_memory",
        "startup_free_memory_below_target",
        "oom_cudagraph_capture",
        "oom_sampler_warmup_or_profile_run",
        "oom_runtime_under_load",
        "oom_weights_do_not_fit",
    }
    seen: Counter[str] = Counter()
    for name, meta in CASES:
        diag = _run(name, meta)
        if diag.cause not in memory:
            continue
        with (CORPUS / f"{name}.log").open("rb") as fh:
            if scan(fh).engine != "vllm":
                continue  # TGI / SGLang logs get their own server's options
        if any(e.detail.split(".", 1)[0] in ENGINE_NAMES for e in diag.evidence):
            continue  # a message only that server prints names it, as triage's remedy does
        options = [diag.remediation.flag_changes] + [a.flag_changes for a in diag.remediation.alternatives]
        for changes in options:
            if not changes:
                continue
            argv = apply_flag_changes(base, changes)
            ns = parser.parse_args(argv)  # argparse exits (SystemExit) on a flag or value vLLM rejects
            for flag, value in changes.items():
                dest = flag.lstrip("-").replace("-", "_")
                if value is None:
                    continue
                assert hasattr(ns, dest), (name, flag)
                if value == "":
                    assert getattr(ns, dest) is True, (name, flag)
            seen[diag.cause] += 1
    for cause in memory - {"oom_weights_do_not_fit"}:  # each is exercised by the corpus
        assert seen[cause] > 0, (cause, seen)

"""Benchmark `gputune triage`: streaming speed and memory on a 1 GB log, accuracy on the corpus.

    PYTHONPATH=. .venv/bin/python bench/triage.py [--size-mb 1024] [--keep]

1. Writes a vLLM-like serving log of --size-mb (metrics, request and access lines as vLLM 0.11+ prints
   them) with a CUDA OOM at the very end into a temporary folder.
2. Times, each in its own process so peak RSS is its own: `wc -l` and a plain Python loop over the
   lines (the baselines), then `diagnose()` on the same file, with the prefilter's automaton
   (pyahocorasick) and with its fallback (one bytes.find pass per trigger word). Prints MB/s, peak RSS
   and the ratios.
3. Diagnoses every case of tests/corpus/ and prints accuracy per label and the mean time per log; the
   lexicon (tuner/triage_lexicon.py) reading each case is the one trained on the corpus's other sets.
   bench/triage_timesplit.py measures the lexicon on the held-out sets' first runs.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus"

LINES = [
    "(APIServer pid=8124) INFO 05-01 12:{m:02d}:{s:02d} [loggers.py:123] Engine 000: Avg prompt throughput: "
    "1520.3 tokens/s, Avg generation throughput: 835.2 tokens/s, Running: 12 reqs, Waiting: 0 reqs, GPU KV "
    "cache usage: 31.4%, Prefix cache hit rate: 12.0%\n",
    '(APIServer pid=8124) INFO:     127.0.0.1:5{s:04d} - "POST /v1/completions HTTP/1.1" 200 OK\n',
    "(APIServer pid=8124) INFO 05-01 12:{m:02d}:{s:02d} [logger.py:41] Received request cmpl-9f{s:04d}a: "
    "prompt: 'Summarise the history of graphics processors and their use in deep learning', params: "
    "SamplingParams(n=1, temperature=0.7, top_p=0.95, max_tokens=256), lora_request: None.\n",
    "(APIServer pid=8124) INFO 05-01 12:{m:02d}:{s:02d} [async_llm.py:270] Added request cmpl-9f{s:04d}a.\n",
]
HEAD = (
    "(APIServer pid=8124) INFO 05-01 11:59:00 [api_server.py:1] vLLM API server version 0.11.0\n"
    "(EngineCore_DP0 pid=9000) INFO 05-01 11:59:30 [gpu_model_runner.py:1] Model loading took 38.2 GiB\n"
    "(EngineCore_DP0 pid=9000) INFO 05-01 11:59:40 [kv_cache_utils.py:1] GPU KV cache size: 301,000 tokens\n"
    "(APIServer pid=8124) INFO 05-01 11:59:59 [launcher.py:1] Application startup complete.\n"
)
TAIL = (
    "(EngineCore_DP0 pid=9000) ERROR 05-01 13:00:00 [core.py:708] torch.OutOfMemoryError: CUDA out of "
    "memory. Tried to allocate 1.15 GiB. GPU 0 has a total capacity of 79.19 GiB of which 402.00 MiB is "
    "free. Including non-PyTorch memory, this process has 78.78 GiB memory in use.\n"
)


def make_log(path: Path, size_mb: int) -> None:
    rng = random.Random(0)
    block = "".join(rng.choice(LINES).format(m=i // 60 % 60, s=i % 60) for i in range(20000)).encode()
    with path.open("wb") as fh:
        fh.write(HEAD.encode())
        written = 0
        while written < size_mb * 2**20:
            fh.write(block)
            written += len(block)
        fh.write(TAIL.encode())


def timed(argv: list[str]) -> tuple[float, str]:
    """Run a command; return its wall time and stdout."""
    import os

    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv,
        capture_output=True,
        cwd=REPO,
        # the repository first; a PYTHONPATH already set (packages installed with --target) stays behind it
        env={**os.environ, "PYTHONPATH": path},
        check=True,
    )
    return time.perf_counter() - t0, proc.stdout.decode(errors="replace")


# Each Python child reports its own peak RSS (getrusage(RUSAGE_SELF).ru_maxrss, KiB) as the last line.
RSS = "\nimport resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
PY_LINES = "import sys\nn=0\nfor _ in open(sys.argv[1],'rb'): n+=1\nprint(n)" + RSS
PY_TRIAGE = (
    "import sys, json\nfrom pathlib import Path\nfrom tuner.triage import diagnose\n"
    "d = diagnose(Path(sys.argv[1]))\nprint(json.dumps({'cause': d.cause, 'line': d.evidence[0].line}))" + RSS
)
# the same, with the prefilter's fallback (one bytes.find pass per trigger word, as without pyahocorasick)
PY_TRIAGE_FIND = "import tuner.triage_scan as _s\n_s.ahocorasick = None\n" + PY_TRIAGE
PY_IMPORT = "import tuner.triage, tuner.triage_scan\ntuner.triage_scan.playbook()" + RSS


def speed(size_mb: int, keep: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="triage-bench-"))
    log = tmp / "vllm.log"
    t0 = time.perf_counter()
    make_log(log, size_mb)
    mb = log.stat().st_size / 2**20
    print(f"log: {log} {mb:.0f} MiB, written in {time.perf_counter() - t0:.1f} s")
    wc_s, _ = timed(["wc", "-l", str(log)])
    py_s, out = timed([sys.executable, "-c", PY_LINES, str(log)])
    py_rss = int(out.split()[-1])
    imp_s, out = timed([sys.executable, "-c", PY_IMPORT])
    imp_rss = int(out.split()[-1])
    tr_s, out = timed([sys.executable, "-c", PY_TRIAGE, str(log)])
    tr_rss = int(out.split()[-1])
    result = json.loads(out.splitlines()[0])
    fi_s, out = timed([sys.executable, "-c", PY_TRIAGE_FIND, str(log)])
    fi_rss = int(out.split()[-1])
    assert json.loads(out.splitlines()[0]) == result, "the two prefilters found different causes"
    print(f"{'':28s} {'seconds':>8s} {'MB/s':>8s} {'peak RSS MiB':>13s}")
    for name, sec, rss in (
        ("wc -l", wc_s, None),
        ("python line loop", py_s, py_rss),
        ("python + import triage", imp_s, imp_rss),
        ("gputune triage", tr_s, tr_rss),
        ("triage, find per trigger", fi_s, fi_rss),
    ):
        rate = f"{mb / sec:8.1f}" if name != "python + import triage" else f"{'-':>8s}"
        rss_s = f"{rss / 1024:13.1f}" if rss is not None else f"{'-':>13s}"
        print(f"{name:28s} {sec:8.2f} {rate} {rss_s}")
    print(f"triage found {result['cause']} at line {result['line']}")
    print(
        f"ratio: triage time / python line loop = {tr_s / py_s:.1f}x; / wc -l = {tr_s / wc_s:.1f}x; "
        f"triage RSS - interpreter+import RSS = {(tr_rss - imp_rss) / 1024:.1f} MiB (bounded: 4 MiB chunks)"
    )
    print(f"prefilter: one automaton pass is {fi_s / tr_s:.1f}x faster than a find pass per trigger word")
    if not keep:
        log.unlink()
        tmp.rmdir()


def accuracy() -> None:
    sys.path.insert(0, str(REPO))
    from tuner import triage_lexicon
    from tuner.triage import diagnose

    # each case read with the lexicon trained on the other sets (as tests/test_triage_corpus.py does)
    lexicons = triage_lexicon.leave_one_set_out(triage_lexicon.corpus_cases(CORPUS))
    total: Counter[str] = Counter()
    right: Counter[str] = Counter()
    times = []
    wrong = []
    complete = [0, 0]  # logs that hold the software's own failure line (not `complete = false`)
    for toml in sorted(CORPUS.glob("*.toml")):
        meta = tomllib.loads(toml.read_text())
        log = toml.with_suffix(".log")
        tel = CORPUS / meta["telemetry"] if "telemetry" in meta else None
        kern = CORPUS / meta["dmesg"] if "dmesg" in meta else None
        t0 = time.perf_counter()
        lex = lexicons.get(triage_lexicon.corpus_set(toml.stem))
        d = diagnose(log, telemetry=tel, dmesg=kern, exit_code=meta.get("exit_code"), lexicon=lex)
        times.append(time.perf_counter() - t0)
        total[meta["label"]] += 1
        ok = d.cause == meta["label"]
        right[meta["label"]] += ok
        if meta.get("complete", True):
            complete[0] += ok
            complete[1] += 1
        if not ok:
            wrong.append(f"{toml.stem}: {d.cause} (expected {meta['label']})")
    print(f"\naccuracy on {sum(total.values())} corpus cases (tests/corpus):")
    for label in sorted(total):
        print(f"  {label:40s} {right[label]:3d}/{total[label]:<3d}")
    print(
        f"  {'overall':40s} {sum(right.values()):3d}/{sum(total.values()):<3d} "
        f"= {sum(right.values()) / sum(total.values()):.1%}"
    )
    print(
        f"  {'logs holding the failure line':40s} {complete[0]:3d}/{complete[1]:<3d} "
        f"= {complete[0] / max(1, complete[1]):.1%}"
    )
    for w in wrong:
        print("  wrong:", w)
    times.sort()
    print(
        f"time per corpus log: mean {1000 * sum(times) / len(times):.1f} ms, median "
        f"{1000 * times[len(times) // 2]:.1f} ms, max {1000 * times[-1]:.1f} ms (in-process, after import)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    if not args.skip_speed:
        speed(args.size_mb, args.keep)
    accuracy()


if __name__ == "__main__":
    main()

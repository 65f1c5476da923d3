"""The last reading of a log that no signature explains: the words of its failure lines, weighed against
the labelled corpus of real failures.

The signatures in ``playbooks/triage/signatures.toml`` each read one message, from the program that
prints it. A log whose message none of them knows (a new release's wording, a server or wrapper the
playbook has not met) would come out ``unknown`` although its words often say which kind of failure
it is: ``TCPStore``, ``rendezvous`` and ``timed out`` are a communication failure in whatever program
prints them; ``cannot open shared object file`` or ``Unsupported config format`` are set-up.

This module reads those words. A naive Bayes model counts, for every word, in how many of the labelled
corpus's cases of each cause (``tests/corpus/*.toml``, real failures with their sources) it appears in
the failure lines; a new log's words are weighed against those counts. The failure lines are the
closing lines of the last two tracebacks (the exception's class, its message, the innermost frames'
package paths) and the last lines of the log.

Bounds, so that it never does harm a signature would not:

- it is consulted only when the signatures name no cause (and name no memory cause even weakly: an
  OOM line set aside because the card had room to spare stays ``unknown``);
- it only names causes that are not about memory (``memory = false`` in causes.toml), so a memory label
  never rests on word counts; a cause that is not the model's clear first (posterior below
  ``MIN_POSTERIOR``) is not named;
- its confidence is low (``LEXICON_CONFIDENCE``), it proposes no argument changes, and `launch
  --auto-fix` does not act on it.

The model is data: ``playbooks/triage/lexicon.tsv``, trained from the corpus with

    PYTHONPATH=. python -m tuner.triage_lexicon tests/corpus playbooks/triage/lexicon.tsv

and a test checks that the committed file is what the corpus trains. ``bench/triage_timesplit.py``
measures what this reading adds on the held-out sets' first runs, trained only on the sets collected
before each one (rounds 37-47: 231 -> 258 of 352 logs holding the failure line). On the fresh sets of
rounds 48-61 it named a cause for 15 of 470 logs, 8 of them right: a small gain, since most new misses
hold words the corpus has not seen either (tests/corpus/HELDOUT.md).
"""

from __future__ import annotations

import functools
import math
import re
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.data import data_dir
from tuner.triage_scan import PyException, ScanResult, playbook, scan

FORMAT = "gputune-triage-lexicon 1"
LEXICON_FILE = "lexicon.tsv"
# what a diagnosis names as its source when the lexicon read it
SOURCE = "lexicon: playbooks/triage/lexicon.tsv (tuner/triage_lexicon.py)"
ALPHA = 1.0  # Laplace smoothing of the word counts
# Naive Bayes counts every word as independent evidence, so its posteriors are all but 0 or 1; the
# log-likelihoods are divided by this temperature before they are normalised, and the reading names a
# cause only when that tempered posterior reaches MIN_POSTERIOR. Chosen on the held-out first runs of
# rounds 37-47 (bench/triage_timesplit.py) and on the corpus read set by set (each set with the lexicon
# of the others): temperature 1 at 0.9 gained 31 first-run cases and lost 3, but turned 16 corpus cases
# that are right as `unknown` wrong; 3 at 0.7 gains 29, loses 1, and turns 10.
TEMPERATURE = 3.0
MIN_POSTERIOR = 0.7
# What a lexical reading is worth next to a signature (0.35 .. 0.99), below every message signature: on
# the replayed first runs of rounds 37-47 it was right in 35 of the 43 logs it read, on the fresh logs of
# rounds 48-61 (where it ran for real) in 8 of 15.
LEXICON_CONFIDENCE = 0.4
EXCEPTIONS_READ = 2  # the closing lines of the last two tracebacks
FRAMES_READ = 3  # the innermost frames of each
TAIL_READ = 12  # the last lines of the log
WORDS_SHOWN = 6
# a log with fewer known words says too little: a one-line message ("AttributeError: 'NoneType' object has
# no attribute 'shape'") is a signature's to read or nobody's (3 .. 8 made no difference on the held-out
# first runs)
MIN_WORDS = 8

_WORD = re.compile(r"[a-z][a-z0-9_]{2,}")
_HEXISH = re.compile(r"[a-f0-9_]+")
_STOP = frozenset(
    (
        "the",
        "and",
        "for",
        "with",
        "that",
        "this",
        "from",
        "are",
        "not",
        "was",
        "but",
        "has",
        "have",
        "you",
        "your",
        "can",
        "will",
        "use",
        "used",
        "using",
        "line",
        "file",
        "none",
        "true",
        "false",
        "self",
        "return",
        "args",
        "kwargs",
    )
)
_PACKAGE_DIRS = ("site-packages", "dist-packages")
# a last exception that speaks of memory is a signature's to read (an OOM set aside stays unknown): word
# counts never name the cause of a memory message, not even a cause that is not about memory
_MEMORY = re.compile(r"memory|\bOOM\b", re.IGNORECASE)
# a line that reports a failure: without one (and without an exception line) there is nothing to read,
# as in the log of a server that is still serving
_FAILURE_LINE = re.compile(
    r"\b(?:ERROR|FATAL|CRITICAL|Error|Exception|Traceback|Killed|Aborted|panic(?:ked)?|failed|fatal|error)\b"
)


# a logger's record at a level below error ('(Worker pid=8207) WARNING 11-29 16:05:22 [utils.py:597] Failed to
# create oneDNN linear, fallback to torch linear. Exception: ...'): an exception it quotes was handled
_QUIET_RECORD = re.compile(r"^\W*(?:\(\w+ pid=\d+\)\s*)?(?:\S+\s+)?(?:WARNING|WARN|INFO|DEBUG)\b")


def _failure_exceptions(res: ScanResult) -> list[PyException]:
    """The log's exceptions, less those a warning or info record quotes (handled, not the failure)."""
    return [e for e in res.exceptions if not _QUIET_RECORD.match(e.text)]


def _words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP and not _HEXISH.fullmatch(w)]


def _frame_words(frame: str) -> list[str]:
    """'/x/site-packages/torch/distributed/rendezvous.py in _f' -> f:torch, f:distributed, f:rendezvous"""
    path = frame.split(" in ", 1)[0]
    parts = path.split("/")
    for key in _PACKAGE_DIRS:
        if key in parts:
            parts = parts[parts.index(key) + 1 :]
            break
    else:
        parts = parts[-2:]
    return ["f:" + p.removesuffix(".py").lower() for p in parts if p]


# a traceback's frame line ('  File "/gpfs/accounts/u/x/sglang/srt/model_runner.py", line 231, in __init__')
# among the last lines: its host path says where the code was installed, not why it failed
_FRAME_LINE = re.compile(r'File "(?P<path>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')


def _tail_words(text: str) -> list[str]:
    m = _FRAME_LINE.search(text)
    if m:
        return _frame_words(m.group("path").replace("\\", "/") + " in " + m.group("func"))
    return _words(text)


def features(res: ScanResult) -> list[tuple[str, int, str]]:
    """The words of a scanned log's failure lines: (feature, line number, the line) in the order read.

    Features: ``X:<class>`` for each exception class, ``f:<part>`` for the package path of the innermost
    frames and of frame lines among the last lines, and the plain words of the exception messages and of
    the other last lines."""
    out: list[tuple[str, int, str]] = []
    for exc in _failure_exceptions(res)[-EXCEPTIONS_READ:]:
        line = exc.text.strip()
        out.append(("X:" + exc.exc.rsplit(".", 1)[-1].lower(), exc.line_no, line))
        out.extend((w, exc.line_no, line) for w in _words(exc.message))
        for frame in exc.frames[-FRAMES_READ:]:
            out.extend((w, exc.line_no, line) for w in _frame_words(frame))
    for no, text in res.tail[-TAIL_READ:]:
        out.extend((w, no, text.strip()) for w in _tail_words(text))
    return out


@dataclass(frozen=True)
class Lexicon:
    """Per cause: how many corpus cases it has, and in how many of them each word appears."""

    cases: dict[str, int]
    counts: dict[str, dict[str, int]]  # word -> cause -> cases holding it

    @functools.cached_property
    def _totals(self) -> dict[str, int]:
        tot: Counter[str] = Counter()
        for per in self.counts.values():
            tot.update(per)
        return {c: tot[c] for c in self.cases}

    def posterior(self, words: Iterable[str]) -> dict[str, float]:
        """P(cause | words), tempered (TEMPERATURE), over the causes the corpus holds (the words it never saw
        are left out)."""
        known = sorted({w for w in words if w in self.counts})
        vocab = len(self.counts)
        n = sum(self.cases.values())
        logp = {}
        for cause, k in self.cases.items():
            denom = math.log(self._totals[cause] + ALPHA * vocab)
            s = math.log(k / n)
            for w in known:
                s += math.log(self.counts[w].get(cause, 0) + ALPHA) - denom
            logp[cause] = s / TEMPERATURE
        top = max(logp.values())
        z = sum(math.exp(v - top) for v in logp.values())
        return {c: math.exp(v - top) / z for c, v in logp.items()}

    def weight(self, word: str, cause: str) -> float:
        """How much more often the word appears with the cause than with the rest (log ratio)."""
        per = self.counts.get(word, {})
        vocab = len(self.counts)
        inside = (per.get(cause, 0) + ALPHA) / (self._totals[cause] + ALPHA * vocab)
        rest_n = sum(v for c, v in per.items() if c != cause)
        rest_tot = sum(v for c, v in self._totals.items() if c != cause)
        outside = (rest_n + ALPHA) / (rest_tot + ALPHA * vocab)
        return math.log(inside / outside)


@dataclass(frozen=True)
class Reading:
    cause: str
    posterior: float
    words: tuple[str, ...]  # the words that weighed most for the cause, heaviest first
    lines: tuple[tuple[int, str, tuple[str, ...]], ...]  # (line, text, its shown words), in log order
    cases: int  # corpus cases the lexicon was trained on


def words_of(res: ScanResult) -> frozenset[str]:
    return frozenset(f for f, _, _ in features(res))


def train(labelled: Iterable[tuple[frozenset[str], str]]) -> Lexicon:
    """Count, per cause, the cases whose failure lines hold each word (``words_of`` of each case)."""
    cases: Counter[str] = Counter()
    counts: dict[str, Counter[str]] = {}
    for words, label in labelled:
        cases[label] += 1
        for w in words:
            counts.setdefault(w, Counter())[label] += 1
    return Lexicon(
        dict(sorted(cases.items())), {w: dict(sorted(c.items())) for w, c in sorted(counts.items())}
    )


@dataclass(frozen=True)
class Case:
    name: str  # the file name without its suffix: 'ho47-vllm-11215-...'
    label: str
    words: frozenset[str]

    @property
    def set(self) -> str:
        return corpus_set(self.name)


def corpus_set(name: str) -> str:
    """The set a corpus case was collected in: its name's first part ('ho47', 'gh', 'cpu', 'gpu')."""
    return name.split("-", 1)[0]


def corpus_cases(folder: Path) -> list[Case]:
    """Every case of a corpus folder (``NAME.toml`` with ``label``, beside ``NAME.log``), scanned."""
    pb = playbook()
    out = []
    for toml in sorted(folder.glob("*.toml")):
        with toml.open("rb") as fh:
            label = tomllib.load(fh).get("label")
        log = toml.with_suffix(".log")
        if not isinstance(label, str) or not log.is_file():
            continue
        with log.open("rb") as fh:
            out.append(Case(toml.stem, label, words_of(scan(fh, "log", pb))))
    return out


def train_cases(cases: Iterable[Case]) -> Lexicon:
    return train((c.words, c.label) for c in cases)


def leave_one_set_out(cases: Sequence[Case]) -> dict[str, Lexicon]:
    """For each set of the corpus, the lexicon trained on all the other sets: what the corpus figures
    use for a case, since a lexicon's reading of the very cases it counted says nothing of new logs."""
    whole = train_cases(cases)
    out: dict[str, Lexicon] = {}
    for name in sorted({c.set for c in cases}):
        members = [c for c in cases if c.set == name]
        sub_cases = Counter(whole.cases)
        counts = {w: dict(per) for w, per in whole.counts.items()}
        for c in members:
            sub_cases[c.label] -= 1
            for w in c.words:
                per = counts[w]
                per[c.label] -= 1
                if not per[c.label]:
                    del per[c.label]
                if not per:
                    del counts[w]
        out[name] = Lexicon({k: v for k, v in sub_cases.items() if v > 0}, counts)
    return out


def dumps(lex: Lexicon, note: str = "") -> str:
    lines = [f"# {FORMAT}" + (f": {note}" if note else "")]
    # the causes in a fixed order, then each word's counts as '<cause index>:<cases>'
    index = {c: i for i, c in enumerate(lex.cases)}
    lines.append("#cases\t" + "\t".join(f"{c}={k}" for c, k in lex.cases.items()))
    for word, per in lex.counts.items():
        lines.append(word + "\t" + ",".join(f"{index[c]}:{k}" for c, k in per.items()))
    return "\n".join(lines) + "\n"


def loads(text: str) -> Lexicon:
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# " + FORMAT):
        raise ValueError(f"not a {FORMAT} file")
    cases: dict[str, int] = {}
    names: list[str] = []
    counts: dict[str, dict[str, int]] = {}
    for line in lines[1:]:
        if line.startswith("#cases\t"):
            for item in line.split("\t")[1:]:
                cause, _, k = item.partition("=")
                cases[cause] = int(k)
                names.append(cause)
            continue
        if not line or line.startswith("#"):
            continue
        if not names:
            raise ValueError(f"{FORMAT} file: word counts before the #cases line")
        word, _, rest = line.partition("\t")
        try:
            counts[word] = {
                names[int(i)]: int(k) for i, _, k in (item.partition(":") for item in rest.split(","))
            }
        except (ValueError, IndexError) as exc:
            raise ValueError(f"{FORMAT} file: bad counts for {word!r}") from exc
    if not cases:
        raise ValueError(f"{FORMAT} file without its #cases line")
    return Lexicon(cases, counts)


@functools.cache
def lexicon(path: str | None = None) -> Lexicon | None:
    """The shipped lexicon (``playbooks/triage/lexicon.tsv``), or None when it is absent or unreadable:
    triage then reads the signatures alone."""
    p = Path(path) if path else data_dir("playbooks") / "triage" / LEXICON_FILE
    try:
        return loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def read(res: ScanResult, allowed: Iterable[str], lex: Lexicon | None = None) -> Reading | None:
    """The cause the words of a log's failure lines point to, among ``allowed``; None when they point
    nowhere clearly (no failure line, a last exception about memory, fewer than MIN_WORDS known words, a
    cause outside ``allowed`` first, or a posterior below MIN_POSTERIOR)."""
    lex = lex if lex is not None else lexicon()
    if lex is None:
        return None
    exceptions = _failure_exceptions(res)
    if not exceptions and not any(_FAILURE_LINE.search(text) for _, text in res.tail[-TAIL_READ:]):
        return None
    if exceptions and _MEMORY.search(exceptions[-1].message):
        return None
    feats = features(res)
    words = {f for f, _, _ in feats if f in lex.counts}
    if len(words) < MIN_WORDS:
        return None
    post = lex.posterior(words)
    ranked = sorted(post.items(), key=lambda kv: -kv[1])
    cause, p = ranked[0]
    if cause not in set(allowed) or p < MIN_POSTERIOR:
        return None
    heaviest = sorted(words, key=lambda w: (-lex.weight(w, cause), w))
    shown = tuple(w for w in heaviest if lex.weight(w, cause) > 0)[:WORDS_SHOWN]
    lines: dict[int, tuple[str, list[str]]] = {}
    for f, no, text in feats:
        if f in shown:
            line = lines.setdefault(no, (text[:300], []))
            if f not in line[1]:
                line[1].append(f)
    return Reading(
        cause=cause,
        posterior=p,
        words=shown,
        lines=tuple((no, text, tuple(ws)) for no, (text, ws) in sorted(lines.items()))[:3],
        cases=sum(lex.cases.values()),
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] in ("-h", "--help"):
        print(
            "usage: python -m tuner.triage_lexicon CORPUS_DIR OUT.tsv\n"
            "Train triage's lexicon from a labelled corpus (NAME.log + NAME.toml with `label`).",
            file=sys.stderr,
        )
        return 2
    folder, out = Path(args[0]), Path(args[1])
    try:
        cases = corpus_cases(folder)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        print(f"{folder}: cannot read the corpus: {exc}", file=sys.stderr)
        return 2
    if not cases:
        print(f"{folder}: no labelled cases (NAME.toml with a label beside NAME.log)", file=sys.stderr)
        return 2
    lex = train_cases(cases)
    # written beside the target and renamed over it, so a failed write leaves the old lexicon whole
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(dumps(lex, f"{len(cases)} cases of {folder.name}/"), encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        print(f"{out}: cannot write the lexicon: {exc.strerror or exc}", file=sys.stderr)
        tmp.unlink(missing_ok=True)
        return 2
    print(f"{out}: {len(lex.counts)} words from {len(cases)} cases", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

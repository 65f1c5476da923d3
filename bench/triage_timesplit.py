"""What triage's lexicon adds on logs it has not seen: the held-out sets' first runs, replayed.

    PYTHONPATH=. .venv/bin/python bench/triage_timesplit.py [--sets ho43,ho44] [--json OUT]

Each held-out set of tests/corpus/HELDOUT.md was triaged once, when it was collected, by the triage of
that day (the commit its section names: "at commit `abc1234`"). This benchmark replays those first runs
side by side with the lexicon (tuner/triage_lexicon.py) as it would have read them then:

1. for every set with a recorded commit, the triage of that commit (its tuner/ and playbooks/, taken
   with `git archive` into a temporary folder) diagnoses the set's logs in its own process: the
   baseline, the recorded first-run figure;
2. the lexicon is trained on the sets collected before that set only (the sets are ordered by their
   number; the corpus's other cases, made here or gathered first, count as earlier), and reads the
   logs the baseline left `unknown` (unless a memory cause was among its weak candidates), as
   `diagnose()` does now. Sets first run by a commit that already had the lexicon (rounds 48 on) are
   shown as they ran: their first run is already the figure with the lexicon.

It prints, per set and in all, the cases right at the first run and with the lexicon, on all logs and on
those holding the failure line (not `complete = false`), the cases it changed (gained, lost, still
wrong), the lexicon's precision where it spoke, and the accuracy per label. Needs the git history
(a clone, not an archive) and takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner import triage_lexicon  # noqa: E402
from tuner.triage_scan import playbook, scan  # noqa: E402

CORPUS = REPO / "tests" / "corpus"
HELDOUT = CORPUS / "HELDOUT.md"
# '## Forty-seventh set (`ho47-*`, 53 cases)' or a range: '## Rounds 48-53 (`ho48-*` .. `ho53-*`, ...)'
_SECTION = re.compile(r"^## .*?\(`ho(\d+)-\*`(?: \.\. `ho(\d+)-\*`)?", re.M)
_COMMIT = re.compile(r"at\s+commit\s+`([0-9a-f]{7,40})`")

# run in the old triage's own process, with its tuner/ first on sys.path
_OLD_RUN = r"""
import json, sys, tomllib
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tuner.triage import diagnose
corpus, names = Path(sys.argv[2]), sys.argv[3].split(",")
out = {}
for name in names:
    meta = tomllib.loads((corpus / f"{name}.toml").read_text())
    tel = corpus / meta["telemetry"] if "telemetry" in meta else None
    dm = corpus / meta["dmesg"] if "dmesg" in meta else None
    d = diagnose(corpus / f"{name}.log", telemetry=tel, dmesg=dm, exit_code=meta.get("exit_code"))
    out[name] = [d.cause, [c for c, _ in d.alternatives]]
print(json.dumps(out))
"""


def recorded_sets() -> dict[str, str]:
    """set -> the commit its first run was made at, from HELDOUT.md's sections."""
    text = HELDOUT.read_text(encoding="utf-8")
    found: dict[str, str] = {}
    marks = list(_SECTION.finditer(text))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        commit = _COMMIT.search(text, m.end(), end)
        if commit:
            first = int(m.group(1))
            for n in range(first, int(m.group(2) or first) + 1):
                found[f"ho{n}"] = commit.group(1)
    return found


def set_order(name: str) -> int:
    """ho1 .. hoN by number; the round-one set 'ho' is 1; cases made here and the first gathered (gpu-,
    cpu-, gh-) 0."""
    if name == "ho":
        return 1
    if name.startswith("ho") and name[2:].isdigit():
        return int(name[2:])
    return 0


def old_run(commit: str, names: list[str]) -> dict[str, list]:
    with tempfile.TemporaryDirectory(prefix="gputune-timesplit-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, "tuner", "playbooks", "checks"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        done = subprocess.run(
            [sys.executable, "-c", _OLD_RUN, tmp, str(CORPUS), ",".join(names)],
            check=True,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": tmp, "HOME": tmp},
        )
    result: dict[str, list] = json.loads(done.stdout)
    return result


def has_lexicon(commit: str) -> bool:
    """True when the commit's triage already reads with the lexicon: its first run is the figure itself."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}:tuner/triage_lexicon.py"], capture_output=True
    )
    return done.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", help="comma-separated sets (default: every set with a recorded commit)")
    ap.add_argument("--json", type=Path, help="also write the per-case results here")
    opts = ap.parse_args()

    sets = recorded_sets()
    if opts.sets:
        want = opts.sets.split(",")
        missing = [s for s in want if s not in sets]
        if missing:
            print(f"no recorded first-run commit for {', '.join(missing)} in {HELDOUT}", file=sys.stderr)
            return 2
        sets = {s: sets[s] for s in want}
    if not sets:
        print(f"no set with a recorded commit in {HELDOUT}", file=sys.stderr)
        return 2

    pb = playbook()
    memory = {c for c, info in pb.causes.items() if info.get("memory")}
    allowed = [c for c, info in pb.causes.items() if not info.get("memory") and c != "unknown"]
    cases = triage_lexicon.corpus_cases(CORPUS)
    meta = {c.name: tomllib.loads((CORPUS / f"{c.name}.toml").read_text()) for c in cases}

    rows = []
    per_label: dict[str, Counter[str]] = {}
    totals: Counter[str] = Counter()
    results: dict[str, dict] = {}
    print(
        f"{'set':6s} {'commit':8s} {'cases':>5s} {'first run':>10s} {'+lexicon':>9s} "
        f"{'complete':>9s} {'first':>6s} {'+lex':>5s}  gained lost"
    )
    for name, commit in sorted(sets.items(), key=lambda kv: set_order(kv[0])):
        k = set_order(name)
        members = [c for c in cases if c.set == name]
        if not members:
            continue
        lex = triage_lexicon.train_cases(c for c in cases if set_order(c.set) < k)
        old = old_run(commit, [c.name for c in members])
        replay = not has_lexicon(commit)  # else the first run already read with the lexicon of its day
        t: Counter[str] = Counter()
        for case in members:
            m = meta[case.name]
            cause, alts = old[case.name]
            new = cause
            if replay and cause == "unknown" and not any(a in memory for a in alts):
                with (CORPUS / f"{case.name}.log").open("rb") as fh:
                    reading = triage_lexicon.read(scan(fh, "log", pb), allowed, lex)
                if reading is not None:
                    new = reading.cause
                    t["spoke"] += 1
                    t["spoke_right"] += new == case.label
            complete = bool(m.get("complete", True))
            t["cases"] += 1
            t["first"] += cause == case.label
            t["new"] += new == case.label
            if complete:
                t["c_cases"] += 1
                t["c_first"] += cause == case.label
                t["c_new"] += new == case.label
                lab = per_label.setdefault(case.label, Counter())
                lab["cases"] += 1
                lab["first"] += cause == case.label
                lab["new"] += new == case.label
            if new != cause:
                t["gained"] += new == case.label
                t["lost"] += cause == case.label
            results[case.name] = {
                "set": name,
                "label": case.label,
                "first_run": cause,
                "with_lexicon": new,
                "complete": complete,
            }
        totals.update(t)
        rows.append((name, commit, t))
        print(
            f"{name:6s} {commit[:8]:8s} {t['cases']:5d} {t['first']:10d} {t['new']:9d} "
            f"{t['c_cases']:9d} {t['c_first']:6d} {t['c_new']:5d}  {t['gained']:6d} {t['lost']:4d}"
        )
    t = totals
    print(
        f"{'all':6s} {'':8s} {t['cases']:5d} {t['first']:10d} {t['new']:9d} "
        f"{t['c_cases']:9d} {t['c_first']:6d} {t['c_new']:5d}  {t['gained']:6d} {t['lost']:4d}"
    )
    if t["cases"] and t["c_cases"]:
        print(
            f"\nfirst run: {t['first'] / t['cases']:.1%} of all logs, "
            f"{t['c_first'] / t['c_cases']:.1%} of logs holding the failure line"
        )
        print(
            f"with the lexicon: {t['new'] / t['cases']:.1%} and {t['c_new'] / t['c_cases']:.1%} "
            f"(ratio {t['c_new'] / max(1, t['c_first']):.3f} on logs holding the failure line)"
        )
    if t["spoke"]:
        print(
            f"the lexicon named a cause for {t['spoke']} logs, {t['spoke_right']} right "
            f"({t['spoke_right'] / t['spoke']:.0%})"
        )
    print("\nper label, logs holding the failure line (first run -> with the lexicon):")
    for label in sorted(per_label):
        c = per_label[label]
        print(f"  {label:40s} {c['first']:3d} -> {c['new']:3d} of {c['cases']:3d}")
    if opts.json:
        opts.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

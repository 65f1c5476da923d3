"""Triage of the corpus logs made on H200s, on the machine itself: cause, label, milliseconds.

PYTHONPATH=. python3 bench/gpu/h200_triage_check.py
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

from tuner.triage import diagnose

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "corpus"


def main() -> None:
    right = 0
    cases = sorted(CORPUS.glob("gpu-h200-*.toml"))
    for toml in cases:
        meta = tomllib.loads(toml.read_text())
        tel = CORPUS / meta["telemetry"] if "telemetry" in meta else None
        kern = CORPUS / meta["dmesg"] if "dmesg" in meta else None
        t0 = time.perf_counter()
        d = diagnose(toml.with_suffix(".log"), telemetry=tel, dmesg=kern, exit_code=meta.get("exit_code"))
        ms = 1000 * (time.perf_counter() - t0)
        ok = d.cause == meta["label"]
        right += ok
        print(f"{'ok  ' if ok else 'MISS'} {toml.stem:40s} {d.cause:36s} {ms:6.1f} ms")
    print(f"{right}/{len(cases)} H200 corpus logs right")


if __name__ == "__main__":
    main()

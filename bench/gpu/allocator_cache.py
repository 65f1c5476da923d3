"""What PyTorch's caching allocator holds freed ('reserved by PyTorch but unallocated') when a CUDA OOM
strikes while weights are created, and when it strikes in a forward pass: the fact triage reads to tell a
weight-loading OOM from a later one when the log names no stage.

    python3 bench/gpu/allocator_cache.py [--out DIR]      # on a GPU host; < 2 minutes on an H200

Each scenario runs in a fresh child process (an empty cache), builds Llama-3-70B-shaped layers (hidden
8192, 8 KV heads of 128, intermediate 28672, bf16) and stops at the first torch.OutOfMemoryError. It
prints one JSON line per scenario with PyTorch's own OOM message and the allocator's counters at that
moment, and writes each message to DIR/<scenario>.log when --out is given:

  load            parameters created one tensor at a time (torch.empty, then filled), as vLLM creates a
                  model's weights before reading the checkpoint into them
  load-staged     the same, each tensor first staged on the GPU and copied in (a loader that moves a
                  checkpoint tensor to the device before narrowing or repacking it)
  first-forward   weights that fit, then one forward pass over a growing number of tokens (vLLM's profile
                  run: the first forward after loading)
  serving         weights, a KV-cache-sized block leaving ~6 GiB, then forward passes whose batch grows
                  step by step (serving under load)

Nothing here changes the GPU's settings.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HIDDEN, KV, INTER, VOCAB = 8192, 1024, 28672, 128256
# Forward passes run through this many of the layers (the allocator's pattern is the same for each layer;
# all of them would only take longer)
FORWARD_LAYERS = 8
SHAPES = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]


def _counters() -> dict[str, float]:
    import torch as t

    s = t.cuda.memory_stats()
    mib = 2**20
    return {
        "reserved_mib": s["reserved_bytes.all.current"] / mib,
        "allocated_mib": s["allocated_bytes.all.current"] / mib,
        "unallocated_mib": (s["reserved_bytes.all.current"] - s["allocated_bytes.all.current"]) / mib,
    }


def _layer(torch: object, staged: bool) -> list[object]:
    import torch as t

    params = []
    for shape in SHAPES:
        p = t.empty(shape, dtype=t.bfloat16, device="cuda")
        if staged:
            tmp = t.ones(shape, dtype=t.bfloat16, device="cuda")
            p.copy_(tmp)
            del tmp
        else:
            p.fill_(0.01)
        params.append(p)
    return params


def _forward(torch: object, layers: list[list[object]], tokens: int) -> None:
    import torch as t

    x = t.randn(tokens, HIDDEN, dtype=t.bfloat16, device="cuda")
    for qkv, o, gate_up, down in layers[:FORWARD_LAYERS]:
        h = x @ qkv.t()
        x = x + (h[:, :HIDDEN] @ o.t())
        gu = x @ gate_up.t()
        act = t.nn.functional.silu(gu[:, :INTER]) * gu[:, INTER:]
        x = x + act @ down.t()


def child(scenario: str) -> dict[str, object]:
    import torch as t

    total = t.cuda.get_device_properties(0).total_memory
    layers: list[list[object]] = []
    phase = "start"
    try:
        if scenario in ("load", "load-staged"):
            phase = "weights"
            emb = t.empty((VOCAB, HIDDEN), dtype=t.bfloat16, device="cuda")
            layers.append([emb])
            while True:  # more layers than the card holds: a 70B model in fp32, or a bigger model
                layers.append(_layer(t, scenario == "load-staged"))
        phase = "weights"
        budget = total * (0.45 if scenario == "first-forward" else 0.5)
        while sum(p.numel() * 2 for layer in layers for p in layer) < budget:  # type: ignore[attr-defined]
            layers.append(_layer(t, False))
        if scenario == "serving":
            phase = "kv-cache"
            free, _ = t.cuda.mem_get_info()
            layers.append([t.empty(int(free - 6 * 2**30), dtype=t.uint8, device="cuda")])  # the KV cache
            phase = "serving"
            tokens = 256
            while True:
                _forward(t, layers, tokens)
                tokens = int(tokens * 1.25)
        phase = "first-forward"
        tokens = 32768
        while True:
            _forward(t, layers, tokens)
            t.cuda.empty_cache()  # each attempt is a first forward: nothing freed from an earlier one
            tokens *= 2
    except t.OutOfMemoryError as e:
        out: dict[str, object] = {"scenario": scenario, "phase": phase, "message": str(e).strip()}
        out.update(_counters())
        out["layers"] = len(layers)
        out["torch"] = t.__version__
        out["device"] = t.cuda.get_device_name(0)
        return out
    finally:
        del layers
    return {"scenario": scenario, "phase": phase, "message": "no OOM"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for one .log per scenario (the OOM as PyTorch printed it)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--scenarios", default="load,load-staged,first-forward,serving")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return 0
    rc = 0
    for name in a.scenarios.split(","):
        r = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if r.returncode != 0 or not line:
            print(json.dumps({"scenario": name, "error": r.stderr[-2000:]}))
            rc = 1
            continue
        print(line, flush=True)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            rec = json.loads(line)
            with open(os.path.join(a.out, f"{name}.log"), "w") as f:
                f.write(f"# bench/gpu/allocator_cache.py scenario {name}: OOM in phase '{rec['phase']}'\n")
                f.write(f"torch.OutOfMemoryError: {rec['message']}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())

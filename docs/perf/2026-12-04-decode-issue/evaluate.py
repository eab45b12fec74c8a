"""The tables of this study from its data files (CPU, no package needed):

    python docs/perf/2026-12-04-decode-issue/evaluate.py

1. The deterministic finalize alone (``scripts/time_finalize.py``): the shipped CuTe kernel, two rewrites, Triton.
2. The shared-memory ring of load batches (``ring_sweep.json.gz``): the best ring knob set of each row / the default.
3. FP32 group scales, the magic-sum rewrite against the shipped code (``magic_sum_ab_*.json.gz``, same rows).
4. The FP32-scale knob sets against each regime's 16-bit-scale set, per scheme (``defaults_*.json.gz``)."""

from __future__ import annotations

import glob
import gzip
import json
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
#: the FP32-scale set of each regime and the 16-bit-scale set it replaces
SETS = {"w16u2c132x/w16u2": "w16u4c132/w16u2", "w8u4x/w8u2x": "w8u8/w8u4", "w4u4x/w8u2x": "w4u8/w8u4"}


def geo(v):
    return math.exp(sum(map(math.log, v)) / len(v))


def _open(path):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def load(name):
    with _open(os.path.join(HERE, name)) as f:
        return json.load(f)


def finalize():
    print("| tokens | k | H | local / global experts | shipped us (GB/s) | batched us | warp table us | Triton us |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    runs = [load(f"finalize_{n}.json") for n in ("shipped", "batched", "warp_table")]
    for rows in zip(*runs):
        r = rows[0]
        gbs = r["bytes"] / r["cute_us"] / 1e3
        print(f"| {r['tokens']} | {r['top_k']} | {r['hidden']} | {r['experts']} / {r['global_experts']} | "
              f"{r['cute_us']:.1f} ({gbs:.0f}) | {rows[1]['cute_us']:.1f} | {rows[2]['cute_us']:.1f} | {r['triton_us']:.1f} |")


def ring():
    ratios = []
    for r in load("ring_sweep.json.gz")["rows"]:
        res = {x["choice"]: x["us"] for x in r["results"] if x.get("us")}
        ring_us = [v for k, v in res.items() if k.startswith("decode ") and "r" in k.split(" ", 1)[1].replace("default", "")]
        if r["default"] in res and ring_us:
            ratios.append(min(ring_us) / res[r["default"]])
    print(f"\nring: the fastest ring set / the default, {len(ratios)} rows: geometric mean {geo(ratios):.3f}, "
          f"range {min(ratios):.2f}-{max(ratios):.2f}")


def _medians(pattern):
    out = {}
    for f in glob.glob(os.path.join(HERE, pattern)):
        for r in load(f)["rows"]:
            for x in r["results"]:
                if x.get("us"):
                    out.setdefault((r["layer"], r["tokens"], x["choice"]), []).append(x["us"])
    return {k: statistics.median(v) for k, v in out.items()}


def magic_sum():
    new, old = _medians("magic_sum_ab_new_*.json.gz"), _medians("magic_sum_ab_old_*.json.gz")
    print("\n| FP32-scale knob set | rows | magic-sum / shipped, geometric mean | range |")
    print("|---|---:|---:|---|")
    for s in sorted({k[2] for k in new if "x" in k[2].split(" ", 1)[1]}):
        r = [new[k] / old[k] for k in new if k[2] == s and k in old]
        print(f"| `{s.split(' ', 1)[1]}` | {len(r)} | {geo(r):.3f} | {min(r):.2f}-{max(r):.2f} |")


def defaults():
    print("\n| scheme, dtype | FP32-scale set | replaces | rows | time / replaced set, geometric mean | range |")
    print("|---|---|---|---:|---:|---|")
    for f in sorted(glob.glob(os.path.join(HERE, "defaults_*.json.gz"))):
        tag = os.path.basename(f)[len("defaults_"):-len(".json.gz")].rsplit("_", 1)
        by = {}
        for r in load(f)["rows"]:
            res = {x["choice"]: x["us"] for x in r["results"] if x.get("us")}
            for new, old in SETS.items():
                a, b = res.get("decode " + new), res.get("decode " + old)
                if a and b and r["default"] in ("decode " + new, "decode " + old):
                    by.setdefault(new, []).append(a / b)
        for new, r in by.items():
            print(f"| {tag[0]}, {tag[1]} | `{new}` | `{SETS[new]}` | {len(r)} | {geo(r):.3f} | {min(r):.2f}-{max(r):.2f} |")


if __name__ == "__main__":
    finalize()
    ring()
    magic_sum()
    defaults()

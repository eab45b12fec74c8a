"""The tables of this study from its sweep (CPU; run from the repository root with the package importable):

    python docs/perf/2026-12-02-decode-prefetch/evaluate.py docs/perf/2026-12-02-decode-prefetch/sweep_d_bf16.json.gz

1. For each knob set of the selection (``w16u4c132/w16u2``, ``w8u8c264/w8u4``, ``w4u8/w8u4``) and each row: the
   time with ``f`` (gate/up L2 prefetch), ``x`` (FP32 group scales, both kernels) and ``fx`` over the time
   without (the same K splits: the split rule's), as geometric mean and range over the rows.
2. Per row the sweep timed, the selection of this revision (H200, tuned table off, as the sweep ran) against the
   sweep's marked default (the selection of the revision before) and the row's fastest choice timed."""

from __future__ import annotations

import gzip
import json
import math
import os
import sys

os.environ["W4A16_MOE_TUNED_TABLE"] = "0"

import torch  # noqa: E402

from w4a16_moe.activations import get_activation  # noqa: E402
from w4a16_moe.device import DeviceInfo  # noqa: E402
from w4a16_moe.kernels.cute import provider  # noqa: E402
from w4a16_moe.kernels.cute.autotune import _knob_text  # noqa: E402
from w4a16_moe.validate import MoECall  # noqa: E402

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
BASES = ("w16u4c132/w16u2", "w8u8c264/w8u4", "w4u8/w8u4")


def variant(base: str, knobs: str) -> str:
    up, down = base.split("/")
    return f"{up}{knobs}/{down}{'x' if 'x' in knobs else ''}"


def geo(v):
    return math.exp(sum(map(math.log, v)) / len(v))


def main(paths) -> None:
    provider._kernels_available = lambda arch: None
    rows = [r for p in paths for r in json.load(gzip.open(p, "rt") if p.endswith(".gz") else open(p))["rows"]]
    print("| knob set | with | rows | time / without, geometric mean | range |")
    print("|---|---|---:|---:|---|")
    for base in BASES:
        for knobs in ("f", "x", "fx"):
            ratios = []
            for row in rows:
                t = {r["choice"]: r["us"] for r in row["results"] if "us" in r}
                a, b = t.get("decode " + base), t.get("decode " + variant(base, knobs))
                if a and b:
                    ratios.append(b / a)
            print(f"| `{base}` | `{knobs}` | {len(ratios)} | {geo(ratios):.3f} | {min(ratios):.2f}-{max(ratios):.2f} |")
    new_old, new_best = [], []
    print("\n| layer | T | previous default, us | this selection | us | best us, choice |")
    print("|---|---:|---|---|---:|---|")
    for row in rows:
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[row["dtype"]]
        L = [int(x) for x in row["layer"].split(",")]
        e, h, i, k = L[:4]
        g = L[4] if len(L) > 4 else None
        t = row["tokens"]
        call = MoECall(t, k, h, i, e, dt, torch.device("cuda"), get_activation("swiglu"), row["finalize"], 0,
                       row["scheme"], global_experts=g)
        p = provider.plan(call, H200)
        res = {r["choice"]: r for r in row["results"] if "us" in r}
        old = res[row["default"]]
        if p.decode:
            want = _knob_text(dict(p.tiles)["knobs"])
            new = res.get("decode " + want) if want else res.get("decode default knobs")
        else:
            new = old if old["family"] != "decode" else None
        best = min(res.values(), key=lambda r: r["us"])
        if new is None:
            print(f"| `{row['layer']}` | {t} | {old['us']} {old['choice']} | not timed | - | - |")
            continue
        new_old.append(new["us"] / old["us"])
        new_best.append(new["us"] / best["us"])
        print(f"| `{row['layer']}` | {t} | {old['us']} {old['choice']} | {new['choice']} | {new['us']} | "
              f"{best['us']} {best['choice']} |")
    print(f"\nthis selection / previous default: {len(new_old)} rows, geometric mean {geo(new_old):.3f}, "
          f"range {min(new_old):.3f}-{max(new_old):.3f}")
    print(f"this selection / best choice timed: {len(new_best)} rows, geometric mean {geo(new_best):.3f}, "
          f"max {max(new_best):.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])

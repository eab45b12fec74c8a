"""The tables of this study from its sweeps (CPU; run from the repository root with the package importable):

    python docs/perf/2026-12-02-decode-defaults/evaluate.py docs/perf/2026-12-02-decode-defaults/sweep_c_*.json

Per decode row: the old default (cd115a6's rule: the default knobs with its K splits, where the sweep timed that
split pair), the shipped default (this revision's plan on an H200, tuned table off, as the sweeps ran), the
fastest decode choice timed, and the geometric means of new / old and new / best."""

from __future__ import annotations

import json
import math
import os
import re
import sys

os.environ["W4A16_MOE_TUNED_TABLE"] = "0"

import torch  # noqa: E402

from w4a16_moe.activations import get_activation  # noqa: E402
from w4a16_moe.device import DeviceInfo  # noqa: E402
from w4a16_moe.kernels.cute import provider  # noqa: E402
from w4a16_moe.kernels.cute.autotune import _knob_text  # noqa: E402
from w4a16_moe.kernels.cute.decode import family as dec  # noqa: E402
from w4a16_moe.formats.schemes import get_scheme  # noqa: E402
from w4a16_moe.validate import MoECall  # noqa: E402

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)


def old_split(cfg, n, k, tokens, top_k, sms, e=None, g=None):
    """cd115a6's decode.family.num_splits."""
    rows = tokens * top_k if cfg.mode == "gate_up" else tokens
    if cfg.mode == "gate_up" and e and g and g > e:
        rows = max(1, round(tokens * top_k * e / g))
    tiles = dec.tile_ctas(cfg, n, rows)
    work = k // 64 if cfg.mode == "gate_up" else top_k * (k // 64)
    s = 1
    while 2 * s <= 16 and tiles * 2 * s <= 2 * sms and work >= 2 * s * cfg.warps * 2:
        s *= 2
    return s


def knob_set(choice: str) -> str:
    c = re.sub(r"(\d)s\d+", r"\1", choice.replace("decode ", ""))
    return "default knobs" if c == "w8u8/w8u4" else c


def main(paths) -> None:
    provider._kernels_available = lambda arch: None
    new_old, new_best = [], []
    print("| layer | dtype | scheme | T | old default us (splits) | shipped default | us | best us, choice |")
    print("|---|---|---|---:|---:|---|---:|---|")
    for path in paths:
        for row in json.load(open(path))["rows"]:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[row["dtype"]]
            L = [int(x) for x in row["layer"].split(",")]
            e, h, i, k = L[:4]
            g = L[4] if len(L) > 4 else None
            t = row["tokens"]
            call = MoECall(t, k, h, i, e, dt, torch.device("cuda"), get_activation("swiglu"), row["finalize"], 0,
                           row["scheme"], global_experts=g)
            p = provider.plan(call, H200)
            if not p.decode:
                continue
            res = [r for r in row["results"] if "us" in r]
            want = _knob_text(dict(p.tiles)["knobs"]) or "default knobs"
            new = next((r for r in res if knob_set(r["choice"]) == want and tuple(r["splits"]) == p.splits), None)
            up, down = dec.configs(get_scheme(row["scheme"]), row["dtype"], "swiglu")
            old_sp = (old_split(up, 2 * i, h, t, k, 132, e, g), old_split(down, h, i, t, k, 132))
            old = next((r for r in res if knob_set(r["choice"]) == "default knobs" and tuple(r["splits"]) == old_sp),
                       None)
            best = min(res, key=lambda r: r["us"])
            if new and old:
                new_old.append(new["us"] / old["us"])
            if new:
                new_best.append(new["us"] / best["us"])
            print(f"| `{row['layer']}` | {row['dtype']} | {row['scheme']} | {t} | "
                  f"{old['us'] if old else '-'} ({old_sp[0]}/{old_sp[1]}) | {want} {p.splits[0]}/{p.splits[1]} | "
                  f"{new['us'] if new else 'not timed'} | {best['us']} {best['choice'][7:]} |")
    geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    print(f"\nshipped / old default: {len(new_old)} rows, geometric mean {geo(new_old):.3f}, "
          f"range {min(new_old):.3f}-{max(new_old):.3f}")
    print(f"shipped / best decode choice: {len(new_best)} rows, geometric mean {geo(new_best):.3f}, "
          f"max {max(new_best):.3f}, {sum(x > 1.1 for x in new_best)} rows above 1.1")


if __name__ == "__main__":
    main(sys.argv[1:])

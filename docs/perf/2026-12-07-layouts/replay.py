"""Replay a layout budget on timed sweeps: per row, the fastest timed choice reading a kept pair over the fastest overall.

    python docs/perf/2026-12-07-layouts/replay.py docs/perf/2026-12-07-k64/held.json ...

Rows are ``explore_tiles.py time --model`` / ``sweep_tiles.py`` rows (every choice timed on one call); the kept pairs
are ``layout_budget.kept_pairs`` of the row's layer (H100 / H200: 132 SMs). Decode choices are left out (under a
budget they read the kept SM90 pair, on kernels these sweeps did not time). Prints, per budget, the geometric mean and
worst of best-kept / best over the rows, and the rows where a kept pair holds no timed choice.
"""

import json
import math
import sys

from w4a16_moe.activations import get_activation
from w4a16_moe.kernels.cute import layout_budget as lb


def _plan_us(row, res, budget):
    """The timed us of the choice the selection makes under ``budget`` (its plan's family and tiles, timed with the
    split rule, or unsplit where the plan does not split), or None: a decode plan, or the choice was not timed."""
    import torch

    from w4a16_moe import settings
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.validate import MoECall

    g = row.get("E_global")
    call = MoECall(row["tokens"], row["top_k"], row["H"], row["I"], row["E"], torch.bfloat16, torch.device("cuda"),
                   get_activation(row.get("activation", "swiglu")), row.get("finalize", "deterministic"), 0,
                   row["scheme"], global_experts=None if g in (None, row["E"]) else g)
    with settings.override(layouts=budget, tuned_table=False):
        provider.clear_plans()
        p = provider.plan(call, DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132))
    if p.decode:
        return None
    same = [r for r in res if r["family"] == p.family and r["tiles"] == dict(p.tiles)]
    for r in same:  # the split rule's timing, else the unsplit one where the plan does not split
        if r["choice"].endswith("split-K rule") or (tuple(p.splits) == (1, 1) and r["choice"].endswith("split-K 1")):
            return r["us"]
    return None


def main(paths):
    from w4a16_moe.kernels.cute import provider

    provider._kernels_available = lambda arch: None  # plan as if every kernel were built
    ratios = {1: [], 2: [], "default": [], "pick all": [], "pick 2": [], "pick 1": []}
    missing = {1: 0, 2: 0}
    for path in paths:
        data = json.load(open(path))
        for row in data["rows"]:
            res = [r for r in row["results"] if "us" in r and not r.get("decode") and r.get("tiles")]
            if len(res) < 3:
                continue
            e, h, i, k = row["E"], row["H"], row["I"], row["top_k"]
            g = row.get("E_global")
            g = None if g in (None, e) else g
            gated = get_activation(row.get("activation", "swiglu")).gated
            scheme = row["scheme"]
            best = min(r["us"] for r in res)
            dflt = [r["us"] for r in res if r.get("default")]
            if dflt:
                ratios["default"].append((dflt[0] / best, f"{row['layer']} {scheme} T={row['tokens']}"))
            for b in ("all", "2", "1"):
                us = _plan_us(row, res, b)
                if us is not None:
                    ratios[f"pick {b}"].append((us / best, f"{row['layer']} {scheme} T={row['tokens']}"))
            for n in (1, 2):
                keep = lb.kept_pairs(n, e, h, i, scheme, gated, k, g, 132, "auto")
                kept = [r["us"] for r in res
                        if lb.pair_of(r["family"], {a: b for a, b in r["tiles"].items()}, h, i, gated, scheme) in keep]
                if not kept:
                    missing[n] += 1
                    continue
                ratios[n].append((min(kept) / best, f"{row['layer']} {scheme} T={row['tokens']}"))
    for n in ("default", 1, 2, "pick all", "pick 2", "pick 1"):
        r = ratios[n]
        gm = math.exp(sum(math.log(x) for x, _ in r) / len(r))
        worst = sorted(r, reverse=True)[:3]
        label = {"default": "the sweep's default", 1: "best of W4A16_MOE_LAYOUTS=1", 2: "best of W4A16_MOE_LAYOUTS=2"}.get(
            n, f"selection's pick, W4A16_MOE_LAYOUTS={str(n)[5:]} (tuned table off)")
        print(f"{label}: {len(r)} rows, / best {gm:.3f} (geomean), worst "
              + ", ".join(f"{x:.2f} ({w})" for x, w in worst) + f"; {missing.get(n, 0)} rows without a kept choice timed")


if __name__ == "__main__":
    main(sys.argv[1:])

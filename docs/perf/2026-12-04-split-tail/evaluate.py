"""The tables of this study (CPU; run from the repository root with the package importable):

    python docs/perf/2026-12-04-split-tail/evaluate.py

Per GEMM (gate/up and down apart, from the sweeps' per-kernel times of the default warp tile at splits 1, 2, 4, 8
and the rule's), the time at the split a rule picks over the fastest timed split, geometric mean and worst:
the previous rule (``split_k``, then the 2-way tail split of unsplit grids of 1-1.5 waves) against the shipped
one (``split_k``, then ``tiles.tail_free_split``)."""
import gzip
import json
import math
import os
from collections import defaultdict

from w4a16_moe.formats.schemes import get_scheme
from w4a16_moe.kernels.cute import tiles
from w4a16_moe.kernels.cute.warp import family as warp

HERE = os.path.dirname(os.path.abspath(__file__))
SMS = 132
SETS = {
    "fit (this study)": ["split_fit.json.gz", "few_experts.json.gz"],
    "held out (this study)": ["split_held.json.gz"],
    "2026-12-02-split-k (older kernels)": ["../2026-12-02-split-k/split_fit.json.gz",
                                           "../2026-12-02-split-k/split_held.json.gz"],
}


def previous_rule(n, k, cfg, routes, experts, top_k, global_experts):
    """warp.family.num_splits before this study: the fill rule, then two parts for an unsplit grid of 1-1.5 waves
    whose partials add at most 5% traffic."""
    if n * k // 2 < warp.SPLIT_MIN_EXPERT_BYTES:
        return 1
    tn = cfg.tokens_per_tile
    ctas = (n // cfg.rows_per_cta) * max(1, round(tiles.expected_tiles(routes, experts, tn, top_k, global_experts)))
    s = tiles.split_k(ctas, warp.SPLIT_CTAS_PER_SM * SMS, k, cfg.k_tile, tn)
    slots = warp.cta_slots(cfg, SMS)
    if s == 1 and slots < ctas <= 1.5 * slots and (k // cfg.k_tile) / 2 >= tiles.SPLIT_MIN_K_TILES \
            and 16 * tn * 2 / k <= 0.05:
        s = 2
    return s


def gemms(names):
    scheme = get_scheme("int4_g128")
    for name in names:
        with gzip.open(os.path.join(HERE, name), "rt") as f:
            rows = json.load(f)["rows"]
        for r in rows:
            dflt = next(x for x in r["results"] if x["default"])
            if dflt["family"] != "warp":
                continue
            t = dict(dflt["tiles"])
            times = defaultdict(dict)
            for x in r["results"]:
                if x["family"] == "warp" and dict(x["tiles"]) == t and len(x.get("kernels", [])) >= 3:
                    up_s, down_s = x["splits"]
                    times["gate_up"].setdefault(up_s, x["kernels"][1][1])
                    times["down"].setdefault(down_s, x["kernels"][2][1])
            up, down = warp.gemm_configs(scheme, "bf16", "swiglu", True, "deterministic", t)
            for which, cfg, n, k in (("gate_up", up, 2 * r["I"], r["H"]), ("down", down, r["H"], r["I"])):
                yield r, which, cfg, n, k, times[which]


def geo(v):
    return math.exp(sum(map(math.log, v)) / len(v))


def main():
    for label, names in SETS.items():
        old, new, changed = [], [], []
        for r, which, cfg, n, k, t in gemms(names):
            args = (n, k, cfg, r["tokens"] * r["top_k"], r["E"])
            hint = (r["top_k"], r.get("E_global", r["E"]))
            a = previous_rule(*args, *hint)
            b = warp.num_splits(*args, SMS, *hint)
            if a not in t or b not in t:
                continue  # a split the sweep did not time (3, 5, 6 only where the rule picked them)
            best = min(t.values())
            old.append(t[a] / best)
            new.append(t[b] / best)
            if a != b:
                changed.append(f"    {r['layer']} {r['tokens']:>2} {which:7s} split {a} -> {b}: "
                               f"{t[a]:6.1f} -> {t[b]:6.1f} us ({t[b] / t[a]:.3f})")
        print(f"{label}: {len(old)} GEMMs, {len(changed)} change; rule / fastest timed split: "
              f"previous {geo(old):.4f} (worst {max(old):.3f}), shipped {geo(new):.4f} (worst {max(new):.3f})")
        print("\n".join(changed))


if __name__ == "__main__":
    main()

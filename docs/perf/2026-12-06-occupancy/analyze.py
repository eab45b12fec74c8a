"""The numbers of this study's README from its data (CPU).

    PYTHONPATH=python python docs/perf/2026-12-06-occupancy/analyze.py

ab_g128.json / ab_g32.json: every warp tile with and without ``occupancy`` (split-K rule), beside the default;
unsplit.json: TN 8, TN 16 / 24 / 32 with occupancy and TN 64, unsplit, on 22 layers at 8-1024 tokens."""
import json
import math
import os
import sys

from w4a16_moe.kernels.cute import cost_model as cm
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
from w4a16_moe.kernels.cute.warp import family as wfam

D = os.path.dirname(os.path.abspath(__file__))
geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731


def ab_rows():
    for f, scheme in (("ab_g128.json", "int4_g128"), ("ab_g32.json", "int4_g32")):
        for r in json.load(open(os.path.join(D, f)))["rows"]:
            t = {}
            for c in r["results"]:
                tl = c["tiles"]
                if c["family"] == "warp" and "occupancy" in tl and c.get("us"):
                    t[(tl["tokens_per_tile"], tl["occupancy"])] = c["us"]
            yield r, scheme, t


def main():
    print("1. each tile with / without occupancy (call time, split-K rule), H100")
    for tn in (16, 24, 32):
        v = [t[(tn, True)] / t[(tn, False)] for _, _, t in ab_rows() if (tn, True) in t and (tn, False) in t]
        print(f"   TN {tn}: {len(v)} rows, geo {geo(v):.3f}, {min(v):.3f}-{max(v):.3f}")
    print("2. at the shipped model's warp picks: occupancy kernels over the plain ones")
    v = []
    for r, scheme, t in ab_rows():
        g = r["E_global"]
        f, tl, _ = fam.rule_choice(r["tokens"] * r["top_k"], r["E"], r["top_k"], g if g > r["E"] else None, scheme,
                                   r["H"], r["I"], True, 132)
        tn = tl.get("tokens_per_tile")
        if f == "warp" and (tn, False) in t:
            x = t[(tn, tn in wfam.OCCUPANCY_TOKENS)] / t[(tn, False)]
            v.append(x)
            if tn in wfam.OCCUPANCY_TOKENS:
                print(f"   {r['layer']:>20} T={r['tokens']:<4} TN {tn}: {x:.3f}")
    print(f"   {len(v)} rows (TN 8 picks, unchanged, count as 1), geo {geo(v):.4f}")
    print("3. unsplit: the shipped model's pick among the warp tiles over the fastest warp tile")
    m = cm.model()
    out = []
    for r in json.load(open(os.path.join(D, "unsplit.json")))["rows"]:
        t = {}
        for c in r["results"]:
            if c["family"] == "warp" and c.get("us") and list(c["splits"]) == [1, 1] and "occupancy" in c["tiles"]:
                tl = {k: v for k, v in c["tiles"].items() if k != "occupancy"}
                t["warp " + candidate_name(tl)] = c["us"]
        g = r["E_global"]
        p = {n: cm.predict_us(n, r["tokens"] * r["top_k"], r["E"], r["H"], r["I"], True, r["top_k"],
                              g if g > r["E"] else None) for n in t if n in m["entries"]}
        pick = min(p, key=p.get)
        out.append((t[pick] / min(t.values()), r["layer"], r["tokens"], pick))
    w = max(out)
    print(f"   {len(out)} rows, geo {geo([o[0] for o in out]):.4f}, {sum(o[0] > 1.05 for o in out)} above 1.05, worst "
          f"{w[0]:.3f} {w[1:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

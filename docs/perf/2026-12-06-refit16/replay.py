"""Replay cost models on this study's sweeps: per row, the time of each model's pick (an unsplit timed choice)
over the fastest timed choice (runs of the same row averaged; ``--rule``: the choices as timed with the split-K
rule, as ``explore_tiles.py time --model`` without ``--splits 1`` times them).

    PYTHONPATH=python python docs/perf/2026-12-06-refit16/replay.py MODEL.json [MODEL2.json] --sweeps A.json B.json ...
"""
import argparse
import collections
import json
import math
import sys

from w4a16_moe.kernels.cute import cost_model
from w4a16_moe.kernels.cute.sm90 import family as fam


def rows(paths, rule=False):
    """{(layer, tokens): {"E",..., "t": {choice name: [us, ...]}, "default": (label, [us])}}"""
    out = {}
    for p in paths:
        for r in json.load(open(p))["rows"]:
            key = (r["layer"], r["tokens"])
            row = out.setdefault(key, dict(E=r["E"], G=r["E_global"], H=r["H"], I=r["I"], k=r["top_k"], T=r["tokens"],
                                           t=collections.defaultdict(list), default=[r["default"], []]))
            for c in r["results"]:
                if "us" not in c:
                    continue
                if c.get("default"):
                    row["default"][1].append(c["us"])
                if not c.get("decode") and (c["choice"].endswith("split-K rule") if rule else list(c["splits"]) == [1, 1]):
                    row["t"][c["choice"].rsplit(" split-K", 1)[0]].append(c["us"])
    return out


def pick(model_path, r):
    cost_model.model.cache_clear()
    m = cost_model.model(model_path)
    orig = cost_model.model
    cost_model.model = lambda path=None: m
    try:
        got = fam.model_choice(r["T"] * r["k"], r["E"], r["H"], r["I"], True, r["k"], r["G"] if r["G"] > r["E"] else None,
                               132, "int4_g128")
    finally:
        cost_model.model = orig
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
    return f"{got[0]} {candidate_name(got[1])}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--sweeps", nargs="+", required=True)
    ap.add_argument("--show", type=float, default=1.05)
    ap.add_argument("--rule", action="store_true", help="the choices as timed with the split-K rule (else: unsplit)")
    a = ap.parse_args()
    R = rows(a.sweeps, a.rule)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    for mp in a.models:
        logs, worst, n = [], [], 0
        for key, r in sorted(R.items()):
            if not r["t"]:
                continue
            best = min(mean(v) for v in r["t"].values())
            p = pick(mp, r)
            if p not in r["t"]:
                print(f"  {key}: pick {p} not timed", file=sys.stderr)
                continue
            x = mean(r["t"][p]) / best
            logs.append(math.log(x))
            n += 1
            if x > a.show:
                worst.append((round(x, 3), key, p[:70]))
        print(f"{mp}: {n} rows, geo {math.exp(mean(logs)):.4f}, max {max(math.exp(v) for v in logs):.3f}, "
              f"> {a.show}: {len(worst)}")
        for w in sorted(worst, reverse=True)[:25]:
            print("   ", *w)


if __name__ == "__main__":
    main()

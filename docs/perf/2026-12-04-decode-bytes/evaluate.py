"""Replay the decode / grouped choice of each rule on the sweeps of this study (CPU, no GPU needed).

    PYTHONPATH=python python docs/perf/2026-12-04-decode-bytes/evaluate.py

For every row (a layer at a token count) it takes the measured time of the choice a rule makes (the decode
kernels with the knob set of the call's regime, or the grouped tile the cost model picks, with the split-K
rule) over the fastest choice the sweep timed, and prints the geometric mean, the worst row and the rows over
1.05, on the fitting sweeps and on the held-out one. It also prints the two linear fits quoted in the README.
"""

import gzip
import json
import math
import os

import numpy as np

from w4a16_moe.kernels.cute.decode import family as dec
from w4a16_moe.kernels.cute.sm90 import family as sm90
from w4a16_moe.kernels.cute.sm90 import tuned

HERE = os.path.dirname(os.path.abspath(__file__))


def load(*names):
    rows = []
    for n in names:
        with gzip.open(os.path.join(HERE, n), "rt") as f:
            rows += json.load(f)["rows"]
    return rows


def facts(r, narrow):
    """(measured us of the decode default, of the cost model's grouped choice, of the fastest choice; routes,
    re-read, MB streamed by decode, MB streamed once per distinct expert) of a sweep row."""
    e, h, i, k, t = r["E"], r["H"], r["I"], r["top_k"], r["tokens"]
    g = r["E_global"] if r["E_global"] > e else None
    res = {x["choice"]: x["us"] for x in r["results"] if "us" in x}
    fam, tiles, _ = sm90.model_choice(t * k, e, h, i, True, k, g, 132)
    tg = res.get(f"{fam} {tuned.candidate_name(tiles)} split-K rule")
    keep, dec.NARROW_TILES_PER_SM = dec.NARROW_TILES_PER_SM, narrow
    try:
        kn = dec.default_knobs(t, k, h, 2 * i, 132, e, g, fp32_scales=r["scheme"] != "int4_g32")
    finally:
        dec.NARROW_TILES_PER_SM = keep
    td = res.get("decode " + (kn or "default knobs"))
    eb = 3 * h * i / 2 / 1e6
    return (td, tg, min(res.values()), t * k, dec.reread_factor(t, k, e, g), dec._local_routes(t * k, k, e, g) * eb,
            dec.expected_experts(t, k, e, g) * eb)


def evaluate(rows, rule, narrow):
    ratios = []
    for r in rows:
        td, tg, best, routes, rr, mb, wd = facts(r, narrow)
        t = td if rule(routes, rr, mb, wd) else tg
        if t is not None:
            ratios.append(t / best)
    a = np.array(ratios)
    return f"geo {math.exp(np.log(a).mean()):.4f}  max {a.max():.3f}  >1.05: {(a > 1.05).sum()}/{len(a)}"


RULES = {
    "64 routes, re-read <= 1.1 (before)": lambda R, rr, mb, wd: R <= 64 and rr <= 1.1,
    "128 routes, re-read <= 1.1": lambda R, rr, mb, wd: R <= 128 and rr <= 1.1,
    "64 routes, re-read, 180 MB": lambda R, rr, mb, wd: R <= 64 and rr <= 1.1 and mb <= 180,
    "128 routes, re-read, 180 MB (shipped)": lambda R, rr, mb, wd: R <= 128 and rr <= 1.1 and mb <= 180,
    "128 routes, re-read, 250 MB": lambda R, rr, mb, wd: R <= 128 and rr <= 1.1 and mb <= 250,
    "128 routes, re-read <= 1.15, 180 MB": lambda R, rr, mb, wd: R <= 128 and rr <= 1.15 and mb <= 180,
    "linear time models": lambda R, rr, mb, wd: R <= 128 and 9.25 + mb / 2.98 < 19.87 + wd / 3.77,
}


def linear_fits(rows):
    """us = a + MB / (TB/s) of the decode default (MB streamed per route) and of the fastest grouped choice (MB
    once per distinct expert) over the rows without the expert-parallel hint (1-24 tokens)."""
    pts = []
    for r in rows:
        if r["E_global"] > r["E"]:
            continue
        td, tg, best, routes, rr, mb, wd = facts(r, 2.5)
        bg = min(x["us"] for x in r["results"] if "us" in x and not x["decode"])
        if td is not None:
            pts.append((mb, wd, td, bg))
    p = np.array(pts)
    for name, x, y in (("decode", p[:, 0], p[:, 2]), ("grouped", p[:, 1], p[:, 3])):
        w = 1 / y
        a, b = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1) * w[:, None], y * w, rcond=None)[0]
        print(f"  {name:8} {a:6.2f} us + MB / {1 / b:.2f} TB/s  ({len(x)} rows, relative least squares)")


if __name__ == "__main__":
    fit = load("fit_int4_g128.json.gz", "fit_int4_g32.json.gz")
    held = load("held_int4_g128.json.gz")
    print("linear fits (fitting sweeps):")
    linear_fits(fit)
    for narrow in (3, 2.5):
        print(f"4-warp gate/up from {narrow} tiles per SM:")
        for name, rule in RULES.items():
            print(f"  {name:38} fit: {evaluate(fit, rule, narrow)}   held out: {evaluate(held, rule, narrow)}")

"""Where the prefill time goes: each kernel of a grouped-path call against its own floor (CPU; reads the sweeps).

    python docs/perf/2026-12-05-prefill-split/split.py            # the tables of the README

Reads the per-kernel times (``kernels``: route preparation x2, gate/up GEMM, down GEMM, deterministic finalize)
that ``scripts/explore_tiles.py time`` recorded in earlier studies, at >= 1024 tokens, and sets each kernel beside
its floor on the H200 of docs/benchmarks.md's floor model (4.3e12 B/s, 7.9e14 FLOP/s), counting every byte the
kernel must move, not only the call's inputs and output:

* gate/up: 4-bit weights + BF16 group scales of the experts present, x in (T x H), h out (R x I);
* down: its weights and scales, h in (R x I), y out (R x H: one row per route, deterministic finalize);
* finalize: y in (R x H), out (T x H).

``R`` = T x top_k x E / E_global (uniform routing: every expert of these rows is hit). The call's floor in
``targets.md`` counts only x and out; ``chain`` below is the sum of the three kernels' floors.
"""

from __future__ import annotations

import json
import math
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
PERF = os.path.dirname(HERE)
BW, FLOPS = 4.3e12, 7.9e14
CLEAN = ["2026-12-04-wide-tiles/heldout_wide.json", "2026-12-04-wide-tiles/explore_wide.json"]
NEWEST = ["2026-12-05-setmaxnreg-tiles/explore_mr.json", "2026-12-05-setmaxnreg-tiles/explore_held.json"]


def floors(r: dict) -> dict:
    """Per-kernel floors (us) of one sweep row, and the call floor of the benchmark's model."""
    e, h, i, k, t = r["E"], r["H"], r["I"], r["top_k"], r["tokens"]
    routes = t * k * e / (r.get("E_global") or e)
    g = int(r["scheme"].split("_g")[1].split("_")[0]) if "_g" in r["scheme"] else h

    def w(n, kk):  # packed codes + BF16 scales of e experts
        return e * n * kk * 0.5 + e * n * (kk / g) * 2

    us = lambda b: b / BW * 1e6  # noqa: E731
    fl = lambda f: f / FLOPS * 1e6  # noqa: E731
    up_b, up_f = us(w(2 * i, h) + t * h * 2 + routes * i * 2), fl(2 * routes * 2 * i * h)
    dn_b, dn_f = us(w(h, i) + routes * i * 2 + routes * h * 2), fl(2 * routes * h * i)
    fin_b = us(routes * h * 2 + t * h * 2)
    call = max(us(w(2 * i, h) + w(h, i) + 2 * t * h * 2), fl(2 * routes * 3 * i * h))
    return dict(up=max(up_b, up_f), up_mem=up_b >= up_f, down=max(dn_b, dn_f), down_mem=dn_b >= dn_f,
                y_us=us(routes * h * 2), fin=fin_b, call=call, chain=max(up_b, up_f) + max(dn_b, dn_f) + fin_b)


def rows(paths, pick):
    for p in paths:
        with open(os.path.join(PERF, p)) as f:
            data = json.load(f)
        for r in data["rows"]:
            if r["tokens"] < 1024 or r.get("finalize", "deterministic") != "deterministic":
                continue
            res = [x for x in r["results"] if x.get("us") and len(x.get("kernels") or ()) == 5]
            x = pick(res)
            if x is not None:
                yield r, x, [t for _, t in x["kernels"]]


def unpipelined(res):
    """The TN 96 tile without PDL (its kernels do not overlap: their times add up to the call's)."""
    return next((x for x in res if x["choice"].startswith("sm90 t96_x4_k64_s4_w2 ")), None)


def fastest(res):
    return min(res, key=lambda x: x["us"]) if res else None


def geo(xs):
    return math.exp(statistics.mean(math.log(x) for x in xs))


def main():
    print("## A. TN 96 without PDL (kernel times add up), >= 1024 tokens\n")
    print("| layer | tokens | call us | gate/up us (x its floor) | down us (x its floor) | y write us | "
          "finalize us (x its floor) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    seen, up_r, dn_r, fin_r = set(), [], [], []
    for r, x, ks in rows(CLEAN, unpipelined):
        key = (r["layer"], r["tokens"])
        if key in seen:
            continue
        seen.add(key)
        f = floors(r)
        up_r.append(ks[2] / f["up"]), dn_r.append(ks[3] / f["down"]), fin_r.append(ks[4] / f["fin"])
        print(f"| `{r['layer']}` | {r['tokens']} | {x['us']:.1f} | {ks[2]:.1f} ({ks[2] / f['up']:.2f}) | "
              f"{ks[3]:.1f} ({ks[3] / f['down']:.2f}) | {f['y_us']:.1f} | {ks[4]:.1f} ({ks[4] / f['fin']:.2f}) |")
    print(f"\n{len(up_r)} rows; geometric mean x floor: gate/up {geo(up_r):.2f}, down {geo(dn_r):.2f}, "
          f"finalize {geo(fin_r):.2f}\n")

    print("## B. The fastest timed choice (setmaxnreg sweeps), >= 1024 tokens, by I\n")
    print("| layer | tokens | fastest choice | us | x call floor | x chain floor | down span share |")
    print("|---|---:|---|---:|---:|---:|---:|")
    by_i: dict = {}
    for r, x, ks in sorted(rows(NEWEST, fastest), key=lambda z: (z[0]["I"], z[0]["layer"], z[0]["tokens"])):
        f = floors(r)
        share = ks[3] / sum(ks)
        by_i.setdefault("I <= 512" if r["I"] <= 512 else "I > 512", []).append((x["us"] / f["call"],
                                                                                 x["us"] / f["chain"], share))
        print(f"| `{r['layer']}` | {r['tokens']} | `{x['choice'].split()[1]}` | {x['us']:.1f} | "
              f"{x['us'] / f['call']:.2f} | {x['us'] / f['chain']:.2f} | {share:.2f} |")
    print()
    for k, v in sorted(by_i.items()):
        print(f"{k}: {len(v)} rows, x call floor {geo([a for a, _, _ in v]):.2f}, x chain floor "
              f"{geo([b for _, b, _ in v]):.2f}, down span share {statistics.mean(c for _, _, c in v):.2f}")


if __name__ == "__main__":
    main()

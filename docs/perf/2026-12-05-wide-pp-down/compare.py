"""Each row of ``explore_tiles.py time`` sweeps: the time of the shipped cost model's choice (the checkout's
``cost_model.json``), of the sweep's default (the model of the revision that ran it) and of the fastest choice timed.

    PYTHONPATH=python python docs/perf/2026-12-05-wide-pp-down/compare.py SWEEP.json ...
"""

from __future__ import annotations

import json
import math
import sys


def main(paths) -> int:
    from w4a16_moe.kernels.cute.sm90 import family as fam
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name

    new_r, old_r = [], []
    print(f"{'layer':18s} {'T':>5s} {'default us':>10s} {'model us':>9s} {'best us':>8s}  model / default  model choice")
    for path in paths:
        for r in json.load(open(path))["rows"]:
            times = {x["choice"]: x["us"] for x in r["results"] if "us" in x}
            if not times:
                continue
            e, h, i, k, t, g = r["E"], r["H"], r["I"], r["top_k"], r["tokens"], r.get("E_global", r["E"])
            best = min(times.values())
            dflt = times.get(r["default"])
            f, tiles, _ = fam.model_choice(t * k, e, h, i, True, k, g if g > e else None)
            name = f"{f} {candidate_name(tiles)}"
            got = [us for c, us in times.items() if c.startswith(name + " split-K")]
            if dflt is None or not got:
                print(f"{r['layer']:18s} {t:5d}  (model choice {name} not timed)")
                continue
            new_r.append(got[0] / best)
            old_r.append(dflt / best)
            print(f"{r['layer']:18s} {t:5d} {dflt:10.1f} {got[0]:9.1f} {best:8.1f}  {got[0] / dflt:15.3f}  {name[5:]}")
    geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))
    print(f"{len(new_r)} rows: model / best geomean {geo(new_r):.3f} (worst {max(new_r):.3f}); "
          f"default / best {geo(old_r):.3f} (worst {max(old_r):.3f}); model / default {geo(new_r) / geo(old_r):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Tile-loop grouped GEMMs beside the shipped ones: the same call (same data, same tiles) with W4A16_MOE_TILE_LOOP=0
(grid y = the tile bound of any routing) and =1 (tile-loop kernels, grid y = tiles.loop_grid), and the shipped
kernels with the exact tile count of this routing as grid y (the floor of what a smaller grid can save; valid only
for this fixed routing). Deterministic outputs must be bit-identical across all three.
python docs/perf/2026-12-05-tile-loop/tl_bench.py OUT.json E,H,I,K[,EG]:TOKENS,TOKENS ...   (INT4 g128, BF16, SwiGLU; tuned table off)
"""
import json
import sys
import time

import torch

import w4a16_moe
from w4a16_moe import settings
from w4a16_moe.bench.layers import build_workload
from w4a16_moe.bench.run import _time
from w4a16_moe.bench.workloads import make_inputs, make_weights
from w4a16_moe.kernels.cute import overrides, provider as prov
from w4a16_moe.device import probe
from w4a16_moe.validate import check_moe_call

out_path = sys.argv[1]
rows = []
orig = prov._max_tiles
for arg in sys.argv[2:]:
    layer, toks = arg.split(":")
    wl, _ = build_workload(layer=layer, group=128)
    gen = torch.Generator(device="cuda").manual_seed(20260908)
    w = make_weights(wl, gen)
    kw = dict(global_num_experts=wl.global_experts) if wl.global_experts > wl.local_experts else {}
    for t in [int(v) for v in toks.split(",")]:
      try:
        x, tw, ids = make_inputs(wl, t, gen)
        out = torch.empty_like(x)
        fn = lambda: w4a16_moe.fused_moe(x, w, tw, ids, out=out, **kw)
        res, plans = {}, {}
        for mode in ("0", "1"):
            with settings.override(tile_loop=mode):
                prov.clear_plans()
                call = check_moe_call(x, w, tw, ids, **kw)
                p = prov.plan(call, probe(x.device))
                plans[mode] = p
                out.fill_(float("nan"))
                fn()
                res[mode] = dict(us=_time(fn), out=out.clone(), plan=p.describe(), grid=p.grid_tiles or p.max_tiles,
                                 bound=p.max_tiles)
        # the loop kernels on half that grid: most CTAs run two tiles, the second one's loads under the first one's
        # epilogue (the widest width for the second)
        if res["1"]["grid"] > 1 and plans["1"].grid_tiles:
            half = -(-res["1"]["grid"] // 2)
            with settings.override(tile_loop="1"), overrides.forced_loop_grid(half):
                prov.clear_plans()
                out.fill_(float("nan"))
                fn()
                res["half"] = dict(us=_time(fn), out=out.clone(), grid=half)
            prov.clear_plans()
        # the shipped kernels with the exact tile count as grid y
        p = plans["0"]
        tn = dict(p.tiles).get("tokens_per_tile") if p.family in ("sm90", "warp") and not p.decode else None
        if tn:
            counts = torch.bincount(ids[(ids >= 0) & (ids < wl.local_experts)].long(), minlength=wl.local_experts)
            exact = max(1, int(((counts + tn - 1) // tn).sum()))
            with settings.override(tile_loop="0"):
                prov._max_tiles = lambda r, e, n: exact if n == tn else orig(r, e, n)
                prov.clear_plans()
                out.fill_(float("nan"))
                fn()
                res["exact"] = dict(us=_time(fn), out=out.clone(), grid=exact)
                prov._max_tiles = orig
                prov.clear_plans()
            with settings.override(tile_loop="0"):
                res["0b"] = dict(us=_time(fn))  # the bound again (drift)
        same = {m: bool(torch.equal(res[m]["out"], res["0"]["out"])) for m in res if "out" in res[m]}
        nan = {m: bool(torch.isnan(res[m]["out"]).any()) for m in res if "out" in res[m]}
        r = dict(layer=layer, tokens=t, us={m: round(v["us"], 2) for m, v in res.items()},
                 grid={m: v.get("grid") for m, v in res.items() if "grid" in v}, bound=res["0"]["bound"],
                 identical=same, nan=nan, plan0=res["0"]["plan"], plan1=res["1"]["plan"])
        base = min(res["0"]["us"], res.get("0b", res["0"])["us"])
        print(f"{layer} T={t}: bound {res['0']['us']:.1f}/{res.get('0b', res['0'])['us']:.1f} us (grid {r['bound']}), "
              f"loop {res['1']['us']:.1f} ({res['1']['us'] / base:.3f}, grid {res['1']['grid']})"
              + (f", exact {res['exact']['us']:.1f} ({res['exact']['us'] / base:.3f}, grid {res['exact']['grid']})"
                 if "exact" in res else "")
              + (f", half {res['half']['us']:.1f} ({res['half']['us'] / base:.3f}, grid {res['half']['grid']})"
                 if "half" in res else "") + f"; identical {same}; nan {nan}", flush=True)
        rows.append(r)
        json.dump(dict(device=torch.cuda.get_device_name(), when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       rows=rows), open(out_path, "w"), indent=1)
      except Exception as exc:  # a row that cannot run (a missing kernel, ...): say so, go on
        prov._max_tiles = orig
        print(f"{layer} T={t}: ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)

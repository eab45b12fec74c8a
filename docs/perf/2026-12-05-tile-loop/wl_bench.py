"""Warp-MMA tile loop (W4A16_MOE_TILE_LOOP=auto, the default) beside the kernels without it (=0): the same call
(same data, same selection otherwise), timed alternately (0, auto, 0, auto); deterministic outputs must be
bit-identical. Rows whose auto plan does not loop are listed without timing.
python docs/perf/2026-12-05-tile-loop/wl_bench.py OUT.json E,H,I,K[,EG]:TOKENS,TOKENS ...   (INT4 g128, BF16, SwiGLU; tuned table off)
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
from w4a16_moe.kernels.cute import provider as prov
from w4a16_moe.device import probe
from w4a16_moe.validate import check_moe_call

out_path = sys.argv[1]
rows = []
for arg in sys.argv[2:]:
    layer, toks = arg.split(":")
    wl, _ = build_workload(layer=layer, group=128)
    gen = torch.Generator(device="cuda").manual_seed(20261205)
    w = make_weights(wl, gen)
    kw = dict(global_num_experts=wl.global_experts) if wl.global_experts > wl.local_experts else {}
    for t in [int(v) for v in toks.split(",")]:
        try:
            x, tw, ids = make_inputs(wl, t, gen)
            out = torch.empty_like(x)
            fn = lambda: w4a16_moe.fused_moe(x, w, tw, ids, out=out, **kw)
            res = {}
            for mode in ("0", "auto"):
                with settings.override(tile_loop=mode):
                    prov.clear_plans()
                    p = prov.plan(check_moe_call(x, w, tw, ids, **kw), probe(x.device))
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    res[mode] = dict(out=out.clone(), plan=p.describe(), grid=p.grid_tiles, bound=p.max_tiles)
            loops = res["auto"]["grid"] > 0
            us = {"0": [], "auto": []}
            if loops:
                for _ in range(2):
                    for mode in ("0", "auto"):
                        with settings.override(tile_loop=mode):
                            prov.clear_plans()
                            fn()
                            us[mode].append(_time(fn))
            same = bool(torch.equal(res["0"]["out"], res["auto"]["out"]))
            nan = any(bool(torch.isnan(res[m]["out"]).any()) for m in res)
            r = dict(layer=layer, tokens=t, loops=loops, us={m: [round(v, 2) for v in us[m]] for m in us},
                     grid=res["auto"]["grid"], bound=res["auto"]["bound"], identical=same, nan=nan,
                     plan0=res["0"]["plan"], plan_auto=res["auto"]["plan"])
            if loops:
                a, b = min(us["0"]), min(us["auto"])
                r["ratio"] = round(b / a, 4)
                print(f"{layer} T={t}: grid {r['grid']}/{r['bound']}: 0 {a:.1f} us, auto {b:.1f} us ({b / a:.3f}); "
                      f"identical {same}; nan {nan}", flush=True)
            else:
                print(f"{layer} T={t}: no loop ({res['auto']['plan'][:90]}); identical {same}; nan {nan}", flush=True)
            rows.append(r)
            json.dump(dict(device=torch.cuda.get_device_name(), when=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           rows=rows), open(out_path, "w"), indent=1)
        except Exception as exc:  # a row that cannot run (a missing kernel, ...): say so, go on
            print(f"{layer} T={t}: ERROR {type(exc).__name__}: {str(exc)[:300]}", flush=True)

"""warp.family.STATIC_SMEM 1024 (shipped) vs 0 (ncu: no static shared memory): the plans whose split-K changes, both
timed on the same inputs (NaN-poisoned output checked against the FP32 reference first)."""
import json, os, sys
import torch
from w4a16_moe import reference_moe
from w4a16_moe.activations import get_activation
from w4a16_moe.bench.workloads import Workload, make_weights
from w4a16_moe.device import probe
from w4a16_moe.kernels.cute import autotune as at, provider
from w4a16_moe.kernels.cute.provider import cute_fused_moe
from w4a16_moe.kernels.cute.warp import family as wf
from w4a16_moe.validate import MoECall

ROWS = [((48, 7168, 2048, 8, 384), 16), ((32, 7168, 2048, 8, 256), 32), ((32, 7168, 2048, 8, 256), 64),
        ((32, 7168, 2048, 8, 256), 128), ((16, 5120, 8192, 1), 4), ((16, 5120, 8192, 1), 32), ((16, 5120, 8192, 1), 64),
        ((8, 4096, 14336, 2), 2), ((8, 4096, 14336, 2), 4), ((8, 4096, 14336, 2), 8), ((8, 4096, 14336, 2), 16),
        ((8, 6144, 2048, 2), 4), ((20, 5120, 1536, 8, 160), 64), ((8, 8192, 3584, 8, 64), 8),
        ((8, 8192, 3584, 8, 64), 16), ((8, 8192, 3584, 8, 64), 32)]
dev = torch.device("cuda")
info = probe(dev)
out, cur, w = [], None, None
for L, T in ROWS:
    e, h, i, k = L[:4]; g = L[4] if len(L) > 4 else None
    if L != cur:
        w = None; torch.cuda.empty_cache()
        wl = Workload("x", "x", g or e, e, h, i, k, "int4_g32", (T,))
        w, cur = make_weights(wl, torch.Generator(device=dev).manual_seed(7), dev), L
    call = MoECall(T, k, h, i, e, torch.bfloat16, dev, get_activation("swiglu"), "deterministic", 0, "int4_g32",
                   global_experts=g)
    x, tw, ids = at._inputs(w, T, k, torch.bfloat16, seed=3000 + T, global_experts=g)
    ref = reference_moe(x, w, tw, ids).float()
    row = dict(layer=",".join(map(str, L)), tokens=T)
    for static in (1024, 0, 1024):
        wf.STATIC_SMEM = static
        provider.clear_plans()
        p = provider.plan(call, info)
        o = torch.full_like(x, float("nan"))
        try:
            cute_fused_moe(x, w, tw, ids, call=call, out=o, plan=p)
            torch.cuda.synchronize()
            err = ((o.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            us = at._time_us(lambda: cute_fused_moe(x, w, tw, ids, call=call, out=o, plan=p))
            row.setdefault(f"static{static}", []).append(dict(splits=list(p.splits), us=round(us, 2), nrmse=round(err, 5)))
        except Exception as ex:  # noqa: BLE001
            row.setdefault(f"static{static}", []).append(dict(splits=list(p.splits), error=str(ex)[:160]))
    print(row, flush=True)
    out.append(row)
json.dump(dict(device=torch.cuda.get_device_name(), scheme="int4_g32", rows=out),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "slots.json"), "w"), indent=1)

"""Kimi-K2 TP8 (384,7168,256,8, INT4 g32): warp TN 8 unsplit vs split 2 vs TN 16 / 24 at a few token counts."""
import json, os, sys
sys.path.insert(0, "scripts")
import torch
from sweep_tiles import measure
from w4a16_moe import reference_moe
from w4a16_moe.activations import get_activation
from w4a16_moe.bench.workloads import Workload, make_weights
from w4a16_moe.device import probe
from w4a16_moe.kernels.cute import autotune as at, choice_plan
from w4a16_moe.kernels.cute.autotune_store import Choice
from w4a16_moe.validate import MoECall

dev = torch.device("cuda")
wl = Workload("kimi", "kimi", 384, 384, 7168, 256, 8, "int4_g32", (32,))
w = make_weights(wl, torch.Generator(device=dev).manual_seed(1), dev)
info = probe(dev)
rows = []
for T in [int(t) for t in sys.argv[1].split(",")]:
    call = MoECall(T, 8, 7168, 256, 384, torch.bfloat16, dev, get_activation("swiglu"), "deterministic", 0, "int4_g32")
    x, tw, ids = at._inputs(w, T, 8, torch.bfloat16, seed=2000 + T)
    ref = reference_moe(x, w, tw, ids)
    for tn, sp in ((8, 1), (8, 2), (8, 3), (16, 1), (16, 2), (24, 1)):
        c = Choice("warp", f"t{tn}_k128_s4_w4_m2", sp)
        p = choice_plan.plan_of_choice(call, info, c)
        r = measure(x, w, tw, ids, ref, call, c, p, None, kernels=True) if p is not None else {"choice": c.label(), "error": "no plan"}
        r["plan_splits"] = list(p.splits) if p is not None else None
        print(T, r.get("choice"), r.get("us"), r.get("plan_splits"), r.get("error", ""), [k[1] for k in r.get("kernels", [])], flush=True)
        rows.append(dict(tokens=T, **r))
json.dump(dict(device=torch.cuda.get_device_name(), layer="384,7168,256,8", scheme="int4_g32", rows=rows),
          open(os.path.join(os.environ.get("OUT", "/tmp"), "kimi_split.json"), "w"), indent=1)

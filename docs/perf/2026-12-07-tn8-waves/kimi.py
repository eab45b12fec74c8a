"""Kimi-K2 TP8 (384,7168,256,8, INT4 g32) at 32 / 256 tokens: warp TN 8 / 16 / 24 (K 128), one profiled call each
(cudaProfilerStart/Stop around it), for ncu --profile-from-start off."""
import sys
import torch
from w4a16_moe.activations import get_activation
from w4a16_moe.bench.workloads import Workload, make_weights
from w4a16_moe.device import probe
from w4a16_moe.kernels.cute import autotune as at, choice_plan
from w4a16_moe.kernels.cute.autotune_store import Choice
from w4a16_moe.kernels.cute.provider import cute_fused_moe
from w4a16_moe.validate import MoECall

dev = torch.device("cuda")
wl = Workload("kimi", "kimi", 384, 384, 7168, 256, 8, "int4_g32", (32,))
w = make_weights(wl, torch.Generator(device=dev).manual_seed(1), dev)
info = probe(dev)
for T in [int(t) for t in sys.argv[1].split(",")]:
    call = MoECall(T, 8, 7168, 256, 384, torch.bfloat16, dev, get_activation("swiglu"), "deterministic", 0, "int4_g32")
    x, tw, ids = at._inputs(w, T, 8, torch.bfloat16, seed=2000 + T)
    for tn in (8, 16, 24):
        p = choice_plan.plan_of_choice(call, info, Choice("warp", f"t{tn}_k128_s4_w4_m2", None))
        o = torch.empty_like(x)
        for _ in range(3):
            cute_fused_moe(x, w, tw, ids, call=call, out=o, plan=p)
        torch.cuda.synchronize()
        print(f"T={T} TN {tn}: {p.describe() if hasattr(p, 'describe') else p}", flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        cute_fused_moe(x, w, tw, ids, call=call, out=o, plan=p)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()

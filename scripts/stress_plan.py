"""Stress one MoE layer's CuTe plan on the GPU: eager calls, then CUDA-graph replays (10 calls per graph), checking
the output against the FP32 reference after each phase (a launch failure stops the process with its CUDA error).

    PYTHONPATH=python python scripts/stress_plan.py SCHEME E H I TOP_K TOKENS TILE [EAGER [GRAPHS]]

TILE: ``auto`` (the provider's plan) or a candidate, forced: its number (``sm90.family.CANDIDATES``) or name. Used to look for the
launch failures of docs/perf/2026-12-05-wide-pp-down; run it under ``compute-sanitizer`` with ``EAGER`` and
``GRAPHS`` 0 (and ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` so that reads past a buffer are flagged)."""
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import torch
import w4a16_moe as wm
from conftest import random_weights, random_routing, nrmse
from w4a16_moe.kernels.cute.sm90 import family as fam

scheme = sys.argv[1]
e, h, i, k, t = (int(v) for v in sys.argv[2:7])
tile = sys.argv[7]
n_eager = int(sys.argv[8]) if len(sys.argv) > 8 else 100
n_graph = int(sys.argv[9]) if len(sys.argv) > 9 else 30
w = random_weights(scheme, e, h, i, dtype=torch.bfloat16, device="cuda", seed=0)
x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
tw, ids = random_routing(t, k, e, seed=3, device="cuda")
out = torch.full_like(x, float("nan"))
ref = wm.reference_moe(x, w, tw, ids)
ctx = contextlib.nullcontext() if tile == "auto" else fam.forced(int(tile) if tile.isdigit() else tile, 1)
tag = f"{scheme} {e},{h},{i},{k} T={t} tile={tile}"
with ctx:
    call = lambda: wm.fused_moe(x, w, tw, ids, finalize="deterministic", backend="cute", out=out)
    call(); torch.cuda.synchronize()
    print(tag, "first call nrmse", float(nrmse(out, ref)), flush=True)
    t0 = time.time()
    for n in range(n_eager):
        call()
        if n % 10 == 9:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(tag, f"{n_eager} eager calls ok in {time.time() - t0:.1f} s, nrmse", float(nrmse(out, ref)), flush=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            call()
    t0 = time.time()
    for n in range(n_graph):
        g.replay()
    torch.cuda.synchronize()
    print(tag, f"{n_graph} x 10 graph calls ok in {time.time() - t0:.1f} s, nrmse", float(nrmse(out, ref)), flush=True)

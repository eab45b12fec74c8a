"""One layer at one token count: the default plan and forced grouped tiles, timed two ways (autotune._time_us, the
short graph replays of the sweeps and the autotuner, and do_bench_cudagraph rep=150 as bench and the peers tool
time), two rounds, with the SM clock and power read after each (GPU machine, prebuilt kernels):

    python time_forced.py E,H,I,TOPK[,E_GLOBAL] TOKENS [CANDIDATE ...]
"""
import subprocess, sys, torch, triton.testing
from w4a16_moe import fused_moe
from w4a16_moe.bench.layers import build_workload
from w4a16_moe.bench.workloads import make_weights, make_inputs
from w4a16_moe.kernels.cute import overrides, autotune
layer, T = sys.argv[1], int(sys.argv[2]); names = sys.argv[3:]
wl, _ = build_workload(layer=layer)
gen = torch.Generator(device="cuda").manual_seed(1234)
w = make_weights(wl, gen, "cuda"); x, tw, ids = make_inputs(wl, T, gen, "cuda")
print("local routes", int(((ids >= 0) & (ids < wl.local_experts)).sum()))
def clk(): return subprocess.run(["nvidia-smi","--query-gpu=clocks.sm,power.draw","--format=csv,noheader"],capture_output=True,text=True).stdout.strip()
for rnd in range(2):
    for n in ["default"] + names:
        ctx = overrides.forced(None if n == "default" else n)
        with ctx:
            fn = lambda: fused_moe(x, w, tw, ids, global_num_experts=wl.global_experts)
            fn(); torch.cuda.synchronize()
            a = autotune._time_us(fn)
            b = triton.testing.do_bench_cudagraph(fn, rep=150) * 1000
            print(f"{n:55s} short {a:8.1f}  rep150 {b:8.1f}  [{clk()}]", flush=True)

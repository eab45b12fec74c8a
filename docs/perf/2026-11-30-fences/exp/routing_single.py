"""Experiment (not committed): route prep at W1 2048 (16384 routes, 384 experts), multi-kernel vs single kernel,
then the W1 tune with the single kernel forced."""
import sys, torch
from w4a16_moe.kernels.triton import routing

def graph_us(fn, reps=200):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10): fn()
    g.replay(); torch.cuda.synchronize()
    st, en = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(20):
        st.record(); g.replay(); en.record(); torch.cuda.synchronize(); ts.append(st.elapsed_time(en) * 1000 / 10)
    ts.sort(); return ts[len(ts)//2]

ids = torch.randint(0, 384, (2048, 8), device="cuda", dtype=torch.int32)
for small in (4096, 1 << 20):
    routing.SMALL_ROUTES = small
    print(f"SMALL_ROUTES={small}: prepare_routes {graph_us(lambda: routing.prepare_routes(ids, 384, 0, 56, zeroed=0)):.1f} us", flush=True)
routing.SMALL_ROUTES = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
from w4a16_moe.bench.tune import main
main(sys.argv[2:])

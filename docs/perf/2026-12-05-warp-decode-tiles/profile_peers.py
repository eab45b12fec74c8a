"""peer_bench.py of the peers tool (../shared/tools/peers beside the checkout) with a timer that first prints the
GPU kernels of the last eager calls (torch.profiler: start offset, duration, gap), then times the call as
peer_bench does (CUDA-graph replay).

    python profile_peers.py PATH/TO/peer_bench.py [peer_bench arguments]

Run in place of peer_bench.py, in the environment device_run.sh sets up."""
import os, sys
pb_path = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(pb_path)))
import torch
import peer_bench as pb

N = [0]
def ptimer(fn, rep):
    N[0] += 1
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(4):
            fn()
            torch.cuda.synchronize()
    ev = sorted([(e.time_range.start, e.time_range.end, e.name) for e in p.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA], key=lambda t: t[0])
    # split into calls: a gap > 30 us starts a new call
    calls, cur = [], []
    for s, e, n in ev:
        if cur and s - cur[-1][1] > 30:
            calls.append(cur); cur = []
        cur.append((s, e, n))
    if cur: calls.append(cur)
    for ci, c in enumerate(calls[-2:]):
        t0 = c[0][0]; prev = None
        print(f"[prof] timer#{N[0]} call {ci}: {len(c)} kernels, span {c[-1][1]-t0:.1f} us, "
              f"busy {sum(e-s for s,e,_ in c):.1f} us", flush=True)
        for s, e, n in c:
            gap = 0 if prev is None else s - prev
            print(f"[prof]   +{s-t0:7.1f} dur {e-s:7.1f} gap {gap:5.1f}  {n[:110]}", flush=True)
            prev = e
    t = pb.cuda_graph_timer(fn, rep)
    print(f"[prof] timer#{N[0]} graph {t:.1f} us", flush=True)
    return t

_run = pb.run
pb.run = lambda *a, **kw: _run(*a, **dict(kw, timer=ptimer))  # main() looks ``run`` up at call time
sys.exit(pb.main(sys.argv[2:]))

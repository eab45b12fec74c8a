"""Per-kernel times of the route-major decode path (gate/up and down listed apart, in launch order).

    python decode_split.py --workload deepseek-ep8 --tokens 2,4,8 [--knobs w4u8/w4u4,w8u8/w8u4] [--ncu]

Eager calls under torch.profiler (CUDA activity); every call's kernels in launch order, median per position.
With --ncu: one call per row and no profiler (run the script under ncu -k regex:Decode).
"""
import argparse

import torch

from w4a16_moe.bench.profile import kernels_in_order
from w4a16_moe.bench.run import _nrmse, _provider_fn, _time
from w4a16_moe.reference import reference_moe
from w4a16_moe.bench.workloads import SEED, WORKLOADS, floor_us, make_inputs, make_weights
from w4a16_moe.kernels.cute import decode_family as dec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="deepseek-ep8")
    ap.add_argument("--tokens", default="2,4,8")
    ap.add_argument("--knobs", default="")
    ap.add_argument("--ncu", action="store_true")
    a = ap.parse_args()
    wl = WORKLOADS[a.workload]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    fn = _provider_fn("cute", wl, weights)
    knobs = [k for k in a.knobs.split(",") if k] or [None]
    # the benchmark's data: one generator, rows drawn in the benchmark's token order
    rows = {}
    for t in wl.tokens:
        rows[t] = make_inputs(wl, t, gen, dev)
    for t in (int(v) for v in a.tokens.split(",")):
        x, tw, ids = rows[t]
        fl = floor_us(wl, weights, t, ids)
        out = torch.empty_like(x)
        ref = None if a.ncu else reference_moe(x, weights, tw, ids)
        first = None
        for kn in knobs:
            dec.FORCE_KNOBS.clear()
            if kn:
                dec.FORCE_KNOBS.update(dec.parse_knobs(kn))
            call = lambda: fn(x, tw, ids, out=out)
            if a.ncu:
                call()
                torch.cuda.synchronize()
                continue
            out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            err = _nrmse(out, ref)
            same = "first" if first is None else ("bit-identical" if torch.equal(out, first) else "DIFFERENT")
            if first is None:
                first = out.clone()
            print(f"T={t} knobs={kn} nrmse={err:.4f} finite={bool(torch.isfinite(out).all())} vs first: {same}")
            pos = kernels_in_order(call)
            g = _time(call)
            print(f"T={t} knobs={kn} routes={fl['local_routes']} experts={fl['experts_present']} "
                  f"floor_eff={fl['floor_eff_us']:.1f} graph={g:.1f} us ({g / fl['floor_eff_us']:.2f} x) | "
                  + " | ".join(f"{n} {us:.1f}" for n, us in pos), flush=True)
    dec.FORCE_KNOBS.clear()


if __name__ == "__main__":
    main()

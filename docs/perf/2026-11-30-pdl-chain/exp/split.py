"""Per-kernel times of one routed MoE call, kernels listed apart in launch order (median over calls).

    python split.py --workload kimi-tp8 --tokens 2048 --buckets 63,70 [--pdl 0]

Eager calls under torch.profiler (the two grouped GEMMs share one kernel name, so ``profile`` averages them);
with PDL a kernel's duration includes the time its CTAs spend in ``griddepcontrol.wait``.
"""
import argparse

import torch

from w4a16_moe.bench.profile import kernels_in_order
from w4a16_moe.bench.run import _provider_fn, _time
from w4a16_moe.bench.workloads import SEED, WORKLOADS, benchmark_rows, make_weights
from w4a16_moe.kernels.cute import sm90_family as fam


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="kimi-tp8")
    ap.add_argument("--tokens", default="2048")
    ap.add_argument("--buckets", default="63")
    a = ap.parse_args()
    wl = WORKLOADS[a.workload]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    tokens = [int(v) for v in a.tokens.split(",")]
    rows = benchmark_rows(wl, tokens, gen, dev)
    for t in tokens:
        x, tw, ids = rows[t]
        for b in (int(v) for v in a.buckets.split(",")):
            with fam.forced(b):
                fn = _provider_fn("cute", wl, weights)
                out = torch.empty_like(x)
                call = (lambda fn=fn, x=x, tw=tw, ids=ids, out=out: fn(x, tw, ids, out=out))
                pos = kernels_in_order(call)
                graph = _time(call)
            print(f"{wl.name} T={t} bucket {b}: graph replay {graph:.1f} us; eager kernels: "
                  + ", ".join(f"{n} {us:.1f}" for n, us in pos))


if __name__ == "__main__":
    main()

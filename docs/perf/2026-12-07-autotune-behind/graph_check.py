"""Every autotuner candidate of a layer's calls, one at a time, as the tuner runs it, then checked after CUDA-graph
replays (GPU). Finds the candidate whose graph replay ended the tuner on Qwen3-235B TP4 at 8 tokens, and any
candidate that is correct eagerly but wrong or faulting when its calls run back to back in a graph.

    W4A16_MOE_PREBUILT_DIR=.device/at2/pb W4A16_MOE_DISABLE_JIT=1 PYTHONPATH=python \\
        python docs/perf/2026-12-07-autotune-behind/graph_check.py --layer 128,4096,384,8 --group 128 --tokens 8

Per candidate (the tuner's order, ``autotune.candidates``; ``--start N`` skips the first N after a crash): its label
is printed (flushed) before any launch, then one eager call against the FP32 reference (NaN-poisoned output), then
``--calls`` calls captured in one graph, replayed ``--replays`` times, each call into its own NaN-poisoned output,
every output checked against the reference. A sticky CUDA error ends the process: the last label printed is the
candidate.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", required=True, help="E,H,I,TOPK[,E_GLOBAL]")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--tokens", required=True, help="comma list")
    ap.add_argument("--finalize", default="deterministic")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=None, help="check candidates before this index only")
    args = ap.parse_args()

    from w4a16_moe.activations import get_activation
    from w4a16_moe.bench.layers import build_workload
    from w4a16_moe.bench.workloads import make_weights
    from w4a16_moe.device import probe
    from w4a16_moe.kernels.cute import autotune, choice_plan
    from w4a16_moe.kernels.cute.provider import cute_fused_moe
    from w4a16_moe.reference import reference_moe
    from w4a16_moe.validate import MoECall

    wl, _ = build_workload(layer=args.layer, group=args.group)
    dev = torch.device("cuda")
    weights = make_weights(wl, torch.Generator(device=dev).manual_seed(1), dev)
    info = probe(dev)
    act = get_activation(wl.activation)
    g = wl.global_experts if wl.global_experts != wl.local_experts else None
    bad = 0
    for t in (int(x) for x in args.tokens.split(",")):
        call = MoECall(t, wl.top_k, wl.hidden, wl.intermediate, wl.local_experts, wl.torch_dtype, dev, act,
                       args.finalize, 0, weights.scheme.name, global_experts=g)
        x, tw, ids = autotune._inputs(weights, t, wl.top_k, wl.torch_dtype, seed=1000 + t, global_experts=g)
        ref = reference_moe(x, weights, tw, ids, activation=act.name).float()

        cands = autotune.candidates(call, info)
        for n, c in enumerate(cands):
            if n < args.start or (args.stop is not None and n >= args.stop):
                continue
            p = choice_plan.plan_of_choice(call, info, c)
            if p is None:
                continue
            print(f"T={t} #{n}/{len(cands)} {c.label()} | {p.family} splits {p.splits} max_tiles {p.max_tiles} "
                  f"grid_tiles {p.grid_tiles} counters {p.counters}", flush=True)
            o = torch.full_like(x, float("nan"))
            cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p)
            torch.cuda.synchronize()
            e0 = autotune._nrmse(o, ref)
            outs = [torch.full_like(x, float("nan")) for _ in range(args.calls)]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                cute_fused_moe(x, weights, tw, ids, call=call, out=outs[0], plan=p)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for o2 in outs:
                    cute_fused_moe(x, weights, tw, ids, call=call, out=o2, plan=p)
            worst = 0.0
            for _ in range(args.replays):
                for o2 in outs:
                    o2.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                worst = max(worst, max(autotune._nrmse(o2, ref) for o2 in outs))
            del graph
            ok = e0 < autotune.MAX_NRMSE and worst < autotune.MAX_NRMSE
            bad += not ok
            print(f"    eager {e0:.4f} graph worst {worst:.4f} {'ok' if ok else 'BAD'}", flush=True)
    print(f"{bad} bad candidates")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

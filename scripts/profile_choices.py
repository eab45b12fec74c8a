"""Run chosen grouped-GEMM choices of one layer once each inside a CUDA profiler range (GPU; for ``ncu``).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \\
        python scripts/profile_choices.py --layer 384,7168,256,8 --tokens 2048 [--scheme int4_g128] \\
        [--choices default | all | "LABEL;LABEL"]

For each choice (``default``: what selection picks; ``all``: every candidate the autotuner would time; or labels
as ``sweep_tiles.py`` prints them, e.g. ``sm90 t32_x2_k128_s4_w1_serial split-K rule``) it checks the output
against the FP32 reference (NaN-poisoned output), runs two warm-up calls, then one call between
``cudaProfilerStart`` / ``cudaProfilerStop``, so ``ncu --profile-from-start off`` sees exactly one call of each
choice, in the order printed. Kernels are never compiled here (``W4A16_MOE_DISABLE_JIT=1`` on the GPU machine).
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layer", required=True, help="E,H,I,TOPK[,E_GLOBAL]")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--scheme", default="int4_g128")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--finalize", default="deterministic")
    ap.add_argument("--choices", default="default", help="default | all | labels separated by ';'")
    args = ap.parse_args(argv)

    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from sweep_tiles import parse_layer

    from w4a16_moe.activations import get_activation
    from w4a16_moe.bench.workloads import SEED, Workload, make_weights
    from w4a16_moe.device import probe
    from w4a16_moe.kernels.cute import autotune as at
    from w4a16_moe.kernels.cute import choice_plan
    from w4a16_moe.kernels.cute.provider import cute_fused_moe
    from w4a16_moe.reference import reference_moe
    from w4a16_moe.validate import MoECall

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    act = get_activation(args.activation)
    e, h, i, k, g = parse_layer(args.layer)
    dev = torch.device("cuda")
    info = probe(dev)
    wl = Workload(f"profile-{args.layer}", args.layer, g or e, e, h, i, k, args.scheme, (args.tokens,), args.dtype,
                  args.activation)
    weights = make_weights(wl, torch.Generator(device=dev).manual_seed(SEED), dev)
    t = args.tokens
    call = MoECall(t, k, h, i, e, dtype, dev, act, args.finalize, 0, weights.scheme.name, global_experts=g)
    default = at._default_choice(call, info)
    cands = at.candidates(call, info)
    if args.choices == "default":
        chosen = [default]
    elif args.choices == "all":
        chosen = cands
    else:
        by_label = {c.label(): c for c in cands}
        want = [s.strip() for s in args.choices.split(";") if s.strip()]
        missing = [s for s in want if s not in by_label]
        if missing:
            raise SystemExit(f"--choices: not candidates of this call: {missing}; candidates: {sorted(by_label)}")
        chosen = [by_label[s] for s in want]
    x, tw, ids = at._inputs(weights, t, k, dtype, seed=2000 + t, global_experts=g)
    ref = reference_moe(x, weights, tw, ids, activation=act.name)
    for c in chosen:
        p = choice_plan.plan_of_choice(call, info, c)
        if p is None:
            print(f"skip {c.label()}: no plan", flush=True)
            continue
        o = torch.full_like(x, float("nan"))
        cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p)
        torch.cuda.synchronize()
        err = ((o.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        for _ in range(2):
            cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"profiled {c.label()} (nrmse {err:.4f}){' [default]' if c == default else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

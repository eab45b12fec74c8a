"""Write the kernel specs of every choice the on-device autotuner would time on some layers (CPU), so that
``warmup(..., autotune=True)`` / ``python -m w4a16_moe bench --autotune`` can run on a GPU machine with JIT off.

    PYTHONPATH=python python scripts/autotune_specs.py --layers 384,7168,256,8 16,5120,8192,1 --scheme int4_g128 \\
        --max-tokens 256 --out .device/autotune_specs.json
    python -m w4a16_moe aot --archs sm_90a --specs .device/autotune_specs.json --out .device/autotune -j 2

For each layer, both finalize modes and each count of ``autotune.token_grid(max_tokens)``, on an H100 and an H200
(their tuned tables differ): the default plan and the plan of every candidate of ``autotune.candidates`` (with a
loader that has every kernel). Layers are ``E,H,I,TOPK[,E_GLOBAL]`` as in ``scripts/sweep_tiles.py``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", nargs="+", required=True, help="E,H,I,TOPK[,E_GLOBAL]")
    ap.add_argument("--max-tokens", type=int, required=True, help="the warmup's max_tokens")
    ap.add_argument("--scheme", default="int4_g128")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch

    from explore_tiles import add_plan_specs, calls, write_specs
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import autotune, choice_plan, provider

    provider._kernels_available = lambda arch: None  # plan without looking for kernels
    have_all = lambda spec, arch: ("prebuilt",)  # noqa: E731
    specs, n_choices = {}, 0
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        info = DeviceInfo("cuda", gpu, (9, 0), 132)
        for fin in ("deterministic", "fused"):
            args.finalize = fin
            for _, _, call in calls(args.layers, autotune.token_grid(args.max_tokens), args, torch.device("cuda")):
                provider.clear_plans()
                plans = [provider.plan(call, info)]
                for c in autotune.candidates(call, info, status=have_all):
                    plans.append(choice_plan.plan_of_choice(call, info, c))
                    n_choices += 1
                add_plan_specs(specs, plans)
    provider.clear_plans()
    write_specs(specs, args.out)
    print(f"{n_choices} candidate plans, {len(specs)} specs -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time each call under every ``W4A16_MOE_LAYOUTS`` value (``all``, ``2``, ``1``) in one process: what a layout budget costs.

    # CPU: the specs of every plan the three settings make on those calls, then build them
    python scripts/layout_budget_time.py specs --layers 384,7168,256,8 --scheme int4_g32 --tokens 1,16,256,4096 \\
        --out .device/budget_specs.json
    python -m w4a16_moe aot --archs sm_90a --specs .device/budget_specs.json --out .device/budget -j 2
    # GPU (carry .device/budget; JIT off)
    W4A16_MOE_PREBUILT_DIR=.device/budget W4A16_MOE_DISABLE_JIT=1 python scripts/layout_budget_time.py time \\
        --layers 384,7168,256,8 --scheme int4_g32 --tokens 1,16,256,4096 --json budget.json

Per call, each setting's plan runs on the same weights and inputs (output poisoned with NaN, checked against the
FP32 reference), then is timed (CUDA graph, ``scripts/sweep_tiles.measure``); the rows are ``explore_tiles.py``'s,
each result's ``choice`` being ``layouts=<setting>: <plan>``. Plans are made as on the device (``specs``: for an H100
and an H200, whose tuned tables differ).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

SETTINGS = ("all", "2", "1")


class _Label:
    """What ``sweep_tiles.measure`` records as the choice."""

    def __init__(self, text: str):
        self.text = text

    def label(self) -> str:
        return self.text


def plan_label(p) -> str:
    tiles = dict(p.tiles)
    if p.decode:
        return f"decode {tiles.get('layout', 'default layout')} knobs {tiles.get('knobs')} splits {p.splits}"
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name

    return f"{p.family} {candidate_name(tiles)} splits {p.splits}"


def plans(call, info) -> dict:
    from w4a16_moe import settings
    from w4a16_moe.kernels.cute import provider

    out = {}
    for s in SETTINGS:
        with settings.override(layouts=s):
            provider.clear_plans()
            out[s] = provider.plan(call, info)
    provider.clear_plans()
    return out


def cmd_specs(args) -> int:
    import torch

    from explore_tiles import add_plan_specs, calls, write_specs
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider

    provider._kernels_available = lambda arch: None  # plan without looking for kernels
    specs = {}
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        info = DeviceInfo("cuda", gpu, (9, 0), 132)
        for _, _, call in calls(args.layers, args.tokens, args, torch.device("cuda")):
            add_plan_specs(specs, plans(call, info).values())
    write_specs(specs, args.out)
    print(f"{len(specs)} specs -> {args.out}")
    return 0


def cmd_time(args) -> int:
    import torch

    from explore_tiles import timed_calls
    from sweep_tiles import measure
    from w4a16_moe.device import probe

    dev = torch.device("cuda")
    info = probe(dev)
    rows = []
    for spec, (e, h, i, k, g), call, weights, (x, tw, ids), ref in timed_calls(args, dev, "budget"):
        t = call.tokens
        res = []
        for s, p in plans(call, info).items():
            res.append(measure(x, weights, tw, ids, ref, call, _Label(f"layouts={s}: {plan_label(p)}"), p, None,
                               kernels=False))
            print(f"{spec} T={t} {res[-1]['choice'][:90]:90s} {res[-1].get('us', res[-1].get('error'))}", flush=True)
        rows.append(dict(layer=spec, E=e, E_global=g or e, H=h, I=i, top_k=k, tokens=t, scheme=args.scheme,
                         dtype=args.dtype, finalize=args.finalize, results=res))
        with open(args.json, "w") as f:  # after every row: a run cut short keeps what it measured
            json.dump(dict(device=info.name, sm_count=info.sm_count, rows=rows), f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("specs", "time"))
    ap.add_argument("--layers", nargs="+", required=True, help="E,H,I,TOPK[,E_GLOBAL]")
    ap.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], required=True)
    ap.add_argument("--scheme", default="int4_g128")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--finalize", default="deterministic", choices=("deterministic", "fused"))
    ap.add_argument("--out", help="specs: where the spec list goes")
    ap.add_argument("--json", help="time: where the rows go")
    ap.add_argument("--budget-s", type=float, default=1e9, help="time: stop starting rows after this many seconds")
    args = ap.parse_args(argv)
    if args.command == "specs":
        if not args.out:
            raise SystemExit("specs: --out is required")
        return cmd_specs(args)
    if not args.json:
        raise SystemExit("time: --json is required")
    return cmd_time(args)


if __name__ == "__main__":
    sys.exit(main())

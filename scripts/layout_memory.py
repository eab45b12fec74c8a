"""The packed weight layouts a layer holds once served at every token count, and their bytes (CPU only).

    python scripts/layout_memory.py                       # the benchmark presets, H200 plans up to 8192 tokens
    python scripts/layout_memory.py --layers 384,7168,256,8 --scheme int4_g32 --max-tokens 512 --gpu "NVIDIA H100 80GB HBM3"
    W4A16_MOE_LAYOUTS=2 python scripts/layout_memory.py   # under a layout budget (kernels/cute/layout_budget.py)

For each layer it plans the calls ``w4a16_moe.warmup`` plans (``provider.warmup_plans``: the selection grid up to
``--max-tokens``, whose decisions every count up to it runs, and the tuned table's counts; both finalize modes, and the
expert-parallel halves of the deterministic ones) on a device
description (no GPU needed: the kernels are assumed available), packs every layout those plans read on the CPU for
one expert (the layouts' bytes scale with the expert count), and prints how many layouts each matrix has and their
bytes over the canonical tensors' (``MoEWeights.packed_nbytes`` over ``nbytes_per_expert``).

``--estimate`` adds, per INT4 layer, what keeping fewer layouts would cost by the cost model's reckoning (not a
measurement): over the grouped calls of 16, 32, ..., ``--max-tokens`` tokens, the model's best choice among those
reading one (w13, w2) layout pair, or two pairs, against its best choice overall (geometric mean and worst ratio; the
decode kernels, which read a fixed SM90 pair, are not in it).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch

import w4a16_moe as wm
from w4a16_moe.activations import get_activation
from w4a16_moe.bench.presets import PRESETS
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import provider, registry
from w4a16_moe.validate import MoECall


def layer_layouts(e: int, h: int, i: int, top_k: int, scheme: str, activation: str = "swiglu", bias: bool = False,
                  global_experts=None, max_tokens: int = 8192, info: DeviceInfo = None) -> tuple:
    """``(weights of one expert with every layout packed, canonical bytes per expert)`` of a layer: the layouts of
    the plans ``w4a16_moe.warmup`` makes (``provider.warmup_plans``)."""
    act = get_activation(activation)
    n13 = 2 * i if act.gated else i
    torch.manual_seed(0)
    w = wm.quantize_experts(torch.randn(1, n13, h) * 0.05, torch.randn(1, h, i) * 0.05, scheme, activation=activation)
    seen = set()
    for _, p in provider.warmup_plans(info, e, h, i, scheme, torch.bfloat16, torch.device("cuda"), act, top_k,
                                      max_tokens, has_bias=bias, global_experts=global_experts):
        fam = registry.get(p.family)
        for which, cfg in zip(("w13", "w2"), p.configs):
            if (p.family, cfg, p.pad) not in seen:
                seen.add((p.family, cfg, p.pad))
                provider._packed(fam, w, which, cfg, torch.bfloat16, p.pad)
    return w, w.nbytes_per_expert()


def layout_pair_estimate(e: int, h: int, i: int, top_k: int, scheme: str, global_experts=None,
                         max_tokens: int = 8192, sm_count: int = 132) -> dict:
    """The cost model's price of fewer layouts on a gated INT4 layer: ``{"one": (pairs, geomean, worst), "two":
    (...)}``, the best one / two (w13, w2) layout pairs and their predicted time over the model's best choice at
    16, 32, ..., ``max_tokens`` tokens (geometric mean, worst), and ``"pairs"``: how many pairs the unrestricted picks
    read."""
    from w4a16_moe.formats.schemes import get_scheme
    from w4a16_moe.kernels.cute import cost_model
    from w4a16_moe.kernels.cute.sm90 import family as sm90

    sch = get_scheme(scheme)

    def pair(family: str, tiles: dict) -> tuple:
        fam = registry.get(family)
        up, down = fam.configs(sch, "bf16", "swiglu", True, "deterministic", tiles)
        return fam.layout_key("w13", up, torch.bfloat16), fam.layout_key("w2", down, torch.bfloat16)

    cands = sm90.model_pool(h, i, True, scheme)
    rows = {}
    for t in (2**j for j in range(4, 31) if 2**j <= max_tokens):
        for name, (f, tiles) in cands.items():
            us = cost_model.predict_us(name, t * top_k, e, *sm90.run_sizes(f, tiles, h, i, True, scheme), True,
                                       top_k, global_experts, sm_count)
            if us is not None:
                rows.setdefault(t, []).append((us, pair(f, tiles)))
    best = {t: min(u for u, _ in r) for t, r in rows.items()}
    pairs = sorted({p for r in rows.values() for _, p in r})

    def price(allowed: set) -> tuple:
        ratios = [min((u for u, p in r if p in allowed), default=math.inf) / best[t] for t, r in rows.items()]
        if not all(map(math.isfinite, ratios)):
            return math.inf, math.inf
        return math.exp(sum(map(math.log, ratios)) / len(ratios)), max(ratios)

    out = {"pairs": len({min(r)[1] for r in rows.values()})}
    for name, n in (("one", 1), ("two", 2)):
        got = min((price(set(c)) + (c,) for c in itertools.combinations(pairs, n)), default=None)
        out[name] = (got[2], got[0], got[1]) if got else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", nargs="*", help="E,H,I,TOPK[,E_GLOBAL] (default: the benchmark presets)")
    ap.add_argument("--scheme", default="int4_g128", help="scheme of --layers")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--gpu", default="NVIDIA H200", help="device name the plans are made for (tuned tables)")
    ap.add_argument("--estimate", action="store_true", help="the cost model's price of one / two layout pairs")
    args = ap.parse_args(argv)
    provider._kernels_available = lambda arch: None  # plan as if every kernel were built
    info = DeviceInfo("cuda", args.gpu, (9, 0), 132)
    if args.layers:
        rows = []
        for text in args.layers:
            v = [int(x) for x in text.split(",")]
            rows.append((text, v[:4], args.scheme, "swiglu", False, v[4] if len(v) > 4 and v[4] != v[0] else None))
    else:
        rows = [(name, [p.local_experts, p.hidden, p.intermediate, p.top_k], p.default_scheme, p.activation, p.bias,
                 p.global_experts if p.global_experts != p.local_experts else None) for name, p in PRESETS.items()]
    print(f"{'layer':22s} {'scheme':12s} w13 w2  packed/canonical  layouts")
    for name, (e, h, i, k), scheme, act, bias, g in rows:
        w, canonical = layer_layouts(e, h, i, k, scheme, act, bias, g, args.max_tokens, info)
        held = w.packed_nbytes()
        n13 = sum(":w13:" in key for key in held)
        n2 = sum(":w2:" in key for key in held)
        keys = ", ".join(sorted(key.replace(":torch.bfloat16", "") for key in held))
        print(f"{name:22s} {scheme:12s} {n13:3d} {n2:3d}  {sum(held.values()) / canonical:15.2f}  {keys}")
        if args.estimate and scheme.startswith("int4") and get_activation(act).gated:
            est = layout_pair_estimate(e, h, i, k, scheme, g, args.max_tokens)
            for label in ("one", "two"):
                pairs, gm, worst = est[label]
                names = " + ".join("/".join(p.replace(":torch.bfloat16", "") for p in pr) for pr in pairs)
                print(f"    model estimate, {label} pair(s) ({names}): {gm:.3f} x (worst {worst:.3f}) of the "
                      f"{est['pairs']}-pair picks at 16-{args.max_tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())

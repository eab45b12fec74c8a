"""Time every grouped-GEMM choice the CuTe provider can make on a set of layers (GPU; data for the selection rule).

    python scripts/sweep_tiles.py --layers 8,4096,14336,2 128,2048,768,8 --tokens 16,64,256,1024 \\
        [--scheme int4_g128] [--dtype bf16] [--finalize deterministic] [--json out.json] [--budget-s 500] [--kernels]
        [--splits rule,1] [--decode-only] [--no-hint] [--decode-splits rule,1] [--decode-knobs w16u4c132f/w16u2,...]

For each layer (``E,H,I,TOPK[,E_GLOBAL]``: uniform routing over the E local experts, or with ``E_GLOBAL > E``
over E_GLOBAL experts of which the E local ones are ids 0..E-1, one expert-parallel rank, its calls carrying the
``global_num_experts`` hint, or with ``--no-hint`` not) and token count it times, like the
autotuner (:mod:`w4a16_moe.kernels.cute.autotune`: first call checked against the FP32 reference, then CUDA
graph replays), every candidate of ``autotune.candidates`` whose kernels the loader has (prebuilt or cached):
the rule's buckets and the tuned table's tiles of the SM90 family, the warp family's tiles, each with the
split-K rule and 1, 2, 4, 8 (``--splits``: fewer, or other counts; the default choice is always timed), and the
decode path where it applies. It writes every time, not only the
fastest, with the selection's default choice marked, so a rule or cost model can be fitted and checked
against all of it. ``--kernels`` adds each choice's kernels apart (route preparation, gate/up GEMM, down GEMM,
finalize: name and median us of five eager calls under ``torch.profiler``), so each GEMM can be modelled alone. Kernels are never compiled here (``W4A16_MOE_DISABLE_JIT=1`` on the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def parse_layer(spec: str) -> tuple:
    """``"E,H,I,TOPK[,E_GLOBAL]"`` -> ``(E, H, I, TOPK, E_GLOBAL or None)`` (None: every expert local)."""
    parts = spec.split(",")
    if len(parts) not in (4, 5) or not all(p.strip().isdigit() for p in parts):
        raise SystemExit(f"--layers: expected E,H,I,TOPK[,E_GLOBAL] (positive integers), got {spec!r}")
    e, h, i, k, *rest = (int(p) for p in parts)
    g = rest[0] if rest else None
    if min(e, h, i, k) < 1 or (g is not None and g < e):
        raise SystemExit(f"--layers: sizes must be >= 1 and E_GLOBAL >= E, got {spec!r}")
    return e, h, i, k, (g if g and g > e else None)


def measure(x, weights, tw, ids, ref, call, choice, plan, default, kernels: bool) -> dict:
    """One sweep result of ``choice`` (its ``plan``) on a call: its output (poisoned with NaN first) checked
    against ``ref`` (a zero reference takes a zero output), then its CUDA-graph time and, with ``kernels``, its
    kernels apart; ``{"choice", "error"}`` where the check or the call fails."""
    import torch

    from w4a16_moe.bench.profile import kernels_in_order
    from w4a16_moe.kernels.cute import autotune as at
    from w4a16_moe.kernels.cute.provider import cute_fused_moe

    o = torch.full_like(x, float("nan"))
    try:
        cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=plan)
        torch.cuda.synchronize()
        err = ((o.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if not (err < at.MAX_NRMSE and bool(torch.isfinite(o).all())):
            return dict(choice=choice.label(), error=f"nrmse {err:.3g}")
        fn = lambda: cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=plan)  # noqa: E731
        us = at._time_us(fn)
        kern = [[n, round(t_us, 2)] for n, t_us in kernels_in_order(fn, calls=5)] if kernels else None
    except Exception as ex:  # noqa: BLE001 - recorded, the sweep goes on
        return dict(choice=choice.label(), error=f"{type(ex).__name__}: {str(ex)[:200]}")
    return dict(choice=choice.label(), family=plan.family, decode=bool(plan.decode), tiles=dict(plan.tiles),
                splits=list(plan.splits), us=round(us, 2), nrmse=round(err, 5),
                default=(default is not None and choice == default), **({"kernels": kern} if kern is not None else {}))


def decode_split(choice):
    """The K split a decode choice forces (its knob text's ``s<N>``, both kernels alike), None: the rule's."""
    from w4a16_moe.kernels.cute.decode.family import forced_splits, knob_items

    return forced_splits(knob_items(choice.candidate or None))[0]


def kept(choice, default, splits: set, decode_only: bool, decode_splits=None) -> bool:
    """Whether the sweep times ``choice``: the default one; a decode choice when its K split is in
    ``decode_splits`` (None: every one); a grouped choice when its split-K choice is in ``splits`` (None: the
    rule's) and ``decode_only`` is off."""
    if choice == default:
        return True
    if choice.decode:
        return decode_splits is None or decode_split(choice) in decode_splits
    return bool(choice.splits in splits and not decode_only)


def with_splits(cands: list, counts) -> list:
    """``cands`` and, for each grouped tile among them, a choice at each split count of ``counts`` (the counts
    ``--splits`` asks for that the autotuner does not time: it offers the rule's and ``autotune.SPLITS``)."""
    from w4a16_moe.kernels.cute.autotune_store import Choice

    tiles = dict.fromkeys((c.family, c.candidate) for c in cands if not c.decode)
    more = [Choice(f, cand, sp) for f, cand in tiles for sp in counts]
    return list(cands) + [c for c in more if c not in cands]


def _split_set(text: str, flag: str) -> set:
    words = [v.strip() for v in text.split(",") if v.strip()]
    if not words or not all(v == "rule" or (v.isdigit() and int(v) >= 1) for v in words):
        raise SystemExit(f"{flag}: expected 'rule' and / or positive counts separated by commas, got {text!r}")
    return {None if v == "rule" else int(v) for v in words}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", nargs="+", required=True, help="E,H,I,TOPK[,E_GLOBAL] per layer")
    ap.add_argument("--tokens", default="16,64,256,1024")
    ap.add_argument("--scheme", default="int4_g128")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--finalize", default="deterministic")
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting new rows after this long")
    ap.add_argument("--splits", default="rule,1,2,4,8",
                    help="split-K choices of the grouped tiles to time: 'rule' and / or counts (default all)")
    ap.add_argument("--decode-only", action="store_true",
                    help="time only the decode path's choices (and the default choice), not the grouped tiles")
    ap.add_argument("--no-hint", action="store_true",
                    help="layers with E_GLOBAL: draw the routing over E_GLOBAL experts but call without the "
                         "expert-parallel hint (an EP rank whose caller passes no global expert count)")
    ap.add_argument("--decode-splits", default=None,
                    help="K splits of the decode choices to time: 'rule' and / or counts (default all)")
    ap.add_argument("--decode-knobs", default="",
                    help="comma-separated decode knob sets to time beside the selection's (each with the K "
                         "splits of --decode-splits), e.g. w16u4c132f/w16u2")
    ap.add_argument("--kernels", action="store_true",
                    help="also record each choice's kernels apart (torch.profiler, eager calls, launch order)")
    args = ap.parse_args(argv)

    import torch

    from w4a16_moe.activations import get_activation
    from w4a16_moe.bench.workloads import SEED, Workload, make_weights
    from w4a16_moe.device import probe
    from w4a16_moe.kernels.cute import autotune as at
    from w4a16_moe.kernels.cute import choice_plan
    from w4a16_moe.reference import reference_moe
    from w4a16_moe.validate import MoECall

    splits = _split_set(args.splits, "--splits")
    dsplits = None if args.decode_splits is None else _split_set(args.decode_splits, "--decode-splits")
    from w4a16_moe.kernels.cute.autotune import DECODE_SPLITS, SPLITS, Choice, with_decode_split

    extra_splits = sorted(sp for sp in splits if sp not in SPLITS)
    if dsplits is not None and not dsplits <= set(DECODE_SPLITS):
        raise SystemExit(f"--decode-splits: the decode choices are timed at {sorted(sp for sp in DECODE_SPLITS if sp)} "
                         f"and 'rule', got {sorted(sp for sp in dsplits - set(DECODE_SPLITS))}")
    from w4a16_moe.kernels.cute.decode.family import parse_knobs

    extra = [kn for kn in args.decode_knobs.split(",") if kn.strip()]
    for kn in extra:
        parse_knobs(kn)  # a malformed set stops the sweep before it starts
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    act = get_activation(args.activation)
    tokens = [int(t) for t in args.tokens.split(",")]
    dev = torch.device("cuda")
    info = probe(dev)
    t_start = time.perf_counter()
    rows = []
    for spec in args.layers:
        e, h, i, k, g = parse_layer(spec)
        wl = Workload(f"sweep-{spec}", spec, g or e, e, h, i, k, args.scheme, tuple(tokens), args.dtype,
                      args.activation)
        weights = make_weights(wl, torch.Generator(device=dev).manual_seed(SEED), dev)
        memo: dict = {}
        for t in tokens:
            if time.perf_counter() - t_start > args.budget_s:
                print(f"# budget spent: {spec} T={t} and later rows not measured", flush=True)
                break
            call = MoECall(t, k, h, i, e, dtype, dev, act, args.finalize, 0, weights.scheme.name,
                           global_experts=None if args.no_hint else g)
            default = at._default_choice(call, info)
            cands = with_splits(at.candidates(call, info, memo=memo), extra_splits)
            cands = [c for c in cands if kept(c, default, splits, args.decode_only, dsplits)]
            if extra and call.tokens * call.top_k <= at.DECODE_TUNE_MAX_ROUTES:
                more = [Choice("decode", with_decode_split(kn, sp)) for kn in extra for sp in DECODE_SPLITS
                        if dsplits is None or sp in dsplits]
                cands += [c for c in more if c not in cands]
            x, tw, ids = at._inputs(weights, t, k, dtype, seed=2000 + t, global_experts=g)
            ref = reference_moe(x, weights, tw, ids, activation=act.name)
            res = []
            for c in cands:
                p = choice_plan.plan_of_choice(call, info, c)
                if p is not None:
                    res.append(measure(x, weights, tw, ids, ref, call, c, p, default, args.kernels))
            ok = [r for r in res if "us" in r]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            dflt = next((r for r in ok if r["default"]), None)
            print(f"{spec} T={t}: {len(ok)} timed; best {best and best['choice']} {best and best['us']} us;"
                  f" default {dflt and dflt['choice']} {dflt and dflt['us']} us", flush=True)
            rows.append(dict(layer=spec, E=e, E_global=g or e, hint=bool(g) and not args.no_hint, H=h, I=i, top_k=k,
                             tokens=t, scheme=args.scheme, dtype=args.dtype,
                             finalize=args.finalize, default=default and default.label(), results=res))
            if args.json:  # after every row: a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(dict(device=info.name, sm_count=info.sm_count, rows=rows), f, indent=1)
            del x, tw, ids, ref
        del weights
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=info.name, sm_count=info.sm_count, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

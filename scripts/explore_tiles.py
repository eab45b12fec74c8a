"""Time tile shapes the selection cannot choose (no candidate, no prebuilt kernel) beside the default choice.

    # CPU: the specs of the default plans and of every tile in TILES.json on those calls, then build them
    python scripts/explore_tiles.py specs --tiles TILES.json --layers 256,7168,256,8 8,4096,14336,2 \\
        --tokens 512,2048 --out .device/explore_specs.json
    python -m w4a16_moe aot --archs sm_90a --specs .device/explore_specs.json --out .device/explore -j 2
    # GPU (carry .device/explore; JIT off): every tile and the default, checked against the reference, timed
    W4A16_MOE_PREBUILT_DIR=.device/explore W4A16_MOE_DISABLE_JIT=1 python scripts/explore_tiles.py time \\
        --tiles TILES.json --layers ... --tokens 512,2048 --json explore.json [--budget-s 400]

``TILES.json`` is a list of tile dicts of the SM90 family (``sm90.family.CANDIDATES``' keys, ``down_*`` for the
down GEMM), or ``{"family": "warp" | "sm90", "tiles": {...}}`` entries. They are registered as candidates of this
process only (``autotune_store.candidate_tiles``), so ``choice_plan.plan_of_choice`` plans them exactly as the
autotuner plans a candidate (split-K: the family's rule, or unsplit with ``--splits 1``). ``--model`` adds every
choice the cost model chooses among, on the layers where it may choose it: the data ``scripts/fit_cost_model.py``
fits the model on (``--model --splits 1``; docs/perf/2026-12-06-refit16). Layers are ``E,H,I,TOPK[,E_GLOBAL]`` as in
``scripts/sweep_tiles.py``, and ``time`` writes that script's JSON rows (``choice``, ``family``, ``tiles``,
``splits``, ``us``, ``nrmse``, ``kernels``, ``default``), so ``scripts/fit_cost_model.py`` reads them. Each
choice is measured as ``sweep_tiles.measure`` measures a candidate (NaN-poisoned output checked against the FP32
reference, then timed, with its kernels apart).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))


def load_tiles(path: str) -> list:
    """``[(family, tiles)]`` of a tiles file (see the module docstring)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, list) or not data:
        raise SystemExit(f"--tiles {path}: expected a non-empty JSON list of tile dicts")
    out = []
    for i, x in enumerate(data):
        fam, t = (x.get("family"), x.get("tiles")) if isinstance(x, dict) and "tiles" in x else ("sm90", x)
        if fam not in ("sm90", "warp") or not isinstance(t, dict) or "tokens_per_tile" not in t:
            raise SystemExit(f"--tiles {path}: entry {i} must be a tile dict with tokens_per_tile, or "
                             "{'family': 'sm90' | 'warp', 'tiles': {...}}")
        out.append((fam, dict(t)))
    return out


_ADDED: dict = {}  # family -> {candidate name: tiles} registered by this process


def register(extra: list) -> list:
    """Make the tiles of ``extra`` candidates of this process; returns their ``(family, name)``."""
    from w4a16_moe.kernels.cute import autotune_store as store
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name

    if not _ADDED:
        base = store.candidate_tiles

        def candidate_tiles(family: str) -> dict:
            return {**base(family), **_ADDED.get(family, {})}

        store.candidate_tiles = candidate_tiles
    names = []
    for fam, t in extra:
        n = candidate_name(t)
        _ADDED.setdefault(fam, {})[n] = t
        names.append((fam, n))
    return names


def parse_twin(text: str) -> dict:
    """``--twin`` ``KEY=VALUE[,KEY=VALUE...]`` -> tile overrides (values: JSON, else the string)."""
    out = {}
    for item in filter(None, (v.strip() for v in (text or "").split(","))):
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--twin: expected KEY=VALUE items separated by commas, got {item!r}")
        try:
            out[key] = json.loads(val)
        except ValueError:
            out[key] = val
    return out


def twin_choices(call, info, default, twin: dict) -> list:
    """The default choice's SM90 tiles with ``twin``'s overrides, as a registered candidate with the default's
    split-K (``[]``: no override given, no SM90 default, or overrides that change nothing)."""
    from w4a16_moe.kernels.cute import choice_plan
    from w4a16_moe.kernels.cute.autotune_store import Choice

    if not twin or default is None or default.family != "sm90":
        return []
    plan = choice_plan.plan_of_choice(call, info, default)
    if plan is None or {**dict(plan.tiles), **twin} == dict(plan.tiles):
        return []
    tiles = {**dict(plan.tiles), **twin}
    (fam, name), = register([("sm90", tiles)])
    return [Choice(fam, name, default.splits)]


_MODEL: dict = {}  # (family, name) -> tiles of the --model choices (model_names), for row_choices' domain check


def model_names() -> list:
    """``[(family, name)]`` of every choice the cost model chooses among (``sm90.family.model_candidates``: the
    rule's tiles, the model tiles and the warp family's), as ``--model`` times them."""
    from w4a16_moe.kernels.cute.sm90 import family as sm90
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name

    out = []
    for fam, t in sm90.model_candidates():
        n = candidate_name(t)
        _MODEL[(fam, n)] = t
        out.append((fam, n))
    return out


def row_choices(call, names: list, splits) -> list:
    """The choices of ``names`` a row times, at ``splits`` (None: the family's rule): all of them, except that a
    ``--model`` choice outside the model's domain on this layer (``sm90.family.in_model_domain`` /
    ``scheme_ok``: rows the fit script would not use) is left out."""
    from w4a16_moe.kernels.cute.autotune_store import Choice
    from w4a16_moe.kernels.cute.sm90 import family as sm90

    out = []
    for f, n in names:
        t = _MODEL.get((f, n))
        if t is not None and not (sm90.in_model_domain(f, t, call.intermediate, call.activation.gated)
                                  and sm90.scheme_ok(t, call.scheme)):
            continue
        out.append(Choice(f, n, splits))
    return out


def calls(layers: list, tokens: list, args, device):
    import torch

    from sweep_tiles import parse_layer
    from w4a16_moe.activations import get_activation
    from w4a16_moe.validate import MoECall

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    for spec in layers:
        e, h, i, k, g = parse_layer(spec)
        for t in tokens:
            yield spec, (e, h, i, k, g), MoECall(t, k, h, i, e, dtype, device, get_activation(args.activation),
                                                  args.finalize, 0, args.scheme, global_experts=g)


def timed_calls(args, device, label: str):
    """Yield ``(spec, (e, h, i, k, g), call, (x, tw, ids), ref)`` for each call of ``args.layers`` x ``args.tokens``
    on ``device``: one layer's weights at a time (the benchmark's data, workload ``<label>-<spec>``), fresh inputs per
    call and their FP32 reference. Starts no call after ``args.budget_s`` seconds."""
    import torch

    from w4a16_moe.bench.workloads import SEED, Workload, make_weights
    from w4a16_moe.kernels.cute import autotune as at
    from w4a16_moe.reference import reference_moe

    t0 = time.perf_counter()
    weights, cur = None, None
    for spec, (e, h, i, k, g), call in calls(args.layers, args.tokens, args, device):
        if time.perf_counter() - t0 > args.budget_s:
            print(f"# budget spent: {spec} T={call.tokens} and later rows not measured", flush=True)
            return
        if spec != cur:
            weights = None
            torch.cuda.empty_cache()
            wl = Workload(f"{label}-{spec}", spec, g or e, e, h, i, k, args.scheme, tuple(args.tokens), args.dtype,
                          args.activation)
            weights, cur = make_weights(wl, torch.Generator(device=device).manual_seed(SEED), device), spec
        x, tw, ids = at._inputs(weights, call.tokens, k, call.dtype, seed=2000 + call.tokens, global_experts=g)
        ref = reference_moe(x, weights, tw, ids, activation=call.activation.name)
        yield spec, (e, h, i, k, g), call, weights, (x, tw, ids), ref


def add_plan_specs(specs: dict, plans) -> int:
    """Add the kernel specs of every plan of ``plans`` to ``specs`` (``{name: spec}``); returns how many of
    ``plans`` are None (a choice that cannot run the call), which add nothing."""
    from w4a16_moe.kernels.cute import provider

    for p in plans:
        if p is not None:
            fam = provider.registry.get(p.family)
            for cfg in p.configs:
                s = fam.spec_for(cfg)
                specs[s.name] = s
    return sum(p is None for p in plans)


def write_specs(specs: dict, path: str) -> None:
    """``specs``' values as the JSON list ``python -m w4a16_moe aot --specs`` reads."""
    with open(path, "w") as f:
        json.dump([s.to_json() for s in specs.values()], f)


def cmd_specs(args, names) -> int:
    import torch

    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import autotune as at
    from w4a16_moe.kernels.cute import choice_plan, provider

    info = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
    provider._kernels_available = lambda arch: None  # plan without looking for kernels
    specs, skipped = {}, 0
    for _, _, call in calls(args.layers, args.tokens, args, torch.device("cuda")):
        twins = twin_choices(call, info, at._default_choice(call, info), args.twin) if args.twin else []
        plans = [provider.plan(call, info)] + [choice_plan.plan_of_choice(call, info, c)
                                               for c in row_choices(call, names, args.splits) + twins]
        skipped += add_plan_specs(specs, plans)
    write_specs(specs, args.out)
    print(f"{len(specs)} specs -> {args.out}" + (f" ({skipped} tile x call pairs cannot run)" if skipped else ""))
    return 0


def cmd_time(args, names) -> int:
    import torch

    from sweep_tiles import measure
    from w4a16_moe.device import probe
    from w4a16_moe.kernels.cute import autotune as at
    from w4a16_moe.kernels.cute import choice_plan

    dev = torch.device("cuda")
    info = probe(dev)
    rows = []
    for spec, (e, h, i, k, g), call, weights, (x, tw, ids), ref in timed_calls(args, dev, "explore"):
        t = call.tokens
        default = at._default_choice(call, info)
        res = []
        choices = [default] + [c for c in row_choices(call, names, args.splits) if c != default]
        twins = twin_choices(call, info, default, args.twin)
        # --twin-first: the twin before the default (the GPU warms over a row: swap to see the order's share)
        for c in (twins + choices if args.twin_first else choices + twins):
            p = None if c is None else choice_plan.plan_of_choice(call, info, c)
            if p is not None:
                res.append(measure(x, weights, tw, ids, ref, call, c, p, default, kernels=True))
                print(f"{spec} T={t} {c.label()[:80]:80s} {res[-1].get('us', res[-1].get('error'))}", flush=True)
        rows.append(dict(layer=spec, E=e, E_global=g or e, H=h, I=i, top_k=k, tokens=t, scheme=args.scheme,
                         dtype=args.dtype, finalize=args.finalize, default=default and default.label(), results=res))
        with open(args.json, "w") as f:  # after every row: a run cut short keeps what it measured
            json.dump(dict(device=info.name, sm_count=info.sm_count, rows=rows), f, indent=1)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("specs", "time"))
    ap.add_argument("--tiles", help="tile dicts to time beside the default (see above)")
    ap.add_argument("--model", action="store_true", help="also every choice the cost model chooses among, where "
                    "it may choose it (data for scripts/fit_cost_model.py)")
    ap.add_argument("--splits", default="rule", choices=("rule", "1"), help="split-K of the --tiles / --model "
                    "choices: the family's rule, or 1 (unsplit: the rows the fit script reads)")
    ap.add_argument("--twin", help="KEY=VALUE[,...]: also time each row's default plan with these tile keys "
                                   "changed (e.g. down_stage16=true)")
    ap.add_argument("--layers", nargs="+", required=True, help="E,H,I,TOPK[,E_GLOBAL] per layer")
    ap.add_argument("--tokens", default="512,2048")
    ap.add_argument("--scheme", default="int4_g128")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--activation", default="swiglu")
    ap.add_argument("--finalize", default="deterministic", choices=("deterministic", "fused"))
    ap.add_argument("--twin-first", action="store_true", help="time: each row's twin before its default")
    ap.add_argument("--out", help="specs: where the spec list goes")
    ap.add_argument("--json", help="time: where the rows go")
    ap.add_argument("--budget-s", type=float, default=400.0, help="time: stop starting new rows after this long")
    args = ap.parse_args(argv)
    args.tokens = [int(v) for v in args.tokens.split(",") if v.strip()]
    if not args.tokens or min(args.tokens) < 1:
        raise SystemExit(f"--tokens: expected positive counts separated by commas, got {args.tokens!r}")
    if args.command == "specs" and not args.out:
        raise SystemExit("specs: --out is required")
    if args.command == "time" and not args.json:
        raise SystemExit("time: --json is required")
    args.twin = parse_twin(args.twin)
    if not args.tiles and not args.twin and not args.model:
        raise SystemExit("give --tiles, --model, --twin or a combination")
    args.splits = None if args.splits == "rule" else int(args.splits)
    names = register(load_tiles(args.tiles)) if args.tiles else []
    if args.model:
        names += [n for n in model_names() if n not in names]
    return cmd_specs(args, names) if args.command == "specs" else cmd_time(args, names)


if __name__ == "__main__":
    sys.exit(main())

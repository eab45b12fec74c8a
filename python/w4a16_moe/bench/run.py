"""``python -m w4a16_moe bench``: time one MoE layer against its floor, on a GPU.

The layer: ``--workload kimi-tp8|deepseek-ep8`` (W1/W2 of docs/benchmarks.md, their data and rows exactly),
``--preset NAME`` (the layers of ``../shared/tools/peers``, same shapes, groups and default token counts;
``--list-presets``) or ``--layer E,H,I,TOPK[,E_GLOBAL]`` (``E_GLOBAL > E``: one EP rank owning ids
``0..E-1``), with ``--group``, ``--scheme``, ``--dtype`` and ``--activation`` (:mod:`.layers`). The data
generation and floor model are :mod:`.workloads`'. The project's calls pass the layer's ``E_GLOBAL`` as
``fused_moe(..., global_num_experts=)`` (the expert-parallel selection hint; a no-op when ``E_GLOBAL = E``).

Per row (token count): draw fresh inputs, compute the FP32 reference, check every provider's output
(NRMSE < 0.02, output poisoned with NaN first), then time the whole local MoE call with warm CUDA-graph
replay (``triton.testing.do_bench_cudagraph(fn, rep=150)``), three samples per provider taken in
alternating provider order, and report the median. ``--json`` writes a list of records (:mod:`.records`:
``layer, tokens, impl, median_us, floor_eff_us, nrmse, device, revision`` and more), ``--markdown`` a
table, ``--plot`` latency against tokens with the floor.

``--autotune``: before timing, run :func:`w4a16_moe.warmup` with ``autotune=True`` for the layer (its top-k,
dtype and activation, the largest token count, both finalize modes; ``--autotune-budget`` seconds, default 60),
so the rows measure the plans the on-device autotuner stored; the warmup's wall time is printed and recorded in
the run's meta (``warmup_s``). Without it the rows measure the shipped selection alone (a stored autotune row
of the same layer and versions in the project-local cache is used either way: clear the cache's ``autotune``
folder for a cold measurement).

Providers (impl name in the records): ``cute`` or ``auto`` (``w4a16_moe``: CuTe / the project's own choice,
deterministic finalize: fixed-order FP32 combine, no split-K, batch-invariant), ``cute-fused``
(``w4a16_moe_fused``: CuTe, fused finalize: FP32 atomics in the down GEMM, split-K allowed), ``triton``
(``w4a16_moe_triton``, deterministic), ``dense-bf16`` (``dense_bf16``: dequantized weights in the
activation dtype through ``torch._grouped_mm``, for scale). Humming and Marlin are measured by the peers
tool (``scripts/gpu_presets.sh``; ``python -m w4a16_moe.bench.merge`` combines the records).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
from typing import Callable, Optional

import torch

from .. import settings
from .. import __version__
from ..activations import apply_activation
from ..api import fused_moe
from ..reference import reference_moe
from . import records as rec
from .workloads import SEED, WORKLOADS, Workload, benchmark_rows, floor_us, make_weights

__all__ = ["run_bench", "PROVIDERS", "main"]

PROVIDERS = ("cute", "auto", "cute-fused", "triton", "dense-bf16")
NRMSE_LIMIT = rec.NRMSE_LIMIT


def _nrmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _dense_bf16(wl: Workload, weights):
    """A dense 16-bit MoE (dequantized weights in the activation dtype, ``torch._grouped_mm``): what 16-bit
    weights would cost."""
    if not hasattr(torch, "_grouped_mm"):
        return None
    dt = wl.torch_dtype
    w13, w2 = weights.dequantize()
    w13, w2 = w13.to(dt), w2.to(dt)  # [E, N, K] contiguous: K-major operands
    e = weights.num_experts
    b13 = None if weights.w13_bias is None else weights.w13_bias.to(dt)
    b2 = None if weights.w2_bias is None else weights.w2_bias.to(dt)

    def run(x, tw, ids):
        t, k = ids.shape
        local = ids.long()
        valid = (local >= 0) & (local < e)
        key = torch.where(valid, local, e).flatten()
        order = torch.sort(key, stable=True).indices
        counts = torch.zeros(e + 1, dtype=torch.int32, device=x.device).scatter_add_(
            0, key, torch.ones_like(key, dtype=torch.int32))
        offs = torch.cumsum(counts[:e], 0, dtype=torch.int32)
        xs = x[order // k]
        h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
        ex = key[order].clamp(max=e - 1)  # each sorted row's expert (rows of invalid routes are dropped below)
        if b13 is not None:
            h = h + b13[ex]
        a = apply_activation(h, wl.activation).to(dt)
        y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offs).float()
        if b2 is not None:
            y = y + b2[ex].float()
        keep = valid.flatten()[order]
        y = torch.where(keep[:, None], y * tw.flatten()[order][:, None], 0.0)  # rows past offs[-1] are unwritten
        out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, order // k, y)
        return out.to(x.dtype)

    return run


def _provider_fn(name: str, wl: Workload, weights) -> Optional[Callable]:
    if name == "dense-bf16":
        return _dense_bf16(wl, weights)
    backend, finalize = (name, "deterministic") if name != "cute-fused" else ("cute", "fused")

    def run(x, tw, ids, out=None):
        # the layer's global expert count as the selection hint (None-equivalent when every expert is local)
        return fused_moe(x, weights, tw, ids, activation=wl.activation, finalize=finalize, backend=backend,
                         out=out, global_num_experts=wl.global_experts)

    return run


def _time(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=150)) * 1000.0  # ms -> us


def run_bench(workload: "str | Workload", providers: list[str], tokens: Optional[list[int]] = None,
              samples: int = 3, log=print, device: str = "cuda", timer: Optional[Callable] = None,
              autotune_s: Optional[float] = None) -> dict:
    """Measure ``workload`` (a :data:`WORKLOADS` name or a :class:`Workload`) at ``tokens`` (default: its
    rows). Returns ``{"meta": ..., "records": [...]}`` (records: :mod:`.records`' schema, one per row and
    provider that ran). ``device`` and ``timer`` (default :func:`_time`) are for tests off the GPU.
    ``autotune_s``: run ``warmup(..., autotune=True, autotune_budget_s=autotune_s)`` first (meta ``warmup_s``)."""
    wl = WORKLOADS[workload] if isinstance(workload, str) else workload
    dev = torch.device(device)
    timer = timer or _time
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    meta = _meta(wl, None if dev.type == "cuda" else str(dev))
    tokens = list(tokens or wl.tokens)
    if autotune_s is not None:
        import time

        from ..api import warmup

        t0 = time.perf_counter()
        warmup(weights, dtype=wl.torch_dtype, activation=wl.activation, top_k=wl.top_k, max_tokens=max(tokens),
               autotune=True, autotune_budget_s=autotune_s)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        meta["warmup_s"] = round(time.perf_counter() - t0, 2)
        meta["autotune_budget_s"] = autotune_s
        log(f"# warmup(autotune=True, budget {autotune_s:g} s, max_tokens {max(tokens)}): {meta['warmup_s']:.1f} s")
    fns = {}
    for p in providers:
        fn = _provider_fn(p, wl, weights)
        if fn is None:
            log(f"# provider {p}: not available here, skipped")
            continue
        fns[p] = fn
    records = []
    data = benchmark_rows(wl, tokens, gen, dev)
    for t in tokens:
        x, tw, ids = data.pop(t)
        fl = floor_us(wl, weights, t, ids)
        ref = reference_moe(x, weights, tw, ids, activation=wl.activation)
        row, errors = {}, {}
        for p, fn in fns.items():
            out = torch.full_like(x, float("nan"))
            try:
                got = fn(x, tw, ids) if p == "dense-bf16" else fn(x, tw, ids, out=out)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                err = _nrmse(got, ref)
                ok = bool(torch.isfinite(got).all()) and err < NRMSE_LIMIT
            except Exception as exc:  # a provider that cannot run a row is reported, not fatal
                log(f"# {p} @ {t} tokens failed: {type(exc).__name__}: {exc}")
                errors[p] = f"{type(exc).__name__}: {str(exc)[:300]}"
                continue
            row[p] = {"nrmse": err, "ok": ok, "samples": []}
            if not ok:
                log(f"# {p} @ {t} tokens: NRMSE {err:.4g} >= {NRMSE_LIMIT} or non-finite output: not timed")
        order = [p for p in fns if p in row and row[p]["ok"]]
        for s in range(samples):
            for p in (order if s % 2 == 0 else order[::-1]):
                fn = fns[p]
                out = torch.empty_like(x)
                call = (lambda fn=fn: fn(x, tw, ids)) if p == "dense-bf16" else (lambda fn=fn, out=out: fn(x, tw, ids, out=out))
                row[p]["samples"].append(timer(call))
        for p in fns:
            if p in row:
                r = row[p]
                med = statistics.median(r["samples"]) if r["samples"] else None
                records.append(_record(wl, meta, t, p, fl, med, r["samples"], r["nrmse"],
                                       None if r["ok"] else f"NRMSE {r['nrmse']:.4g} >= {NRMSE_LIMIT} or non-finite"))
            elif p in errors:
                records.append(_record(wl, meta, t, p, fl, None, [], None, errors[p]))
        cells = "  ".join(
            f"{p}={row[p]['samples'] and statistics.median(row[p]['samples']):9.1f}us"
            f" ({row[p]['samples'] and statistics.median(row[p]['samples']) / fl['floor_eff_us']:.2f}x)"
            if row.get(p) and row[p]["samples"] else f"{p}=      n/a" for p in fns)
        log(f"{wl.name} T={t:5d}  floor_eff={fl['floor_eff_us']:8.1f}us  {cells}")
        del x, tw, ids, ref
    return {"meta": meta, "records": records}


def _record(wl: Workload, meta: dict, tokens: int, provider: str, fl: dict, median, samples, nrmse, error) -> dict:
    """One record of :mod:`.records`' schema (the eight required fields first), with the benchmark's own
    fields (``workload``, ``provider``, ``samples_us``, ``floor_us``, ``experts_present``, ``local_routes``)."""
    r = {
        "layer": wl.name, "tokens": tokens, "impl": rec.PROVIDER_IMPL[provider], "median_us": median,
        "floor_eff_us": fl["floor_eff_us"], "nrmse": nrmse, "device": meta["device"], "revision": meta["revision"],
        "dtype": wl.dtype, "scheme": wl.scheme, "activation": wl.activation, "bias": wl.bias, "date": meta["date"],
        "source": "w4a16_moe bench", "provider": provider, "workload": wl.name, "samples_us": list(samples),
        "floor_us": fl["floor_us"], "experts_present": fl["experts_present"], "local_routes": fl["local_routes"],
        "layer_shape": {"E": wl.local_experts, "H": wl.hidden, "I": wl.intermediate, "topk": wl.top_k,
                        "E_global": wl.global_experts},
        "versions": meta["versions"],
    }
    if error:
        r["error"] = error
    if nrmse is not None and not math.isfinite(nrmse):
        r["nrmse"] = None  # JSON has no nan / inf; the error says why
        r.setdefault("error", f"non-finite output (NRMSE {nrmse})")
    return r


def _meta(wl: Workload, device_name: Optional[str] = None) -> dict:
    import importlib.metadata as md

    def ver(name: str) -> Optional[str]:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {
        "workload": wl.name,
        "layer": wl.name,
        "description": wl.description,
        "dtype": wl.dtype,
        "scheme": wl.scheme,
        "activation": wl.activation,
        "command": " ".join(["python -m w4a16_moe"] + sys.argv[1:]),
        "revision": settings.get().revision or _git_revision(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name or torch.cuda.get_device_name(),
        "versions": {
            "w4a16_moe": __version__, "torch": torch.__version__, "triton": ver("triton"),
            "nvidia-cutlass-dsl": ver("nvidia-cutlass-dsl"), "python": platform.python_version(),
            "cuda": torch.version.cuda, **_source_hashes(),
        },
        "timing": "triton.testing.do_bench_cudagraph(fn, rep=150); 3 samples per provider in alternating order; median",
    }


def _source_hashes() -> dict:
    """``{"source:<family>": hash}`` of every registered kernel family: what a tuned-table row must match to be
    used (:func:`w4a16_moe.kernels.cute.sm90.tuned.is_current`)."""
    from ..kernels.cute.autotune_store import running_versions

    return {k: v for k, v in running_versions().items() if k.startswith("source:")}


def _git_revision() -> Optional[str]:
    """``git rev-parse HEAD`` of the checkout, with ``+dirty`` when tracked files differ from it (a copied
    tree, e.g. on a GPU machine, may carry an older ``.git``: set ``W4A16_MOE_REVISION`` there)."""
    import subprocess

    here = os.path.dirname(__file__)
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=here).stdout.strip()
        if not rev:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=20, cwd=here).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:
        return None


def write_markdown(result: dict, path: str) -> None:
    """The records of ``result`` (:func:`run_bench`) as a markdown table, with the run's command and versions."""
    m = result["meta"]
    rec.write_markdown(result["records"], path, title=m["description"], notes=[
        f"command: `{m['command']}`", f"versions: {json.dumps(m['versions'])}", f"timing: {m['timing']}",
        "data: bench/workloads.py (seed 20260908); floor model: bench/workloads.floor_us"])


def write_plot(result: dict, path: str, log=None) -> bool:
    """Latency against tokens with the floor (False, with a message, when matplotlib is missing)."""
    return rec.write_plot(result["records"], path, log=log)


def _list_presets() -> str:
    from .presets import PRESETS

    lines = []
    for n, p in PRESETS.items():
        ep = f",{p.global_experts}" if p.global_experts != p.local_experts else ""
        how = f"--group {p.group}" if p.scheme is None else f"--scheme {p.scheme}"
        if p.activation != "swiglu":
            how += f" --activation {p.activation}"
        lines.append(f"{n:<20} --layer {p.local_experts},{p.hidden},{p.intermediate},{p.top_k}{ep} {how}"
                     f"{' +biases' if p.bias else ''}   {p.what}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    from .. import cli

    from .layers import LayerArgError, build_workload, parse_tokens

    ap = cli.parser("bench", __doc__, epilog="presets:\n" + _list_presets())
    ap.add_argument("--workload", default=None, help=f"docs/benchmarks.md workload: {', '.join(sorted(WORKLOADS))}")
    ap.add_argument("--preset", default=None, help="a layer of the peers tool (see below)")
    ap.add_argument("--layer", default=None,
                    help="E,H,I,TOPK[,E_GLOBAL]: local experts, hidden, intermediate, top-k, global experts "
                         "(E_GLOBAL > E: one EP rank owning ids 0..E-1)")
    ap.add_argument("--group", type=int, default=None,
                    help="INT4 group size 32|64|128 (default: the preset's or workload's, 128 for --layer)")
    ap.add_argument("--scheme", default=None, help="weight scheme (default int4_g<group>)")
    ap.add_argument("--dtype", default="bf16", help="activation dtype: bf16 (default) or fp16")
    ap.add_argument("--activation", default=None, help="swiglu (default; a preset's own, e.g. swiglu_oai for "
                    "gpt-oss-120b), geglu, swiglu_oai, relu2 or silu")
    ap.add_argument("--providers", default="cute,triton", help=f"comma-separated subset of {','.join(PROVIDERS)}")
    ap.add_argument("--tokens", default=None,
                    help="comma-separated token counts (default: the workload's rows, or the peers tool's "
                         "1,2,4,...,8192 for --preset / --layer)")
    ap.add_argument("--samples", type=int, default=3, help="timing samples per provider and row (default 3)")
    ap.add_argument("--json", default=None, help="write the records (a JSON list, one per row and provider)")
    ap.add_argument("--markdown", default=None, help="write a markdown table to this path")
    ap.add_argument("--plot", default=None, help="write a PNG plot of latency against tokens (needs matplotlib)")
    ap.add_argument("--autotune", action="store_true",
                    help="warmup(autotune=True) for the layer before timing (its wall time is recorded)")
    ap.add_argument("--autotune-budget", type=float, default=60.0,
                    help="the autotuner's time budget in seconds (default 60)")
    ap.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    args = ap.parse_args(argv)
    if args.list_presets:
        print(_list_presets())
        return 0
    try:
        wl, default_tokens = build_workload(workload=args.workload, preset=args.preset, layer=args.layer,
                                            group=args.group, scheme=args.scheme, dtype=args.dtype,
                                            activation=args.activation)
        tokens = parse_tokens(args.tokens) or list(default_tokens)
    except LayerArgError as e:
        ap.error(str(e))
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if not providers:
        ap.error("--providers: no provider given")
    seen = {}
    for p in providers:
        if p not in PROVIDERS:
            ap.error(f"--providers: unknown provider {p!r} (known: {', '.join(PROVIDERS)})")
        impl = rec.PROVIDER_IMPL[p]
        if impl in seen:
            ap.error(f"--providers: {seen[impl]} and {p} both report as impl {impl}; give one of them")
        seen[impl] = p
    if args.samples < 1:
        ap.error(f"--samples: must be >= 1, got {args.samples}")
    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    if not (args.autotune_budget > 0 and math.isfinite(args.autotune_budget)):
        ap.error(f"--autotune-budget: must be a positive number of seconds, got {args.autotune_budget}")
    result = run_bench(wl, providers, tokens, samples=args.samples,
                       autotune_s=args.autotune_budget if args.autotune else None)
    if args.json:
        rec.write_json(result["records"], args.json)
    if args.markdown:
        write_markdown(result, args.markdown)
    if args.plot:
        write_plot(result, args.plot)
    return 0

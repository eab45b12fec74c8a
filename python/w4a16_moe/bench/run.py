"""``python -m w4a16_moe bench``: reproduce the W1/W2 tables of docs/benchmarks.md on a GPU.

Per row (token count): draw fresh inputs, compute the FP32 reference, check every provider's output
(NRMSE < 0.02, output poisoned with NaN first), then time the whole local MoE call with warm CUDA-graph
replay (``triton.testing.do_bench_cudagraph(fn, rep=150)``), three samples per provider taken in
alternating provider order, and report the median. Records go to ``--json``; ``--plot`` draws
latency against tokens with the floor.

Providers: ``cute`` (CuTe, deterministic finalize: fixed-order FP32 combine, no split-K, batch-invariant),
``cute-fused`` (CuTe, fused finalize: FP32 atomics in the down GEMM, split-K allowed), ``triton``
(deterministic), ``dense-bf16`` (dequantized BF16 weights through ``torch._grouped_mm``, for scale).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
from typing import Callable, Optional

import torch

from .. import settings
from .. import __version__
from ..api import fused_moe
from ..reference import reference_moe
from .workloads import SEED, WORKLOADS, Workload, benchmark_rows, floor_us, make_weights

__all__ = ["run_bench", "PROVIDERS", "main"]

PROVIDERS = ("cute", "cute-fused", "triton", "dense-bf16")
NRMSE_LIMIT = 0.02


def _nrmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _dense_bf16(wl: Workload, weights):
    """A dense BF16 MoE (dequantized weights, ``torch._grouped_mm``): what 16-bit weights would cost."""
    if not hasattr(torch, "_grouped_mm"):
        return None
    w13, w2 = weights.dequantize()
    w13, w2 = w13.to(torch.bfloat16), w2.to(torch.bfloat16)  # [E, N, K] contiguous: K-major operands
    e, i = weights.num_experts, weights.intermediate_size

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
        a = (torch.nn.functional.silu(h[:, :i].float()) * h[:, i:].float()).to(torch.bfloat16)
        y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offs).float()
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
        return fused_moe(x, weights, tw, ids, activation="swiglu", finalize=finalize, backend=backend, out=out)

    return run


def _time(fn: Callable[[], object]) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=150)) * 1000.0  # ms -> us


def run_bench(workload: str, providers: list[str], tokens: Optional[list[int]] = None, samples: int = 3,
              log=print) -> dict:
    wl = WORKLOADS[workload]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    fns = {}
    for p in providers:
        fn = _provider_fn(p, wl, weights)
        if fn is None:
            log(f"# provider {p}: not available here, skipped")
            continue
        fns[p] = fn
    records = []
    tokens = list(tokens or wl.tokens)
    data = benchmark_rows(wl, tokens, gen, dev)
    for t in tokens:
        x, tw, ids = data.pop(t)
        fl = floor_us(wl, weights, t, ids)
        ref = reference_moe(x, weights, tw, ids)
        row = {}
        for p, fn in fns.items():
            out = torch.full_like(x, float("nan"))
            try:
                got = fn(x, tw, ids) if p == "dense-bf16" else fn(x, tw, ids, out=out)
                torch.cuda.synchronize()
                err = _nrmse(got, ref)
                ok = bool(torch.isfinite(got).all()) and err < NRMSE_LIMIT
            except Exception as exc:  # a provider that cannot run a row is reported, not fatal
                log(f"# {p} @ {t} tokens failed: {type(exc).__name__}: {exc}")
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
                row[p]["samples"].append(_time(call))
        for p, r in row.items():
            med = statistics.median(r["samples"]) if r["samples"] else None
            records.append({
                "workload": wl.name, "tokens": t, "provider": p, "median_us": med, "samples_us": r["samples"],
                "floor_us": fl["floor_us"], "floor_eff_us": fl["floor_eff_us"], "nrmse": r["nrmse"],
                "experts_present": fl["experts_present"], "local_routes": fl["local_routes"],
            })
        cells = "  ".join(
            f"{p}={row[p]['samples'] and statistics.median(row[p]['samples']):9.1f}us"
            f" ({row[p]['samples'] and statistics.median(row[p]['samples']) / fl['floor_eff_us']:.2f}x)"
            if row.get(p) and row[p]["samples"] else f"{p}=      n/a" for p in fns)
        log(f"{wl.name} T={t:5d}  floor_eff={fl['floor_eff_us']:8.1f}us  {cells}")
        del x, tw, ids, ref
    return {"meta": _meta(wl), "records": records}


def _meta(wl: Workload) -> dict:
    import importlib.metadata as md

    def ver(name: str) -> Optional[str]:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    return {
        "workload": wl.name,
        "description": wl.description,
        "command": " ".join(["python -m w4a16_moe"] + sys.argv[1:]),
        "revision": settings.get().revision or _git_revision(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "versions": {
            "w4a16_moe": __version__, "torch": torch.__version__, "triton": ver("triton"),
            "nvidia-cutlass-dsl": ver("nvidia-cutlass-dsl"), "python": platform.python_version(),
            "cuda": torch.version.cuda,
        },
        "timing": "triton.testing.do_bench_cudagraph(fn, rep=150); 3 samples per provider in alternating order; median",
    }


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
    recs = result["records"]
    provs = sorted({r["provider"] for r in recs}, key=lambda p: PROVIDERS.index(p) if p in PROVIDERS else 99)
    tokens = sorted({r["tokens"] for r in recs})
    by = {(r["tokens"], r["provider"]): r for r in recs}
    m = result["meta"]
    lines = [f"# {m['description']}", "",
             f"- command: `{m['command']}`", f"- revision: {m['revision']}", f"- date: {m['date']}",
             f"- device: {m['device']}", f"- versions: {json.dumps(m['versions'])}", f"- timing: {m['timing']}", "",
             "| tokens | floor_eff (us) | " + " | ".join(f"{p} (us) | {p} / floor_eff | {p} NRMSE" for p in provs) + " |",
             "|---:|---:|" + "---:|---:|---:|" * len(provs)]
    for t in tokens:
        fe = next(r["floor_eff_us"] for r in recs if r["tokens"] == t)
        cells = []
        for p in provs:
            r = by.get((t, p))
            if r is None or r["median_us"] is None:
                cells += ["n/a", "", ""]
            else:
                cells += [f"{r['median_us']:.1f}", f"{r['median_us'] / fe:.2f}", f"{r['nrmse']:.4f}"]
        lines.append(f"| {t} | {fe:.1f} | " + " | ".join(cells) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def write_plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = result["records"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in sorted({r["provider"] for r in recs}):
        pts = sorted((r["tokens"], r["median_us"]) for r in recs if r["provider"] == p and r["median_us"])
        ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=p)
    fl = sorted({(r["tokens"], r["floor_eff_us"]) for r in recs})
    ax.plot([a for a, _ in fl], [b for _, b in fl], "k--", label="floor_eff")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("latency (us)")
    ax.set_title(result["meta"]["description"], fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Optional[list[str]] = None) -> int:
    from .. import cli

    ap = cli.parser("bench", __doc__)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--providers", default="cute,triton", help=f"comma-separated subset of {','.join(PROVIDERS)}")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default: the workload's rows)")
    ap.add_argument("--json", default=None, help="write records (one per row and provider) to this path")
    ap.add_argument("--markdown", default=None, help="write a markdown table to this path")
    ap.add_argument("--plot", default=None, help="write a PNG plot of latency against tokens to this path")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    for p in providers:
        if p not in PROVIDERS:
            ap.error(f"--providers: unknown provider {p!r} (known: {', '.join(PROVIDERS)})")
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    result = run_bench(args.workload, providers, tokens)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        write_markdown(result, args.markdown)
    if args.plot:
        write_plot(result, args.plot)
    return 0

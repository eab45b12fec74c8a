"""``python -m w4a16_moe tune --workload kimi-tp8|deepseek-ep8 [--finalize ...] --json PATH``.

Times the CuTe provider's whole MoE call for every candidate tile shape (``sm90.family.CANDIDATES``: the
rule's buckets plus deep-pipeline decode shapes) and split-K choice (``--splits``, default: the rule and
1, 2, 4, 8) at each token count of a workload, the same way the benchmark times it (checked against the FP32
reference first, then CUDA-graph replay), and writes the best choice per token count as tuned-table
entries keyed by GPU name and layer shape (``e<E>of<E_global>`` for an EP rank, whose calls carry the
``global_num_experts`` hint here as in the benchmark; ``kernels/cute/sm90/tuned.json`` format: rows name their candidate
by ``candidate_name`` and carry the device, versions, revision and date of the run).

The data of a token count are the benchmark's row for it (the rows drawn in the workload's order from the
benchmark's seed). ``--routings N`` times every candidate on N routings of each token count, the benchmark's
row and N - 1 fresh draws, and decides by the mean: at a few tokens the time depends on how many local
routes and experts a routing has, and a choice should not rest on one draw.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import torch

from ..api import fused_moe
from ..kernels.cute import overrides
from ..kernels.cute.sm90 import family as fam
from ..kernels.cute.sm90.tuned import candidate_name
from ..reference import reference_moe
from .run import _meta, _nrmse, _time
from .workloads import SEED, WORKLOADS, benchmark_rows, make_inputs, make_weights

__all__ = ["tune", "main"]


def _rows(wl, tokens, routings: int, gen, dev) -> dict:
    """``{T: [(x, topk_weights, topk_ids), ...]}``: the benchmark's row for each of ``tokens``
    (:func:`~.workloads.benchmark_rows`), then ``routings - 1`` fresh draws."""
    first = benchmark_rows(wl, tokens, gen, dev)
    extra = torch.Generator(device=dev).manual_seed(SEED + 1)
    return {t: [first[t]] + [make_inputs(wl, t, extra, dev) for _ in range(routings - 1)] for t in tokens}


def tune(workload: str, finalize: str = "deterministic", tokens=None, log=print, splits=(None, 1, 2, 4, 8),
         buckets=None, decode_knobs=(), routings: int = 1) -> dict:
    """``decode_knobs``: knob sets (:func:`decode.family.parse_knobs` strings) of the route-major decode
    kernels to time beside the grouped-GEMM candidates (bucket ``"d:<knobs>"`` in the trials); ``routings``:
    routings per token count (see the module docstring); a trial's ``us`` is the mean over them."""
    from ..kernels.cute.decode import family as dec

    wl = WORKLOADS[workload]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    gpu = torch.cuda.get_device_name()
    # an EP rank's rows (routing over more experts than the local ones) go to its e<E>of<E_global> key
    key = fam.tuned_key(gpu, wl.local_experts, wl.hidden, wl.intermediate, wl.scheme, "bf16", wl.top_k,
                        wl.global_experts)
    hint = wl.global_experts  # the calls carry the global_num_experts hint, as the benchmark's do
    splits_opts = list(splits)
    buckets = list(range(len(fam.CANDIDATES))) if buckets is None else list(buckets)
    if routings < 1:
        raise ValueError(f"routings: expected >= 1, got {routings}")
    tokens = list(tokens or wl.tokens)
    data = _rows(wl, tokens, routings, gen, dev)
    rows, trials = [], []
    for t in tokens:
        cases = [(x, tw, ids, reference_moe(x, weights, tw, ids)) for x, tw, ids in data[t]]

        def measure(label, bucket, sp):
            """Check the forced choice against the reference on every routing, then time it into
            ``trials`` (mean over the routings)."""
            times, errs = [], []
            for x, tw, ids, ref in cases:
                out = torch.full_like(x, float("nan"))
                fused_moe(x, weights, tw, ids, finalize=finalize, backend="cute", out=out, global_num_experts=hint)
                err = _nrmse(out, ref)
                if not (err < 0.02 and bool(torch.isfinite(out).all())):
                    log(f"# T={t} {label}: NRMSE {err:.3g}, skipped")
                    return
                errs.append(err)
                times.append(_time(lambda: fused_moe(x, weights, tw, ids, finalize=finalize, backend="cute",
                                                     out=out, global_num_experts=hint)))
            trials.append({"tokens": t, "bucket": bucket, "splits": sp, "us": sum(times) / len(times),
                           "candidate": candidate_name(fam.CANDIDATES[bucket]) if isinstance(bucket, int) else None,
                           "us_per_routing": times, "nrmse": max(errs)})

        for kn in decode_knobs:
            with overrides.forced_decode(dec.parse_knobs(kn)):
                if dec.use_decode(t, wl.top_k, max_routes=1 << 30):
                    measure(f"decode {kn}", f"d:{kn}", None)
        for b in buckets:
            for sp in splits_opts:
                with overrides.forced(b, sp):
                    measure(f"bucket {b} splits {sp}", b, sp)
        here = [r for r in trials if r["tokens"] == t]
        if not here:
            raise RuntimeError(f"tune: no candidate passed the NRMSE check at T={t}")
        top = min(here, key=lambda r: r["us"])
        b = top["bucket"]
        what = (f"decode {b[2:]}" if isinstance(b, str)
                else f"bucket {b} (TN={fam.CANDIDATES[b]['tokens_per_tile']}) splits {top['splits']}")
        log(f"{wl.name} T={t:5d} best {what}: {top['us']:.1f} us   | " + "  ".join(
            f"b{r['bucket']}s{r['splits']}={r['us']:.1f}" for r in here))
        gemm = [r for r in here if not isinstance(r["bucket"], str)]
        if gemm:
            g = min(gemm, key=lambda r: r["us"])
            rows.append({"tokens": t, "family": "sm90", "candidate": g["candidate"], "splits": g["splits"],
                         "us": round(g["us"], 1)})
    meta = _meta(wl)
    prov = {k: meta[k] for k in ("device", "versions", "revision", "date")}
    rows = [{**r, **prov} for r in rows]
    dec_sum = decode_summary(trials, wl.top_k)
    if dec_sum is not None:
        dec_sum.update(prov)
    return {"key": key, "finalize": finalize, "rows": rows, "decode": dec_sum, "trials": trials, "meta": meta}


def decode_summary(trials: list, top_k: int) -> Optional[dict]:
    """The tuned-table ``decode`` entry the trials support: ``max_routes`` = ``T * top_k`` of the largest
    token count up to which the decode kernels won at every measured count (0: never), and the best knob set
    per token count where they won. None when no decode trial ran."""
    dec_t = sorted({r["tokens"] for r in trials if isinstance(r["bucket"], str)})
    if not dec_t:
        return None
    max_routes, knobs = 0, []
    for t in dec_t:
        rs = [r for r in trials if r["tokens"] == t]
        best = min(rs, key=lambda r: r["us"])
        if not isinstance(best["bucket"], str):
            break
        max_routes = t * top_k
        knobs.append([t, best["bucket"][2:]])
    return {"max_routes": max_routes, "knobs": knobs}


def main(argv: Optional[list[str]] = None) -> int:
    from .. import cli

    ap = cli.parser("tune", __doc__)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--finalize", default="deterministic", choices=["deterministic", "fused"])
    ap.add_argument("--tokens", default=None)
    ap.add_argument("--splits", default="rule,1,2,4,8", help="split-K choices to time ('rule' = num_splits)")
    ap.add_argument("--buckets", default=None, help="indices into sm90.family.CANDIDATES (default: all; 'none': only "
                    "--decode-knobs)")
    ap.add_argument("--decode-knobs", default="",
                    help="comma-separated decode-kernel knob sets to time too, e.g. w8u4/w8u2,w16u4/w8u2 "
                         "(gate_up / down: warps w, unroll u; cN: a persistent grid of at most N CTAs; sN: a K split "
                         "over N CTAs per output tile, default the split rule)")
    ap.add_argument("--routings", type=int, default=1,
                    help="routings per token count: the benchmark's row and N - 1 fresh draws; the mean decides")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    sp = [None if v == "rule" else int(v) for v in a.splits.split(",")]
    bk = None if not a.buckets else [] if a.buckets == "none" else [int(v) for v in a.buckets.split(",")]
    res = tune(a.workload, a.finalize, [int(t) for t in a.tokens.split(",")] if a.tokens else None, splits=sp,
               buckets=bk, decode_knobs=[v for v in a.decode_knobs.split(",") if v], routings=a.routings)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0

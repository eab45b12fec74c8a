"""``python -m w4a16_moe tune --workload kimi-tp8|deepseek-ep8 [--finalize ...] --json PATH``.

Times the CuTe provider's whole MoE call for every candidate tile shape (``sm90_family.CANDIDATES``: the
rule's buckets plus deep-pipeline decode shapes) and split-K choice (``--splits``, default: the rule and
1, 2, 4, 8) at each token count of a workload, the same way the benchmark times it (checked against the FP32
reference first, then CUDA-graph replay), and writes the best choice per token count as tuned-table
entries keyed by GPU name and layer shape (``kernels/cute/tuned_sm90.json`` format), with the versions.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import torch

from ..api import fused_moe
from ..kernels.cute import sm90_family as fam
from ..reference import reference_moe
from .run import _meta, _nrmse, _time
from .workloads import SEED, WORKLOADS, make_inputs, make_weights

__all__ = ["tune", "main"]


def tune(workload: str, finalize: str = "deterministic", tokens=None, log=print, splits=(None, 1, 2, 4, 8),
         buckets=None) -> dict:
    wl = WORKLOADS[workload]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    gpu = torch.cuda.get_device_name()
    key = fam.tuned_key(gpu, wl.local_experts, wl.hidden, wl.intermediate, wl.scheme, "bf16", wl.top_k)
    splits_opts = list(splits)
    buckets = list(range(len(fam.CANDIDATES))) if buckets is None else list(buckets)
    rows, trials = [], []
    try:
        for t in tokens or wl.tokens:
            x, tw, ids = make_inputs(wl, t, gen, dev)
            ref = reference_moe(x, weights, tw, ids)
            best = None
            for b in buckets:
                for sp in splits_opts:
                    fam.FORCE.clear()
                    fam.FORCE.update(bucket=b, splits=sp)
                    out = torch.full_like(x, float("nan"))
                    fused_moe(x, weights, tw, ids, finalize=finalize, backend="cute", out=out)
                    err = _nrmse(out, ref)
                    if not (err < 0.02 and bool(torch.isfinite(out).all())):
                        log(f"# T={t} bucket {b} splits {sp}: NRMSE {err:.3g}, skipped")
                        continue
                    us = _time(lambda: fused_moe(x, weights, tw, ids, finalize=finalize, backend="cute", out=out))
                    trials.append({"tokens": t, "bucket": b, "splits": sp, "us": us, "nrmse": err})
                    if best is None or us < best[0]:
                        best = (us, b, sp)
            log(f"{wl.name} T={t:5d} best bucket {best[1]} (TN={fam.CANDIDATES[best[1]]['tokens_per_tile']}) "
                f"splits {best[2]}: {best[0]:.1f} us   | " + "  ".join(
                    f"b{r['bucket']}s{r['splits']}={r['us']:.0f}" for r in trials if r["tokens"] == t))
            rows.append([t, best[1], best[2]])
    finally:
        fam.FORCE.clear()
    return {"key": key, "finalize": finalize, "rows": rows, "trials": trials, "meta": _meta(wl)}


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m w4a16_moe tune", description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--finalize", default="deterministic", choices=["deterministic", "fused"])
    ap.add_argument("--tokens", default=None)
    ap.add_argument("--splits", default="rule,1,2,4,8", help="split-K choices to time ('rule' = num_splits)")
    ap.add_argument("--buckets", default=None, help="indices into sm90_family.CANDIDATES (default: all)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    sp = [None if v == "rule" else int(v) for v in a.splits.split(",")]
    bk = [int(v) for v in a.buckets.split(",")] if a.buckets else None
    res = tune(a.workload, a.finalize, [int(t) for t in a.tokens.split(",")] if a.tokens else None, splits=sp,
               buckets=bk)
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    return 0

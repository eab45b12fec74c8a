"""``python -m w4a16_moe profile --workload kimi-tp8|deepseek-ep8 --tokens 1,8 [--providers cute,...]``.

Where the time of one MoE call goes: runs the call eagerly under ``torch.profiler`` (CUDA activity) and
prints, per GPU kernel, its name, launches per call and mean duration, next to the whole call's
CUDA-graph replay time (the benchmark's timing). The data are the benchmark's (``bench/workloads.py``).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from typing import Optional

import torch

from .run import _provider_fn, _time
from .workloads import SEED, WORKLOADS, benchmark_rows, make_weights

__all__ = ["cuda_events", "kernels_in_order", "profile_call", "main"]


def cuda_events(fn, calls: int = 20) -> list:
    """The CUDA kernel events of ``calls`` eager calls of ``fn()`` (after 3 warm-up calls), in launch order."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda ev: ev.time_range.start)


def kernels_in_order(fn, calls: int = 20) -> list:
    """``[(kernel name, median us)]`` of one call of ``fn()``, its kernels apart in launch order (kernels that
    share a name, such as the two grouped GEMMs, are not merged as in :func:`profile_call`)."""
    import statistics

    evs = cuda_events(fn, calls)
    per = len(evs) // calls
    return [(evs[i].name[:40], statistics.median(evs[c * per + i].device_time for c in range(calls)))
            for i in range(per)]


def profile_call(fn, calls: int = 20) -> list:
    """``[(kernel name, launches per call, mean us)]`` of ``fn()`` over ``calls`` eager calls."""
    total = defaultdict(float)
    count = defaultdict(int)
    for ev in cuda_events(fn, calls):
        total[ev.name] += ev.device_time
        count[ev.name] += 1
    rows = [(name, count[name] / calls, total[name] / count[name]) for name in total]
    return sorted(rows, key=lambda r: -r[1] * r[2])


def main(argv: Optional[list[str]] = None) -> int:
    from .. import cli

    ap = cli.parser("profile", __doc__)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--tokens", default="1,8")
    ap.add_argument("--providers", default="cute")
    ap.add_argument("--json", default=None)
    ap.add_argument("--buckets", default=None,
                    help="SM90 tile candidates to force, one profile each (indices into sm90.family.CANDIDATES; "
                         "default: the tuned table / rule)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile: needs a CUDA GPU", file=sys.stderr)
        return 2
    wl = WORKLOADS[a.workload]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(SEED)
    weights = make_weights(wl, gen, dev)
    out_json = []
    from ..kernels.cute.sm90 import family as fam

    buckets = [None] if a.buckets is None else [int(b) for b in a.buckets.split(",")]
    tokens = [int(v) for v in a.tokens.split(",")]
    data = benchmark_rows(wl, tokens, gen, dev)
    for t in tokens:
        x, tw, ids = data[t]
        for p in a.providers.split(","):
            for b in buckets:
                with fam.forced(b):
                    fn = _provider_fn(p, wl, weights)
                    out = torch.empty_like(x)
                    call = (lambda fn=fn, x=x, tw=tw, ids=ids, out=out: fn(x, tw, ids, out=out))
                    rows = profile_call(call)
                    graph_us = _time(call)
                kern = sum(n * us for _, n, us in rows)
                what = p if b is None else f"{p} bucket {b}"
                print(f"{wl.name} T={t} {what}: graph replay {graph_us:.1f} us, kernels {kern:.1f} us per call")
                for name, n, us in rows:
                    print(f"    {us:8.1f} us x {n:.0f}  {name[:110]}")
                out_json.append({"workload": wl.name, "tokens": t, "provider": p, "bucket": b, "graph_us": graph_us,
                                 "kernels": [{"name": nm, "per_call": n, "mean_us": us} for nm, n, us in rows]})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out_json, f, indent=1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Time the deterministic finalize kernels alone (GPU): the CuTe routing family's and the Triton one.

    PYTHONPATH=python W4A16_MOE_DISABLE_JIT=1 python scripts/time_finalize.py [--json OUT] [--label NAME]

Per case (tokens, top_k, hidden, local experts of the global ones: ids uniform over the global experts, the
local ones ``0 .. E-1``, as on an expert-parallel rank) it checks the CuTe finalize bit for bit against the
Triton one on the same inputs (``out`` poisoned before each), then times each alone: one CUDA graph of
``--calls`` launches, replayed ``--reps`` times, median us per launch. ``GB/s`` counts the bytes the combine
must move: the valid routes' ``y`` rows read, ``out`` written. Run it with another tree's ``python/`` on
``PYTHONPATH`` (and its prebuilt kernels) to compare two revisions of the CuTe kernel in separate processes;
the Triton kernel is the same in both and shows that the machine is too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

# (tokens, top_k, hidden, local experts, global experts)
CASES = (
    (1, 8, 7168, 256, 256),
    (64, 8, 7168, 256, 256),
    (512, 8, 7168, 384, 384),
    (2048, 8, 7168, 384, 384),
    (4096, 8, 4096, 128, 128),
    (2048, 8, 5120, 20, 160),
    (2048, 8, 7168, 32, 256),
    (4096, 8, 7168, 32, 256),
    (8192, 8, 7168, 32, 256),
    (1024, 2, 4096, 8, 8),
)


def _graph_us(fn, calls: int, reps: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--label", default=os.environ.get("W4A16_MOE_REVISION", "this tree"))
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)

    import torch

    from w4a16_moe.kernels.cute.routing.launch import launch_finalize_cute
    from w4a16_moe.kernels.routing.finalize import launch_finalize

    dev = torch.device("cuda")
    rows = []
    print(f"{'tokens':>6} {'k':>2} {'H':>5} {'E/Eg':>8} {'valid':>6} {'cute us':>8} {'GB/s':>6} {'triton us':>9} "
          f"{'GB/s':>6}  [{args.label}]")
    for t, k, h, e, eg in CASES:
        g = torch.Generator(device=dev).manual_seed(1000 + t * k + h)
        ids = torch.argsort(torch.rand(t, eg, device=dev, generator=g), dim=1)[:, :k].to(torch.int32).contiguous()
        tw = torch.softmax(torch.randn(t, k, device=dev, generator=g), dim=1).contiguous()
        valid = ids < e
        y = torch.randn(t * k, h, device=dev, generator=g).to(torch.bfloat16)
        y[~valid.reshape(-1)] = float("nan")  # rows of other ranks' routes: never written, never read
        outs = {n: torch.empty(t, h, dtype=torch.bfloat16, device=dev) for n in ("cute", "triton")}
        fns = {"cute": lambda: launch_finalize_cute(y, tw, outs["cute"], topk_ids=ids, num_experts=e),
               "triton": lambda: launch_finalize(y, tw, outs["triton"], topk_ids=ids, num_experts=e)}
        for o in outs.values():
            o.fill_(float("nan"))
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        same = bool(torch.equal(outs["cute"].view(torch.int16), outs["triton"].view(torch.int16)))
        if not same or outs["cute"].isnan().any():
            raise SystemExit(f"finalize {t}x{k}x{h}: the CuTe output differs from the Triton one")
        nvalid = int(valid.sum())
        nbytes = (nvalid + t) * h * 2
        us = {n: _graph_us(fn, args.calls, args.reps) for n, fn in fns.items()}
        row = dict(tokens=t, top_k=k, hidden=h, experts=e, global_experts=eg, valid_routes=nvalid, bytes=nbytes,
                   cute_us=round(us["cute"], 2), triton_us=round(us["triton"], 2), label=args.label,
                   device=torch.cuda.get_device_name(dev))
        rows.append(row)
        print(f"{t:6d} {k:2d} {h:5d} {e:>3d}/{eg:<4d} {nvalid:6d} {us['cute']:8.2f} {nbytes / us['cute'] / 1e3:6.0f} "
              f"{us['triton']:9.2f} {nbytes / us['triton'] / 1e3:6.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

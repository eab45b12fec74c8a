"""``python -m w4a16_moe bench-ep [--tokens 16,256,2048] [--json PATH] [--markdown PATH]``: an EP2 layer.

Two ranks (one GPU each, NCCL) run :func:`w4a16_moe.distributed.ep_moe` on a DeepSeek-shaped layer
(H=7168, I=2048, top-8, INT4 g128) of 64 experts, 32 per rank, each rank with its own T tokens; one GPU
runs the same 64 experts on all 2T tokens with ``fused_moe``. Both are timed with CUDA events around
whole calls (eager: the all-to-all needs its counts on the host, so the EP layer is not graph-captured),
median of 20 after 5 warm-up calls; the EP latency is the slowest rank's. tokens/s = 2T / latency.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from typing import Optional

import torch

E, H, I, K, G = 64, 7168, 2048, 8, "int4_g128"


def _weights(device):
    from .workloads import _matrix
    from ..formats.schemes import get_scheme
    from ..formats.weights import MoEWeights

    gen = torch.Generator(device=device).manual_seed(20260908)
    return MoEWeights(get_scheme(G), _matrix(gen, G, E, 2 * I, H, device), _matrix(gen, G, E, H, I, device), True)


def _inputs(t, rank, device):
    gen = torch.Generator(device=device).manual_seed(1000 + rank * 7919 + t)
    x = torch.randn(t, H, generator=gen, device=device).to(torch.bfloat16)
    ids = torch.rand(t, E, generator=gen, device=device).topk(K, dim=1).indices.to(torch.int32)
    tw = torch.softmax(torch.randn(t, K, generator=gen, device=device), dim=1)
    return x, tw, ids


def _time_events(fn, iters=20, warm=5, pre=None):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(iters):
        if pre is not None:
            pre()  # e.g. a barrier, so that every rank starts together (not timed)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(ts)


def _worker(rank, world, init, tokens, backend, result):
    import torch.distributed as dist

    from ..distributed import ep_moe, shard_experts

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init}", rank=rank, world_size=world)
    dev = torch.device("cuda", rank)
    local = shard_experts(_weights(dev), rank, world)
    out = {}
    for t in tokens:
        x, tw, ids = _inputs(t, rank, dev)

        def sync():
            dist.barrier()
            torch.cuda.synchronize()

        us = _time_events(lambda: ep_moe(x, local, tw, ids, backend=backend), pre=sync)
        m = torch.tensor([us], device=dev)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        out[t] = m.item()
    if rank == 0:
        torch.save(out, result)
    dist.destroy_process_group()


def run(tokens, backend="auto") -> dict:
    import torch.multiprocessing as mp

    from ..api import fused_moe

    with tempfile.TemporaryDirectory() as d:
        res = os.path.join(d, "res.pt")
        mp.spawn(_worker, args=(2, os.path.join(d, "init"), tokens, backend, res), nprocs=2, join=True)
        ep = torch.load(res)
    dev = torch.device("cuda", 0)
    w = _weights(dev)
    rows = []
    for t in tokens:
        parts = [_inputs(t, r, dev) for r in range(2)]
        x = torch.cat([p[0] for p in parts])
        tw = torch.cat([p[1] for p in parts])
        ids = torch.cat([p[2] for p in parts])
        one = _time_events(lambda: fused_moe(x, w, tw, ids, backend=backend))
        rows.append({"tokens_per_rank": t, "ep2_us": ep[t], "one_gpu_us": one,
                     "ep2_tokens_per_s": 2 * t / ep[t] * 1e6, "one_gpu_tokens_per_s": 2 * t / one * 1e6})
    return {"layer": f"E={E} (32 per rank), H={H}, I={I}, top-{K}, {G}, bf16", "backend": backend, "rows": rows}


def main(argv: Optional[list[str]] = None) -> int:
    from .. import cli

    from .run import _meta
    from .workloads import WORKLOADS

    ap = cli.parser("bench-ep", __doc__)
    ap.add_argument("--tokens", default="16,256,2048")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", default=None)
    a = ap.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print("bench-ep: needs two CUDA GPUs", file=sys.stderr)
        return 2
    r = run([int(t) for t in a.tokens.split(",")], a.backend)
    r["meta"] = _meta(WORKLOADS["deepseek-ep8"])
    r["meta"]["description"] = "EP2 layer vs one GPU"
    for row in r["rows"]:
        print(f"T/rank={row['tokens_per_rank']:5d}  EP2 {row['ep2_us']:9.1f} us ({row['ep2_tokens_per_s']:10.0f} tok/s)"
              f"  one GPU {row['one_gpu_us']:9.1f} us ({row['one_gpu_tokens_per_s']:10.0f} tok/s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    if a.markdown:
        m = r["meta"]
        lines = [f"# EP2 layer vs one GPU: {r['layer']}", "", f"- command: `{m['command']}`", f"- revision: {m['revision']}",
                 f"- date: {m['date']}", f"- device: 2x {m['device']}", f"- versions: {json.dumps(m['versions'])}",
                 "- timing: CUDA events around whole eager calls, median of 20 after 5 warm-ups; EP = slowest rank", "",
                 "| tokens per rank | EP2 (us) | EP2 tokens/s | one GPU, 2T tokens (us) | one GPU tokens/s |",
                 "|---:|---:|---:|---:|---:|"]
        for row in r["rows"]:
            lines.append(f"| {row['tokens_per_rank']} | {row['ep2_us']:.1f} | {row['ep2_tokens_per_s']:.0f} | "
                         f"{row['one_gpu_us']:.1f} | {row['one_gpu_tokens_per_s']:.0f} |")
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0

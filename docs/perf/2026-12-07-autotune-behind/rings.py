"""Which ping-pong rings of the shipped selection change order with the ping-pong rule (CPU).

    PYTHONPATH=python python docs/perf/2026-12-07-autotune-behind/rings.py

For the default plan of every preset layer (BF16, its scheme), 1-8192 tokens, both finalize modes, on an H100 and
an H200: each GEMM with ``pingpong=2``, its ring's stages and each split's K tiles ``nk``, and whether its two
mainloops run unordered under the old rule (``0 < nk < S``) and under ``sm90.config.pingpong_unordered``.
"""

from __future__ import annotations

import torch

from w4a16_moe.activations import get_activation
from w4a16_moe.bench.presets import PRESETS
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import provider
from w4a16_moe.kernels.cute.sm90.config import pingpong_unordered
from w4a16_moe.validate import MoECall


def main() -> None:
    provider._kernels_available = lambda arch: None  # plan without looking for kernels
    plans, rings, changed = 0, [], []
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        info = DeviceInfo("cuda", gpu, (9, 0), 132)
        for name, pr in PRESETS.items():
            scheme = pr.scheme or f"int4_g{pr.group}"
            g = None if pr.global_experts == pr.local_experts else pr.global_experts
            for fin in ("deterministic", "fused"):
                for t in pr.tokens:
                    call = MoECall(t, pr.top_k, pr.hidden, pr.intermediate, pr.local_experts, torch.bfloat16,
                                   torch.device("cuda"), get_activation("swiglu"), fin, 0, scheme, global_experts=g)
                    provider.clear_plans()
                    p = provider.plan(call, info)
                    plans += 1
                    if p.decode:
                        continue
                    for cfg, k, sp in ((p.configs[0], pr.hidden, p.splits[0]), (p.configs[1], pr.intermediate,
                                                                                p.splits[1])):
                        if getattr(cfg, "pingpong", 0) != 2:
                            continue
                        kt = k // cfg.k_tile
                        per = -(-kt // sp)
                        nks = sorted({max(min(kt, s * per + per) - s * per, 0) for s in range(sp)})
                        old = [0 < nk < cfg.stages for nk in nks]
                        new = [pingpong_unordered(cfg.stages, nk) for nk in nks]
                        rings.append((cfg.stages, tuple(nks), tuple(new)))
                        if old != new:
                            changed.append((gpu, name, fin, t, cfg.name(), nks))
    provider.clear_plans()
    print(f"{plans} plans, {len(rings)} ping-pong GEMMs; (stages, nk per split, unordered): {sorted(set(rings))}")
    print(f"{len(changed)} change order:")
    for c in changed:
        print("  ", c)


if __name__ == "__main__":
    main()

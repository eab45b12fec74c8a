"""Which kernels the plans of 1..MAX tokens run that ``warmup(max_tokens=MAX)``'s plans do not (CPU only, H200 plans,
both finalize modes, BF16; nothing prebuilt is needed): per layer, the kernels warmup loads, the (kernel, padding)
pairs some count runs beyond them, and the first counts that run each.

    PYTHONPATH=python python docs/perf/2026-12-07-selection-grid/coverage.py [MAX, default 8192]
"""

import sys

import torch

from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import provider
from w4a16_moe.validate import MoECall

INFO = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
LAYERS = [((384, 7168, 256, 8, None), "int4_g32"), ((32, 7168, 2048, 8, 256), "int4_g128"),
          ((256, 7168, 256, 8, None), "int4_g128"), ((128, 4096, 384, 8, None), "int4_g128"),
          ((16, 5120, 8192, 1, None), "int4_g128"), ((128, 5120, 1024, 1, None), "int4_g128"),
          ((60, 2048, 704, 4, None), "int4_g32"), ((8, 4096, 14336, 2, None), "int4_g128"),
          ((128, 2880, 2880, 4, None), "mxfp4")]


def main(max_tokens: int):
    provider._kernels_available = lambda arch: None  # plans only: no kernel is loaded
    act = get_activation("swiglu")
    print("| layer | scheme | kernels warmup loads | kernels run beyond them | first counts running one |")
    print("|---|---|---:|---:|---|")
    for (e, h, i, k, g), scheme in LAYERS:
        warm = set()
        for _, p in provider.warmup_plans(INFO, e, h, i, scheme, torch.bfloat16, torch.device("cuda"), act, k,
                                          max_tokens, ("deterministic", "fused"), False, g):
            warm |= {(c.name(), p.pad) for c in p.configs}
        missing = {}
        for fin in ("deterministic", "fused"):
            for t in range(1, max_tokens + 1):
                call = MoECall(t, k, h, i, e, torch.bfloat16, torch.device("cuda"), act, fin, 0, scheme,
                               global_experts=g)
                p, _ = provider._plan_cached(call, INFO)
                for c in p.configs:
                    if (c.name(), p.pad) not in warm:
                        missing.setdefault((c.name(), p.pad), t)
        first = sorted(set(missing.values()))[:4]
        print(f"| {e},{h},{i},{k}{',' + str(g) if g else ''} | {scheme} | {len(warm)} | {len(missing)} | "
              f"{', '.join(map(str, first)) or '-'} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8192)

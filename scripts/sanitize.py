"""Small MoE calls through every CuTe path, for compute-sanitizer (memcheck, initcheck, racecheck).

    compute-sanitizer --tool memcheck python scripts/sanitize.py --path sm90
    scripts/sanitize.sh                      # all three tools x every path, counts in $OUT/sanitize.json

Paths: ``decode`` (route-major decode kernels), ``sm90`` (WGMMA grouped GEMMs + route preparation +
finalize), ``warp`` (portable mma.sync grouped GEMMs). Each case is a tiny layer (E 4, H 256, I 256, so
racecheck finishes in seconds) on fresh random inputs, output poisoned with NaN, checked against the FP32
reference (NRMSE < 0.02); it covers both finalize modes, INT4 group 32 / zero points / per-channel, NVFP4,
MXFP4, expert offsets with invalid routes, split-K (small calls) and the masked (DeepEP) layout. Exit code 1
when a check fails (a sanitizer error is reported by compute-sanitizer itself).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import torch  # noqa: E402

import w4a16_moe as wm  # noqa: E402
from w4a16_moe import settings  # noqa: E402

E, H, I = 4, 256, 256
CASES = (  # (scheme, dtype, tokens, top_k, finalize, expert_offset, global experts)
    ("int4_g32", torch.bfloat16, 3, 2, "deterministic", 0, 4),
    ("int4_g32", torch.bfloat16, 5, 2, "fused", 0, 4),
    ("int4_g128_zp", torch.float16, 6, 2, "deterministic", 4, 12),  # EP: most routes are other ranks'
    ("int4_channel", torch.bfloat16, 2, 3, "fused", 2, 8),
    ("nvfp4", torch.bfloat16, 4, 2, "deterministic", 0, 4),
    ("mxfp4", torch.bfloat16, 40, 2, "deterministic", 0, 6),  # ids >= E are invalid routes
)


def _weights(scheme, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * I, H, generator=g) / H**0.5
    w2 = torch.randn(E, H, I, generator=g) / I**0.5
    return wm.quantize_experts(w13.to(dtype), w2.to(dtype), scheme).to("cuda")


def _nrmse(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def run(path: str) -> int:
    with settings.override(cute_family="warp" if path == "warp" else "sm90",
                           cute_decode="1" if path == "decode" else "0"):
        return _run_cases(path)


def _run_cases(path: str) -> int:
    failed = 0
    for n, (scheme, dtype, t, k, fin, off, eg) in enumerate(CASES):
        w = _weights(scheme, dtype, n)
        g = torch.Generator().manual_seed(100 + n)
        x = torch.randn(t, H, generator=g).to(dtype).cuda()
        ids = torch.rand(t, eg, generator=g).topk(k, dim=1).indices.to(torch.int32).cuda()
        tw = torch.softmax(torch.randn(t, k, generator=g), dim=1).cuda()
        out = torch.full_like(x, float("nan"))
        wm.fused_moe(x, w, tw, ids, finalize=fin, expert_offset=off, backend="cute", out=out)
        ref = wm.reference_moe(x, w, tw, ids, expert_offset=off)
        err = _nrmse(out, ref)
        ok = not torch.isnan(out).any().item() and err < 0.02
        failed += not ok
        print(f"{path:6s} {scheme:13s} {str(dtype)[6:]:9s} T={t:<3d} k={k} {fin:13s} off={off} nrmse={err:.4f} "
              f"{'ok' if ok else 'FAIL'}")
    if path != "decode":  # the masked layout runs on the grouped GEMMs
        w = _weights("int4_g32", torch.bfloat16, 99)
        cap = 8
        g = torch.Generator().manual_seed(7)
        x = torch.randn(E, cap, H, generator=g).to(torch.bfloat16).cuda()
        m = torch.tensor([3, 0, 8, 5], dtype=torch.int32, device="cuda")
        out = wm.fused_moe_masked(x, w, m, backend="cute")
        ref = wm.reference_moe_masked(x, w, m)
        err = _nrmse(out, ref)
        ok = not torch.isnan(out).any().item() and err < 0.02
        failed += not ok
        print(f"{path:6s} masked int4_g32 bf16 cap={cap} nrmse={err:.4f} {'ok' if ok else 'FAIL'}")
    torch.cuda.synchronize()
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", action="append", choices=("decode", "sm90", "warp"),
                    help="path(s) to run (default: all three)")
    paths = ap.parse_args().path or ["decode", "sm90", "warp"]
    failed = sum(run(p) for p in paths)
    print(f"sanitize: {failed} failed check(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m w4a16_moe demo``: quantize a built-in MoE layer, run it, check it, print a table.

The embedded layer is Qwen3-30B-A3B-shaped (128 experts, H=2048, I=768, top-8, SwiGLU) with
seeded random weights. On a GPU every scheme runs through ``fused_moe`` (provider ``auto``) at a few
token counts and is checked against the FP32 reference on the same quantized weights (NRMSE < 0.02);
without a GPU the demo says so and runs the reference on a tiny layer instead, where NRMSE is the
quantization error against the layer's original BF16 weights. Each row prints ok or FAIL; the exit
status is 1 when a row fails.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from . import cli
from .api import fused_moe, quantize_experts
from .formats.schemes import SCHEMES
from .providers import resolve_backend, select_provider
from .reference import reference_moe
from .validate import check_moe_call

__all__ = ["main"]

LAYER = {"experts": 128, "hidden": 2048, "intermediate": 768, "top_k": 8}
TINY = {"experts": 8, "hidden": 256, "intermediate": 128, "top_k": 2}
GPU_NRMSE_LIMIT = 0.02  # fused_moe against the FP32 reference on the same quantized weights
CPU_NRMSE_LIMIT = 0.3  # the quantized layer's reference against the BF16-weight layer (quantization error)


def _layer(cfg: dict, scheme: str, device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    e, h, i = cfg["experts"], cfg["hidden"], cfg["intermediate"]
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(torch.bfloat16)
    return quantize_experts(w13.to(device), w2.to(device), scheme)


def _inputs(cfg: dict, tokens: int, device, seed: int = 1):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(tokens, cfg["hidden"], generator=g).to(torch.bfloat16)
    ids = torch.rand(tokens, cfg["experts"], generator=g).topk(cfg["top_k"], dim=1).indices.to(torch.int32)
    tw = torch.softmax(torch.randn(tokens, cfg["top_k"], generator=g), dim=1)
    return x.to(device), tw.to(device), ids.to(device)


def _nrmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main(argv: Optional[list[str]] = None) -> int:
    ap = cli.parser("demo", __doc__)
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated schemes")
    ap.add_argument("--tokens", default="1,16,256", help="comma-separated token counts")
    ap.add_argument("--backend", default="auto")
    a = ap.parse_args(argv)
    schemes = [s for s in a.schemes.split(",") if s]
    if not torch.cuda.is_available():
        cfg = TINY
        print("demo: no CUDA GPU on this machine: fused_moe needs one, so this runs the FP32 reference "
              f"on a tiny layer (E={cfg['experts']}, H={cfg['hidden']}, I={cfg['intermediate']}, top-{cfg['top_k']}).")
        print("NRMSE = ||ref_4bit - ref_bf16|| / ||ref_bf16||: the quantization error, the FP32 reference on the "
              "quantized weights\nagainst the same layer with its original BF16 weights (no kernel runs here). "
              "Random Gaussian weights at 4 bits\n"
              f"land at 0.1-0.25; ok below {CPU_NRMSE_LIMIT} (a wrong dequantization lands near 1 or above).")
        print(f"{'scheme':14s} {'tokens':>6s} {'NRMSE vs BF16 weights':>22s} {'ms':>8s}  check")
        failures = 0
        for s in schemes:
            err, ms = _quantization_error(cfg, s, tokens=4)
            ok = err < CPU_NRMSE_LIMIT
            failures += not ok
            print(f"{s:14s} {4:6d} {err:22.4f} {ms:8.2f}  {'ok' if ok else 'FAIL'}")
        return 1 if failures else 0
    cfg, dev = LAYER, torch.device("cuda")
    tokens = [int(t) for t in a.tokens.split(",") if t]
    print(f"demo layer: E={cfg['experts']}, H={cfg['hidden']}, I={cfg['intermediate']}, top-{cfg['top_k']}, "
          f"SwiGLU, BF16, on {torch.cuda.get_device_name()}")
    print("NRMSE = ||fused_moe - ref|| / ||ref||, ref = the FP32 reference on the same quantized weights; "
          f"ok below {GPU_NRMSE_LIMIT}.")
    print(f"{'scheme':14s} {'tokens':>6s} {'provider':>9s} {'NRMSE':>8s} {'us/call':>9s}  check")
    failures = 0
    for s in schemes:
        w = _layer(cfg, s, dev)
        for t in tokens:
            x, tw, ids = _inputs(cfg, t, dev)
            prov = select_provider(check_moe_call(x, w, tw, ids), resolve_backend(a.backend)).provider
            out = torch.full_like(x, float("nan"))
            fused_moe(x, w, tw, ids, backend=a.backend, out=out)
            err = _nrmse(out, reference_moe(x, w, tw, ids))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                fused_moe(x, w, tw, ids, backend=a.backend, out=out)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / 20 * 1e6
            ok = err < GPU_NRMSE_LIMIT and bool(torch.isfinite(out).all())
            failures += not ok
            print(f"{s:14s} {t:6d} {prov:>9s} {err:8.4f} {us:9.1f}  {'ok' if ok else 'FAIL'}")
    return 1 if failures else 0


def _dense_moe(x, w13, w2, tw, ids):
    """The layer with its unquantized BF16 weights, one route at a time (FP32 math)."""
    i = w2.shape[2]
    y = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w13[e].float() @ x[t].float()
            y[t] += tw[t, j] * (w2[e].float() @ (torch.nn.functional.silu(h[:i]) * h[i:]))
    return y


def _quantization_error(cfg: dict, scheme: str, tokens: int) -> tuple[float, float]:
    """(NRMSE of the quantized layer's FP32 reference against the BF16-weight layer, reference ms)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    e, h, i = cfg["experts"], cfg["hidden"], cfg["intermediate"]
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(torch.bfloat16)
    x, tw, ids = _inputs(cfg, tokens, "cpu")
    q = quantize_experts(w13, w2, scheme)
    t0 = time.perf_counter()
    ref = reference_moe(x, q, tw, ids)
    ms = (time.perf_counter() - t0) * 1e3
    return _nrmse(ref, _dense_moe(x, w13, w2, tw, ids)), ms

"""Synthetic MXFP4 MoE layers (gpt-oss style) for mxfp4_bench.py: weights, biases, rows, floor model, NRMSE.

Weights are drawn exactly as the project's benchmark draws an ``mxfp4`` layer (``w4a16_moe.bench.workloads``:
generator seed 20260908 on the device; per matrix, w13 first then w2: E2M1 codes = uniform random bytes (two
codes per byte, low nibble first), then u ~ U[0, 1) per group of 32 and the E8M0 exponent
``round(log2((0.75 + 0.5 u) * sqrt(21.5 / 8.5625) / (4.6 sqrt(K))))``: the INT4 benchmark's weight RMS, so every
GEMM output is O(1) -- for K = 2880 the exponents are -8 and -7). Then the biases (not in the project's
benchmark): ``w13_bias`` [E, 2I] and ``w2_bias`` [E, H] ~ 0.25 N(0, 1) in BF16 (vLLM keeps MoE biases in BF16).
Every variant of a layer reads the same draws (the 'plain' variant ignores the biases).

Rows as the project's ``make_inputs`` / ``benchmark_rows``: x ~ N(0, 1) in BF16, topk_ids = top-k of uniform
scores over E_global, topk_weights = softmax of N(0, 1) logits (FP32); first one row per token count of the
layer's default list (1, 4, 16, 64, 256, 1024, 4096 for gpt-oss-120b), in that order, the unrequested ones
dropped, then the other requested counts in the order given -- so a subset run measures the full run's rows and
``python -m w4a16_moe bench --preset gpt-oss-120b`` (same draws, biases included) the same data.

The FP32 reference is the project's ``w4a16_moe.reference_moe`` (exact dequantization, FP64 per expert, biases
after each GEMM, routes combined in top-k order). The floor model is the project's (``workloads.floor_us``): bytes of
the distinct local experts hit (codes + E8M0 scales; biases, 0.1 %, not counted) + T*H*2 bytes in and out at
4.3e12 B/s, flops 2 * routes * (H*2I + I*H) at 7.9e14 FLOP/s, floor_eff = max(floor, 6 us).
"""
import math

import torch

SEED = 20260908
BW = 4.3e12
FLOPS = 7.9e14
LAUNCH_FLOOR_US = 6.0
NRMSE_GATE = 0.02
BIAS_STD = 0.25
_FP4_RMS_RATIO = math.sqrt(21.5 / 8.5625)  # RMS of INT4 values (code - 8) over the RMS of E2M1 values


class Mxfp4Layer:
    """Canonical tensors of one layer: w13 rows are gate rows 0..I-1 then up rows (the project's
    ``MoEWeights.from_mxfp4`` order). ``blocks`` uint8 [E, N, K/2], ``scales`` uint8 E8M0 [E, N, K/32]."""

    def __init__(self, w13_blocks, w13_scales, w2_blocks, w2_scales, w13_bias, w2_bias):
        self.w13_blocks, self.w13_scales = w13_blocks, w13_scales
        self.w2_blocks, self.w2_scales = w2_blocks, w2_scales
        self.w13_bias, self.w2_bias = w13_bias, w2_bias
        self.E, n13, kb = w13_blocks.shape
        self.H, self.I = 2 * kb, n13 // 2


def _matrix(gen, e, n, k, device):
    codes = torch.randint(0, 256, (e, n, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    u = torch.rand(e, n, k // 32, generator=gen, device=device)
    exp = torch.round(torch.log2((0.75 + 0.5 * u) * _FP4_RMS_RATIO / (4.6 * math.sqrt(k))))
    return codes, (exp.to(torch.int32).clamp(-127, 127) + 127).to(torch.uint8)


def make_layer(E, H, I, gen, device, bias_std=BIAS_STD):
    """One gated MXFP4 layer (see the module docstring for the draws)."""
    if H % 32 or I % 32:
        raise ValueError(f'H ({H}) and I ({I}) must be multiples of 32 (MXFP4 groups)')
    w13_blocks, w13_scales = _matrix(gen, E, 2 * I, H, device)
    w2_blocks, w2_scales = _matrix(gen, E, H, I, device)
    w13_bias = (torch.randn(E, 2 * I, generator=gen, device=device) * bias_std).to(torch.bfloat16)
    w2_bias = (torch.randn(E, H, generator=gen, device=device) * bias_std).to(torch.bfloat16)
    return Mxfp4Layer(w13_blocks, w13_scales, w2_blocks, w2_scales, w13_bias, w2_bias)


def make_row(T, H, E_global, topk, gen, device, dtype=torch.bfloat16):
    """(x [T, H], topk_ids [T, k] int32, topk_weights [T, k] fp32), drawn as the project's make_inputs."""
    x = torch.randn(T, H, generator=gen, device=device).to(dtype)
    scores = torch.rand(T, E_global, generator=gen, device=device)
    ids = scores.topk(topk, dim=1).indices.to(torch.int32).contiguous()
    logits = torch.randn(T, topk, generator=gen, device=device)
    return x, ids, torch.softmax(logits, dim=1).contiguous()


def make_rows(tokens, default_tokens, H, E_global, topk, gen, device, dtype=torch.bfloat16):
    """{T: row} for ``tokens``: the rows of ``default_tokens`` drawn first in that order (unrequested ones dropped),
    then the other counts in the order given (the project's benchmark_rows)."""
    out = {}
    for t in default_tokens:
        row = make_row(t, H, E_global, topk, gen, device, dtype)
        if t in tokens:
            out[t] = row
    for t in tokens:
        if t not in out:
            out[t] = make_row(t, H, E_global, topk, gen, device, dtype)
    return out


def project_weights(layer, bias, activation):
    """The project's MoEWeights of ``layer`` (with or without its biases) via MoEWeights.from_mxfp4."""
    import w4a16_moe as wm
    return wm.MoEWeights.from_mxfp4(layer.w13_blocks, layer.w13_scales, layer.w2_blocks, layer.w2_scales,
                                    w13_bias=layer.w13_bias if bias else None,
                                    w2_bias=layer.w2_bias if bias else None, activation=activation)


def reference(x, ids, wts, weights, activation):
    """FP32 reference output [T, H] (the project's reference_moe)."""
    from w4a16_moe import reference_moe
    return reference_moe(x, weights, wts, ids, activation=activation)


def nrmse(out, ref):
    out = out.float()
    if not torch.isfinite(out).all():
        return float('nan')
    if ref.norm().item() == 0.0:
        return 0.0 if out.abs().max().item() == 0.0 else float('inf')
    return ((out - ref.float()).norm() / ref.float().norm()).item()


def floor_model(ids, E_local, H, I, T):
    flat = ids.reshape(-1).long()
    local = flat[(flat >= 0) & (flat < E_local)]
    n_hit = int(torch.unique(local).numel())
    n_routes = int(local.numel())
    w_elems = 2 * I * H + H * I
    per_expert = w_elems // 2 + w_elems // 32
    bytes_ = n_hit * per_expert + T * H * 2 * 2
    flops = 2 * n_routes * (H * 2 * I + I * H)
    t_mem, t_flop = bytes_ / BW, flops / FLOPS
    floor = max(t_mem, t_flop) * 1e6
    return dict(experts_present=n_hit, local_routes=n_routes, bytes=bytes_, flops=flops, floor_us=floor,
                floor_eff_us=max(floor, LAUNCH_FLOOR_US), bound='mem' if t_mem >= t_flop else 'flop')

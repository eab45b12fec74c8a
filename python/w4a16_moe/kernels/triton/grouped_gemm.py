"""Grouped W4A16 GEMMs over expert-sorted rows, dequantizing the canonical 4-bit weights in registers.

Two kernels, each one launch per MoE call:

``_gate_up_kernel``  ``inter[p, :] = act(x[row(p)] @ w13[e].T + b13[e])`` for every sorted position ``p`` of
                     expert ``e``. For gated activations the program computes the gate tile (w13 rows ``n``)
                     and the up tile (rows ``I + n``) from the same A tile and applies the activation before
                     the store.
``_down_kernel``     ``y[p] = inter[p] @ w2[e].T + b2[e]``; the epilogue either stores ``y`` (unweighted) into a
                     per-route buffer (deterministic finalize), atomically adds ``topk_weight * y`` into
                     ``out[token]`` (fused finalize), or stores into the masked output (DeepEP layout).

Grid: 1-D, ``num_m * cdiv(N, BLOCK_N)`` programs, mapped to (row-block, column-tile) with a GROUP_M swizzle
so programs running together share weight tiles (same expert) and A tiles (same rows). ``num_m`` is the
host-side bound of :func:`routing.num_row_blocks` (routed) or ``E * cdiv(cap, BLOCK_M)`` (masked); routed
programs whose block is unused exit at once.

Weights are read in the canonical layout (:mod:`w4a16_moe.formats.weights`): codes uint8 ``[E, N, K/2]``
(low nibble = even k), scales ``[E, N, K/g]``, zeros uint8 ``[E, N, K/g]``, global_scale fp32 ``[E, N]``.
A tile ``W[n0:n0+BN, k0:k0+BK]`` is loaded as bytes ``[BN, BK/2]``, split into nibbles and interleaved back
to ``[BN, BK]``, scaled per group in FP32, cast to x's dtype and fed transposed to ``tl.dot`` (FP32 accumulate).
The optional per-expert biases (FP32 or BF16, ``b13 [E, 2I|I]``, ``b2 [E, H]``) are added to the FP32
accumulators after the column scales: before the activation, and before the routing weight.
Exact factors are moved out of the K loop: per-channel INT4 scales and the NVFP4 per-row global scale are
applied to the FP32 accumulator per output column. E2M1, E4M3 and E8M0 are decoded with integer bit
arithmetic (fp16 bit patterns reinterpreted), which is portable to the interpreter and to sm80+.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ...formats.weights import QuantizedMatrix

__all__ = ["GemmConfig", "launch_gate_up", "launch_down", "RowSource", "DOWN_ROUTE_BUFFER", "DOWN_ATOMIC",
           "DOWN_MASKED"]

KIND_INT4, KIND_NVFP4, KIND_MXFP4 = 0, 1, 2
_KINDS = {"int4": KIND_INT4, "nvfp4": KIND_NVFP4, "mxfp4": KIND_MXFP4}

# epilogues of the down GEMM
DOWN_ROUTE_BUFFER = 0  # store y (unweighted) at ybuf[route]
DOWN_ATOMIC = 1  # out[token] += topk_weight * y (atomics; plain store when top-k == 1)
DOWN_MASKED = 2  # store y at out[e * cap + r], zeros for r >= masked_m[e]

GROUP_M = 8


@dataclass(frozen=True)
class GemmConfig:
    """Tile configuration of one GEMM launch."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# --------------------------------------------------------------------------------------------------
# Decoding helpers (all exact)
# --------------------------------------------------------------------------------------------------
@triton.jit
def _e2m1_times_2m14(codes):
    """E2M1 codes (int32, 0..15) -> FP32 ``value * 2**-14``.

    Placing the sign at bit 15 and the 3 magnitude bits at bits 11..9 of an fp16 gives exactly
    ``e2m1 * 2**-14`` (both the subnormal code 1 and the normal codes scale by the same power of two).
    """
    bits = ((codes & 7) << 9) | ((codes & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_times_2p14(raw):
    """FP8 E4M3 bits (int32, 0..255) -> FP32 ``value * 2**14`` (NaN encodings are not special-cased).

    Bits ``s eeee mmm`` placed at fp16 bits 15 and 13..7 give ``value * 2**-8``; times ``2**22``.
    """
    bits = ((raw & 0x7F) << 7) | ((raw & 0x80) << 8)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 4194304.0


@triton.jit
def _e8m0_times_2p14(raw):
    """E8M0 exponent bits (int32) -> FP32 ``2**(raw - 127 + 14)``; 255 -> NaN, raw > 240 -> +inf."""
    biased = raw + 14
    bits = tl.where(raw == 255, 0x7FC00000, tl.where(biased > 254, 0x7F800000, biased << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_groups(ptr, rows, row_ok, k0, K, G: tl.constexpr, BK: tl.constexpr):
    """Per-group parameters ``[BN, max(BK // G, 1)]`` (scales or zeros) of K columns ``k0 .. k0+BK-1``."""
    NG: tl.constexpr = (BK + G - 1) // G
    groups = k0 // G + tl.arange(0, NG)
    mask = row_ok[:, None] & (groups < K // G)[None, :]
    return tl.load(ptr + rows[:, None] * (K // G) + groups[None, :], mask=mask, other=0)


@triton.jit
def _expand_groups(t, G: tl.constexpr, BK: tl.constexpr):
    """Repeat each of the ``BK // G`` group columns ``G`` times -> ``[BN, BK]`` (``[BN, 1]`` if ``BK <= G``)."""
    if BK > G:
        BN: tl.constexpr = t.shape[0]
        NG: tl.constexpr = BK // G
        out = tl.reshape(tl.broadcast_to(t[:, :, None], (BN, NG, G)), (BN, BK))
    else:
        out = t
    return out


@triton.jit
def _dequant_tile(codes_ptr, scales_ptr, zeros_ptr, rows, row_ok, k0, K,
                  KIND: tl.constexpr, G: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_ZP: tl.constexpr,
                  BK: tl.constexpr, DT: tl.constexpr):
    """Dequantized ``W[rows, k0:k0+BK]`` as ``[BN, BK]`` in ``DT``; pointers are at the expert's base.

    Masked (out-of-range) rows and columns load code 0 with scale 0 (or a zero A column), so they add 0.
    Per-channel INT4 returns the exact ``code - 8``; its scale is applied in the epilogue.
    """
    half = k0 // 2 + tl.arange(0, BK // 2)
    mask = row_ok[:, None] & (half < K // 2)[None, :]
    packed = tl.load(codes_ptr + rows[:, None] * (K // 2) + half[None, :], mask=mask, other=0).to(tl.int32)
    codes = tl.interleave(packed & 0xF, packed >> 4)  # column j holds the code of k0 + j
    if KIND == 0:
        if PER_CHANNEL:
            w = (codes - 8).to(DT)
        else:
            s = _expand_groups(_load_groups(scales_ptr, rows, row_ok, k0, K, G, BK).to(tl.float32), G, BK)
            if HAS_ZP:
                z = _expand_groups(_load_groups(zeros_ptr, rows, row_ok, k0, K, G, BK).to(tl.int32), G, BK)
                w = ((codes - z).to(tl.float32) * s).to(DT)
            else:
                w = ((codes - 8).to(tl.float32) * s).to(DT)
    else:
        raw = _load_groups(scales_ptr, rows, row_ok, k0, K, G, BK).to(tl.int32)
        if KIND == 1:
            s = _e4m3_times_2p14(raw)
        else:
            s = _e8m0_times_2p14(raw)
        w = (_e2m1_times_2m14(codes) * _expand_groups(s, G, BK)).to(DT)
    return w


@triton.jit
def _column_scale(acc, scales_ptr, gscale_ptr, cols, col_ok, PER_CHANNEL: tl.constexpr,
                  HAS_GSCALE: tl.constexpr):
    """Apply per-output-column factors: per-channel INT4 scales ``[N, 1]`` and NVFP4 global scales ``[N]``."""
    if PER_CHANNEL:
        acc = acc * tl.load(scales_ptr + cols, mask=col_ok, other=0).to(tl.float32)[None, :]
    if HAS_GSCALE:
        acc = acc * tl.load(gscale_ptr + cols, mask=col_ok, other=0.0)[None, :]
    return acc


@triton.jit
def _add_bias(acc, bias_ptr, cols, col_ok, HAS_BIAS: tl.constexpr):
    """``acc + bias[cols]`` in FP32 (``bias_ptr`` at the expert's row); ``acc`` unchanged without a bias."""
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _activation(g, u, alpha, limit, ACT: tl.constexpr):
    """FP32 activation codes of :mod:`w4a16_moe.activations`: 0 swiglu, 1 geglu (erf), 2 relu2, 3 silu,
    4 swiglu_oai (``alpha``, ``limit``: FP32 scalars, read by code 4 only)."""
    if ACT == 0:
        out = g / (1.0 + tl.exp(-g)) * u
    elif ACT == 4:
        gc = tl.minimum(g, limit)
        uc = tl.minimum(tl.maximum(u, -limit), limit)
        out = gc / (1.0 + tl.exp(-alpha * gc)) * (uc + 1.0)
    elif ACT == 1:
        out = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476)) * u
    elif ACT == 2:
        r = tl.maximum(g, 0.0)
        out = r * r
    else:
        out = g / (1.0 + tl.exp(-g))
    return out


# --------------------------------------------------------------------------------------------------
# Row mapping
# --------------------------------------------------------------------------------------------------
@triton.jit
def _tile_coords(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M consecutive row-blocks sweep the column tiles together."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def _routed_rows(block_info_ptr, sorted_ptr, pid_m, BM: tl.constexpr):
    """(expert, sorted positions [BM], row mask, route ids [BM], #valid rows) of routed row-block ``pid_m``."""
    expert = tl.load(block_info_ptr + pid_m * 4)
    row_begin = tl.load(block_info_ptr + pid_m * 4 + 1)
    row_end = tl.load(block_info_ptr + pid_m * 4 + 2)
    pos = row_begin + tl.arange(0, BM)
    ok = pos < row_end
    route = tl.load(sorted_ptr + pos, mask=ok, other=0)
    return expert, pos, ok, route, row_end - row_begin


@triton.jit
def _masked_rows(masked_m_ptr, pid_m, cap, BM: tl.constexpr):
    """(expert, flat rows e*cap + r [BM], r < count, r < cap, #valid rows) of masked row-block ``pid_m``."""
    blocks_per_expert = tl.cdiv(cap, BM)
    expert = pid_m // blocks_per_expert
    r0 = (pid_m % blocks_per_expert) * BM
    r = r0 + tl.arange(0, BM)
    count = tl.minimum(tl.maximum(tl.load(masked_m_ptr + expert), 0), cap)
    return expert, expert * cap + r, r < count, r < cap, count - r0


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["num_m"])
def _gate_up_kernel(
    x_ptr, inter_ptr, codes_ptr, scales_ptr, zeros_ptr, gscale_ptr, bias_ptr, sorted_ptr, block_info_ptr,
    masked_m_ptr, num_m, cap, alpha, limit, H: tl.constexpr, I: tl.constexpr,
    TOPK: tl.constexpr, MASKED: tl.constexpr, GATED: tl.constexpr, ACT: tl.constexpr, KIND: tl.constexpr,
    G: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GSCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    """``inter [P, I] = act(A @ w13[e].T)``; A rows are ``x[route // TOPK]`` (routed) or ``x[e*cap + r]`` (masked)."""
    DT = x_ptr.dtype.element_ty
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_m, tl.cdiv(I, BN), GROUP_M)
    if MASKED:
        expert, pos, row_ok, _in_cap, n_valid = _masked_rows(masked_m_ptr, pid_m, cap, BM)
        a_rows = pos
    else:
        expert, pos, row_ok, route, n_valid = _routed_rows(block_info_ptr, sorted_ptr, pid_m, BM)
        a_rows = route // TOPK
    if n_valid <= 0:
        return

    n_rows = 2 * I if GATED else I  # rows of w13
    e64 = expert.to(tl.int64)
    codes_e = codes_ptr + e64 * n_rows * (H // 2)
    scales_e = scales_ptr + e64 * n_rows * (H // G)
    zeros_e = zeros_ptr + e64 * n_rows * (H // G)
    gscale_e = gscale_ptr + e64 * n_rows
    bias_e = bias_ptr + e64 * n_rows

    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < I
    offs_k = tl.arange(0, BK)
    a_ptrs = x_ptr + a_rows.to(tl.int64)[:, None] * H + offs_k[None, :]
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, H, BK):
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & (k0 + offs_k < H)[None, :], other=0.0)
        w_g = _dequant_tile(codes_e, scales_e, zeros_e, cols, col_ok, k0, H, KIND, G, PER_CHANNEL, HAS_ZP, BK, DT)
        acc_g = tl.dot(a, tl.trans(w_g), acc_g)
        if GATED:
            w_u = _dequant_tile(codes_e, scales_e, zeros_e, cols + I, col_ok, k0, H, KIND, G, PER_CHANNEL,
                                HAS_ZP, BK, DT)
            acc_u = tl.dot(a, tl.trans(w_u), acc_u)

    acc_g = _column_scale(acc_g, scales_e, gscale_e, cols, col_ok, PER_CHANNEL, HAS_GSCALE)
    acc_g = _add_bias(acc_g, bias_e, cols, col_ok, HAS_BIAS)
    if GATED:
        acc_u = _column_scale(acc_u, scales_e, gscale_e, cols + I, col_ok, PER_CHANNEL, HAS_GSCALE)
        acc_u = _add_bias(acc_u, bias_e, cols + I, col_ok, HAS_BIAS)
        h = _activation(acc_g, acc_u, alpha, limit, ACT)
    else:
        h = _activation(acc_g, acc_g, alpha, limit, ACT)
    dst = inter_ptr + pos.to(tl.int64)[:, None] * I + cols[None, :]
    tl.store(dst, h.to(DT), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_m"])
def _down_kernel(
    inter_ptr, out_ptr, codes_ptr, scales_ptr, zeros_ptr, gscale_ptr, bias_ptr, sorted_ptr, block_info_ptr,
    masked_m_ptr, topk_w_ptr,
    num_m, cap, H: tl.constexpr, I: tl.constexpr,
    TOPK: tl.constexpr, MODE: tl.constexpr, KIND: tl.constexpr, G: tl.constexpr, PER_CHANNEL: tl.constexpr,
    HAS_ZP: tl.constexpr, HAS_GSCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
):
    """``y = inter[p] @ w2[e].T`` with the epilogue selected by ``MODE`` (see DOWN_* constants)."""
    DT = inter_ptr.dtype.element_ty
    pid_m, pid_n = _tile_coords(tl.program_id(0), num_m, tl.cdiv(H, BN), GROUP_M)
    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < H
    if MODE == 2:
        expert, pos, row_ok, in_cap, n_valid = _masked_rows(masked_m_ptr, pid_m, cap, BM)
        if n_valid <= 0:  # rows past masked_m[e]: zeros, no weight traffic
            dst = out_ptr + pos.to(tl.int64)[:, None] * H + cols[None, :]
            tl.store(dst, tl.zeros((BM, BN), dtype=DT), mask=in_cap[:, None] & col_ok[None, :])
            return
    else:
        expert, pos, row_ok, route, n_valid = _routed_rows(block_info_ptr, sorted_ptr, pid_m, BM)
        if n_valid <= 0:
            return

    e64 = expert.to(tl.int64)
    codes_e = codes_ptr + e64 * H * (I // 2)
    scales_e = scales_ptr + e64 * H * (I // G)
    zeros_e = zeros_ptr + e64 * H * (I // G)
    gscale_e = gscale_ptr + e64 * H

    offs_k = tl.arange(0, BK)
    a_ptrs = inter_ptr + pos.to(tl.int64)[:, None] * I + offs_k[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, I, BK):
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & (k0 + offs_k < I)[None, :], other=0.0)
        w = _dequant_tile(codes_e, scales_e, zeros_e, cols, col_ok, k0, I, KIND, G, PER_CHANNEL, HAS_ZP, BK, DT)
        acc = tl.dot(a, tl.trans(w), acc)
    y = _column_scale(acc, scales_e, gscale_e, cols, col_ok, PER_CHANNEL, HAS_GSCALE)
    y = _add_bias(y, bias_ptr + e64 * H, cols, col_ok, HAS_BIAS)

    if MODE == 0:
        dst = out_ptr + route.to(tl.int64)[:, None] * H + cols[None, :]
        tl.store(dst, y.to(DT), mask=row_ok[:, None] & col_ok[None, :])
    elif MODE == 1:
        w_route = tl.load(topk_w_ptr + route, mask=row_ok, other=0.0)
        val = (y * w_route[:, None]).to(DT)
        dst = out_ptr + (route // TOPK).to(tl.int64)[:, None] * H + cols[None, :]
        mask = row_ok[:, None] & col_ok[None, :]
        if TOPK == 1:
            tl.store(dst, val, mask=mask)  # one route per token: no conflicts
        else:
            tl.atomic_add(dst, val, mask=mask, sem="relaxed")
    else:
        y = tl.where(row_ok[:, None], y, 0.0)
        dst = out_ptr + pos.to(tl.int64)[:, None] * H + cols[None, :]
        tl.store(dst, y.to(DT), mask=in_cap[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------------------------------
# Host launchers
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowSource:
    """Where the GEMM rows come from.

    Routed: ``sorted_routes``/``block_info`` from :func:`routing.prepare_routes`, ``num_m`` its block bound.
    Masked: ``masked_m [E]`` int32 and ``cap``; ``num_m = E * cdiv(cap, BLOCK_M)``.
    """

    num_m: int
    top_k: int = 1
    sorted_routes: Optional[torch.Tensor] = None
    block_info: Optional[torch.Tensor] = None
    masked_m: Optional[torch.Tensor] = None
    cap: int = 0

    @property
    def masked(self) -> bool:
        return self.masked_m is not None


def _weight_args(qm: QuantizedMatrix) -> tuple[list, dict]:
    """Kernel tensors (codes, scales, zeros, global_scale; dummies where absent) and scheme constexprs."""
    sch = qm.scheme
    scales = qm.scales.view(torch.uint8) if sch.kind == "nvfp4" else qm.scales
    zeros = qm.zeros if qm.zeros is not None else qm.codes
    gscale = qm.global_scale if qm.global_scale is not None else qm.codes
    consts = dict(
        KIND=_KINDS[sch.kind], G=qm.group_size, PER_CHANNEL=sch.per_channel, HAS_ZP=sch.zero_point,
        HAS_GSCALE=sch.has_global_scale,
    )
    return [qm.codes, scales, zeros, gscale], consts


def _row_args(rows: RowSource, dummy: torch.Tensor) -> list:
    if rows.masked:
        return [dummy, dummy, rows.masked_m]
    return [rows.sorted_routes, rows.block_info, dummy]


def launch_gate_up(x: torch.Tensor, inter: torch.Tensor, w13: QuantizedMatrix, rows: RowSource, *, act_code: int,
                   gated: bool, cfg: GemmConfig, bias: Optional[torch.Tensor] = None, alpha: float = 0.0,
                   limit: float = 0.0) -> None:
    """``inter [P, I] = act(x[rows] @ w13.T + bias)`` (x ``[T, H]`` or ``[E*cap, H]``, inter in x's dtype;
    ``bias [E, 2I|I]`` FP32/BF16 or None; ``alpha``/``limit``: the swiglu_oai parameters, unused otherwise)."""
    hidden = x.shape[-1]
    inter_size = inter.shape[-1]
    w_tensors, consts = _weight_args(w13)
    grid = (rows.num_m * triton.cdiv(inter_size, cfg.block_n),)
    _gate_up_kernel[grid](
        x, inter, *w_tensors, bias if bias is not None else w13.codes, *_row_args(rows, w13.codes),
        rows.num_m, rows.cap, float(alpha), float(limit), hidden, inter_size,
        TOPK=rows.top_k, MASKED=rows.masked, GATED=gated, ACT=act_code, HAS_BIAS=bias is not None, **consts,
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_M=GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def launch_down(inter: torch.Tensor, out: torch.Tensor, w2: QuantizedMatrix, rows: RowSource, *, mode: int,
                topk_weights: Optional[torch.Tensor], cfg: GemmConfig, bias: Optional[torch.Tensor] = None) -> None:
    """Down GEMM ``inter @ w2.T + bias`` with epilogue ``mode``; ``out`` is ybuf ``[R, H]`` or the final output;
    ``bias [E, H]`` FP32/BF16 or None (added before the routing weight)."""
    inter_size = inter.shape[-1]
    hidden = w2.n
    w_tensors, consts = _weight_args(w2)
    grid = (rows.num_m * triton.cdiv(hidden, cfg.block_n),)
    _down_kernel[grid](
        inter, out, *w_tensors, bias if bias is not None else w2.codes, *_row_args(rows, w2.codes),
        topk_weights if topk_weights is not None else inter,
        rows.num_m, rows.cap, hidden, inter_size,
        TOPK=rows.top_k, MODE=mode, HAS_BIAS=bias is not None, **consts,
        BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, GROUP_M=GROUP_M,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )

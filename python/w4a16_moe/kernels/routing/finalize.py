"""Deterministic finalize: ``out[t] = sum_j w[t, j] * ybuf[t*k + j]`` over valid routes, in fixed j order.

``ybuf [T*k, H]`` (x's dtype) holds each route's unweighted expert output; rows of invalid routes were never
written and may hold anything (NaN included), so they are excluded with ``tl.where`` (and a masked load),
never multiplied by zero. The sum runs in FP32 in the order ``j = 0 .. k-1`` with one cast at the end, so the
result is bit-identical from run to run. Every element of ``out`` is written (zeros for tokens with no valid
route). Grid: ``(T, cdiv(H, BLOCK_H))``. Validity comes from the ids (``triton_fused_moe``) or from a bool
mask (``triton_combine_routes``, the expert-parallel combine), with the same arithmetic in both cases.

On SM90 and later it is launched with programmatic dependent launch and executes ``griddepcontrol.wait``
before reading anything: behind a kernel that triggers its dependents early (the SM90 down GEMM with its
``pdl`` knob) its CTAs take the SMs that kernel's last CTAs free and are ready when its writes land; behind
any other kernel it starts when that kernel's CTAs have exited, as without the attribute.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .prepare import pdl_supported

__all__ = ["launch_finalize"]

_MAX_BLOCK_H = 1024


@triton.jit(do_not_specialize=["expert_offset"])
def _finalize_kernel(ybuf_ptr, topk_w_ptr, ids_ptr, valid_ptr, out_ptr, H, LDY, num_experts, expert_offset,
                     TOPK: tl.constexpr, FROM_MASK: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    """Validity from the ids (``offset <= id < offset + E``) or, with FROM_MASK, from a uint8 mask ``[T, k]``."""
    if PDL:
        gdc_wait()  # launched with PDL: the previous kernel's writes (ybuf) are visible once this returns
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        route = t * TOPK + j
        if FROM_MASK:
            valid = tl.load(valid_ptr + route) != 0
        else:
            eid = tl.load(ids_ptr + route)
            valid = (eid >= expert_offset) & (eid < expert_offset + num_experts)
        w = tl.load(topk_w_ptr + route)
        y = tl.load(ybuf_ptr + route * LDY + cols, mask=col_ok & valid, other=0.0).to(tl.float32)
        acc += tl.where(valid, w * y, 0.0)
    tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def launch_finalize(ybuf: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, *,
                    topk_ids: Optional[torch.Tensor] = None, num_experts: int = 0, expert_offset: int = 0,
                    valid: Optional[torch.Tensor] = None) -> None:
    """Combine ``ybuf [T*k, H]`` into ``out [T, H]`` (T >= 1). ``ybuf`` may be wider than ``out`` (a
    padded ``[T*k, Hp]`` buffer: its first ``H`` columns are read through its row stride).

    Route validity comes from ``topk_ids [T, k]`` (int32/int64) with ``num_experts``/``expert_offset``, or from
    a bool ``valid [T, k]``. ``topk_weights`` fp32 ``[T, k]``; all inputs contiguous.
    """
    tokens, hidden = out.shape
    top_k = topk_weights.shape[1]
    from_mask = valid is not None
    valid_u8 = valid.view(torch.uint8) if from_mask else ybuf
    ids = topk_ids if topk_ids is not None else ybuf
    block_h = min(_MAX_BLOCK_H, triton.next_power_of_2(hidden))
    grid = (tokens, triton.cdiv(hidden, block_h))
    pdl = pdl_supported(out.device)
    extra = {"launch_pdl": True} if pdl else {}
    if ybuf.dim() != 2 or ybuf.stride(1) != 1 or ybuf.shape[1] < hidden:
        raise ValueError(f"ybuf: expected a row-major [T*k, >= {hidden}] tensor, got shape {tuple(ybuf.shape)}")
    _finalize_kernel[grid](ybuf, topk_weights, ids, valid_u8, out, hidden, ybuf.stride(0), num_experts, expert_offset,
                           TOPK=top_k, FROM_MASK=from_mask, BLOCK_H=block_h, PDL=pdl, num_warps=4, **extra)

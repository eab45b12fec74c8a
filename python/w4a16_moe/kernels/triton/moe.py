"""Triton provider of the fused W4A16 MoE: entry points and the tile-configuration table.

Launches per call (no host synchronization anywhere, so a call can be captured in a CUDA graph):

* ``finalize="deterministic"``: route prep (1 kernel; 2 when ``T*k > 4096``), gate/up GEMM,
  down GEMM into the per-route buffer, finalize kernel.
* ``finalize="fused"``: route prep, memset of ``out``, gate/up GEMM, down GEMM with atomic adds (plain stores
  when top-k is 1).
* expert-parallel halves: :func:`triton_expert_routes` (prep, gate/up, down into ``y``) and
  :func:`triton_combine_routes` (the finalize kernel, validity from a mask).
* masked (DeepEP LL): gate/up GEMM and down GEMM only (rows are ``x[e, r]`` directly; no route prep and no
  memset: the down GEMM also writes the zero rows).

The weights' optional per-expert biases are added inside the GEMM epilogues (``w13_bias`` before the
activation, ``w2_bias`` to each route's output before its routing weight); ``swiglu_oai`` takes its
``alpha``/``limit`` as kernel scalars.

Tile configurations
-------------------
The row-block size ``BLOCK_M`` follows the expected rows per expert ``m = cdiv(T*k, min(E, T*k))`` (masked:
``m = cap``), bucketed to 16 / 32 / 64 / 128 (masked: at most 64, since DeepEP capacities are upper bounds
rarely filled). Each bucket has one fixed configuration per GEMM, so each kernel has at most four compiled
variants per (scheme, activation, dtype, top-k, mode, model shape); the token count is never specialized on.

=======  ==========================================  ======================================
BLOCK_M  gate/up: BLOCK_N, BLOCK_K, warps, stages     down: BLOCK_N, BLOCK_K, warps, stages
=======  ==========================================  ======================================
16       64, 128, 4, 4                               64, 128, 4, 4
32       64, 128, 4, 4                               64, 128, 4, 4
64       64 (128 if non-gated), 64, 4, 4             128, 64, 4, 4
128      64 (128 if non-gated), 64, 8, 3             128, 64, 8, 3
=======  ==========================================  ======================================

Small buckets are weight-bandwidth bound: narrow column tiles give many programs and deep K tiles keep
loads in flight. Large buckets are compute bound: wider tiles; the gated gate/up GEMM keeps two FP32
accumulators (gate and up), hence its narrower BLOCK_N. These are starting points for H200 (SM90), not
tuned values; BLOCK_K is a power of two, so it always divides or is divided by the scheme's group size.
"""

from __future__ import annotations

import torch
import triton

from ...activations import get_activation
from ...formats.weights import MoEWeights
from ..routing.finalize import launch_finalize
from .grouped_gemm import DOWN_ATOMIC, DOWN_MASKED, DOWN_ROUTE_BUFFER, GemmConfig, RowSource, launch_down, \
    launch_gate_up
from ..routing.prepare import prepare_routes

__all__ = ["triton_fused_moe", "triton_fused_moe_masked", "triton_expert_routes", "triton_combine_routes",
           "select_configs", "CONFIG_TABLE"]

# BLOCK_M -> (gate/up gated, gate/up non-gated, down)
CONFIG_TABLE: dict[int, tuple[GemmConfig, GemmConfig, GemmConfig]] = {
    16: (GemmConfig(16, 64, 128, 4, 4), GemmConfig(16, 64, 128, 4, 4), GemmConfig(16, 64, 128, 4, 4)),
    32: (GemmConfig(32, 64, 128, 4, 4), GemmConfig(32, 64, 128, 4, 4), GemmConfig(32, 64, 128, 4, 4)),
    64: (GemmConfig(64, 64, 64, 4, 4), GemmConfig(64, 128, 64, 4, 4), GemmConfig(64, 128, 64, 4, 4)),
    128: (GemmConfig(128, 64, 64, 8, 3), GemmConfig(128, 128, 64, 8, 3), GemmConfig(128, 128, 64, 8, 3)),
}


def _bucket(rows_per_expert: int, largest: int = 128) -> int:
    for block_m in (16, 32, 64):
        if rows_per_expert <= block_m or block_m == largest:
            return block_m
    return 128


def select_configs(rows_per_expert: int, gated: bool, *, masked: bool = False) -> tuple[GemmConfig, GemmConfig]:
    """(gate/up, down) configurations for an expected ``rows_per_expert`` (see the module table)."""
    gated_up, plain_up, down = CONFIG_TABLE[_bucket(rows_per_expert, 64 if masked else 128)]
    return (gated_up if gated else plain_up), down


def _routed_gemms(x: torch.Tensor, weights: MoEWeights, ids: torch.Tensor, expert_offset: int, activation: str,
                  ) -> tuple[torch.Tensor, RowSource, GemmConfig]:
    """Route prep + gate/up GEMM for ``T * k >= 1`` routes; returns (inter, rows, down config).

    The configuration depends only on ``(T * k, E, gated)``, so :func:`triton_fused_moe` and
    :func:`triton_expert_routes` compute identical per-route outputs for identical shapes.
    """
    weights.require_canonical("provider triton")
    act = get_activation(activation)
    top_k = ids.shape[1]
    num_experts = weights.num_experts
    num_routes = ids.numel()
    cfg_up, cfg_down = select_configs(triton.cdiv(num_routes, min(num_experts, num_routes)), act.gated)
    plan = prepare_routes(ids, num_experts, expert_offset, cfg_up.block_m)
    rows = RowSource(plan.num_blocks, top_k, plan.sorted_routes, plan.block_info)
    inter = torch.empty(num_routes, weights.intermediate_size, dtype=x.dtype, device=x.device)
    _gate_up(x, inter, weights, rows, act, cfg_up)
    return inter, rows, cfg_down


def _gate_up(x: torch.Tensor, inter: torch.Tensor, weights: MoEWeights, rows: RowSource, act, cfg: GemmConfig) -> None:
    launch_gate_up(x, inter, weights.w13, rows, act_code=act.code, gated=act.gated, cfg=cfg, bias=weights.w13_bias,
                   alpha=act.alpha or 0.0, limit=act.limit or 0.0)


def triton_fused_moe(x: torch.Tensor, weights: MoEWeights, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                     activation: str, finalize: str, expert_offset: int, out: torch.Tensor) -> None:
    """Fused MoE into ``out``; arguments already validated (:func:`w4a16_moe.validate.check_moe_call`).

    Args:
        x: ``[T, H]`` bf16/fp16, contiguous, on the GPU (any ``T >= 0``).
        weights: the layer's :class:`MoEWeights` (``E`` local experts), on x's device.
        topk_weights: ``[T, k]`` fp32.  topk_ids: ``[T, k]`` int32 or int64 global expert ids.
        activation: name from :mod:`w4a16_moe.activations` matching ``weights.gated``.
        finalize: ``"deterministic"`` (bit-identical run to run) or ``"fused"`` (atomic accumulation).
        expert_offset: global id of local expert 0; ids outside ``[offset, offset + E)`` contribute nothing.
        out: ``[T, H]`` in x's dtype, contiguous; every element is overwritten.
    """
    tokens, hidden = x.shape
    if tokens == 0:
        return
    ids = topk_ids.contiguous()
    tw = topk_weights.contiguous()
    inter, rows, cfg_down = _routed_gemms(x, weights, ids, expert_offset, activation)
    if finalize == "fused":
        out.zero_()  # tokens without a valid route stay zero
        launch_down(inter, out, weights.w2, rows, mode=DOWN_ATOMIC, topk_weights=tw, cfg=cfg_down,
                    bias=weights.w2_bias)
        return
    ybuf = torch.empty(ids.numel(), hidden, dtype=x.dtype, device=x.device)
    launch_down(inter, ybuf, weights.w2, rows, mode=DOWN_ROUTE_BUFFER, topk_weights=None, cfg=cfg_down,
                bias=weights.w2_bias)
    launch_finalize(ybuf, tw, out, topk_ids=ids, num_experts=weights.num_experts, expert_offset=expert_offset)


def triton_expert_routes(x: torch.Tensor, weights: MoEWeights, local_ids: torch.Tensor, *, activation: str,
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """First half of the deterministic path: ``(y [T, k, H] in x's dtype, valid [T, k] bool)``.

    ``local_ids [T, k]`` int32/int64 local expert ids (``-1`` or any id outside ``[0, E)`` = no route).
    ``y[t, j]`` is the unweighted expert output of a valid route, bit-identical to what
    :func:`triton_fused_moe` (deterministic) computes for the same shapes; entries of invalid routes are
    unspecified. No host synchronization.
    """
    tokens, hidden = x.shape
    top_k = local_ids.shape[1]
    valid = (local_ids >= 0) & (local_ids < weights.num_experts)
    y = torch.empty(tokens, top_k, hidden, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return y, valid
    inter, rows, cfg_down = _routed_gemms(x.contiguous(), weights, local_ids.contiguous(), 0, activation)
    launch_down(inter, y.view(-1, hidden), weights.w2, rows, mode=DOWN_ROUTE_BUFFER, topk_weights=None,
                cfg=cfg_down, bias=weights.w2_bias)
    return y, valid


def triton_combine_routes(y: torch.Tensor, topk_weights: torch.Tensor, valid: torch.Tensor, *,
                          launch=None) -> torch.Tensor:
    """Second half: ``out [T, H] = sum_j topk_weights[:, j] * y[:, j]`` over ``valid`` routes, FP32 in fixed
    j order, one cast to ``y``'s dtype (the finalize kernel of :func:`triton_fused_moe`). Invalid entries
    of ``y [T, k, H]`` are never read. ``launch``: a finalize launcher of the same contract in place of the
    Triton one (the CuTe routing family's, :func:`w4a16_moe.kernels.cute.provider.finalize_launcher`)."""
    tokens, _, hidden = y.shape
    out = torch.empty(tokens, hidden, dtype=y.dtype, device=y.device)
    if tokens == 0:
        return out
    (launch or launch_finalize)(y.contiguous().view(-1, hidden), topk_weights.float().contiguous(), out,
                                valid=valid.to(torch.bool).contiguous())
    return out


def triton_fused_moe_masked(x: torch.Tensor, weights: MoEWeights, masked_m: torch.Tensor, *, activation: str,
                            out: torch.Tensor) -> None:
    """Masked (DeepEP low-latency) MoE into ``out``; arguments already validated.

    ``x [E, cap, H]`` bf16/fp16 contiguous, ``masked_m [E]`` int32 on the GPU, ``out`` like x.
    ``out[e, r] = mlp_e(x[e, r])`` (unweighted) for ``r < clamp(masked_m[e], 0, cap)``; other rows are not
    read and are written as zeros.
    """
    weights.require_canonical("provider triton")
    num_experts, cap, hidden = x.shape
    if num_experts == 0 or cap == 0:
        return
    act = get_activation(activation)
    cfg_up, cfg_down = select_configs(cap, act.gated, masked=True)
    assert cfg_up.block_m == cfg_down.block_m
    rows = RowSource(num_experts * triton.cdiv(cap, cfg_up.block_m), masked_m=masked_m.contiguous(), cap=cap)
    inter = torch.empty(num_experts * cap, weights.intermediate_size, dtype=x.dtype, device=x.device)
    _gate_up(x.view(-1, hidden), inter, weights, rows, act, cfg_up)
    launch_down(inter, out.view(-1, hidden), weights.w2, rows, mode=DOWN_MASKED, topk_weights=None, cfg=cfg_down,
                bias=weights.w2_bias)

"""Per-route expert outputs and their fixed-order combine, per provider.

:func:`w4a16_moe.fused_moe` with ``finalize="deterministic"`` is, for every provider, the composition
``combine_routes(expert_routes(...))``. The expert-parallel layer (:mod:`w4a16_moe.distributed`) runs the
two halves on different ranks; both halves are the provider's own code, so for the same per-rank shapes the
results are bit-identical, and with a batch-invariant provider (CuTe with ``W4A16_MOE_BATCH_INVARIANT=1``)
they equal the single-process result bit for bit.
"""

from __future__ import annotations

from typing import Optional

import torch

from .formats.weights import MoEWeights
from .providers import get_provider, resolve_backend, select_provider
from .validate import check_routes_call

__all__ = ["expert_routes", "combine_routes", "weighted_partial"]


def expert_routes(x: torch.Tensor, weights: MoEWeights, local_ids: torch.Tensor, *, activation: str,
                  backend: str = "auto", global_num_experts: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y [R, k, H], valid [R, k])``: the unweighted output of every valid route (local ids, -1 = none).

    ``y`` is FP32 for the reference provider and x's dtype for the GPU providers (what their
    deterministic finalize reads); entries of invalid routes are unspecified. ``global_num_experts``: the
    selection hint of :func:`w4a16_moe.fused_moe` (ids uniform over that many experts, the ``E`` local ones
    among them); results do not depend on it. With a ``weights.w13_perm`` (act order over H) the ``R * k``
    routes are gathered (:func:`w4a16_moe.ops.permuted_routes_input`) and run as top-1 rows, as
    :func:`w4a16_moe.fused_moe` does.
    """
    if getattr(weights, "w13_perm", None) is not None:  # (a non-MoEWeights gets check_routes_call's error)
        return _permuted_expert_routes(x, weights, local_ids, activation, backend, global_num_experts)
    call = check_routes_call(x, weights, local_ids, activation=activation, global_num_experts=global_num_experts)
    decision = select_provider(call, resolve_backend(backend))
    return get_provider(decision.provider).expert_routes(decision.plan, call, x, weights, local_ids)


def _permuted_expert_routes(x, weights: MoEWeights, local_ids, activation, backend, global_num_experts):
    from .ops import permuted_expert_routes

    check_routes_call(x, weights, local_ids, activation=activation, global_num_experts=global_num_experts)
    return permuted_expert_routes(x, weights.without_w13_perm(), weights.w13_perm, local_ids.reshape(-1).long(),
                                  local_ids.shape[1], activation, backend, global_num_experts)


def combine_routes(y: torch.Tensor, topk_weights: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype, *,
                   backend: str = "auto") -> torch.Tensor:
    """``sum_j topk_weights[:, j] * y[:, j]`` over valid routes, FP32 in fixed top-k order, cast to ``dtype``.

    GPU routes (16-bit ``y``) are combined by the deterministic finalize of the route preparation in use: the CuTe
    routing family's where the CuTe provider uses it on this device (every kernel of it prebuilt for the arch, or
    ``W4A16_MOE_ROUTING=cute``; not with ``backend="triton"``), else the Triton one. Both give the same bits."""
    if y.dtype == torch.float32:  # reference routes
        from .reference import combine_routes as ref_combine

        return ref_combine(y, topk_weights, valid).to(dtype)
    from .kernels.triton.moe import triton_combine_routes

    launch = None
    if y.is_cuda and resolve_backend(backend) != "triton":
        from .archs import arch_of_capability
        from .kernels.cute.provider import finalize_launcher

        launch = finalize_launcher(arch_of_capability(*torch.cuda.get_device_capability(y.device)))
    return triton_combine_routes(y, topk_weights, valid, launch=launch).to(dtype)  # written in y's dtype


def weighted_partial(x: torch.Tensor, weights: MoEWeights, topk_weights: torch.Tensor, local_ids: torch.Tensor, *,
                     activation: str, backend: str = "auto", global_num_experts: Optional[int] = None) -> torch.Tensor:
    """``fused_moe`` over local ids (-1 = none) with fused finalize: per token, the weighted sum of its routes
    (``global_num_experts``: the selection hint, as for :func:`expert_routes`)."""
    from .api import fused_moe

    return fused_moe(x, weights, topk_weights, local_ids, activation=activation, finalize="fused", backend=backend,
                     global_num_experts=global_num_experts)

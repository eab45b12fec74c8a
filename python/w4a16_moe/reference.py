"""FP32 references of the fused MoE ops, on any device (CPU included).

The references dequantize the 4-bit weights exactly (:func:`w4a16_moe.formats.dequantize_matrix`),
add the optional per-expert biases (``w13_bias`` after the first GEMM, ``w2_bias`` after the second),
undo an act-order ``w13_perm`` on the dequantized ``w13`` columns (the torch ops gather ``x`` instead),
compute every GEMM and the activation in FP32 and combine the routes of a token in top-k order.
They return FP32 tensors; the ``backend="reference"`` provider of ``fused_moe`` casts to x's dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

from .activations import apply_activation
from .formats.quantize import dequantize_matrix
from .formats.weights import MoEWeights, QuantizedMatrix
from .validate import check_masked_call, check_moe_call

__all__ = ["reference_moe", "reference_moe_masked"]

_REF_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _expert(qm: QuantizedMatrix, e: int) -> torch.Tensor:
    return dequantize_matrix(qm.map(lambda t: t[e : e + 1]))[0]


def _expert_w13(weights: MoEWeights, e: int) -> torch.Tensor:
    """Expert ``e``'s dequantized ``w13`` with its columns in the true input order: a ``w13_perm`` is undone on
    the weights here (stored column ``j`` is input channel ``w13_perm[e, j]``), independently of the torch ops,
    which gather ``x`` instead."""
    w = _expert(weights.w13, e)
    perm = weights.w13_perm
    if perm is None:
        return w
    true = torch.empty_like(w)
    true[:, perm[e].long()] = w
    return true


def _expert_mlp(x: torch.Tensor, weights: MoEWeights, e: int, activation: str) -> torch.Tensor:
    """One expert's MLP on rows ``x``: computed in FP64 and rounded to FP32.

    FP64 makes each row's result independent of how many rows are batched with it (the last FP64 bits
    of a BLAS product may depend on the batch; after rounding to FP32 they do not, except with
    negligible probability), so the expert-parallel path, which batches rows differently, reproduces
    the single-process result exactly.
    """
    weights.require_canonical("the FP32 reference")
    h = x.double() @ _expert_w13(weights, e).double().t()
    if weights.w13_bias is not None:
        h = h + weights.w13_bias[e].double()
    a = apply_activation(h, activation)
    y = a @ _expert(weights.w2, e).double().t()
    if weights.w2_bias is not None:
        y = y + weights.w2_bias[e].double()
    return y.float()


def reference_routes(
    x: torch.Tensor, weights: MoEWeights, topk_ids: torch.Tensor, *, activation: str, expert_offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-route expert outputs ``y [T, k, H]`` (FP32, unweighted; zeros for invalid routes) and the
    ``valid [T, k]`` mask. Inputs must already be validated."""
    t, k = topk_ids.shape
    local = topk_ids.long() - expert_offset
    valid = (local >= 0) & (local < weights.num_experts)
    y = torch.zeros(t, k, x.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(local[valid]).tolist():
        tok, slot = torch.nonzero(valid & (local == e), as_tuple=True)
        y[tok, slot] = _expert_mlp(x[tok], weights, e, activation)
    return y, valid


def combine_routes(y: torch.Tensor, topk_weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``sum_j topk_weights[:, j] * y[:, j]`` over valid routes, in FP32 and fixed top-k order."""
    res = torch.zeros(y.shape[0], y.shape[2], dtype=torch.float32, device=y.device)
    for j in range(y.shape[1]):
        res += torch.where(valid[:, j, None], topk_weights[:, j, None] * y[:, j].float(), 0.0)
    return res


def reference_moe(
    x: torch.Tensor,
    weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "swiglu",
    finalize: str = "deterministic",
    expert_offset: int = 0,
    backend: str = "reference",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """FP32 reference of :func:`w4a16_moe.fused_moe`.

    ``out[t] = sum_j topk_weights[t, j] * mlp_{e}(x[t])`` over the routes ``j`` whose
    ``e = topk_ids[t, j] - expert_offset`` is a local expert (``0 <= e < E``), summed in ``j`` order.
    ``finalize`` and ``backend`` are accepted for signature compatibility and change nothing.
    Returns FP32 ``[T, H]``; when ``out`` is given the result is also copied into it.
    """
    check_moe_call(
        x, weights, topk_weights, topk_ids, activation=activation, finalize=finalize,
        expert_offset=expert_offset, out=out, x_dtypes=_REF_DTYPES,
    )
    y, valid = reference_routes(x, weights, topk_ids, activation=activation, expert_offset=expert_offset)
    res = combine_routes(y, topk_weights, valid)
    if out is not None:
        out.copy_(res)
    return res


def reference_moe_masked(
    x: torch.Tensor,
    weights: MoEWeights,
    masked_m: torch.Tensor,
    *,
    activation: str = "swiglu",
    backend: str = "reference",
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """FP32 reference of :func:`w4a16_moe.fused_moe_masked` (DeepEP low-latency layout).

    ``out[e, r] = mlp_e(x[e, r])`` for ``r < clamp(masked_m[e], 0, cap)``, zeros elsewhere; unweighted.
    """
    call = check_masked_call(x, weights, masked_m, activation=activation, out=out, x_dtypes=_REF_DTYPES)
    res = reference_masked(call, x, weights, masked_m)
    if out is not None:
        out.copy_(res)
    return res


def reference_masked(call, x: torch.Tensor, weights: MoEWeights, masked_m: torch.Tensor) -> torch.Tensor:
    """The FP32 masked reference of an already validated call (:class:`~w4a16_moe.validate.MaskedCall`)."""
    res = torch.zeros(call.experts, call.capacity, call.hidden, dtype=torch.float32, device=x.device)
    counts = masked_m.clamp(0, call.capacity).tolist()
    for e, m in enumerate(counts):
        if m:
            res[e, :m] = _expert_mlp(x[e, :m], weights, e, call.activation.name)
    return res

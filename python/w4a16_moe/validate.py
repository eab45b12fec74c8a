"""Argument checks shared by every public entry point.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong shape, device,
layout or value) with a message that names the argument, the rule and the actual value. Only
metadata is inspected: nothing here reads device memory or synchronizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .activations import Activation, get_activation
from .formats.weights import MoEWeights

__all__ = ["MoECall", "MaskedCall", "check_moe_call", "check_masked_call", "check_routes_call",
           "check_global_experts", "FINALIZE_MODES", "ACT_DTYPES"]

FINALIZE_MODES = ("deterministic", "fused")
ACT_DTYPES = (torch.bfloat16, torch.float16)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class MoECall:
    """The checked description of one ``fused_moe`` call (shapes only, no data)."""

    tokens: int
    top_k: int
    hidden: int
    intermediate: int
    experts: int
    dtype: torch.dtype
    device: torch.device
    activation: Activation
    finalize: str
    expert_offset: int
    scheme: str
    #: the expert-parallel first half (:func:`w4a16_moe.routes.expert_routes`): per-route outputs, no combine
    routes_only: bool = False
    #: the weights carry per-expert biases (``w13_bias`` and/or ``w2_bias``)
    has_bias: bool = False
    #: the ``global_num_experts`` hint (expert parallelism: ``topk_ids`` are uniform over this many experts,
    #: ``experts`` of them local); None = every route assumed local (also when the hint equals ``experts``)
    global_experts: Optional[int] = None


@dataclass(frozen=True)
class MaskedCall:
    experts: int
    capacity: int
    hidden: int
    intermediate: int
    dtype: torch.dtype
    device: torch.device
    activation: Activation
    scheme: str
    #: the weights carry per-expert biases (``w13_bias`` and/or ``w2_bias``)
    has_bias: bool = False


def _tensor(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _same_device(t: torch.Tensor, name: str, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, but x is on {device}")


def _int(v: object, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    return v


def check_weights(weights: object, x_device: torch.device, hidden: int, what: str = "x") -> MoEWeights:
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected w4a16_moe.MoEWeights, got {type(weights).__name__}")
    if weights.device != x_device:
        raise ValueError(f"weights: on {weights.device}, but {what} is on {x_device}")
    if weights.hidden_size != hidden:
        raise ValueError(
            f"{what}: hidden size {hidden} does not match the weights' hidden size {weights.hidden_size}"
        )
    return weights


def check_activation(activation: object, weights: MoEWeights) -> Activation:
    act = get_activation(activation)  # type: ignore[arg-type]
    if act.gated != weights.gated:
        kind = "gated" if weights.gated else "non-gated"
        raise ValueError(
            f"activation: {act.name!r} is {'gated' if act.gated else 'non-gated'}, but the weights were "
            f"built for a {kind} activation (w13 has {weights.w13.n} rows, I={weights.intermediate_size})"
        )
    return act


def check_global_experts(global_num_experts: object, num_experts: int, expert_offset: int = 0) -> Optional[int]:
    """The ``global_num_experts`` hint as a call carries it: None when not given or when it equals the local
    expert count (every expert is local: no expert parallelism); else an int with
    ``global_num_experts >= expert_offset + E_local`` (the local ids must be global ids)."""
    if global_num_experts is None:
        return None
    g = _int(global_num_experts, "global_num_experts")
    if g < expert_offset + num_experts:
        raise ValueError(
            f"global_num_experts: must be >= expert_offset + E_local = {expert_offset} + {num_experts} = "
            f"{expert_offset + num_experts} (the local experts are global ids expert_offset .. "
            f"expert_offset + E_local - 1), got {g}"
        )
    return None if g == num_experts else g


def check_moe_call(
    x: object,
    weights: object,
    topk_weights: object,
    topk_ids: object,
    *,
    activation: object = "swiglu",
    finalize: object = "deterministic",
    expert_offset: object = 0,
    out: object = None,
    x_dtypes: tuple = ACT_DTYPES,
    global_num_experts: object = None,
) -> MoECall:
    """Check the arguments of ``fused_moe`` / ``reference_moe``; return the call's static description."""
    x = _tensor(x, "x")
    if x.dtype not in x_dtypes:
        raise TypeError(f"x: expected dtype {' or '.join(map(str, x_dtypes))}, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [T, H], got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"x: must be contiguous (strides {x.stride()})")
    tokens, hidden = x.shape
    w = check_weights(weights, x.device, hidden)
    ids = _tensor(topk_ids, "topk_ids")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected int32 or int64, got {ids.dtype}")
    if ids.dim() != 2 or ids.shape[0] != tokens:
        raise ValueError(f"topk_ids: expected shape [T={tokens}, k], got {tuple(ids.shape)}")
    top_k = ids.shape[1]
    if top_k < 1:
        raise ValueError(f"topk_ids: top-k must be at least 1, got shape {tuple(ids.shape)}")
    _same_device(ids, "topk_ids", x.device)
    tw = _tensor(topk_weights, "topk_weights")
    if tw.dtype != torch.float32:
        raise TypeError(f"topk_weights: expected float32, got {tw.dtype}")
    if tuple(tw.shape) != (tokens, top_k):
        raise ValueError(f"topk_weights: expected shape {(tokens, top_k)} like topk_ids, got {tuple(tw.shape)}")
    _same_device(tw, "topk_weights", x.device)
    act = check_activation(activation, w)
    if finalize not in FINALIZE_MODES:
        raise ValueError(f"finalize: expected one of {FINALIZE_MODES}, got {finalize!r}")
    off = _int(expert_offset, "expert_offset")
    if not 0 <= off <= INT32_MAX - w.num_experts:
        raise ValueError(f"expert_offset: must be in [0, {INT32_MAX - w.num_experts}], got {off}")
    g = check_global_experts(global_num_experts, w.num_experts, off)
    if out is not None:
        o = _tensor(out, "out")
        if o.dtype != x.dtype:
            raise TypeError(f"out: expected dtype {x.dtype} like x, got {o.dtype}")
        if tuple(o.shape) != (tokens, hidden):
            raise ValueError(f"out: expected shape {(tokens, hidden)}, got {tuple(o.shape)}")
        _same_device(o, "out", x.device)
        if not o.is_contiguous():
            raise ValueError("out: must be contiguous")
    return MoECall(
        tokens, top_k, hidden, w.intermediate_size, w.num_experts, x.dtype, x.device, act,
        str(finalize), off, w.scheme.name, has_bias=w.has_bias, global_experts=g,
    )


def check_routes_call(x: object, weights: object, local_ids: object, *, activation: object = "swiglu",
                      global_num_experts: object = None) -> MoECall:
    """Check the arguments of the expert-parallel first half (:func:`w4a16_moe.routes.expert_routes`:
    ``x [R, H]``, local ids ``[R, k]``, -1 = none; ``global_num_experts``: the selection hint, as for
    ``fused_moe`` with ``expert_offset=0``); return its ``routes_only`` call description."""
    x = _tensor(x, "x")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"x: expected dtype {' or '.join(map(str, ACT_DTYPES))}, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [T, H], got shape {tuple(x.shape)}")
    tokens, hidden = x.shape
    w = check_weights(weights, x.device, hidden)
    ids = _tensor(local_ids, "local_ids")
    if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 2 or ids.shape[0] != tokens or ids.shape[1] < 1:
        raise ValueError(f"local_ids: expected int32/int64 [T={tokens}, k >= 1], got {ids.dtype} {tuple(ids.shape)}")
    _same_device(ids, "local_ids", x.device)
    act = check_activation(activation, w)
    g = check_global_experts(global_num_experts, w.num_experts)
    return MoECall(tokens, ids.shape[1], hidden, w.intermediate_size, w.num_experts, x.dtype, x.device, act,
                   "deterministic", 0, w.scheme.name, routes_only=True,
                   has_bias=w.has_bias, global_experts=g)


def check_masked_call(
    x: object, weights: object, masked_m: object, *, activation: object = "swiglu", out: Optional[object] = None,
    x_dtypes: tuple = ACT_DTYPES,
) -> MaskedCall:
    """Check the arguments of ``fused_moe_masked`` / ``reference_moe_masked``."""
    x = _tensor(x, "x")
    if x.dtype not in x_dtypes:
        raise TypeError(f"x: expected dtype {' or '.join(map(str, x_dtypes))}, got {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"x: expected a 3-D tensor [E, cap, H], got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"x: must be contiguous (strides {x.stride()})")
    e, cap, hidden = x.shape
    w = check_weights(weights, x.device, hidden)
    if e != w.num_experts:
        raise ValueError(f"x: expected {w.num_experts} experts in dim 0 (the weights' local experts), got {e}")
    m = _tensor(masked_m, "masked_m")
    if m.dtype != torch.int32:
        raise TypeError(f"masked_m: expected int32, got {m.dtype}")
    if tuple(m.shape) != (e,):
        raise ValueError(f"masked_m: expected shape ({e},), got {tuple(m.shape)}")
    _same_device(m, "masked_m", x.device)
    act = check_activation(activation, w)
    if out is not None:
        o = _tensor(out, "out")
        if o.dtype != x.dtype or tuple(o.shape) != tuple(x.shape) or o.device != x.device or not o.is_contiguous():
            raise ValueError(f"out: expected a contiguous {x.dtype} tensor {tuple(x.shape)} on {x.device}")
    return MaskedCall(e, cap, hidden, w.intermediate_size, x.dtype, x.device, act, w.scheme.name, w.has_bias)

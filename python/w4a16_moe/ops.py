"""The torch ops behind the public API: ``torch.ops.w4a16_moe.{fused_moe, fused_moe_out, fused_moe_masked}``.

Each op takes the weights as their canonical tensors (see :mod:`w4a16_moe.formats.weights`)
so it can live in a TorchScript-style schema; each has a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces calls without graph breaks. The real implementation
validates the call once (one :class:`~w4a16_moe.validate.MoECall`), picks a provider and its plan
(:mod:`w4a16_moe.providers`; plans are cached per call shape) and runs that plan. The weights are rebuilt
from their tensors without re-running :meth:`MoEWeights.validate` when tensors of the same metadata
were validated before (validation reads only metadata).

Schemas (``W`` stands for the ten weight tensors
``w13_codes, w13_scales, w13_zeros?, w13_global_scale?, w2_codes, w2_scales, w2_zeros?, w2_global_scale?,
w13_bias?, w2_bias?``; ``activation`` is the canonical string form of :mod:`w4a16_moe.activations`, parameters
included, e.g. ``"swiglu_oai(alpha=1.5,limit=10.0)"``)::

    fused_moe(x, W, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend,
              global_num_experts=None, w13_perm=None) -> Tensor
    fused_moe_out(x, W, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend, out!,
                  global_num_experts=None, w13_perm=None) -> ()
    fused_moe_masked(x, W, masked_m, scheme, activation, backend, w13_perm=None) -> Tensor

``global_num_experts`` (``int?``, after the original arguments so that existing positional calls keep working)
is the expert-parallel selection hint of :func:`w4a16_moe.fused_moe`; it is checked and carried in the call
description (:class:`~w4a16_moe.validate.MoECall` ``global_experts``), which is all selection reads. These
schemas are defined here in Python (the C++ library ``w4a16_moe_C`` only launches kernels), and selection
happens in Python inside the op.

``w13_perm`` (``Tensor?``, last; :attr:`MoEWeights.w13_perm`, GPTQ act order over the hidden size) is applied
here, once, for every provider: expert ``e`` computes ``w13_e @ x[w13_perm[e]]``, so a routed call gathers
``xg [T*k, H]``, ``xg[r] = x[r // k][w13_perm[e_r]]`` (in chunks of routes, the int64 index at most 64 MiB;
no host sync, CUDA-graph safe), runs the provider's per-route half (:func:`w4a16_moe.routes.expert_routes`,
top-1 over ``T*k`` rows, the weights without the permutation) and combines the routes in FP32 in fixed
top-k order (:func:`w4a16_moe.routes.combine_routes`: torch ops for the reference's FP32 routes, one Triton
finalize kernel for the GPU providers'): the result is deterministic for both ``finalize`` modes (``fused``
takes the same path). A masked call gathers ``x[e, :, w13_perm[e]]`` and runs the provider's masked path. Only
the permutation's metadata is checked here (its values, once, when :class:`MoEWeights` is built).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .ep_observe import observed_global_experts
from .formats.schemes import get_scheme
from .formats.weights import MoEWeights, QuantizedMatrix, check_w13_perm
from .providers import get_provider, resolve_backend, select_provider
from .validate import check_masked_call, check_moe_call, check_routes_call

__all__ = ["weight_args", "weights_from_args", "permuted_routes_input", "permuted_expert_routes"]

_W = (
    "Tensor w13_codes, Tensor w13_scales, Tensor? w13_zeros, Tensor? w13_global_scale, "
    "Tensor w2_codes, Tensor w2_scales, Tensor? w2_zeros, Tensor? w2_global_scale, "
    "Tensor? w13_bias, Tensor? w2_bias"
)
_NW = 10  # weight tensors per call (see _W)
_ROUTED = "Tensor topk_weights, Tensor topk_ids, str scheme, str activation, str finalize, int expert_offset, str backend"

_lib = torch.library.Library("w4a16_moe", "DEF")
_lib.define(f"fused_moe(Tensor x, {_W}, {_ROUTED}, int? global_num_experts=None, Tensor? w13_perm=None) -> Tensor")
_lib.define(f"fused_moe_out(Tensor x, {_W}, {_ROUTED}, Tensor(a!) out, int? global_num_experts=None, "
            "Tensor? w13_perm=None) -> ()")
_lib.define(f"fused_moe_masked(Tensor x, {_W}, Tensor masked_m, str scheme, str activation, str backend, "
            "Tensor? w13_perm=None) -> Tensor")


def weight_args(w: MoEWeights) -> tuple:
    """The ten weight tensors of ``w`` in op-argument order (quantized w13, quantized w2, then the biases)."""
    a, b = w.w13, w.w2
    return (a.codes, a.scales, a.zeros, a.global_scale, b.codes, b.scales, b.zeros, b.global_scale,
            w.w13_bias, w.w2_bias)


def weights_from_args(scheme: str, *t: Optional[torch.Tensor]) -> MoEWeights:
    """Rebuild :class:`MoEWeights` (validated) from :func:`weight_args` tensors (the two biases may be left
    out: eight tensors mean no biases)."""
    if len(t) not in (8, _NW):
        raise TypeError(f"weights_from_args: expected 8 or {_NW} weight tensors, got {len(t)}")
    sch = get_scheme(scheme)
    w13 = QuantizedMatrix(sch, t[0], t[1], t[2], t[3])
    w2 = QuantizedMatrix(sch, t[4], t[5], t[6], t[7])
    if not isinstance(t[4], torch.Tensor) or t[4].dim() != 3:
        raise TypeError("w2.codes: expected a uint8 tensor [E, H, I/2]")
    gated = isinstance(t[0], torch.Tensor) and t[0].dim() == 3 and t[0].shape[1] == 2 * t[4].shape[2] * 2
    b13, b2 = (t[8], t[9]) if len(t) == _NW else (None, None)
    return MoEWeights(sch, w13, w2, gated, b13, b2)


_VALIDATED: dict = {}  # (scheme, metadata of the ten tensors) -> gated, for layouts validated before
_VALIDATED_MAX = 1024


def _meta(t) -> Optional[tuple]:
    return None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)


def _weights(scheme: str, wts: tuple) -> MoEWeights:
    """:func:`weights_from_args`, validating only tensors of metadata not seen before (real tensors only)."""
    key = (scheme, tuple(_meta(t) if isinstance(t, torch.Tensor) else t for t in wts))
    gated = _VALIDATED.get(key)
    if gated is None:
        w = weights_from_args(scheme, *wts)
        if len(_VALIDATED) >= _VALIDATED_MAX:
            _VALIDATED.clear()
        _VALIDATED[key] = w.gated
        return w
    sch = get_scheme(scheme)
    return MoEWeights.trusted(sch, QuantizedMatrix(sch, *wts[:4]), QuantizedMatrix(sch, *wts[4:8]), gated,
                              wts[8], wts[9])


def _check_perm(w13_perm, weights: MoEWeights) -> None:
    if w13_perm is not None:
        check_w13_perm(w13_perm, weights.num_experts, weights.hidden_size, weights.device)


# int64 gather indices per chunk of routes: at most this many elements (64 MiB)
_GATHER_ELEMS = 2**23


def permuted_routes_input(x: torch.Tensor, w13_perm: torch.Tensor, local: torch.Tensor, top_k: int) -> torch.Tensor:
    """``xg [R, H]`` with ``xg[r] = x[r // top_k][w13_perm[local[r]]]`` for ``local [R]`` int64 expert ids in
    ``0..E-1`` (clamped by the caller). Gathered in chunks of routes so that the int64 index stays at most
    64 MiB; no host sync."""
    r, h = local.shape[0], x.shape[1]
    xg = x.new_empty(r, h)
    flat = x.reshape(-1)
    chunk = max(1, _GATHER_ELEMS // h)
    # [R]: offset of each route's token row in flat x (routes are token-major: R = T * top_k)
    t = r // top_k
    rows = torch.arange(0, t * h, h, device=x.device)[:, None].expand(t, top_k).reshape(r)
    for s in range(0, r, chunk):
        sl = slice(s, min(s + chunk, r))
        idx = w13_perm.index_select(0, local[sl]).to(torch.int64)  # [c, H]
        idx += rows[sl, None]
        torch.index_select(flat, 0, idx.view(-1), out=xg[sl].view(-1))
    return xg


def permuted_expert_routes(x, weights: MoEWeights, w13_perm, local: torch.Tensor, top_k: int, activation: str,
                           backend: str, global_num_experts=None) -> tuple:
    """``(y [T, k, H], valid [T, k])`` of the routes ``local [T*k]`` (int64 local expert ids; out of ``0..E-1``:
    invalid) of ``weights`` (without the permutation) under ``w13_perm``: x gathered per route
    (:func:`permuted_routes_input`), then the provider's per-route half over the ``T*k`` rows as top-1."""
    t, e = x.shape[0], weights.num_experts
    valid = (local >= 0) & (local < e)
    xg = permuted_routes_input(x, w13_perm, local.clamp(0, e - 1), top_k)
    ids1 = torch.where(valid, local, -1).to(torch.int32).view(t * top_k, 1)
    rcall = check_routes_call(xg, weights, ids1, activation=activation, global_num_experts=global_num_experts)
    decision = select_provider(rcall, resolve_backend(backend))
    y, _ = get_provider(decision.provider).expert_routes(decision.plan, rcall, xg, weights, ids1)
    return y.view(t, top_k, -1), valid.view(t, top_k)


def _run_permuted(call, x, weights, w13_perm, topk_weights, topk_ids, backend, out, global_num_experts):
    """A routed call with ``w13_perm``: :func:`permuted_expert_routes`, then the FP32 combine."""
    from .routes import combine_routes

    t, k = topk_ids.shape
    if t == 0:
        return
    local = topk_ids.reshape(-1).long()
    if call.expert_offset:
        local = local - call.expert_offset
    y, valid = permuted_expert_routes(x, weights, w13_perm, local, k, call.activation.name, backend,
                                      global_num_experts)
    out.copy_(combine_routes(y, topk_weights, valid, x.dtype))


def _run_routed(x, wts, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend, out,
                global_num_experts=None, w13_perm=None):
    weights = _weights(scheme, wts)
    call = check_moe_call(
        x, weights, topk_weights, topk_ids, activation=activation, finalize=finalize,
        expert_offset=expert_offset, out=out, global_num_experts=global_num_experts,
    )
    backend = resolve_backend(backend)
    if global_num_experts is None and backend in ("auto", "cute"):
        g = observed_global_experts(weights.w13.codes, topk_ids, call.experts, call.expert_offset)
        if g is not None:
            global_num_experts = g
            call = dataclasses.replace(call, global_experts=g)
    if w13_perm is not None:
        _check_perm(w13_perm, weights)
        _run_permuted(call, x, weights, w13_perm, topk_weights, topk_ids, backend, out, global_num_experts)
        return
    decision = select_provider(call, backend)
    get_provider(decision.provider).run(decision.plan, call, x, weights, topk_weights, topk_ids, out)


@torch.library.impl(_lib, "fused_moe", "CompositeExplicitAutograd")
def _fused_moe(x, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs, w13_bias, w2_bias,
               topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend, global_num_experts=None,
               w13_perm=None):
    wts = (w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs, w13_bias, w2_bias)
    out = torch.empty_like(x)
    _run_routed(x, wts, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend, out,
                global_num_experts, w13_perm)
    return out


@torch.library.impl(_lib, "fused_moe_out", "CompositeExplicitAutograd")
def _fused_moe_out(x, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs, w13_bias,
                   w2_bias, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend, out,
                   global_num_experts=None, w13_perm=None):
    wts = (w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs, w13_bias, w2_bias)
    _run_routed(x, wts, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend, out,
                global_num_experts, w13_perm)


@torch.library.impl(_lib, "fused_moe_masked", "CompositeExplicitAutograd")
def _fused_moe_masked(x, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs, w13_bias,
                      w2_bias, masked_m, scheme, activation, backend, w13_perm=None):
    weights = _weights(scheme, (w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs,
                                w13_bias, w2_bias))
    call = check_masked_call(x, weights, masked_m, activation=activation)
    if w13_perm is not None:  # x[e, :, w13_perm[e]]: the index is expanded over cap, not materialized
        _check_perm(w13_perm, weights)
        x = torch.gather(x, 2, w13_perm.long()[:, None, :].expand(x.shape))
    decision = select_provider(call, resolve_backend(backend))
    out = torch.empty_like(x)
    get_provider(decision.provider).run_masked(decision.plan, call, x, weights, masked_m, out)
    return out


# ------------------------------------------------------------------------------------------------
# fake (meta) implementations: shape checks only, so torch.compile reports bad input at trace time
# ------------------------------------------------------------------------------------------------

@torch.library.register_fake("w4a16_moe::fused_moe")
def _fused_moe_fake(x, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs, w13_bias,
                    w2_bias, topk_weights, topk_ids, scheme, activation, finalize, expert_offset, backend,
                    global_num_experts=None, w13_perm=None):
    weights = weights_from_args(scheme, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs,
                                w13_bias, w2_bias)
    _check_perm(w13_perm, weights)
    check_moe_call(x, weights, topk_weights, topk_ids, activation=activation, finalize=finalize, expert_offset=expert_offset,
                   global_num_experts=global_num_experts)
    return torch.empty_like(x)


@torch.library.register_fake("w4a16_moe::fused_moe_out")
def _fused_moe_out_fake(x, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs,
                        w13_bias, w2_bias, topk_weights, topk_ids, scheme, activation, finalize, expert_offset,
                        backend, out, global_num_experts=None, w13_perm=None):
    weights = weights_from_args(scheme, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs,
                                w13_bias, w2_bias)
    _check_perm(w13_perm, weights)
    check_moe_call(x, weights, topk_weights, topk_ids, activation=activation, finalize=finalize,
                   expert_offset=expert_offset, out=out, global_num_experts=global_num_experts)


@torch.library.register_fake("w4a16_moe::fused_moe_masked")
def _fused_moe_masked_fake(x, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs,
                           w13_bias, w2_bias, masked_m, scheme, activation, backend, w13_perm=None):
    weights = weights_from_args(scheme, w13_codes, w13_scales, w13_zeros, w13_gs, w2_codes, w2_scales, w2_zeros, w2_gs,
                                w13_bias, w2_bias)
    _check_perm(w13_perm, weights)
    check_masked_call(x, weights, masked_m, activation=activation)
    return torch.empty_like(x)

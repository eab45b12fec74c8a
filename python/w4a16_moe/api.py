"""The public entry points: :func:`quantize_experts`, :func:`fused_moe`, :func:`fused_moe_masked`."""

from __future__ import annotations

import time
from typing import Optional

import torch

from . import ep_observe, ops
from .activations import Activation, get_activation
from .formats.quantize import quantize_matrix
from .formats.schemes import Scheme, get_scheme
from .formats.weights import MoEWeights

__all__ = ["quantize_experts", "fused_moe", "fused_moe_masked", "warmup"]


def quantize_experts(
    w13: torch.Tensor, w2: torch.Tensor, scheme: "str | Scheme", *, activation: str = "swiglu",
    scale_dtype: Optional[torch.dtype] = None,
) -> MoEWeights:
    """Quantize dense expert weights into ``scheme``.

    Args:
        w13: ``[E, 2I, H]`` (gate rows ``0..I-1``, then up rows) for gated activations, ``[E, I, H]``
            for non-gated ones; BF16, FP16 or FP32.
        w2: ``[E, H, I]``.
        scheme: a name from :data:`w4a16_moe.SCHEMES`.
        activation: the activation the layer will run; decides whether ``w13`` is gated.
        scale_dtype: dtype of INT4 scales (default: the weights' dtype, BF16 for FP32 weights).
    """
    sch = get_scheme(scheme)
    act = get_activation(activation)
    for name, t in (("w13", w13), ("w2", w2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected a 3-D tensor, got shape {tuple(t.shape)}")
    e, n13, h = w13.shape
    if tuple(w2.shape[:2]) != (e, h) and w2.shape[0] == e and n13 == w2.shape[1]:
        raise ValueError(
            f"w13: shape {tuple(w13.shape)} looks transposed: its {n13} rows equal w2's H; w13 must be "
            f"[E, 2I|I, H] (rows are outputs) for w2 of shape {tuple(w2.shape)}"
        )
    if tuple(w2.shape[:2]) != (e, h):
        raise ValueError(f"w2: expected shape [E={e}, H={h}, I], got {tuple(w2.shape)}")
    i = w2.shape[2]
    want = 2 * i if act.gated else i
    if n13 != want:
        rows = "2I" if act.gated else "I"
        raise ValueError(
            f"w13: activation {act.name!r} needs {rows}={want} rows for I={i} (from w2), got {n13}"
        )
    q13 = quantize_matrix(w13, sch, name="w13", scale_dtype=scale_dtype)
    q2 = quantize_matrix(w2, sch, name="w2", scale_dtype=scale_dtype)
    return MoEWeights(sch, q13, q2, act.gated)


def _check_tensor_args(**kw: object) -> None:
    for name, v in kw.items():
        if v is not None and not isinstance(v, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(v).__name__}")


def _activation_name(activation: object) -> object:
    """The canonical string form the torch ops carry (an :class:`Activation` is accepted as well)."""
    return activation.name if isinstance(activation, Activation) else activation


def _check_scalar_args(**kw: object) -> None:
    for name, v in kw.items():
        if name == "global_num_experts" and v is None:
            continue
        if name in ("expert_offset", "global_num_experts"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}: expected an int{' or None' if name == 'global_num_experts' else ''}, "
                                f"got {type(v).__name__}")
        elif not isinstance(v, str):
            raise TypeError(f"{name}: expected a str, got {type(v).__name__}")


def fused_moe(
    x: torch.Tensor,
    weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: "str | Activation" = "swiglu",
    finalize: str = "deterministic",
    expert_offset: int = 0,
    backend: str = "auto",
    out: Optional[torch.Tensor] = None,
    global_num_experts: Optional[int] = None,
) -> torch.Tensor:
    """Fused MoE over routed tokens with 4-bit expert weights.

    Args:
        x: ``[T, H]`` BF16 or FP16, contiguous, on a CUDA GPU.
        weights: the layer's local experts (:class:`MoEWeights`), on x's device; their optional
            per-expert biases (``w13_bias``, ``w2_bias``) are added after the first and the second GEMM.
            With a ``w13_perm`` (GPTQ act order over H) each route's row of x is gathered first and the
            routes are combined in FP32 in top-k order for both ``finalize`` modes (deterministic).
        topk_weights: ``[T, k]`` FP32 routing weights (used as given: no renormalization).
        topk_ids: ``[T, k]`` int32 (int64 accepted) global expert ids. Local experts are ids
            ``expert_offset .. expert_offset + E - 1``; any other id (-1 included) contributes nothing.
        activation: ``swiglu`` | ``geglu`` | ``swiglu_oai`` (gpt-oss; ``"swiglu_oai(alpha=A,limit=L)"`` or
            :func:`w4a16_moe.activations.swiglu_oai` for other parameters) (gated) or ``relu2`` | ``silu``
            (non-gated).
        finalize: ``deterministic`` (fixed top-k-order FP32 combine, bit-identical run to run) or
            ``fused`` (fastest, may use atomics).
        expert_offset: first global id of the local experts (expert parallelism).
        backend: ``auto`` | ``cute`` | ``triton`` | ``reference`` (``W4A16_MOE_BACKEND`` applies to ``auto``).
        out: optional ``[T, H]`` output of x's dtype to write into.
        global_num_experts: the model's total expert count under expert parallelism (vLLM's name), a
            selection hint only: the CuTe provider then expects ``T * k * E / global_num_experts`` local
            routes (uniform routing) instead of ``T * k`` when it picks token tiles, split-K and the decode
            path, and looks up tuned rows of that EP layer. Must be ``>= expert_offset + E``; ``E`` says every
            route is local. None: the layer's first eager call (outside ``warmup`` and CUDA-graph capture)
            reads its ids once (one sync) and, if some valid id is not local, plans the layer's calls from then
            on with the smallest ``E * 2^j`` above its largest id (:mod:`w4a16_moe.ep_observe`;
            ``W4A16_MOE_EP_OBSERVE=0``: assume all local).
            Results do not depend on it beyond the plan's summation order.

    Returns:
        ``[T, H]`` in x's dtype: ``sum_j topk_weights[t, j] * (w2_e act(w13_e x[t] + b13_e) + b2_e)``.
    """
    activation = _activation_name(activation)
    _check_tensor_args(x=x, topk_weights=topk_weights, topk_ids=topk_ids, out=out)
    _check_scalar_args(activation=activation, finalize=finalize, expert_offset=expert_offset, backend=backend,
                       global_num_experts=global_num_experts)
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected w4a16_moe.MoEWeights, got {type(weights).__name__}")
    args = (x, *ops.weight_args(weights), topk_weights, topk_ids, weights.scheme.name, activation, finalize,
            expert_offset, backend)
    if out is None:
        return torch.ops.w4a16_moe.fused_moe(*args, global_num_experts, weights.w13_perm)
    torch.ops.w4a16_moe.fused_moe_out(*args, out, global_num_experts, weights.w13_perm)
    return out


def fused_moe_masked(
    x: torch.Tensor, weights: MoEWeights, masked_m: torch.Tensor, *, activation: "str | Activation" = "swiglu",
    backend: str = "auto",
) -> torch.Tensor:
    """Fused MoE in DeepEP's low-latency (masked per-expert) layout.

    Args:
        x: ``[E, cap, H]`` BF16 or FP16, contiguous: the tokens each local expert received.
        weights: the ``E`` local experts.
        masked_m: ``[E]`` int32 on the GPU: how many rows of ``x[e]`` are real. Values are clamped to
            ``[0, cap]``; rows at or past ``masked_m[e]`` are not read.
        activation, backend: as for :func:`fused_moe`.

    Returns:
        ``[E, cap, H]`` in x's dtype: ``w2_e act(w13_e x[e, r] + b13_e) + b2_e`` for real rows (unweighted:
        DeepEP's combine applies the routing weights), zeros for the others.
    """
    activation = _activation_name(activation)
    _check_tensor_args(x=x, masked_m=masked_m)
    _check_scalar_args(activation=activation, backend=backend)
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected w4a16_moe.MoEWeights, got {type(weights).__name__}")
    return torch.ops.w4a16_moe.fused_moe_masked(
        x, *ops.weight_args(weights), masked_m, weights.scheme.name, activation, backend, weights.w13_perm
    )


def _warmup_token_counts(num_experts: int, top_k: int, max_tokens: int) -> list[int]:
    """Token counts that reach every tile bucket of both GPU providers up to ``max_tokens``.

    Buckets are chosen from the routes per expert ``r = cdiv(T*k, min(E, T*k))``, which grows with T; the
    bucket edges are r = 8, 16, 32, 64, 128, and Triton's route preparation switches path at T*k = 4096.
    With the ``global_num_experts`` hint, pass the global count as ``num_experts``: the expected routes per
    local expert then grow as ``T*k / E_global``.
    """
    ts = {1, max_tokens, 4096 // top_k, 4096 // top_k + 1}
    for edge in (8, 16, 32, 64, 128):
        ts.add(-(-(edge * num_experts + 1) // top_k))
    return sorted(t for t in ts if 1 <= t <= max_tokens)


def warmup(
    weights: MoEWeights, *, dtype: torch.dtype = torch.bfloat16, activation: "str | Activation" = "swiglu",
    top_k: int = 8,
    max_tokens: int = 8192, finalize: tuple = ("deterministic", "fused"), expert_offset: int = 0,
    backend: str = "auto", masked_capacity: Optional[int] = None, autotune: Optional[bool] = None,
    autotune_budget_s: float = 60.0, autotune_jit: bool = False, global_num_experts: Optional[int] = None,
    release_canonical: bool = False,
) -> list[int]:
    """Compile / load every kernel and pack ``weights`` for calls of 1..``max_tokens`` tokens.

    Call it before capturing ``fused_moe`` in a CUDA graph: a first use inside capture (kernel module
    load, weight packing) raises instead of corrupting the capture. Runs real calls on synthetic inputs
    for token counts that reach every tile configuration; returns those token counts.
    ``masked_capacity``: also warm up :func:`fused_moe_masked` for ``x [E, masked_capacity, H]``.

    ``autotune`` (default: ``W4A16_MOE_AUTOTUNE``): first time the CuTe provider's candidates for this
    layer on this GPU (:mod:`w4a16_moe.kernels.cute.autotune`) so that the whole warmup takes about
    ``autotune_budget_s`` seconds at most (the tuner gets what is left of it after the setup, less
    :data:`~w4a16_moe.kernels.cute.autotune.WARMUP_RESERVE_S` for loading and running the tuned plans), using
    only kernels that are prebuilt or cached (``autotune_jit=True``: compiling allowed), and store the
    fastest per token count in the project-local cache; the plans of this layer use them from then on,
    in this and later processes (token counts already tuned for the running versions are not measured
    again). Raises inside CUDA-graph capture. Calls after warmup tune and compile nothing.

    ``global_num_experts``: the hint the layer's :func:`fused_moe` calls will pass (expert parallelism); the
    plans warmed up and tuned are those of calls carrying it (a layer tuned with the hint is tuned apart).
    Pass it for an expert-parallel layer even when its calls do not: warmup's synthetic ids never decide the
    hint that such calls observe (:mod:`w4a16_moe.ep_observe`), so the plans warmed up are those they will run.

    ``release_canonical=True``: then free the canonical codes, scales and zero points (:meth:`MoEWeights.release_canonical`),
    so that the layer holds only the packed layouts its kernels read (README "Memory"; with
    ``W4A16_MOE_LAYOUTS=1`` about the canonical bytes in all). Calls of up to ``max_tokens`` tokens with this
    warmup's dtype, ``top_k``, finalize modes, ``expert_offset`` and ``global_num_experts`` keep running (everything
    they read was packed here, :func:`w4a16_moe.kernels.cute.tiles.selection_grid`); anything needing another layout
    or the canonical tensors (another dtype, the Triton or reference provider, ``reference_moe``,
    ``MoEWeights.to``) raises a ``RuntimeError`` saying so. Needs the CuTe provider for the layer and no
    ``w13_perm``.

    Weights with a ``w13_perm`` (act order over H) run every call as the top-1 per-route half over ``T*k`` rows
    (:mod:`w4a16_moe.ops`): the CuTe kernels are loaded and tuned for that equivalent call (top-1, up to
    ``max_tokens * top_k`` rows, deterministic), and the real calls below take the permuted path.
    """
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected w4a16_moe.MoEWeights, got {type(weights).__name__}")
    activation = get_activation(_activation_name(activation)).name
    if isinstance(finalize, str):
        finalize = (finalize,)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k: expected a positive int, got {top_k!r}")
    if not isinstance(release_canonical, bool):
        raise TypeError(f"release_canonical: expected a bool, got {release_canonical!r}")
    if release_canonical and weights.w13_perm is not None:
        raise ValueError("release_canonical=True: weights with a w13_perm (act order over H) keep their canonical "
                         "tensors (not supported)")
    if autotune is None:
        from . import settings

        autotune = settings.get().autotune
    if autotune:
        from .kernels.cute.autotune import check_not_capturing

        check_not_capturing()
        if not (isinstance(autotune_budget_s, (int, float)) and autotune_budget_s > 0):
            raise ValueError(f"autotune_budget_s: expected a positive number of seconds, got {autotune_budget_s!r}")
    # act order over H: every call runs as the top-1 per-route half over T*k rows of the weights without the
    # permutation (ops.py); that is the layer the CuTe kernels are loaded and tuned for
    plain = weights if weights.w13_perm is None else weights.without_w13_perm()
    k_run, t_run, fin_run = (top_k, max_tokens, tuple(finalize)) if plain is weights else \
        (1, max_tokens * top_k, ("deterministic",))
    with ep_observe.paused():  # synthetic ids: they must not decide the layer's expert-parallel hint
        return _warmup(weights, plain, dtype, activation, top_k, max_tokens, finalize, expert_offset, backend,
                       masked_capacity, autotune, autotune_budget_s, autotune_jit, global_num_experts, k_run,
                       t_run, fin_run, release_canonical)


def _warmup(weights, plain, dtype, activation, top_k, max_tokens, finalize, expert_offset, backend, masked_capacity,
            autotune, autotune_budget_s, autotune_jit, global_num_experts, k_run, t_run, fin_run,
            release_canonical=False) -> list[int]:
    from .providers import resolve_backend, select_provider
    from .validate import check_moe_call

    t_start = time.perf_counter()
    dev = weights.device
    e = weights.num_experts
    probe_x = torch.zeros(1, weights.hidden_size, dtype=dtype, device=dev)
    probe_ids = torch.full((1, top_k), expert_offset, dtype=torch.int32, device=dev)
    call = check_moe_call(probe_x, weights, torch.ones(1, top_k, device=dev), probe_ids, activation=activation,
                          expert_offset=expert_offset, global_num_experts=global_num_experts)
    g = call.global_experts  # None when not given or equal to E
    tokens = _warmup_token_counts(g or e, top_k, max_tokens)
    chosen = select_provider(call, resolve_backend(backend)).provider
    if release_canonical and chosen != "cute":
        raise ValueError(f"release_canonical=True: this layer's calls run on provider {chosen!r}, which reads the "
                         "canonical tensors (only the CuTe provider reads packed layouts)")
    if chosen == "cute":
        from .kernels.cute.provider import cute_warmup

        if autotune:
            from .kernels.cute.autotune import autotune_layer, tuning_budget

            autotune_layer(plain, dtype, activation, k_run, t_run, fin_run,
                           tuning_budget(autotune_budget_s, time.perf_counter() - t_start), autotune_jit,
                           global_experts=g)
        cute_warmup(plain, dtype, activation, t_run, k_run, finalizes=fin_run, global_experts=g)
    for t in tokens:
        x = torch.zeros(t, weights.hidden_size, dtype=dtype, device=dev)
        ids = (torch.arange(t * top_k, device=dev, dtype=torch.int32).view(t, top_k) % e) + expert_offset
        tw = torch.full((t, top_k), 1.0 / top_k, dtype=torch.float32, device=dev)
        for fin in finalize:
            fused_moe(x, weights, tw, ids, activation=activation, finalize=fin, expert_offset=expert_offset,
                      backend=backend, global_num_experts=global_num_experts)
    if masked_capacity is not None:
        if not isinstance(masked_capacity, int) or masked_capacity < 1:
            raise ValueError(f"masked_capacity: expected a positive int, got {masked_capacity!r}")
        xm = torch.zeros(e, masked_capacity, weights.hidden_size, dtype=dtype, device=dev)
        mm = torch.full((e,), masked_capacity, dtype=torch.int32, device=dev)
        fused_moe_masked(xm, weights, mm, activation=activation, backend=backend)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    from .log import logger

    held = weights.packed_nbytes()
    logger.info("warmup: %d packed layouts of %s hold %.1f MB beside its %.1f MB of canonical tensors", len(held),
                weights, sum(held.values()) / 1e6, weights.nbytes_per_expert() * weights.num_experts / 1e6)
    if release_canonical:
        freed = weights.release_canonical()
        logger.info("warmup: released %.1f MB of canonical tensors of %s", freed / 1e6, weights)
    return tokens

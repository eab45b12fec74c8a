"""Expert- and tensor-parallel MoE layers over ``torch.distributed`` (NCCL on GPUs, gloo on CPUs).

Expert parallelism (:func:`ep_moe`): each of the ``world`` ranks holds ``E_local`` experts, the global
experts ``rank * E_local .. (rank + 1) * E_local - 1`` (:func:`shard_experts` cuts them out of a
full :class:`MoEWeights`). Every rank passes its own tokens with *global* expert ids and gets back the
outputs of its own tokens:

1. dispatch: each token goes once to every rank that owns one of its routed experts, with the local ids
   of those routes (``-1`` for the others); the per-rank counts are exchanged with ``all_to_all_single``
   on the device, then read on the host because ``all_to_all_single`` takes split sizes as lists (the
   only host synchronization);
2. each rank runs its local experts on what it received and returns, per valid route, the unweighted
   expert output (``finalize="deterministic"``) or, per token, the weighted sum of its routes
   (``finalize="fused"``, less traffic). These calls carry no ``global_num_experts`` hint: a rank receives
   only tokens with at least one route to it, so the uniform-over-global-experts model the hint stands for
   does not describe them (with top-1 routing every received route is local);
3. the source rank combines: deterministic mode puts the per-route outputs back in ``[T, k, H]`` and sums
   them in FP32 in fixed top-k order with the same code the single-GPU path uses, so the result is
   bit-identical run to run; with the CuTe provider in batch-invariant mode
   (``W4A16_MOE_BATCH_INVARIANT=1``: no split-K in deterministic calls) it also equals one process
   running all experts bit for bit. Fused mode adds the partial sums in rank order.

Tensor parallelism (:func:`tp_moe`): every rank holds all experts with a slice of the intermediate
dimension (:func:`shard_intermediate`; the Kimi-K2 TP8 shard ``I=256`` is one such slice), computes its
partial output, and the partials are summed with ``all_reduce``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .activations import get_activation
from .formats.schemes import SCHEMES
from .formats.weights import MoEWeights, QuantizedMatrix, layout_cache
from .validate import ACT_DTYPES, FINALIZE_MODES

__all__ = ["ep_moe", "tp_moe", "shard_experts", "shard_intermediate"]


# ------------------------------------------------------------------------------------------------
# sharding helpers
# ------------------------------------------------------------------------------------------------

def shard_experts(weights: MoEWeights, rank: int, world: int) -> MoEWeights:
    """The experts ``rank * E/world .. (rank+1) * E/world - 1`` of ``weights`` (for :func:`ep_moe`), with
    their rows of the biases and of ``w13_perm``."""
    e = weights.num_experts
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < world ({world}), got {rank}")
    if e % world:
        raise ValueError(f"weights: {e} experts are not divisible by the world size {world}")
    n = e // world
    sl = slice(rank * n, (rank + 1) * n)
    return MoEWeights(weights.scheme, weights.w13.map(lambda t: t[sl].contiguous()),
                      weights.w2.map(lambda t: t[sl].contiguous()), weights.gated,
                      _cut(weights.w13_bias, lambda b: b[sl]), _cut(weights.w2_bias, lambda b: b[sl]),
                      _cut(weights.w13_perm, lambda p: p[sl]))


def _cut(bias: Optional[torch.Tensor], fn) -> Optional[torch.Tensor]:
    return None if bias is None else fn(bias).contiguous()


def shard_intermediate(weights: MoEWeights, rank: int, world: int) -> MoEWeights:
    """Slice ``rank`` of ``world`` of the intermediate dimension (for :func:`tp_moe`).

    ``w13`` keeps gate rows and up rows ``[rank*I/world, (rank+1)*I/world)``; ``w2`` keeps those columns.
    ``w13_bias`` keeps the same rows; ``w2_bias`` (per output row, not split by a K slice) goes to rank 0 only,
    so the all-reduce of :func:`tp_moe` adds it once (as ``load_experts(tp=...)`` does). ``w13_perm`` (over H,
    not split) is kept.
    """
    i = weights.intermediate_size
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank: expected 0 <= rank < world ({world}), got {rank}")
    if i % world:
        raise ValueError(f"weights: intermediate size {i} is not divisible by the world size {world}")
    s = i // world
    mult = weights.scheme.min_k_multiple()
    if weights.scheme.per_channel and s % 8 or not weights.scheme.per_channel and s % mult:
        raise ValueError(
            f"weights: intermediate shard {s} (I={i} / world {world}) is not a multiple of {mult} "
            f"(scheme {weights.scheme.name})"
        )
    lo, hi = rank * s, (rank + 1) * s
    rows = torch.arange(lo, hi)
    if weights.gated:
        rows = torch.cat((rows, rows + i))
    w13 = weights.w13.map(lambda t: t[:, rows.to(t.device)].contiguous())
    g = weights.w2.group_size

    def cut_w2(t: torch.Tensor, name: str) -> torch.Tensor:
        if name == "codes":
            return t[:, :, lo // 2 : hi // 2].contiguous()
        if name in ("scales", "zeros"):
            if weights.scheme.per_channel:
                return t.contiguous()  # one scale per output row: unchanged by a K slice
            return t[:, :, lo // g : hi // g].contiguous()
        return t.contiguous()  # global_scale [E, H]: per output row

    w2 = QuantizedMatrix(weights.scheme, *(None if t is None else cut_w2(t, k) for k, t in weights.w2.tensors().items()))
    b13 = _cut(weights.w13_bias, lambda b: b[:, rows.to(b.device)])
    b2 = _cut(weights.w2_bias, lambda b: b) if rank == 0 else None
    return MoEWeights(weights.scheme, w13, w2, weights.gated, b13, b2, weights.w13_perm)


# ------------------------------------------------------------------------------------------------
# checks
# ------------------------------------------------------------------------------------------------

def _group_info(group: Optional[dist.ProcessGroup], x: torch.Tensor) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized (call torch.distributed.init_process_group)")
    backend = dist.get_backend(group)
    if x.device.type == "cuda" and backend == "gloo":
        raise ValueError(f"group: backend {backend!r} cannot move CUDA tensors here; use an NCCL process group")
    if x.device.type == "cpu" and backend == "nccl":
        raise ValueError("group: backend 'nccl' needs CUDA tensors, but x is on cpu; use a gloo process group")
    return dist.get_rank(group), dist.get_world_size(group)


_SCHEME_IDS = {name: i for i, name in enumerate(SCHEMES)}


def _check_same_everywhere(weights: MoEWeights, x: torch.Tensor, top_k: int, group, world: int, what: str) -> None:
    """All ranks must agree on scheme, shapes, gating, dtype and top-k (checked once per weights and group)."""
    key = ("dist-check", id(group), what, x.dtype, top_k)
    cache = layout_cache(weights.w13.codes)
    if cache.get(key):
        return
    desc = torch.tensor(
        [weights.num_experts, weights.hidden_size, weights.intermediate_size, _SCHEME_IDS[weights.scheme.name],
         int(weights.gated), ACT_DTYPES.index(x.dtype), top_k], dtype=torch.int64, device=x.device)
    allv = [torch.empty_like(desc) for _ in range(world)]
    dist.all_gather(allv, desc, group=group)
    names = ["experts", "hidden size", "intermediate size", "scheme", "gated", "dtype", "top-k"]
    mine = desc.tolist()
    for r, other in enumerate(t.tolist() for t in allv):
        for name, a, b in zip(names, mine, other):
            if a != b:
                if name == "scheme":
                    a, b = list(SCHEMES)[a], list(SCHEMES)[b]
                raise ValueError(f"{what}: {name} differs across ranks (this rank: {a}, rank {r}: {b})")
    cache[key] = True


def _check_inputs(x, weights, topk_weights, topk_ids, activation, finalize):
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"local_weights: expected w4a16_moe.MoEWeights, got {type(weights).__name__}")
    for name, t in (("x", x), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or x.dtype not in ACT_DTYPES:
        raise ValueError(f"x: expected a 2-D bfloat16/float16 tensor [T, H], got {x.dtype} {tuple(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids: expected int32/int64 [T={x.shape[0]}, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights: expected float32 {tuple(topk_ids.shape)}, got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if finalize not in FINALIZE_MODES:
        raise ValueError(f"finalize: expected one of {FINALIZE_MODES}, got {finalize!r}")
    get_activation(activation)


# ------------------------------------------------------------------------------------------------
# expert parallelism
# ------------------------------------------------------------------------------------------------

def _true_positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """Flat indices of the ``count`` True entries of ``mask`` in order (``nonzero`` without a host sync)."""
    return torch.argsort((~mask.reshape(-1)).to(torch.int8), stable=True)[:count]


def _a2a(send: torch.Tensor, send_splits: list, recv_splits: list, group) -> torch.Tensor:
    recv = send.new_empty((sum(recv_splits), *send.shape[1:]))
    dist.all_to_all_single(recv, send.contiguous(), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    return recv


def ep_moe(
    x: torch.Tensor,
    local_weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    group: Optional[dist.ProcessGroup] = None,
    activation: str = "swiglu",
    finalize: str = "deterministic",
    backend: str = "auto",
) -> torch.Tensor:
    """Expert-parallel fused MoE (see the module docstring).

    Args:
        x: ``[T, H]`` this rank's tokens (BF16/FP16; CUDA with NCCL, CPU with gloo).
        local_weights: this rank's ``E_local`` experts (global ids ``rank*E_local ...``); every rank must
            hold the same number of experts in the same scheme and shapes.
        topk_weights / topk_ids: ``[T, k]``; ids are global (``0 .. world*E_local - 1``); any other id
            (-1 included) contributes nothing.
        group: the process group (default: the world).
        activation, finalize, backend: as for :func:`w4a16_moe.fused_moe`.

    Returns:
        ``[T, H]`` in x's dtype: this rank's tokens through all experts of all ranks.
    """
    from .routes import combine_routes, expert_routes, weighted_partial

    _check_inputs(x, local_weights, topk_weights, topk_ids, activation, finalize)
    rank, world = _group_info(group, x)
    t, k = topk_ids.shape
    _check_same_everywhere(local_weights, x, k, group, world, "local_weights")
    e_local = local_weights.num_experts
    dev = x.device
    ids = topk_ids.long()
    valid = (ids >= 0) & (ids < e_local * world)
    dest = torch.where(valid, ids // e_local, -1)  # [T, k]
    ranks = torch.arange(world, device=dev)
    to_rank = (dest[None, :, :] == ranks[:, None, None])  # [W, T, k]
    tok_mask = to_rank.any(dim=2)  # [W, T]: token t goes to rank r

    # counts per destination: tokens and routes; exchanged on the device, then read once on the host
    send_counts = torch.stack((tok_mask.sum(1), to_rank.sum((1, 2))), dim=1)  # [W, 2]
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    counts = torch.cat((send_counts, recv_counts), dim=1).cpu().tolist()
    send_tok = [c[0] for c in counts]
    send_rt = [c[1] for c in counts]
    recv_tok = [c[2] for c in counts]
    recv_rt = [c[3] for c in counts]

    # dispatch: (rank-major, then token order) rows of x, with the local ids of their routes on that rank
    order = _true_positions(tok_mask, sum(send_tok))
    src_rank, src_tok = order // t, order % t
    local_ids = torch.where(dest[src_tok] == src_rank[:, None], ids[src_tok] - src_rank[:, None] * e_local, -1)
    recv_x = _a2a(x[src_tok], send_tok, recv_tok, group)
    recv_ids = _a2a(local_ids.to(torch.int32), send_tok, recv_tok, group)

    if finalize == "deterministic":
        # receivers: per valid route (row-major over received rows, then j), the unweighted expert output
        y, y_valid = expert_routes(recv_x, local_weights, recv_ids, activation=activation, backend=backend)
        mine = _true_positions(y_valid, sum(recv_rt))  # (source rank, token, j) order
        back = _a2a(y.reshape(-1, x.shape[1])[mine], recv_rt, send_rt, group)  # [routes sent, H]
        # source: the routes come back in (rank, token, j) order, exactly the order of to_rank's True entries
        full = torch.zeros(t * k, x.shape[1], dtype=back.dtype, device=dev)
        full[_true_positions(to_rank, sum(send_rt)) % (t * k)] = back
        full = full.view(t, k, -1)
        return combine_routes(full, topk_weights, valid, x.dtype, backend=backend)

    # fused: each rank returns per received token the weighted sum of its routes; sources add in rank order
    recv_w = _a2a(torch.where(dest[src_tok] == src_rank[:, None], topk_weights[src_tok], 0.0), send_tok, recv_tok, group)
    part = weighted_partial(recv_x, local_weights, recv_w, recv_ids, activation=activation, backend=backend)
    back = _a2a(part, recv_tok, send_tok, group)  # [tokens sent, H] in x's dtype
    out = torch.zeros(t, x.shape[1], dtype=torch.float32, device=dev)
    out.index_add_(0, src_tok, back.float())
    return out.to(x.dtype)


# ------------------------------------------------------------------------------------------------
# tensor parallelism
# ------------------------------------------------------------------------------------------------

def tp_moe(
    x: torch.Tensor,
    shard_weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    group: Optional[dist.ProcessGroup] = None,
    activation: str = "swiglu",
    finalize: str = "deterministic",
    expert_offset: int = 0,
    backend: str = "auto",
) -> torch.Tensor:
    """Tensor-parallel fused MoE: every rank holds all experts with a slice of the intermediate size
    (:func:`shard_intermediate`) and the same tokens; partial outputs are summed with ``all_reduce``
    (in FP32, then cast once to x's dtype).
    """
    from .api import fused_moe

    _check_inputs(x, shard_weights, topk_weights, topk_ids, activation, finalize)
    _, world = _group_info(group, x)
    _check_same_everywhere(shard_weights, x, topk_ids.shape[1], group, world, "shard_weights")
    part = fused_moe(x, shard_weights, topk_weights, topk_ids, activation=activation, finalize=finalize,
                     expert_offset=expert_offset, backend=backend).float()
    dist.all_reduce(part, group=group)
    return part.to(x.dtype)

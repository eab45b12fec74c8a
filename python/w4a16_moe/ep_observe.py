"""The expert-parallel hint of a layer whose calls do not pass ``global_num_experts``, read from its first call.

An expert-parallel rank holds ``E`` of the model's experts, and its ``topk_ids`` are global ids: only about
``T * k * E / E_global`` of the routes are local. The CuTe selection sizes token tiles, split-K and the decode
path by the expected local routes, so a rank that does not say ``global_num_experts`` is planned as if every
route were local (for 64-128 tokens of a Qwen3-235B EP8 rank that is 1.3-1.8 x slower than the hinted plan).

The first eager call of a layer without the hint therefore looks at its ids once (one device sync, once per
layer): if any valid id (``>= 0``) lies outside the local range ``[expert_offset, expert_offset + E)``, the
layer's calls from then on are planned with the estimate of :func:`estimate_global_experts`. Otherwise the layer
is recorded as not expert-parallel.

The estimate. ``max id + 1`` is a lower bound of the global count, and a poor one on a short first call: the
8 ids of one token top-8 over DeepSeek-V3's 256 experts all stay below 224 with probability (7/8)^8 = 0.34
(12% low on average). The peers tool's first call of the DeepSeek-V3 EP8 rank (one token) reached id 241; with
the hint 242 its 2048-token calls took the 96-token tiles and ran 526.8 us, with 256 the 80-token tiles and
472.9 us (H200, docs/benchmarks/2026-12-03b). When the local range starts at a multiple of ``E`` (ranks of
``E`` experts each, the layout of every engine), the estimate is therefore the smallest ``E * 2^j`` above every
id: exact for a power-of-two rank count (EP2 ... EP64) unless all the observed ids fall in the lower half of
the ranks (probability ``2^-(T*k)``: 0.4% for one token top-8), and at most 2 x too large for another rank
count. Otherwise it is ``max(max id + 1, expert_offset + E)``.

The decision is made once, so every call of the layer after it runs the same plan (deterministic results stay
bit-identical run to run); it changes plans only, never results beyond the plan's summation order.

No decision is taken (and none is recorded) inside CUDA-graph capture or :func:`paused` (``warmup`` runs its
synthetic calls there); a first call inside capture records "not expert-parallel", so a captured graph and
later eager calls agree. ``W4A16_MOE_EP_OBSERVE=0`` turns it off. Decisions are kept per process, keyed by
the layer's ``w13`` codes storage (device, address, shape) and ``(E, expert_offset)``, so re-wrapped tensors of
the same weights (the torch op's arguments, ``torch.compile``) find them; a later layer allocated at a freed
layer's address inherits its decision, which only affects speed.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

import torch

from . import settings
from .log import logger

__all__ = ["observed_global_experts", "estimate_global_experts", "paused", "forget"]

_state = threading.local()
_NOT_EP = 0  # the recorded decision "every valid id is local"
_decisions: dict = {}  # (device, codes address, codes shape, E, expert_offset) -> E_global or _NOT_EP
_lock = threading.Lock()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Calls inside the block neither take nor record a decision (their ids are synthetic)."""
    prev = getattr(_state, "paused", False)
    _state.paused = True
    try:
        yield
    finally:
        _state.paused = prev


def _key(codes: torch.Tensor, num_experts: int, expert_offset: int) -> tuple:
    return (str(codes.device), codes.data_ptr(), tuple(codes.shape), num_experts, expert_offset)


def forget() -> None:
    """Drop every recorded decision (tests; layers whose routing changed on purpose)."""
    with _lock:
        _decisions.clear()


def observed_global_experts(codes: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                            expert_offset: int) -> Optional[int]:
    """The ``global_num_experts`` hint of the layer whose ``w13`` codes are ``codes`` (None: not
    expert-parallel, or no decision yet); takes the decision on this call when it may (see the module)."""
    if not settings.get().ep_observe:
        return None
    key = _key(codes, num_experts, expert_offset)
    hit = _decisions.get(key)
    if hit is not None:
        return hit or None
    if getattr(_state, "paused", False) or topk_ids.numel() == 0:
        return None
    if topk_ids.is_cuda and torch.cuda.is_current_stream_capturing():
        with _lock:
            _decisions.setdefault(key, _NOT_EP)
        return _decisions[key] or None
    ids = topk_ids.reshape(-1)
    lo, hi = expert_offset, expert_offset + num_experts
    outside = ((ids >= 0) & ((ids < lo) | (ids >= hi))).any()
    top, out = torch.stack((ids.max().to(torch.int64), outside.to(torch.int64))).tolist()
    g = estimate_global_experts(int(top), num_experts, expert_offset) if out else _NOT_EP
    with _lock:
        g = _decisions.setdefault(key, g)
    if g:
        logger.info("layer of %d local experts (ids %d..%d) called without global_num_experts: its ids reach %d, "
                    "so its calls are planned with the expert-parallel hint global_num_experts=%d", num_experts,
                    lo, hi - 1, top, g)
    return g or None


def estimate_global_experts(max_id: int, num_experts: int, expert_offset: int) -> int:
    """The ``global_num_experts`` estimate from the largest observed id (see the module): ``E * 2^j``, the
    smallest that exceeds ``max_id`` and the local range, when the range starts at a multiple of ``E``;
    else ``max(max_id + 1, expert_offset + E)``."""
    if num_experts < 1 or max_id < 0 or expert_offset < 0:
        raise ValueError(f"estimate_global_experts: expected max_id >= 0, num_experts >= 1 and expert_offset >= 0, "
                         f"got {max_id}, {num_experts}, {expert_offset}")
    bound = max(max_id + 1, expert_offset + num_experts)
    if expert_offset % num_experts:
        return bound
    ranks = 1
    while ranks * num_experts < bound:
        ranks *= 2
    return ranks * num_experts

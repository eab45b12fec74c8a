"""Route preparation on the GPU: group the valid (token, slot) routes by local expert.

A *route* is one entry ``r = t * k + j`` of ``topk_ids [T, k]``. It is *valid* when
``expert_offset <= topk_ids[t, j] < expert_offset + E``; its local expert is ``topk_ids[t, j] - expert_offset``.
Everything here runs in Triton kernels with shapes known on the host, so a call never synchronizes
and can be captured in a CUDA graph.

Outputs (a :class:`RoutePlan`, all int32):

``sorted_routes [R]``   route ids grouped by expert: positions ``route_start[e] .. route_start[e+1]-1`` hold
                        the routes of expert ``e`` (in no particular order inside an expert). Positions at or
                        past ``route_start[E]`` (the number of valid routes) are not written.
``route_start [E+1]``   exclusive prefix sum of the per-expert route counts.
``block_start [E+1]``   exclusive prefix sum of ``cdiv(count_e, BLOCK_M)``: the first row-block of each expert
                        (entry E = the number of row-blocks in use); the CuTe kernels binary-search it.
``block_info [B, 4]``   one row per GEMM row-block ``b < B`` (``B = num_blocks``, a host-side upper bound):
                        ``(expert, row_begin, row_end, unused)``. Block ``b`` covers sorted positions
                        ``row_begin .. min(row_begin + BLOCK_M, row_end) - 1``; blocks of expert ``e`` are
                        consecutive. Unused blocks are ``(E, 0, 0)``: a GEMM program reading one exits.

Two implementations, chosen on the host from ``R = T * k`` (never from data):

* ``R <= SMALL_ROUTES``: one single-program kernel (zero the counts, ``tl.debug_barrier``, count with
  atomics, barrier, scan + block table, barrier, scatter with atomics). One launch, no memset.
* larger: two kernels over ``P`` programs, each owning a contiguous span of routes, so prefill-sized inputs
  are not serialized on one SM, and nothing needs a memset:

  1. *histogram*: program ``p`` writes the per-expert counts of its span to row ``p`` of ``hist [P, E_PAD]``
     (``tl.histogram``, no atomics) and zeroes its share of the ``zeroed`` buffer;
  2. *place*: every program sums all rows of ``hist`` (the expert totals: route and block tables) and the rows
     before its own (where its routes of each expert start), and scatters its span with atomics on a cursor
     row of its own; program 0 also writes ``route_start`` / ``block_start`` / ``block_info``.

  Measured on the H200 at 16384 routes (W1 2048): 3.4 + 5.8 us of kernel time (docs/perf/2026-11-30-pdl-chain,
  run 1, eager, without PDL), where the previous memset + count / scan / scatter kernels took 13.2 us in
  four launches (docs/perf/2026-11-30-decode-pipe, run 8).

Scatter positions come from ``tl.atomic_add(cursor + e, 1)``, which hands distinct old values to the
lanes of one vector even when they hit the same address; the order inside an expert is therefore
arbitrary, which is harmless: every GEMM row is computed independently of its neighbours.

Programmatic dependent launch (:func:`pdl_supported`: SM90 and later, never in the interpreter): the histogram
kernel (or the single-program kernel) lets the next kernel launch at once; the place kernel is launched with
the PDL attribute, executes ``griddepcontrol.wait`` before reading ``hist``, and lets the next kernel launch
too. A GEMM launched with PDL after it must execute ``griddepcontrol.wait`` before reading the plan (the SM90
grouped GEMM does, see its ``pdl`` knob); a kernel launched without the attribute starts after the preparation
completed, as usual.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from ... import settings

__all__ = ["RoutePlan", "prepare_routes", "prepare_masked_routes", "num_row_blocks", "pdl_supported",
           "SMALL_ROUTES"]

# Routes up to which the single-program preparation kernel is used (one launch instead of two).
SMALL_ROUTES = 4096
_CHUNK = 1024  # routes handled per vector step
_MAX_PROGRAMS = 128  # programs of the two-kernel path (each place program reads every histogram row)
_BLOCK_TILE = 4096  # elements of the [experts, J_CHUNK] tile used when writing block_info
_PREP_WARPS = 4


@dataclass(frozen=True)
class RoutePlan:
    """Device tensors describing the expert-grouped routes (see module docstring)."""

    sorted_routes: torch.Tensor
    route_start: torch.Tensor
    block_start: torch.Tensor
    block_info: torch.Tensor
    num_blocks: int
    block_m: int
    zeroed: Optional[torch.Tensor] = None  # int32 [n] zeroed by the preparation (``zeroed=n``), else None


def num_row_blocks(num_routes: int, num_experts: int, block_m: int) -> int:
    """Host-side upper bound on ``sum_e cdiv(count_e, block_m)`` over any routing of ``num_routes`` routes.

    ``cdiv(c, m) <= (c - 1) // m + 1`` summed over the (at most ``min(E, R)``) non-empty experts is at most
    ``cdiv(R, m) + min(E, R)``; and ``cdiv(c, m) <= c`` gives ``R``.
    """
    return min(num_routes, triton.cdiv(num_routes, block_m) + min(num_experts, num_routes))


# --------------------------------------------------------------------------------------------------
# Shared device helpers
# --------------------------------------------------------------------------------------------------
@triton.jit
def _local_experts(ids_ptr, offs, num_routes, expert_offset, num_experts):
    """Local expert (int32) and validity of routes ``offs``; compares in the ids' own dtype (no overflow)."""
    in_range = offs < num_routes
    ids = tl.load(ids_ptr + offs, mask=in_range, other=-1)
    valid = in_range & (ids >= expert_offset) & (ids < expert_offset + num_experts)
    local = tl.where(valid, ids - expert_offset, 0).to(tl.int32)
    return local, valid


@triton.jit
def _write_plan(counts, lane, num_experts, route_start_ptr, block_start_ptr, block_info_ptr, num_blocks,
                BLOCK_M: tl.constexpr, J_CHUNK: tl.constexpr, FILL: tl.constexpr):
    """From per-expert ``counts`` (a register vector over ``lane``, zero past E) write route_start,
    block_start and the block table; returns ``route_begin`` (the exclusive prefix sum over ``lane``).

    Each expert writes its own blocks (a [experts, J_CHUNK] tile per step, so the loop runs
    ``cdiv(max blocks of one expert, J_CHUNK)`` times: once at decode sizes), then the unused tail of the
    table is filled with the sentinel expert E.
    """
    is_expert = lane < num_experts
    route_end = tl.cumsum(counts, axis=0)
    route_begin = route_end - counts
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, axis=0)
    block_begin = block_end - blocks
    # lane E (padding, count 0) holds the total number of valid routes
    tl.store(route_start_ptr + lane, route_begin, mask=lane <= num_experts)
    tl.store(block_start_ptr + lane, block_begin, mask=lane <= num_experts)

    zero = tl.zeros((1, J_CHUNK), dtype=tl.int32)
    max_blocks = tl.max(blocks, axis=0)
    j0 = 0
    # (while, not range: runtime-bounded range loops break the interpreter on numpy 2.4)
    while j0 < max_blocks:
        j = j0 + tl.arange(0, J_CHUNK)
        j0 += J_CHUNK
        ok = is_expert[:, None] & (j[None, :] < blocks[:, None])
        entry = block_info_ptr + (block_begin[:, None] + j[None, :]) * 4
        tl.store(entry, lane[:, None] + zero, mask=ok)
        tl.store(entry + 1, route_begin[:, None] + j[None, :] * BLOCK_M, mask=ok)
        tl.store(entry + 2, route_end[:, None] + zero, mask=ok)

    b0 = tl.sum(blocks, axis=0)
    while b0 < num_blocks:
        b = b0 + tl.arange(0, FILL)
        b0 += FILL
        ok = b < num_blocks
        sentinel = tl.zeros((FILL,), dtype=tl.int32)
        tl.store(block_info_ptr + b * 4, sentinel + num_experts, mask=ok)
        tl.store(block_info_ptr + b * 4 + 1, sentinel, mask=ok)
        tl.store(block_info_ptr + b * 4 + 2, sentinel, mask=ok)
    return route_begin


@triton.jit
def _scatter_span(ids_ptr, start, end, expert_offset, num_experts, cursor_ptr, sorted_ptr, CHUNK: tl.constexpr):
    """Write the valid routes ``start .. end - 1`` to ``sorted`` at positions handed out by atomics on
    ``cursor_ptr[local expert]`` (set beforehand to where each expert's routes of this span start)."""
    c0 = 0
    while c0 < end - start:
        offs = start + c0 + tl.arange(0, CHUNK)
        c0 += CHUNK
        local, valid = _local_experts(ids_ptr, offs, end, expert_offset, num_experts)
        pos = tl.atomic_add(cursor_ptr + local, 1, mask=valid, sem="relaxed")
        tl.store(sorted_ptr + pos, offs, mask=valid)


# --------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["num_routes", "expert_offset", "num_blocks", "num_zero"])
def _route_prep_single_kernel(ids_ptr, num_routes, expert_offset, num_experts, counts_ptr, cursor_ptr,
                              sorted_ptr, route_start_ptr, block_start_ptr, block_info_ptr, num_blocks,
                              zero_ptr, num_zero,
                              BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr,
                              J_CHUNK: tl.constexpr, PDL: tl.constexpr):
    """Whole preparation in one program. ``tl.debug_barrier`` (bar.sync) orders the phases' global
    memory traffic inside the CTA; counts and cursors are initialized with stores that bypass L1 (``.cg``) and
    afterwards only read and updated with atomics (performed at L2), so no thread can see a stale L1 line.
    Also zeroes ``zero_ptr[:num_zero]``."""
    if PDL:
        gdc_launch_dependents()  # a GEMM launched with PDL sets up, then waits for this grid
    zstart = 0
    while zstart < num_zero:
        zoffs = zstart + tl.arange(0, CHUNK)
        zstart += CHUNK
        tl.store(zero_ptr + zoffs, tl.zeros([CHUNK], tl.int32), mask=zoffs < num_zero)
    lane = tl.arange(0, E_PAD)
    # plain stores at L2 (.cg), ordered before the atomics below by the barrier: an atomic exchange would
    # read the uninitialized workspace (compute-sanitizer initcheck)
    tl.store(counts_ptr + lane, tl.zeros([E_PAD], tl.int32), mask=lane < num_experts, cache_modifier=".cg")
    tl.debug_barrier()
    start = 0
    while start < num_routes:
        offs = start + tl.arange(0, CHUNK)
        start += CHUNK
        local, valid = _local_experts(ids_ptr, offs, num_routes, expert_offset, num_experts)
        tl.atomic_add(counts_ptr + local, 1, mask=valid, sem="relaxed")
    tl.debug_barrier()
    counts = tl.atomic_add(counts_ptr + lane, 0, mask=lane < num_experts, sem="relaxed")
    counts = tl.where(lane < num_experts, counts, 0)
    route_begin = _write_plan(counts, lane, num_experts, route_start_ptr, block_start_ptr, block_info_ptr,
                              num_blocks, BLOCK_M, J_CHUNK, CHUNK)
    # written at L2 (.cg): the scatter phase updates the cursors with atomics (at L2) from other threads
    tl.store(cursor_ptr + lane, route_begin, mask=lane < num_experts, cache_modifier=".cg")
    tl.debug_barrier()
    _scatter_span(ids_ptr, 0, num_routes, expert_offset, num_experts, cursor_ptr, sorted_ptr, CHUNK)


@triton.jit(do_not_specialize=["num_routes", "expert_offset", "span", "num_zero"])
def _route_hist_kernel(ids_ptr, num_routes, expert_offset, num_experts, hist_ptr, span, zero_ptr, num_zero,
                       E_PAD: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr):
    """Program ``p``: ``hist[p, e]`` = the valid routes of expert ``e`` in routes ``[p*span, (p+1)*span)``
    (every one of the ``E_PAD`` entries written); zeroes its share of ``zero_ptr[:num_zero]``."""
    if PDL:
        gdc_launch_dependents()  # the place kernel (launched with PDL) waits for this whole grid
    p = tl.program_id(0)
    nprog = tl.num_programs(0)
    zper = tl.cdiv(num_zero, nprog)
    z0 = p * zper
    zend = tl.minimum(z0 + zper, num_zero)
    while z0 < zend:
        zoffs = z0 + tl.arange(0, CHUNK)
        z0 += CHUNK
        tl.store(zero_ptr + zoffs, tl.zeros([CHUNK], tl.int32), mask=zoffs < zend)
    start = p * span
    end = tl.minimum(start + span, num_routes)
    acc = tl.zeros([E_PAD], dtype=tl.int32)
    while start < end:
        offs = start + tl.arange(0, CHUNK)
        start += CHUNK
        local, valid = _local_experts(ids_ptr, offs, end, expert_offset, num_experts)
        acc += tl.histogram(local, E_PAD, mask=valid)
    tl.store(hist_ptr + p * E_PAD + tl.arange(0, E_PAD), acc)


@triton.jit(do_not_specialize=["num_routes", "expert_offset", "span", "num_blocks"])
def _route_place_kernel(ids_ptr, num_routes, expert_offset, num_experts, hist_ptr, span, cursor_ptr, sorted_ptr,
                        route_start_ptr, block_start_ptr, block_info_ptr, num_blocks,
                        BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr, J_CHUNK: tl.constexpr,
                        HIST_ROWS: tl.constexpr, PDL: tl.constexpr):
    """Program ``p``: the expert totals (all ``hist`` rows) and the routes of each expert in the spans before
    its own, then its span's routes scattered to ``sorted`` with atomics on cursor row ``p`` (this program's
    alone). Program 0 also writes the route and block tables."""
    if PDL:
        gdc_wait()  # launched with PDL: hist is complete and visible once this returns
        gdc_launch_dependents()
    p = tl.program_id(0)
    nprog = tl.num_programs(0)
    lane = tl.arange(0, E_PAD)
    total = tl.zeros([E_PAD], dtype=tl.int32)
    before = tl.zeros([E_PAD], dtype=tl.int32)
    rows = tl.arange(0, HIST_ROWS)
    q0 = 0
    while q0 < nprog:  # HIST_ROWS rows per step: their loads are in flight together
        q = q0 + rows
        q0 += HIST_ROWS
        tile = tl.load(hist_ptr + q[:, None] * E_PAD + lane[None, :], mask=(q < nprog)[:, None], other=0)
        total += tl.sum(tile, axis=0)
        before += tl.sum(tl.where((q < p)[:, None], tile, 0), axis=0)
    counts = tl.where(lane < num_experts, total, 0)
    route_begin = tl.cumsum(counts, axis=0) - counts
    # atomic write: the scatter below updates the cursors with atomics (at L2)
    cursor = cursor_ptr + p * E_PAD
    tl.atomic_xchg(cursor + lane, route_begin + before, mask=lane < num_experts, sem="relaxed")
    if p == 0:
        _write_plan(counts, lane, num_experts, route_start_ptr, block_start_ptr, block_info_ptr, num_blocks,
                    BLOCK_M, J_CHUNK, CHUNK)
    tl.debug_barrier()
    _scatter_span(ids_ptr, p * span, tl.minimum(p * span + span, num_routes), expert_offset, num_experts, cursor,
                  sorted_ptr, CHUNK)


# --------------------------------------------------------------------------------------------------
# Host entry point
# --------------------------------------------------------------------------------------------------
def _int32_workspace(sizes: dict, device) -> tuple:
    """One int32 allocation split into named parts, in ``sizes`` order, each starting at a multiple of 4
    elements (16 bytes), so that pointer alignment, which Triton specializes on, never depends on sizes:
    ``(ws, offsets, parts)``."""
    offsets, total = {}, 0
    for name, size in sizes.items():
        offsets[name] = total
        total += -(-size // 4) * 4
    ws = torch.empty(total, dtype=torch.int32, device=device)
    return ws, offsets, {name: ws[offsets[name] : offsets[name] + size] for name, size in sizes.items()}


@functools.lru_cache(maxsize=None)
def _pdl_capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_supported(device: torch.device) -> bool:
    """Whether the Triton route preparation and finalize launch with programmatic dependent launch on
    ``device``: a CUDA device of compute capability 9.0 or later, the kernels compiled (not the Triton
    interpreter), and ``W4A16_MOE_PDL`` not ``0`` (which turns it off, e.g. to measure what it gains)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    if not settings.get().pdl:
        return False
    return _pdl_capable(device.index if device.index is not None else torch.cuda.current_device())


def _spans(num_routes: int) -> tuple:
    """``(programs, span)`` of the two-kernel path: at most ``_MAX_PROGRAMS`` programs, each owning
    ``span`` (a multiple of ``_CHUNK``) consecutive routes."""
    programs = min(triton.cdiv(num_routes, _CHUNK), _MAX_PROGRAMS)
    span = triton.cdiv(triton.cdiv(num_routes, programs), _CHUNK) * _CHUNK
    return triton.cdiv(num_routes, span), span


def prepare_routes(topk_ids: torch.Tensor, num_experts: int, expert_offset: int, block_m: int,
                   zeroed: int = 0) -> RoutePlan:
    """Group the routes of ``topk_ids [T, k]`` (int32/int64, contiguous, ``T * k >= 1``) by local expert.

    Launches 1 kernel when ``T * k <= SMALL_ROUTES``, else 2 (see the module docstring); never
    synchronizes. ``zeroed > 0`` also returns ``plan.zeroed``, an int32 buffer of that many zeros (split-K
    tile counters of the GEMMs that follow), zeroed by the same launches (no extra graph node).
    """
    num_routes = topk_ids.numel()
    num_blocks = num_row_blocks(num_routes, num_experts, block_m)
    e = num_experts
    e_pad = triton.next_power_of_2(e + 1)
    j_chunk = max(2, min(16, _BLOCK_TILE // e_pad))
    pdl = pdl_supported(topk_ids.device)
    extra = {"launch_pdl": True} if pdl else {}
    if num_routes <= SMALL_ROUTES:
        ws, _, part = _int32_workspace(
            {"block_info": 4 * num_blocks, "sorted": num_routes, "counts": e, "zeroed": zeroed, "cursor": e,
             "route_start": e + 1, "block_start": e + 1}, topk_ids.device)
        block_info = part["block_info"].view(num_blocks, 4)
        _route_prep_single_kernel[(1,)](
            topk_ids, num_routes, expert_offset, e, part["counts"], part["cursor"], part["sorted"],
            part["route_start"], part["block_start"], block_info, num_blocks,
            part["zeroed"] if zeroed else part["counts"], zeroed,
            BLOCK_M=block_m, E_PAD=e_pad, CHUNK=_CHUNK, J_CHUNK=j_chunk, PDL=pdl,
            num_warps=_PREP_WARPS,
        )
    else:
        programs, span = _spans(num_routes)
        ws, _, part = _int32_workspace(
            {"block_info": 4 * num_blocks, "sorted": num_routes, "zeroed": zeroed, "hist": programs * e_pad,
             "cursor": programs * e_pad, "route_start": e + 1, "block_start": e + 1}, topk_ids.device)
        block_info = part["block_info"].view(num_blocks, 4)
        _route_hist_kernel[(programs,)](
            topk_ids, num_routes, expert_offset, e, part["hist"], span, part["zeroed"] if zeroed else part["hist"],
            zeroed, E_PAD=e_pad, CHUNK=_CHUNK, PDL=pdl, num_warps=_PREP_WARPS)
        _route_place_kernel[(programs,)](
            topk_ids, num_routes, expert_offset, e, part["hist"], span, part["cursor"], part["sorted"],
            part["route_start"], part["block_start"], block_info, num_blocks,
            BLOCK_M=block_m, E_PAD=e_pad, CHUNK=_CHUNK, J_CHUNK=j_chunk, HIST_ROWS=max(1, _BLOCK_TILE // e_pad),
            PDL=pdl, num_warps=_PREP_WARPS, **extra)
    return RoutePlan(part["sorted"], part["route_start"], part["block_start"], block_info, num_blocks, block_m,
                     part["zeroed"] if zeroed else None)


# ------------------------------------------------------------------------------------------------
# masked (DeepEP low-latency) layout: rows are x[e, r] for r < masked_m[e]; no top-k, no gather
# ------------------------------------------------------------------------------------------------

@triton.jit
def _masked_prep_kernel(masked_m_ptr, cap, num_experts, sorted_ptr, route_start_ptr, block_start_ptr, out_ptr, H,
                        BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
                        PDL: tl.constexpr):
    """Program ``(e, c)``: expert ``e``'s prefix sums (from all of ``masked_m``), its route ids for rows
    ``c*ROWS ..`` and zeros in ``out`` for those of its rows at or past ``masked_m[e]``."""
    if PDL:
        gdc_launch_dependents()  # a GEMM launched with PDL sets up, then waits for this grid
    e = tl.program_id(0)
    c = tl.program_id(1)
    lanes = tl.arange(0, BLOCK_E)
    before_r = 0
    before_b = 0
    e0 = 0
    while e0 < num_experts:
        idx = e0 + lanes
        e0 += BLOCK_E
        m = tl.load(masked_m_ptr + idx, mask=idx < num_experts, other=0)
        m = tl.minimum(tl.maximum(m, 0), cap)
        sel = idx < e
        before_r += tl.sum(tl.where(sel, m, 0))
        before_b += tl.sum(tl.where(sel, (m + BLOCK_M - 1) // BLOCK_M, 0))
    me = tl.minimum(tl.maximum(tl.load(masked_m_ptr + e), 0), cap)
    if c == 0:
        tl.store(route_start_ptr + e, before_r)
        tl.store(block_start_ptr + e, before_b)
        if e == num_experts - 1:
            tl.store(route_start_ptr + num_experts, before_r + me)
            tl.store(block_start_ptr + num_experts, before_b + (me + BLOCK_M - 1) // BLOCK_M)
    rows = c * ROWS + tl.arange(0, ROWS)
    tl.store(sorted_ptr + before_r + rows, e * cap + rows, mask=rows < me)
    # rows past masked_m[e] are defined as zeros
    dead = (rows >= me) & (rows < cap)
    base = (e * cap + rows).to(tl.int64) * H
    h0 = 0
    while h0 < H:
        cols = h0 + tl.arange(0, BLOCK_H)
        h0 += BLOCK_H
        ptrs = out_ptr + base[:, None] + cols[None, :]
        tl.store(ptrs, tl.zeros((ROWS, BLOCK_H), dtype=out_ptr.dtype.element_ty), mask=dead[:, None] & (cols < H)[None, :])


def prepare_masked_routes(masked_m: torch.Tensor, cap: int, block_m: int, out: torch.Tensor,
                          zeroed: int = 0) -> RoutePlan:
    """A :class:`RoutePlan` for the masked layout ``x [E, cap, H]``: expert ``e``'s routes are the flat rows
    ``e*cap + r`` for ``r < clamp(masked_m[e], 0, cap)`` (``route_start``/``block_start`` as in
    :func:`prepare_routes`; ``block_info`` is not built). Also writes zeros into the rows of
    ``out [E, cap, H]`` at or past ``masked_m[e]``. One launch, no synchronization. ``zeroed``: as in
    :func:`prepare_routes` (here a memset, only when split-K needs counters)."""
    e = masked_m.numel()
    hidden = out.shape[-1]
    ws, _, part = _int32_workspace(
        {"sorted": e * cap, "route_start": e + 1, "block_start": e + 1, "zeroed": zeroed}, masked_m.device)
    sorted_routes, route_start, block_start = part["sorted"], part["route_start"], part["block_start"]
    zero_part = None
    if zeroed:
        zero_part = part["zeroed"]
        zero_part.zero_()
    rows = 16
    grid = (e, triton.cdiv(cap, rows))
    _masked_prep_kernel[grid](masked_m, cap, e, sorted_routes, route_start, block_start, out, hidden,
                              BLOCK_M=block_m, BLOCK_E=min(1024, triton.next_power_of_2(e)), ROWS=rows,
                              BLOCK_H=min(1024, triton.next_power_of_2(hidden)), PDL=pdl_supported(out.device),
                              num_warps=4)
    empty_info = ws[:0].view(0, 4)
    return RoutePlan(sorted_routes, route_start, block_start, empty_info, 0, block_m, zero_part)

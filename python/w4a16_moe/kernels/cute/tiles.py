"""Host-side tile rules shared by the grouped-GEMM families (no DSL import): the routes-per-expert bucket of a
call, the token tiles the split-K rule counts, and the ``group`` codegen parameter of a scheme.

A family's tile table is a tuple of ``(bound, tiles)``: the first entry whose ``bound`` (routes per expert) is at
least the call's, or whose bound is None, gives the call's tile parameters.

Expert parallelism: with the ``global_num_experts`` hint (``global_experts`` here, :func:`expected_local`) the
rules use the expected local routes and the expected distinct local experts hit under uniform routing over
the global experts; without it they assume every route is local (only host-known sizes are used).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

__all__ = ["routes_per_expert", "active_experts", "expected_local", "expected_tiles", "loop_grid", "selection_points",
           "selection_grid", "split_k", "select",
           "group_param"]


def expected_local(num_routes: int, num_experts: int, top_k: int, global_experts: int) -> tuple:
    """``(R_local, D_local)`` of a call of ``num_routes = T * top_k`` routes whose ids are uniform over
    ``global_experts`` experts, ``num_experts`` of them local: the expected local routes
    ``R_local = T * k * E_local / E_global`` and the expected distinct local experts hit
    ``D_local = E_local * (1 - (1 - k / E_global)^T)`` (a token's ``k`` experts are distinct, so a local
    expert misses one token with probability ``1 - k / E_global``)."""
    if num_routes <= 0 or num_experts <= 0:
        return 0.0, 0.0
    g = max(global_experts, num_experts)
    tokens = num_routes / max(1, top_k)
    miss = max(0.0, 1.0 - min(top_k, g) / g)
    return num_routes * num_experts / g, num_experts * (1.0 - miss ** tokens)


def _ceil(v: float) -> int:
    """``ceil(v)`` where ``v`` within 0.01 above an integer counts as that integer: ``D_local`` approaches
    ``E_local`` from below, and 16.000002 expected routes per expert must not take the next bucket."""
    return max(1, math.ceil(v - 0.01))


def routes_per_expert(num_routes: int, num_experts: int, top_k: Optional[int] = None,
                      global_experts: Optional[int] = None) -> int:
    """Routes of one active expert: ``cdiv(T * k, min(E, T * k))`` when every route is assumed local (no hint;
    an upper bound under expert parallelism), else ``ceil(R_local / D_local)`` (:func:`expected_local`; needs
    ``top_k``)."""
    if global_experts is None:
        return -(-num_routes // max(1, min(num_experts, num_routes)))
    r, d = expected_local(num_routes, num_experts, _need_top_k(top_k), global_experts)
    return _ceil(r / d) if d > 0 else 1


def active_experts(num_routes: int, num_experts: int, top_k: Optional[int] = None,
                   global_experts: Optional[int] = None) -> int:
    """The experts with at least one route, as the split-K rule counts them (one token tile each):
    ``min(E, T * k)`` without the hint, ``ceil(D_local)`` with it (at least 1)."""
    if global_experts is None:
        return max(1, min(num_experts, num_routes))
    return _ceil(expected_local(num_routes, num_experts, _need_top_k(top_k), global_experts)[1])


@functools.lru_cache(maxsize=8192)
def expected_tiles(num_routes: int, num_experts: int, tokens_per_tile: int, top_k: Optional[int] = None,
                   global_experts: Optional[int] = None) -> float:
    """Expected token tiles ``sum_e E[ceil(n_e / TN)]`` of a call under uniform routing: a local expert's
    route count ``n_e`` is Binomial(T, k / E_global) (``global_experts`` None: E_global = E, every route local;
    ``top_k`` None: Binomial(T * k, 1 / E), for callers that know only the route count). What the split-K
    rules count CTAs with and what the cost model streams weights for (each token tile re-reads its expert's
    weights); an expert with 65 routes on TN 64 takes two tiles, which ``active_experts`` would count as one."""
    if num_routes <= 0 or num_experts <= 0:
        return 0.0
    tn = max(1, tokens_per_tile)
    if top_k is None or top_k < 1:
        trials, p = num_routes, 1.0 / num_experts
    else:
        g = max(global_experts or num_experts, num_experts)
        trials, p = max(1, num_routes // top_k), min(1.0, top_k / g)
    if p >= 1.0:
        return float(num_experts * -(-trials // tn))
    mean = trials * p
    sd = math.sqrt(mean * (1.0 - p))
    lo, hi = max(1, int(mean - 12 * sd) - 1), min(trials, int(mean + 12 * sd) + 2)
    lq, lp = math.log1p(-p), math.log(p)
    base = math.lgamma(trials + 1)
    acc = 0.0
    for n in range(lo, hi + 1):
        acc += math.exp(base - math.lgamma(n + 1) - math.lgamma(trials - n + 1) + n * lp + (trials - n) * lq) * -(-n // tn)
    return num_experts * acc


#: grid y of a tile-loop launch: the expected token tiles of uniform routing times LOOP_MARGIN, plus LOOP_SLACK
#: (CTAs past the last tile leave at once; tiles past the grid run on CTA y, y + grid, ...: only where the routing is
#: skewed well beyond uniform)
LOOP_MARGIN = 1.125
LOOP_SLACK = 2


def loop_grid(num_routes: int, num_experts: int, tokens_per_tile: int, top_k: Optional[int] = None,
              global_experts: Optional[int] = None, bound: Optional[int] = None) -> int:
    """Grid y of a tile-loop grouped GEMM (its CTAs loop over the token tiles past the grid): about the expected
    tiles (:func:`expected_tiles`) with :data:`LOOP_MARGIN` and :data:`LOOP_SLACK`, at least 1 and at most
    ``bound`` (the tile bound of any routing, the grid of a kernel without the loop). On an expert-parallel rank
    (``global_experts``) the expected tiles are a fraction of the bound: the CTAs the bound launches beyond
    them would find no tile."""
    g = math.ceil(expected_tiles(num_routes, num_experts, tokens_per_tile, top_k, global_experts) * LOOP_MARGIN)
    g = max(1, g + LOOP_SLACK)
    return min(g, bound) if bound else g


#: the token counts at which a routed call's selection decides, up to :data:`SELECTION_DENSE` every count, above it a
#: grid of :data:`SELECTION_STEPS` points per octave (``T = 2^j + m * 2^(j - 4)``): a call between two grid points
#: runs the decision of one of them (:func:`selection_points`), so that ``warmup`` can load and pack everything any
#: token count up to its ``max_tokens`` runs (:func:`selection_grid`). The cost model's choice at the exact count was
#: 0.01-0.14% faster than the better of the two grid points' choices (predicted, geometric mean over 257-8192 tokens
#: of ten benchmark layers; at most 1.10 x at a count just past a wave boundary) and 0.4-1.6% faster than the lower
#: point's alone (at most 1.59 x)
SELECTION_DENSE = 256
SELECTION_STEPS = 16


def _grid_step(tokens: int) -> int:
    return max(1, 1 << (tokens.bit_length() - 1)) // SELECTION_STEPS


def selection_points(tokens: int) -> tuple:
    """The token counts whose selection a call of ``tokens`` tokens may run: ``(tokens,)`` up to
    :data:`SELECTION_DENSE` and on the grid above it, else the grid points ``(lo, hi)`` around it."""
    if tokens <= SELECTION_DENSE:
        return (tokens,)
    q = _grid_step(tokens)
    lo = tokens // q * q
    return (tokens,) if lo == tokens else (lo, lo + q)


def selection_grid(max_tokens: int) -> list:
    """Every token count whose selection a call of 1..``max_tokens`` tokens can run (:func:`selection_points`):
    ``1..min(max_tokens, SELECTION_DENSE)`` and the grid points above it, through the first at or past
    ``max_tokens``."""
    out = list(range(1, min(max_tokens, SELECTION_DENSE) + 1))
    t = SELECTION_DENSE
    while t < max_tokens:
        t += _grid_step(t)
        out.append(t)
    return out


#: split-K: a split must keep at least this many K tiles, and the FP32 partials it writes and the fix-up
#: reads back (``16 * TN * splits / K`` of the weight bytes) at most :data:`SPLIT_MAX_TRAFFIC`
#: (fitted on the H200 sweep of docs/perf/2026-12-01-cost-model: beyond either, a split costs more than the
#: SMs it fills)
SPLIT_MIN_K_TILES = 12
SPLIT_MAX_TRAFFIC = 0.25
SPLIT_MAX = 8


def split_k(ctas: int, target_ctas: int, k: int, k_tile: int, tokens_per_tile: int) -> int:
    """Split-K parts for a launch of ``ctas`` CTAs (row blocks x expected token tiles) over a K of ``k``:
    1 when the grid reaches ``target_ctas``, else enough parts to reach it (at most :data:`SPLIT_MAX`), as
    long as each part keeps :data:`SPLIT_MIN_K_TILES` K tiles and the partials' traffic stays within
    :data:`SPLIT_MAX_TRAFFIC` of the weights'."""
    ctas = max(1, ctas)
    if ctas >= target_ctas:
        return 1
    k_tiles = k // max(1, k_tile)
    s = max(1, min(SPLIT_MAX, -(-target_ctas // ctas)))
    while s > 1 and (k_tiles / s < SPLIT_MIN_K_TILES or 16 * tokens_per_tile * s / max(1, k) > SPLIT_MAX_TRAFFIC):
        s -= 1
    return s


#: the tail band: a grid of more than one and at most this many waves of a kernel's real CTA slots runs a second
#: wave that is mostly empty; :func:`tail_free_split` moves a split out of it
TAIL_MAX_WAVES = 1.6
#: ... to a larger split only where its FP32 partials (``16 * TN * splits / K`` of the weight bytes) add at most this
#: much traffic (TN 16 at K 5120, 10%, lost 11-20% at split 2: docs/perf/2026-12-03-tail-split; 0.08 or 0.25
#: here did no better on the held-out rows of docs/perf/2026-12-04-split-tail)
TAIL_MAX_TRAFFIC = 0.05
#: the splits :func:`tail_free_split` moves to
TAIL_SPLITS = (1, 2, 4, 8)


def tail_free_split(ctas: int, splits: int, slots: int, target_ctas: int, k: int, k_tile: int,
                    tokens_per_tile: int) -> int:
    """``splits`` (of :func:`split_k`, for a launch of ``ctas`` unsplit CTAs of which one wave holds ``slots``:
    CTAs per SM x SMs), or, when its grid ``ctas * splits`` falls in the tail band (more than one and at most
    :data:`TAIL_MAX_WAVES` waves), the split of :data:`TAIL_SPLITS` outside the band that reaches
    ``target_ctas`` with the fewest parts, else the largest one outside the band below it; a larger split keeps
    :data:`SPLIT_MIN_K_TILES` K tiles per part and :data:`TAIL_MAX_TRAFFIC`.

    A grid in the band runs a second wave less than 60% full: the SMs that finish the first wave early take the
    tail while the others idle (H200, ncu of Llama-4 Scout's gate/up GEMM at 8 tokens, 768 CTAs on 660 slots:
    SMs active 68% of the cycles). An unsplit grid there splits in two (2-3.2 waves of half-length CTAs); a grid
    that :func:`split_k` filled into it goes back below one wave or on to 2+ waves (Scout's gate/up at 4
    tokens: 512 CTAs, split 2 = 1.55 waves, 48.3 us; unsplit 39.9 us)."""
    def in_tail(s: int) -> bool:
        return slots < ctas * s <= TAIL_MAX_WAVES * slots

    if not in_tail(splits):
        return splits
    k_tiles = k // max(1, k_tile)
    ok = [s for s in TAIL_SPLITS if s <= SPLIT_MAX and not in_tail(s)
          and (s <= splits or (k_tiles / s >= SPLIT_MIN_K_TILES
                               and 16 * tokens_per_tile * s / max(1, k) <= TAIL_MAX_TRAFFIC))]
    if not ok:
        return splits
    reach = [s for s in ok if ctas * s >= target_ctas]
    return min(reach) if reach else max(ok)


def _need_top_k(top_k: Optional[int]) -> int:
    if top_k is None or top_k < 1:
        raise ValueError(f"top_k: the expert-parallel rule needs the call's top-k (>= 1), got {top_k!r}")
    return top_k


def select(table: tuple, num_routes: int, num_experts: int, top_k: Optional[int] = None,
           global_experts: Optional[int] = None) -> dict:
    """The tile parameters of ``table`` for a call of ``num_routes = T * k`` routes over ``num_experts`` local
    experts (``global_experts``: the expert-parallel hint, with ``top_k``; see :func:`routes_per_expert`)."""
    r = routes_per_expert(num_routes, num_experts, top_k, global_experts)
    for bound, tiles in table:
        if bound is None or r <= bound:
            return dict(tiles)
    raise ValueError("tile table: the last entry's bound must be None")


def group_param(scheme) -> int:
    """The ``group`` config field of a scheme: its group size, 0 for per-channel scales."""
    return 0 if scheme.group_size is None else scheme.group_size

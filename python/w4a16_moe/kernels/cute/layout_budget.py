"""How many packed weight layouts a layer may hold (``W4A16_MOE_LAYOUTS``), and which ones.

Every grouped choice reads one *pair* of packed layouts, ``(w13, w2)``, at the sizes it runs the layer at (its
padding); each layout is a full copy of the matrix's 4-bit weights. Left free (``all``, the default), each call
takes its fastest choice, and a layer served at every token count holds 2-4 layouts per matrix (README "Memory").
With ``W4A16_MOE_LAYOUTS=2`` (or ``1``) on the SM90 family, every plan of a layer reads one of at most two (one)
pairs, picked once per layer (:func:`kept_pairs`):

* one pair of the SM90 family whose layouts the decode kernels are built for (:data:`DECODE_LAYOUTS`): the decode
  kernels read it (:func:`decode_pair`), and so do the masked layout's calls;
* with ``2``, a second pair of either family.

The pairs are those minimizing the geometric mean, over ``R = 1, 2, 4, ...`` routes (up to 8192 tokens), of the
cost model's predicted time of the best choice reading them over its best choice overall (INT4 weights); FP4
weights, which the model does not price, keep the SM90 pairs the rule's buckets read at the most of those route
counts. A call then takes the fastest choice that reads a kept pair (:func:`restricted_choice`): the model's, or
for FP4 the kept bucket of the nearest token width; a tuned or an autotuned row only where it reads one.

Pairs are keyed by layer: experts, hidden and intermediate sizes, scheme, gated or not, top-k (None for masked
calls), the expert-parallel hint and the SM count. Other families (the warp family alone on GPUs other than SM90)
are not restricted: they hold one layout per matrix and K tile.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Optional

from ... import settings

__all__ = ["Pair", "DECODE_LAYOUTS", "budget", "pair_of", "plan_pair", "kept_pairs", "kept", "allows",
           "restricted_choice", "decode_pair", "route_grid"]

#: the SM90 layouts ``(m64_per_block, k_tile)`` the decode kernels are built for, per matrix (the AOT set has their
#: default knob sets on each): the first of each is the layout they read with every layout kept. H100, one token
#: (docs/perf/2026-12-07-layouts): gate/up on x4 K64 took about 1 us more than on x2 K128, down on x2 K64 or
#: x8 K64 2-6 us more than on x4 K64, so the kept SM90 pair reads w2 in x4 K64
DECODE_LAYOUTS = {"w13": ((2, 128), (4, 64)), "w2": ((4, 64),)}
#: the token counts the pairs are priced over (times top-k: the routes; masked calls: routes up to 8 x this)
MAX_TOKENS = 8192


@dataclass(frozen=True)
class Pair:
    """The packed layouts one choice reads: ``w13`` / ``w2`` layout keys without the dtype (e.g.
    ``"cute-sm90:w13:x4:k64:"``) and the ``(Hp, Ip)`` sizes it packs them at."""

    w13: str
    w2: str
    sizes: tuple

    @property
    def sm90(self) -> bool:
        return self.w13.startswith("cute-sm90:")

    def geometry(self, which: str) -> tuple:
        """``(m64_per_block, k_tile)`` of an SM90 layout."""
        parts = (self.w13 if which == "w13" else self.w2).split(":")
        return int(parts[2][1:]), int(parts[3][1:])

    @property
    def decode_layout(self) -> tuple:
        """Both SM90 layouts as the decode kernels' ``layout`` (``((X, BK) of w13, (X, BK) of w2)``)."""
        return self.geometry("w13"), self.geometry("w2")

    def __str__(self) -> str:
        strip = lambda k: ":".join(k.split(":")[2:]).rstrip(":")  # noqa: E731
        return f"{self.w13.split(':')[0][5:]} {strip(self.w13)}/{strip(self.w2)} at {self.sizes[0]}x{self.sizes[1]}"


def budget() -> Optional[int]:
    """Pairs a layer may hold (``W4A16_MOE_LAYOUTS``): None for ``all``."""
    v = settings.get().layouts
    return None if v == "all" else int(v)


def _scheme(scheme):
    from ...formats.schemes import get_scheme

    return get_scheme(scheme or "int4_g32")


@functools.lru_cache(maxsize=8192)
def _pair(family: str, tiles_items: tuple, hidden: int, intermediate: int, gated: bool, scheme: str) -> Pair:
    from . import registry
    from .sm90.family import run_sizes

    fam = registry.get(family)
    tiles = dict(tiles_items)
    up, down = fam.configs(_scheme(scheme), "bf16", "swiglu" if gated else "relu2", gated, "deterministic", tiles)
    return Pair(fam.layout_key("w13", up, ""), fam.layout_key("w2", down, ""),
                run_sizes(family, tiles, hidden, intermediate, gated, scheme))


def pair_of(family: str, tiles: dict, hidden: int, intermediate: int, gated: bool, scheme: str) -> Pair:
    """The :class:`Pair` a grouped choice (``family``'s ``tiles``) reads on a layer."""
    return _pair(family, tuple(sorted(tiles.items())), hidden, intermediate, gated, scheme)


def plan_pair(p, call) -> Pair:
    """The :class:`Pair` plan ``p`` of ``call`` reads."""
    from . import registry

    fam = registry.get(p.family)
    return Pair(fam.layout_key("w13", p.configs[0], ""), fam.layout_key("w2", p.configs[1], ""),
                tuple(p.pad) or (call.hidden, call.intermediate))


def route_grid(top_k: Optional[int]) -> list:
    """The route counts the pairs are priced at: ``T * top_k`` for ``T = 1, 2, 4, ..., MAX_TOKENS`` (masked calls,
    ``top_k`` None: ``1 ... 8 * MAX_TOKENS``)."""
    k = top_k or 1
    top = MAX_TOKENS * (top_k or 8)
    return [r for r in (k << j for j in range(0, 40)) if r <= top]


def _decode_ok(p: Pair) -> bool:
    return p.sm90 and p.geometry("w13") in DECODE_LAYOUTS["w13"] and p.geometry("w2") in DECODE_LAYOUTS["w2"]


def _candidates(hidden: int, intermediate: int, gated: bool, scheme: str) -> dict:
    """``{name: (family, tiles)}`` a budgeted call may choose among: the cost model's pool (INT4), else the SM90
    rule's buckets (FP4)."""
    from .sm90 import family as sm90
    from .sm90.tuned import candidate_name

    if sm90._fp4(scheme):
        return {f"sm90 {candidate_name(t)}": ("sm90", dict(t)) for _, t in sm90.TILES}
    return sm90.model_pool(hidden, intermediate, gated, scheme)


@functools.lru_cache(maxsize=1024)
def kept_pairs(n: int, experts: int, hidden: int, intermediate: int, scheme: str, gated: bool,
               top_k: Optional[int], global_experts: Optional[int], sm_count: int, cute_family: str) -> tuple:
    """The ``n`` (1 or 2) :class:`Pair` s a layer keeps (see the module docstring), the SM90 pair first.
    ``cute_family`` (``W4A16_MOE_CUTE_FAMILY``, which decides whether the model's pool has the warp family's tiles)
    only keys the cache."""
    from . import cost_model
    from .sm90 import family as sm90

    cands = _candidates(hidden, intermediate, gated, scheme)
    pairs = {name: pair_of(f, t, hidden, intermediate, gated, scheme) for name, (f, t) in cands.items()}
    grid = route_grid(top_k)
    if sm90._fp4(scheme):  # no prices: the rule's picks, counted
        count: dict = {}
        for j, r in enumerate(grid):
            f, t, _ = sm90.rule_choice(r, experts, top_k, global_experts, scheme)
            p = pair_of(f, t, hidden, intermediate, gated, scheme)
            count[p] = count.get(p, 0) + 1 + j / 1e3  # ties: the pair of larger calls
        ranked = sorted(count, key=count.get, reverse=True)
        first = [p for p in ranked if _decode_ok(p)] or [p for p in ranked if p.sm90] or [pairs[next(iter(pairs))]]
        rest = [p for p in ranked if p != first[0]]
        return (first[0],) + tuple(rest[: n - 1])
    rows = []
    for r in grid:
        priced = {}
        for name, (f, t) in cands.items():
            us = cost_model.predict_us(name, r, experts, *pairs[name].sizes, gated, top_k, global_experts, sm_count)
            if us is not None:
                p = pairs[name]
                priced[p] = min(us, priced.get(p, math.inf))
        if priced:
            rows.append(priced)
    distinct = sorted({p for row in rows for p in row}, key=str)
    firsts = [p for p in distinct if _decode_ok(p)] or [p for p in distinct if p.sm90]
    if not firsts:  # the model prices no SM90 pair: the rule's bucket at the largest call
        f, t, _ = sm90.rule_choice(grid[-1], experts, top_k, global_experts)
        return (pair_of(f, t, hidden, intermediate, gated, scheme),)

    def score(keep: tuple) -> float:
        logs = []
        for row in rows:
            got = min((row[p] for p in keep if p in row), default=math.inf)
            logs.append(math.log(got / min(row.values())))
        return sum(logs) / len(logs)

    combos = [(a,) + rest for a in firsts for rest in itertools.combinations([p for p in distinct if p != a], n - 1)]
    return min(combos, key=lambda c: (score(c), [str(p) for p in c]))


def kept(call, info) -> Optional[tuple]:
    """The pairs ``call``'s layer keeps on ``info`` under ``W4A16_MOE_LAYOUTS``, or None: every layout allowed (``all``,
    a family other than SM90, the selection overrides of the tuner / tests)."""
    from . import overrides, provider

    n = budget()
    if n is None or overrides.current().any:
        return None
    base, _ = provider.family_for(info)
    if base is None or base.name != "sm90":
        return None
    return kept_pairs(n, call.experts, call.hidden, call.intermediate, call.scheme, call.activation.gated,
                      getattr(call, "top_k", None), getattr(call, "global_experts", None), info.sms,
                      settings.get().cute_family)


def allows(p, call, info) -> bool:
    """Whether plan ``p`` reads a pair ``call``'s layer keeps (always, without a budget)."""
    keep = kept(call, info)
    return keep is None or plan_pair(p, call) in keep


def restricted_choice(call, info, keep: tuple, routes: int) -> tuple:
    """``(family, tiles)``: the fastest choice of ``routes`` routes reading one of the ``keep`` pairs (the cost
    model's; FP4 or unpriced: the kept candidate of the token width nearest the rule's)."""
    from . import cost_model
    from .sm90 import family as sm90

    h, i, gated, scheme = call.hidden, call.intermediate, call.activation.gated, call.scheme
    cands = {name: ft for name, ft in _candidates(h, i, gated, scheme).items()
             if pair_of(*ft, h, i, gated, scheme) in keep}
    if not cands:
        raise RuntimeError(f"W4A16_MOE_LAYOUTS={settings.get().layouts}: no choice reads the kept pairs "
                           f"{', '.join(map(str, keep))} of this layer (E={call.experts}, H={h}, I={i}, {scheme})")
    if not sm90._fp4(scheme):
        sizes = {name: pair_of(f, t, h, i, gated, scheme).sizes for name, (f, t) in cands.items()}
        got = cost_model.best(cands, routes, call.experts, h, i, gated, getattr(call, "top_k", None),
                              getattr(call, "global_experts", None), info.sms, sizes=sizes)
        if got is not None:
            f, t = cands[got[0]]
            return f, dict(t)
    _, rule, _ = sm90.rule_choice(routes, call.experts, getattr(call, "top_k", None),
                                  getattr(call, "global_experts", None), scheme)
    tn = rule["tokens_per_tile"]
    f, t = min(cands.values(), key=lambda ft: (abs(math.log(ft[1]["tokens_per_tile"] / tn)), ft[0] != "sm90"))
    return f, dict(t)


def decode_pair(call, info) -> tuple:
    """``(budgeted, pair)``: whether ``call``'s layer is under a layout budget, and then the kept SM90 pair the
    decode kernels read (their layouts and padded sizes), or None where no kept pair is one they are built for
    (:data:`DECODE_LAYOUTS`; the call then runs the grouped kernels). ``(False, None)``: no budget, the decode
    kernels read their default layouts (``decode.family.LAYOUT``)."""
    keep = kept(call, info)
    if keep is None:
        return False, None
    return True, next((p for p in keep if _decode_ok(p)), None)

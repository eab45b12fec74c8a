"""Plans of explicit choices: a stored autotune row, or one of the autotuner's candidates.

:func:`plan_of_choice` turns a :class:`~.autotune_store.Choice` (the decode kernels with a knob set, or a
grouped family's candidate tile shape and split-K) into the CuTe provider's :class:`~w4a16_moe.plan.Plan`
of a routed call, or None where that choice cannot run the call here; :func:`autotuned_plan` is the
selection step that takes the autotune store's row for the call (after the overrides, before the tuned
table and the rules: see :func:`.provider._make_plan`).
"""

from __future__ import annotations

import os
from typing import Optional

from ... import settings
from ...device import DeviceInfo
from ...plan import Plan
from . import layout_budget, overrides, registry
from .provider import (_DTYPES, _decode_beside, _decode_plan_of, _max_tiles, _module, _routed_grouped_plan,
                       family_for)
from .registry import KernelFamily

__all__ = ["autotuned_plan", "plan_of_choice"]



def autotuned_plan(base: KernelFamily, call, sch, dt: str, info: DeviceInfo, sel=None) -> Optional[Plan]:
    """The plan of the autotune store's row for this layer and token count (:mod:`.autotune_store`), or
    None: no row, overrides active, ``W4A16_MOE_CUTE_DECODE=1``, or the row's choice cannot run here. ``sel``: the
    call at the selection-grid count whose row it runs (:func:`.provider._routed_plan`; default: the call)."""
    from . import autotune_store as store

    if overrides.current().any or settings.get().cute_decode == "1":
        return None
    key = store.LayerKey(info.name, call.experts, call.hidden, call.intermediate, call.scheme, dt, call.top_k,
                         call.activation.name, call.finalize, call.global_experts, settings.get().layouts)
    hit = store.lookup(key, (sel or call).tokens)
    if hit is None:
        return None
    row, path = hit
    note = f"autotuned row T={row.tokens}{'' if row.complete else ' (partial)'}, {os.path.basename(path)}"
    for choice in (row.best, row.grouped):
        p = None if choice is None else plan_of_choice(call, info, choice, note, base=base, scheme=sch, sel=sel)
        if p is not None:
            return p
    return None


def plan_of_choice(call, info: DeviceInfo, choice, note: str = "", *, base: Optional[KernelFamily] = None,
                   scheme=None, sel=None) -> Optional[Plan]:
    """The plan of routed ``call`` running ``choice`` (:class:`.autotune_store.Choice`: the autotuner's
    candidates and stored rows), or None when the choice cannot run it here (family not allowed on the
    device, decode path off for this call, unknown candidate, grid too large). ``sel``: the call at the
    selection-grid count that decides the tile loop (default: the call)."""
    from ...formats.schemes import get_scheme
    from . import autotune_store as store

    if base is None:
        base, _ = family_for(info)
        if base is None:
            return None
    sch = scheme or get_scheme(call.scheme)
    dt = _DTYPES[call.dtype]
    if choice.decode:
        dec = _decode_beside(base)
        s = settings.get()
        if (dec is None or getattr(call, "routes_only", False) or s.batch_invariant or s.cute_decode == "0"
                or dec.can_implement(call) is not None or layout_budget.decode_pair(call, info) == (True, None)):
            return None
        knobs = _module(dec).knob_items(choice.candidate or None)
        return _decode_plan_of(base, dec, call, sch, dt, info, knobs, note or f"knobs {choice.candidate or 'default'}")
    allowed = {base.name} | ({"warp"} if base.name == "sm90" and settings.get().cute_family == "auto" else set())
    if choice.family not in allowed:
        return None
    tiles = store.candidate_tiles(choice.family).get(choice.candidate)
    if tiles is None:
        return None
    fam = registry.get(choice.family)
    if _max_tiles(call.tokens * call.top_k, call.experts, tiles["tokens_per_tile"]) > fam.max_grid_y:
        return None
    return _routed_grouped_plan(base, fam, call, sch, dt, info, dict(tiles), choice.splits, note, sel=sel)

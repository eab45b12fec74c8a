"""The CuTe DSL provider: which calls its kernels cover, and how a call is launched.

One ``fused_moe`` call on SM90 runs (no host synchronization; capturable in a CUDA graph):

1. route preparation (the Triton route-prep kernel: sorted routes, ``route_start``, ``block_start``);
2. the gate/up grouped GEMM (:mod:`.sm90.grouped_gemm`, mode ``gate_up``): ``h[slot] = act(W13_e x[t])``;
3. the down grouped GEMM: ``y[route] = W2_e h[slot]`` (deterministic) or ``out32[t] += w * y`` (fused,
   FP32 atomics);
4. deterministic: the fixed top-k-order FP32 finalize (the Triton provider's kernel, shared so both
   providers combine identically); fused: one cast of ``out32``.

Small routed calls (``T * top_k`` up to a tuned bound, by default 128 routes that read each expert's
weights about once; see :mod:`.decode.family`)
skip all of that on SM90: two route-major decode kernels (:mod:`.decode.gemv`) read each route's expert
id straight from ``topk_ids``, write ``h`` by route, and the down kernel combines every token's routes in
fixed order straight into ``out`` (no route preparation, no finalize pass; deterministic, both finalize
modes). Where their grids would leave SMs idle (a token or two, few large experts, short TP shards) each
kernel splits K over several CTAs per output tile (:func:`.decode.family.num_splits`; partials and arrival
counters in a per-device scratch allocated once, outside CUDA-graph capture). ``W4A16_MOE_CUTE_DECODE=0|1`` turns them off / forces them; batch-invariant mode never uses them.

Two kernel families share the launch ABI and the routing contract: the Hopper WGMMA family
(:mod:`.sm90.family`, SM90 only) and the portable warp-MMA family (:mod:`.warp.family`, SM80 to SM120;
compile-verified only on archs other than SM90). A device gets the SM90 family on compute capability 9.x,
else the warp family when it was built for that arch; ``W4A16_MOE_CUTE_FAMILY=sm90|warp`` forces one
(e.g. ``warp`` to run the portable family on an H200).

The families are registered in :mod:`.registry`. :class:`CuteProvider` plans a call once per call shape
(:class:`~w4a16_moe.plan.Plan`: family, tiles, split-K, decode or not, kernel configs; cached by the call's
static description, the device, the settings and the selection overrides) and executes the plan.

Weights are permuted once per (family, tile shape, dtype) into the family's fragment-ready layout
(:mod:`.sm90.pack`, :mod:`.warp.pack`) and cached beside the canonical tensors.

gpt-oss experts (per-expert biases, ``swiglu_oai`` with any ``alpha`` / ``limit``) run on every family. The
configs of a biased layer have ``bias=True``: the gate/up kernel adds ``w13_bias`` before the activation, the
deterministic (and masked) down kernel adds ``w2_bias`` before rounding ``y``; both read an FP32 bias table
``[E, rows]`` (padded, un-interleaved gate/up order, converted once and cached on the bias tensor:
:func:`_bias`) from the launch ABI's ``topk_weights`` slot, which only the ``atomic_f32`` epilogue reads. The
decode kernels read the same tables from the ``route_start`` slot (down adds the token's weighted w2 biases
itself, in both finalize modes). The
fused finalize starts its FP32 accumulator from ``sum_j topk_weights[t, j] * w2_bias[ids[t, j] - offset]``
over the token's local routes (:func:`_fused_acc`) instead of zeros. A layer with one bias only reads a zero
table for the other.

Any ``H`` and ``I`` that are multiples of 8 and of the scheme's group (the weights' own rule) run: a plan whose
tiles do not divide them runs the kernels on padded sizes ``Plan.pad = (Hp, Ip)`` (zero-padded weights packed
once, x copied into a zero-padded buffer, outputs through padded buffers; :mod:`.padding`). Aligned layers run
exactly as before (no padding, no copies). Kernels come from the
loader (prebuilt, JIT cache, JIT).
The first use of a kernel (module load, weight packing) must not happen inside CUDA-graph capture:
call :func:`w4a16_moe.warmup` before capturing.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from typing import Optional

import torch

from ... import settings
from ...device import DeviceInfo
from ...plan import Plan
from . import layout_budget, overrides, registry
from . import tiles as tiles_rule
from .registry import KernelFamily

__all__ = ["CuteProvider", "PROVIDER", "unavailable_reason", "cute_fused_moe", "cute_fused_moe_masked",
           "cute_expert_routes", "warmup_plans", "cute_warmup", "batch_invariant", "family_for", "clear_plans"]

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _kernels_available(arch: str) -> Optional[str]:
    """None when kernels can be had (prebuilt manifest for arch, or the CuTe DSL for JIT), else why not.
    Cached per arch and the environment that decides it."""
    s = settings.get()
    return _kernels_available_cached(arch, s.prebuilt_dir, s.disable_jit)


@functools.lru_cache(maxsize=None)
def _kernels_available_cached(arch: str, _prebuilt_env, _jit_env) -> Optional[str]:
    from ...loader import jit_cache, prebuilt

    if prebuilt.summary().get("per_arch", {}).get(arch):
        return None
    if jit_cache.jit_disabled():
        return "no prebuilt kernels for this arch and JIT is disabled (W4A16_MOE_DISABLE_JIT=1)"
    if importlib.util.find_spec("cutlass") is None:
        return "no prebuilt kernels for this arch and the CuTe DSL (nvidia-cutlass-dsl) is not installed for JIT"
    return None


def family_for(info: DeviceInfo) -> "tuple[Optional[KernelFamily], Optional[str]]":
    """``(grouped family, None)`` serving a CUDA device, or ``(None, why not)``: the first registered
    grouped family that supports the device (``W4A16_MOE_CUTE_FAMILY`` forces one)."""
    forced = settings.get().cute_family
    grouped = [f.name for f in registry.families() if f.role == "grouped"]
    if forced != "auto" and forced not in grouped:
        raise ValueError(f"W4A16_MOE_CUTE_FAMILY: expected auto or one of {', '.join(grouped)}, got {forced!r}")
    arch = info.arch
    why = None
    for fam in registry.families():
        if fam.role != "grouped" or (forced != "auto" and fam.name != forced):
            continue
        why = fam.supports(info.capability, arch)
        if why is None:
            return fam, None
        if forced != "auto":
            return None, f"W4A16_MOE_CUTE_FAMILY={forced}, but {why}"
    return None, why or f"no CuTe kernel family for {arch}"


def _decode_beside(base: KernelFamily) -> Optional[KernelFamily]:
    for fam in registry.families():
        if fam.role == "decode" and fam.beside == base.name:
            return fam
    return None


def batch_invariant() -> bool:
    """``W4A16_MOE_BATCH_INVARIANT=1``: deterministic calls never split K, so a route's result does not
    depend on the batch it came in (what lets expert parallelism reproduce one GPU bit for bit), at the
    cost of small-batch speed. Default: split-K allowed (still bit-identical run to run)."""
    return settings.get().batch_invariant


def _max_tiles(num_routes: int, num_experts: int, tn: int) -> int:
    return -(-num_routes // tn) + min(num_experts, num_routes)


def _counter_tiles(family: KernelFamily, cfg, n: int, max_tiles: int, splits: int) -> int:
    return (n // family.rows_per_cta(cfg)) * max_tiles if splits > 1 else 0


# ------------------------------------------------------------------------------------------------------
# planning (host only, cached per call shape)
# ------------------------------------------------------------------------------------------------------
_PLANS: dict = {}
_PLANS_STATE: list = [None, None, None]
_PLANS_MAX = 4096


def clear_plans() -> None:
    """Forget every cached plan (a test that changed what selection reads, e.g. the tuned table)."""
    _PLANS.clear()


def _plan_cached(call, info: DeviceInfo) -> tuple:
    """``(plan or None, reason or None)`` of ``call`` on ``info``, cached by the call's static description,
    the device, the settings snapshot, the selection overrides and the autotune store's generation."""
    from . import autotune_store

    s, o, g = settings.get(), overrides.current(), autotune_store.generation()
    if _PLANS_STATE[0] is not s or _PLANS_STATE[1] is not o or _PLANS_STATE[2] != g:
        _PLANS.clear()
        _PLANS_STATE[:] = [s, o, g]
    key = (call, info)
    hit = _PLANS.get(key)
    if hit is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        hit = _PLANS[key] = _make_plan(call, info)
    return hit


def _grouped_choice(base: KernelFamily, call, dt: str, info: DeviceInfo) -> tuple:
    """``(family, tiles, splits or None)`` of a routed call: the SM90 family may hand a layer shape to
    another family where its tuned table or its cost model found that faster (the plan then names that
    family)."""
    name, tiles, splits = base.choose(call.tokens, call.top_k, call.experts, call.hidden, call.intermediate,
                                      call.scheme, dt, info.name, call.global_experts,
                                      gated=call.activation.gated, sm_count=info.sms)
    fam = registry.get(name)
    if fam is not base and fam.can_implement(call) is not None:  # the chosen family lacks a feature
        fam, tiles, splits = base, base.select_tiles(call.tokens * call.top_k, call.experts, call.top_k,
                                                     call.global_experts), None
    keep = layout_budget.kept(call, info)
    if keep is not None and layout_budget.pair_of(fam.name, tiles, call.hidden, call.intermediate,
                                                  call.activation.gated, call.scheme) not in keep:
        name, tiles = layout_budget.restricted_choice(call, info, keep, call.tokens * call.top_k)
        fam, splits = registry.get(name), None
        if fam is not base and fam.can_implement(call) is not None:
            fam, tiles = base, layout_budget.restricted_choice(call, info, tuple(p for p in keep if p.sm90),
                                                               call.tokens * call.top_k)[1]
    return fam, tiles, splits


def _module(fam: KernelFamily):
    """The family's module (the decode rule and the tuned table's decode entries live there)."""
    import sys

    return sys.modules[type(fam).__module__]


def _make_plan(call, info: DeviceInfo) -> tuple:
    from ...formats.schemes import get_scheme
    from ...validate import MaskedCall

    if not info.is_cuda:
        return None, f"device {info.type} is not a CUDA GPU"
    base, why = family_for(info)
    if base is None:
        return None, why
    why = base.can_implement(call)
    if why:
        return None, why
    sch = get_scheme(call.scheme)
    dt = _DTYPES[call.dtype]
    act = call.activation
    sm = info.sms
    e = call.experts
    inv = batch_invariant()
    if isinstance(call, MaskedCall):
        tiles = base.select_tiles(e * call.capacity, e)
        keep = layout_budget.kept(call, info)
        if keep is not None and layout_budget.pair_of(base.name, tiles, call.hidden, call.intermediate, act.gated,
                                                      call.scheme) not in keep:
            tiles = layout_budget.restricted_choice(call, info, tuple(p for p in keep if p.sm90), e * call.capacity)[1]
        if e * -(-call.capacity // tiles["tokens_per_tile"]) > base.max_grid_y:
            return None, f"{e} experts x capacity {call.capacity} exceed one launch's grid (provider cute)"
        why = _kernels_available(_arch(base, info))
        if why:
            return None, why
        up, down = base.configs(sch, dt, act.name, act.gated, "deterministic", tiles, bias=call.has_bias)
        hp, ip, n13 = _padded(base, up, down, call, sch)
        r = e * call.capacity
        max_tiles = e * -(-call.capacity // up.tokens_per_tile)
        a = _arch(base, info)
        su = 1 if inv else base.num_splits(n13, hp, up, r, e, sm, arch=a)
        sd = 1 if inv else base.num_splits(hp, ip, down, r, e, sm, arch=a)
        return _grouped_plan(base, info, tiles, up, down, su, sd, max_tiles, n13, hp, "masked" + _budget_note(call, info),
                             pad=_pad_field(call, hp, ip)), None
    points = tiles_rule.selection_points(call.tokens)
    if len(points) == 1:
        return _routed_plan(base, call, call, sch, dt, info)
    # between two points of the selection grid: the decision of one of them, the one the cost model prices faster at
    # this count (the lower one where it prices neither), so that warmup's plans of the grid hold every kernel and
    # layout this call can run (:func:`.tiles.selection_points`)
    got = [(_routed_plan(base, call, dataclasses.replace(call, tokens=t), sch, dt, info), t) for t in points]
    ok = [(p, t) for (p, _), t in got if p is not None]
    if not ok:
        return got[0][0]
    priced = [(_predicted_us(p, call, info), t, p) for p, t in ok]
    if len(ok) == 2 and all(us is not None for us, _, _ in priced):
        _, t, p = min(priced, key=lambda x: (x[0], x[1]))
    else:
        p, t = ok[0]
    return dataclasses.replace(p, note=f"{p.note}, decided at T={t} (selection grid {points[0]} / {points[1]})"), None


def _routed_plan(base: KernelFamily, call, sel, sch, dt: str, info: DeviceInfo) -> tuple:
    """``(plan or None, why)`` of routed ``call`` running the decision of ``sel``, the same call at a token count of
    the selection grid (:func:`.tiles.selection_points`; ``call`` itself on it): family, tiles, split-K (tuned rows),
    the decode path and its knobs, the tile loop are decided at ``sel``; the launch (grid, split-K rule, scratch) is
    ``call``'s."""
    e = call.experts
    fam, tiles, splits = _grouped_choice(base, sel, dt, info)
    r = call.tokens * call.top_k
    if _max_tiles(r, e, tiles["tokens_per_tile"]) > fam.max_grid_y:
        return None, f"{call.tokens} tokens x top-{call.top_k} exceed one launch's grid (provider cute)"
    why = _kernels_available(_arch(base, info))
    if why:
        return None, why
    from .choice_plan import autotuned_plan

    auto = autotuned_plan(base, call, sch, dt, info, sel=sel)
    if auto is not None and layout_budget.allows(auto, call, info):
        return auto, None
    dec, why_not_decode = _decode_plan(base, call, sch, dt, info, sel=sel)
    if dec is not None:
        return dec, None
    note = "forced" if overrides.current().candidate is not None else _table_note(base, sel, dt, info, why_not_decode)
    return _routed_grouped_plan(base, fam, call, sch, dt, info, tiles, splits, note + _budget_note(call, info),
                                sel=sel), None


def _predicted_us(p: Plan, call, info: DeviceInfo) -> Optional[float]:
    """The cost model's time of grouped plan ``p``'s choice on ``call`` (None: decode, or a choice it does not price)."""
    if p.decode:
        return None
    from . import cost_model
    from .sm90.tuned import candidate_name

    hp, ip = p.pad or (call.hidden, call.intermediate)
    return cost_model.predict_us(f"{p.family} {candidate_name(dict(p.tiles))}", call.tokens * call.top_k, call.experts,
                                 hp, ip, call.activation.gated, call.top_k, call.global_experts, info.sms)


def _budget_note(call, info: DeviceInfo) -> str:
    """``", W4A16_MOE_LAYOUTS=N: kept <pairs>"`` under a layout budget (:mod:`.layout_budget`), else ``""``."""
    keep = layout_budget.kept(call, info)
    if keep is None:
        return ""
    return f", W4A16_MOE_LAYOUTS={settings.get().layouts}: kept " + " + ".join(map(str, keep))


def _table_note(base: KernelFamily, call, dt: str, info: DeviceInfo, why_not_decode: str = "") -> str:
    """Where a grouped choice came from: the tuned table's row (``tuned row T=...``) or the rule, then
    ``why_not_decode`` (from :func:`_decode_plan`), then with the expert-parallel hint the expected routes per
    local expert it used."""
    counts = getattr(_module(base), "tuned_token_counts", None)
    rows = counts(info.name, call.experts, call.hidden, call.intermediate, call.scheme, dt, call.top_k,
                  call.global_experts) if counts else []
    if not rows:
        return _rule_note(base, call, info) + why_not_decode + _ep_note(call)
    below = [t for t in rows if t <= call.tokens]
    return f"tuned row T={below[-1] if below else rows[0]}" + why_not_decode + _ep_note(call)


def _rule_note(base: KernelFamily, call, info: DeviceInfo) -> str:
    """``"cost model: ~X us for both GEMMs"`` where the family's cost model chose the tiles, else ``"rule"``."""
    from ...formats.schemes import get_scheme

    pick = getattr(_module(base), "model_choice", None)
    if pick is None or get_scheme(call.scheme).is_fp4:
        return "rule"
    got = pick(call.tokens * call.top_k, call.experts, call.hidden, call.intermediate, call.activation.gated,
               call.top_k, call.global_experts, info.sms, call.scheme)
    return "rule" if got is None else f"cost model: ~{got[2]:.0f} us for both GEMMs"


def _ep_note(call) -> str:
    """``", EP hint: E of E_global experts, ~R routes on ~D local experts"`` for a call with the
    ``global_num_experts`` hint (:func:`.tiles.expected_local`), ``""`` without it."""
    g = getattr(call, "global_experts", None)
    if g is None:
        return ""
    from .tiles import expected_local

    r, d = expected_local(call.tokens * call.top_k, call.experts, call.top_k, g)
    return f", EP hint: {call.experts} of {g} experts, ~{r:.1f} local routes on ~{d:.1f} experts"


def _routed_grouped_plan(base, fam, call, sch, dt: str, info: DeviceInfo, tiles: dict, splits, note: str,
                         sel=None) -> Plan:
    """The grouped-GEMM plan of a routed call with ``tiles`` of ``fam`` and ``splits`` (None: the rule); whether its
    kernels loop over token tiles is decided at ``sel``'s token count (:func:`_routed_plan`; default: the call's)."""
    act = call.activation
    e = call.experts
    r = call.tokens * call.top_k
    g, k = call.global_experts, call.top_k
    max_tiles = _max_tiles(r, e, tiles["tokens_per_tile"])
    grid_tiles = _tile_loop_grid(fam, r, e, tiles["tokens_per_tile"], k, g, max_tiles,
                                 None if sel is None else sel.tokens * k)
    # the tile loop is how this plan launches the candidate's kernels (its grid is ``grid_tiles``), not part of the
    # tile: the plan keeps the candidate's tiles, so a plan names the candidate that reproduces it
    kernel_tiles = dict(tiles, tile_loop=True) if grid_tiles else tiles
    if _warp_pdl(fam, call, info, grid_tiles):  # likewise the launch with PDL
        kernel_tiles = dict(kernel_tiles, pdl=True)
    up, down = fam.configs(sch, dt, act.name, act.gated, call.finalize, kernel_tiles, bias=call.has_bias)
    hp, ip, n13 = _padded(fam, up, down, call, sch)
    if call.finalize == "deterministic" and batch_invariant():
        # no split-K: each route's result is then independent of the batch it came in (same kernel math
        # for every tile shape), which is what lets expert parallelism reproduce one GPU bit for bit.
        # Otherwise split-K partials are summed in fixed split order: still bit-identical run to run.
        splits = 1
    a = _arch(base, info)
    su = fam.num_splits(n13, hp, up, r, e, info.sms, k, g, arch=a) if splits is None else min(splits, hp // up.k_tile)
    sd = fam.num_splits(hp, ip, down, r, e, info.sms, k, g, arch=a) if splits is None else min(splits, ip // down.k_tile)
    return _grouped_plan(fam, info, tiles, up, down, su, sd, max_tiles, n13, hp, note, arch=a,
                         pad=_pad_field(call, hp, ip), grid_tiles=grid_tiles)


#: ``W4A16_MOE_TILE_LOOP=auto`` (the default) takes the warp-MMA tile-loop kernels where the loop grid is at most
#: this fraction of the bound (H200, docs/perf/2026-12-05-tile-loop: 0.91-0.95 x at loop / bound 0.26-0.44 on
#: expert-parallel ranks at decode sizes, 1.00 at 0.24-0.35, 1.01-1.04 at 0.70)
TILE_LOOP_AUTO_FRACTION = 0.5


def _tile_loop_grid(fam: KernelFamily, num_routes: int, num_experts: int, tn: int, top_k: int, global_experts,
                    bound: int, decide_routes: Optional[int] = None) -> int:
    """Grid y of the warp-MMA family's tile-loop kernels where ``W4A16_MOE_TILE_LOOP`` (or a forced loop grid,
    :func:`.overrides.forced_loop_grid`) asks for them (:func:`.tiles.loop_grid`, at most ``bound``); 0: no loop.
    Only that family loops: the SM90 loop kernels of the study were 1.02-1.06 x slower per tile. ``auto`` decides at
    ``decide_routes`` routes (a point of the selection grid, :func:`_routed_plan`; default ``num_routes``)."""
    if fam.name != "warp":
        return 0
    forced_grid = overrides.current().loop_grid
    if forced_grid is not None:
        return min(forced_grid, bound)
    mode = settings.get().tile_loop
    if mode == "0":
        return 0
    from .tiles import loop_grid

    grid = loop_grid(num_routes, num_experts, tn, top_k, global_experts, bound)
    if mode == "1":
        return grid
    if decide_routes is None or decide_routes == num_routes:
        return grid if grid <= TILE_LOOP_AUTO_FRACTION * bound else 0
    d_bound = _max_tiles(decide_routes, num_experts, tn)
    d_grid = loop_grid(decide_routes, num_experts, tn, top_k, global_experts, d_bound)
    return grid if d_grid <= TILE_LOOP_AUTO_FRACTION * d_bound else 0


def _warp_pdl(fam: KernelFamily, call, info: DeviceInfo, grid_tiles: int) -> bool:
    """Whether the warp-MMA family's kernels of this call are launched with PDL (:func:`.warp.family.pdl_launch`;
    ``W4A16_MOE_PDL=0`` turns it off; SM90 and later)."""
    if fam.name != "warp" or not settings.get().pdl or not info.capability or info.capability[0] < 9:
        return False
    from .warp.family import pdl_launch

    return pdl_launch((2 if call.activation.gated else 1) * call.intermediate, call.hidden, bool(grid_tiles))


def _padded(fam: KernelFamily, up, down, call, sch) -> tuple:
    """``(Hp, Ip, gate/up rows)`` the configs ``up`` / ``down`` run the call's layer at
    (:func:`.padding.padded_sizes`; ``(H, I, 2I|I)`` when it is aligned)."""
    from .padding import padded_sizes

    gated = call.activation.gated
    hp, ip = padded_sizes(fam, up, down, call.hidden, call.intermediate, gated, sch)
    return hp, ip, 2 * ip if gated else ip


def _pad_field(call, hp: int, ip: int) -> tuple:
    return () if (hp, ip) == (call.hidden, call.intermediate) else (hp, ip)


def _arch(base: KernelFamily, info: DeviceInfo) -> str:
    """The arch the family's kernels are built for on this device (the SM90 families: sm_90a)."""
    return base.archs[0] if len(base.archs) == 1 else info.arch


def _grouped_plan(fam, info, tiles, up, down, su, sd, max_tiles, n13, h, note, arch=None, pad=(), grid_tiles=0) -> Plan:
    counters = max(_counter_tiles(fam, up, n13, max_tiles, su), _counter_tiles(fam, down, h, max_tiles, sd))
    return Plan("cute", fam.name, arch or _arch(fam, info), False, tuple(sorted(tiles.items())), (su, sd),
                (up, down), (fam.spec_for(up).name, fam.spec_for(down).name), max_tiles=max_tiles,
                grid_tiles=grid_tiles, counters=counters, note=note, pad=pad)


def _decode_plan(base: KernelFamily, call, sch, dt: str, info: DeviceInfo, sel=None) -> tuple:
    """``(plan or None, why not)``: the plan of a routed call on the decode kernels beside ``base``, or None when
    it does not use them (:func:`.decode.family.use_decode`, the tuned bound, the overrides); ``why not`` is
    ``", not decode: <why>"`` (:func:`.decode.family.decode_refusal`) for a call within the decode path's route
    bound that the rule declined, else ``""``. Decided at ``sel``'s token count (:func:`_routed_plan`; default:
    the call's), launched at the call's."""
    launch, call = call, (sel or call)
    if getattr(call, "routes_only", False):
        return None, ""  # expert-parallel halves always run the grouped GEMMs
    dec = _decode_beside(base)
    if dec is None or dec.can_implement(call) is not None or dec.can_implement(launch) is not None:
        return None, ""
    dmod = _module(dec)
    smod = _module(base)
    force = overrides.current()
    key = (info.name, call.experts, call.hidden, call.intermediate, call.scheme, dt, call.top_k, call.global_experts)
    if force.decode_knobs is not None:  # the tuner timing the decode kernels
        bound = 1 << 30
    elif force.candidate is not None:  # the tuner timing a grouped-GEMM tile shape
        return None, ""
    else:
        bound = smod.decode_bound(*key)
    n13 = call.intermediate * (2 if call.activation.gated else 1)
    expert_bytes = (n13 + call.intermediate) * call.hidden // 2  # one expert's 4-bit gate/up and down weights
    why = dmod.decode_refusal(call.tokens, call.top_k, bound, call.experts, call.global_experts, call.scheme,
                              expert_bytes=expert_bytes)
    if why is not None:
        return None, (f", not decode: {why}" if call.tokens * call.top_k <= dmod.DECODE_MAX_ROUTES else "")
    budgeted, pair = layout_budget.decode_pair(call, info)
    if budgeted and pair is None:
        return None, f", not decode: W4A16_MOE_LAYOUTS={settings.get().layouts} keeps no layout pair it reads"
    if force.decode_knobs is not None:
        knobs = force.decode_knobs
        note = "forced knobs"
    else:
        # (the tuned table's knob sets are built on the decode kernels' default layouts only)
        on_default = pair is None or pair.decode_layout == dmod.DEFAULT_LAYOUT
        text = smod.decode_knobs(call.tokens, *key) if on_default else None
        if text is None:  # no tuned knob set for the layer: the default set of its regime
            text = dmod.default_knobs(call.tokens, call.top_k, call.hidden, n13, info.sms,
                                      call.experts, call.global_experts, fp32_scales=dmod.takes_fp32_scales(sch))
            note = f"default knobs {text}" if text else "default knobs"
        else:
            note = f"knobs {text}" if text else "default knobs"
        knobs = dmod.knob_items(text)
        if settings.get().cute_decode == "1":
            note += ", W4A16_MOE_CUTE_DECODE=1"
        elif bound is not None:
            note += f", tuned bound {bound} routes"
        else:
            reread = dmod.reread_factor(call.tokens, call.top_k, call.experts, call.global_experts)
            mb = dmod.streamed_bytes(call.tokens, call.top_k, expert_bytes, call.experts, call.global_experts) / 1e6
            note += f", cost model: re-read {reread:.2f}x, {mb:.0f} MB streamed"
        note += _ep_note(call) + _budget_note(call, info)
    return _decode_plan_of(base, dec, launch, sch, dt, info, knobs, note), ""


def _decode_plan_of(base: KernelFamily, dec: KernelFamily, call, sch, dt: str, info: DeviceInfo, knobs: tuple,
                    note: str) -> Plan:
    """The decode plan of ``call`` with knob items ``knobs``: its configs, and the K split of each kernel
    (the knobs' ``s<N>``, else :func:`.decode.family.num_splits` for the device's SM count)."""
    dmod = _module(dec)
    tiles = {"knobs": knobs}
    _, pair = layout_budget.decode_pair(call, info)
    if pair is not None:  # a layout budget: the kept SM90 pair's layouts, at its padded sizes
        tiles["layout"] = pair.decode_layout
    up, down = dec.configs(sch, dt, call.activation.name, call.activation.gated, call.finalize, tiles,
                           bias=call.has_bias)
    hp, ip, n13 = _padded(dec, up, down, call, sch)
    if pair is not None:
        hp, ip = pair.sizes
        n13 = 2 * ip if call.activation.gated else ip
    fu, fd = dmod.forced_splits(knobs)
    su = fu if fu is not None else dmod.num_splits(up, n13, hp, call.tokens, call.top_k, info.sms, call.experts,
                                                   call.global_experts)
    sd = fd if fd is not None else dmod.num_splits(down, hp, ip, call.tokens, call.top_k, info.sms, call.experts,
                                                   call.global_experts)
    counters = (dmod.scratch_sizes(up, n13, call.tokens, call.top_k, su)[1]
                + dmod.scratch_sizes(down, hp, call.tokens, call.top_k, sd)[1])
    return Plan("cute", dec.name, _arch(base, info), True, tuple(sorted(tiles.items())), (su, sd), (up, down),
                (dec.spec_for(up).name, dec.spec_for(down).name), max_tiles=0, counters=counters, note=note,
                pad=_pad_field(call, hp, ip))


def unavailable_reason(call, info: DeviceInfo) -> Optional[str]:
    """Why the CuTe kernels cannot run ``call`` on ``info`` (None when they can)."""
    return _plan_cached(call, info)[1]


def plan(call, info: DeviceInfo) -> Plan:
    """The :class:`~w4a16_moe.plan.Plan` of ``call`` on ``info`` (``RuntimeError`` when the provider
    cannot run it: :func:`unavailable_reason` says why)."""
    p, why = _plan_cached(call, info)
    if p is None:
        raise RuntimeError(f"provider cute: {why}")
    return p


# ------------------------------------------------------------------------------------------------------
# execution
# ------------------------------------------------------------------------------------------------------
def _sizes(p: Plan, weights) -> tuple:
    """``(Hp, Ip, gate/up rows)`` plan ``p`` runs ``weights`` at (the layer's own sizes when unpadded)."""
    hp, ip = p.pad or (weights.hidden_size, weights.intermediate_size)
    return hp, ip, 2 * ip if weights.gated else ip


def _layout(family: KernelFamily, weights, which: str, cfg, dtype: torch.dtype, pad: tuple = ()) -> tuple:
    """``(cache key, build)`` of the packed layout of ``which`` that ``cfg`` reads at plan padding ``pad``
    (the key names padded sizes; an unpadded layer's key and layout are the family's own)."""
    from .padding import pad_matrix, pad_suffix

    qm = weights.w13 if which == "w13" else weights.w2
    interleave = which == "w13" and weights.gated
    key = family.layout_key(which, cfg, dtype)
    if not pad:
        return key, lambda w: family.pack(qm, cfg, dtype, interleave)
    hp, ip = pad
    n_pad, k_pad = ((2 * ip if weights.gated else ip), hp) if which == "w13" else (hp, ip)
    return (key + pad_suffix(qm.n, qm.k, n_pad, k_pad),
            lambda w: family.pack(pad_matrix(qm, n_pad, k_pad, halves=interleave), cfg, dtype, interleave))


def _packed(family: KernelFamily, weights, which: str, cfg, dtype: torch.dtype, pad: tuple = ()):
    return weights.packed_for(*_layout(family, weights, which, cfg, dtype, pad))


def _bias_slot(weights, which: str, pad: tuple) -> tuple:
    """``(anchor tensor, cache key)`` of the kernels' FP32 bias table of ``which`` ("w13" / "w2") at plan
    padding ``pad``: cached on the bias tensor itself (so it follows the tensor through re-wrapped weights);
    a layer with only the other bias gets a zero table, cached on that one."""
    hp, ip = pad or (weights.hidden_size, weights.intermediate_size)
    rows = (2 * ip if weights.gated else ip) if which == "w13" else hp
    own = weights.w13_bias if which == "w13" else weights.w2_bias
    if own is not None:
        return own, f"cute-bias:{rows}"
    return (weights.w2_bias if which == "w13" else weights.w13_bias), f"cute-bias:zeros-{which}:{rows}"


def _bias(weights, which: str, pad: tuple = ()) -> torch.Tensor:
    """The FP32 bias table ``[E, rows]`` the kernels read for ``which`` (converted and padded once, cached):
    w13: the padded, un-interleaved row order of the packed gate/up matrix (gate rows ``[0, I)`` at ``[0, I)``,
    up rows at ``[Ip, Ip + I)``; non-gated ``[0, I)``), w2: ``[0, H)``; padded rows are 0."""
    from ...formats.weights import layout_cache

    anchor, key = _bias_slot(weights, which, pad)
    cache = layout_cache(anchor)
    hit = cache.get(key)
    if hit is None:
        rows = int(key.rpartition(":")[2])
        e = weights.num_experts
        hit = torch.zeros(e, rows, dtype=torch.float32, device=anchor.device)
        own = weights.w13_bias if which == "w13" else weights.w2_bias
        if own is not None:
            b = own.float()
            if which == "w13" and weights.gated:
                i = weights.intermediate_size
                hit[:, :i] = b[:, :i]
                hit[:, rows // 2 : rows // 2 + i] = b[:, i:]
            else:
                hit[:, : b.shape[1]] = b
        cache[key] = hit
    return hit


def _biases_of(weights, cfgs) -> list:
    """The bias tables (``"w13"`` / ``"w2"``) a launch of the (gate_up, down) configs ``cfgs`` reads: the
    configs' own, and the fused finalize's w2 biases (its accumulator starts from them)."""
    up, down = cfgs
    need = ["w13"] if getattr(up, "bias", False) else []
    if getattr(down, "bias", False) or (weights.w2_bias is not None and getattr(down, "epi", "") == "atomic_f32"):
        need.append("w2")
    return need


def _fused_acc(weights, topk_weights, ids, expert_offset: int, width: int, pad: tuple) -> torch.Tensor:
    """The fused finalize's FP32 accumulator ``[T, width]``: zeros, or with a w2 bias
    ``sum_j topk_weights[t, j] * w2_bias[ids[t, j] - expert_offset]`` over the token's local routes (plain
    torch ops, no host synchronization: capturable)."""
    tokens, top_k = ids.shape
    if weights.w2_bias is None:
        return torch.zeros(tokens, width, dtype=torch.float32, device=ids.device)
    b2 = _bias(weights, "w2", pad)
    e = weights.num_experts
    local = ids.long() - expert_offset
    valid = (local >= 0) & (local < e)
    wv = torch.where(valid, topk_weights, 0.0)
    idx = torch.where(valid, local, 0)
    acc = b2[idx[:, 0]] * wv[:, :1]
    for j in range(1, top_k):
        acc.addcmul_(b2[idx[:, j]], wv[:, j : j + 1])
    return acc


def _kernel(family: KernelFamily, arch: str, cfg):
    # no cache of its own: the loader memoizes kernels per process, and a second cache here could keep a kernel
    # the loader has forgotten (``is_loaded``, which the capture check reads, would then disagree with it)
    from ...loader import get_kernel

    return get_kernel(family.spec_for(cfg), arch)


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _launch(family, arch, cfg, packed, act, out, routes, topk_weights, num_experts, n, k, num_routes, top_k,
            max_tiles, splits, grid_tiles=0):
    """Launch one grouped GEMM: grid y ``max_tiles`` (the tile bound; the split-K scratch is sized for it), or
    ``grid_tiles`` for a tile-loop kernel (its CTAs loop over the tiles past it)."""
    dev = act.device
    if splits > 1:
        cols = family.rows_per_cta(cfg)
        tiles = (n // cols) * max_tiles
        ws = torch.empty(tiles * splits * cfg.tokens_per_tile * cols, dtype=torch.float32, device=dev)
        counters = routes.zeroed  # zeroed by the route preparation; the kernel re-arms what it used
        assert counters is not None and counters.numel() >= tiles
    else:
        ws = counters = routes.route_start  # never read when num_splits == 1
    _run_kernel(family, arch, cfg, (packed.data, act, out, routes.sorted_routes, routes.route_start,
                                    routes.block_start, topk_weights, ws, counters),
                (num_experts, n, k, num_routes, top_k,
                 grid_tiles if grid_tiles and getattr(cfg, "tile_loop", False) else max_tiles, splits))


def _run_kernel(family, arch, cfg, tensors: tuple, scalars: tuple) -> None:
    """Launch ``cfg``'s kernel with the family launch ABI (nine tensors, seven ints): through the stable-ABI
    torch op (torch's current stream) when the op library is available, else through ctypes."""
    launcher = _launcher_cached(family, arch, cfg)
    if launcher is not None:
        launcher(*tensors, *scalars)
    else:
        _kernel(family, arch, cfg)(*(t.data_ptr() for t in tensors), *scalars, _stream())


@functools.lru_cache(maxsize=None)
def _launcher_cached(family, arch: str, cfg):
    """``torch.ops.w4a16_moe_C.grouped_gemm`` bound to the kernel of ``cfg``
    (:func:`w4a16_moe.loader.torch_op.gemm_launcher`: about half the host cost of a ctypes call), or None
    when the op library is unavailable."""
    from ...loader.torch_op import gemm_launcher

    return gemm_launcher(_kernel(family, arch, cfg))


def _check_capture(family: KernelFamily, arch: str, weights, cfgs, dtype, pad: tuple = ()) -> None:
    """Refuse a first use (kernel module load, weight packing, bias conversion) inside CUDA-graph capture."""
    if not torch.cuda.is_current_stream_capturing():
        return
    from ...formats.weights import layout_cache
    from ...loader import is_loaded

    cold = [c.name() for c in cfgs if not is_loaded(family.spec_for(c), arch)]
    layouts = layout_cache(weights.w13.codes)
    unpacked = [w for c, w in zip(cfgs, ("w13", "w2")) if _layout(family, weights, w, c, dtype, pad)[0] not in layouts]
    for which in _biases_of(weights, cfgs):
        anchor, key = _bias_slot(weights, which, pad)
        if key not in layout_cache(anchor):
            unpacked.append(f"{which}_bias")
    if cold or unpacked:
        raise RuntimeError(
            "fused_moe (provider cute): first use inside CUDA-graph capture (kernels not loaded yet: "
            f"{cold or 'none'}; weights not packed yet: {unpacked or 'none'}); call "
            "w4a16_moe.warmup(weights, ...) for the token counts you will capture before capturing"
        )


def cute_routing(arch: str, num_experts: int) -> bool:
    """Whether calls on ``arch`` with ``num_experts`` local experts prepare routes and finalize with the CuTe
    routing family (``W4A16_MOE_ROUTING``: ``cute`` always, ``triton`` never, ``auto`` when every kernel of
    that family is prebuilt for ``arch`` and ``num_experts`` fits its tables)."""
    s = settings.get()
    if s.routing != "auto":
        return s.routing == "cute"
    from .routing import config as rcfg

    return num_experts + 1 <= rcfg.E_PADS[-1] and _routing_prebuilt(arch, s.prebuilt_dir)


def routing_choice(arch: str, num_experts: int) -> str:
    """:func:`cute_routing` in words (``doctor``)."""
    s = settings.get()
    kind = "cute" if cute_routing(arch, num_experts) else "triton"
    if s.routing != "auto":
        return f"{kind} (W4A16_MOE_ROUTING={s.routing})"
    from .routing import config as rcfg

    if num_experts + 1 > rcfg.E_PADS[-1]:
        why = f"{num_experts} local experts exceed the CuTe tables ({rcfg.E_PADS[-1] - 1})"
    elif kind == "cute":
        why = f"every CuTe routing kernel is prebuilt for {arch}"
    else:
        why = f"the CuTe routing kernels are not all prebuilt for {arch}"
    return f"{kind} (W4A16_MOE_ROUTING=auto: {why})"


@functools.lru_cache(maxsize=None)
def _routing_prebuilt(arch: str, _prebuilt_env) -> bool:
    """Every spec of the CuTe routing family is in the prebuilt libraries for ``arch`` (cached per arch and
    ``W4A16_MOE_PREBUILT_DIR``)."""
    from ...loader import prebuilt
    from .routing import family as rfam

    if arch not in rfam.ARCHS:
        return False
    return all(prebuilt.lookup(spec, arch)[0] is not None for spec in rfam.aot_variants("full"))


def _routing(arch: str, num_experts: int) -> tuple:
    """``(prepare_routes, prepare_masked_routes, launch_finalize, pad_copy)`` of :func:`cute_routing`: the CuTe
    routing family or the Triton kernels (same contract, bit-identical finalize)."""
    if cute_routing(arch, num_experts):
        from .routing import launch as rl

        return rl.prepare_routes_cute, rl.prepare_masked_routes_cute, rl.launch_finalize_cute, rl.pad_copy_cute
    from ..routing.finalize import launch_finalize
    from ..routing.prepare import prepare_masked_routes, prepare_routes
    from .pad_copy import pad_copy

    return prepare_routes, prepare_masked_routes, launch_finalize, pad_copy


def finalize_launcher(arch: str):
    """The deterministic finalize launcher (validity from ids or a mask) of the route preparation in use on ``arch``
    (:func:`_routing`): the CuTe routing family's or the Triton one; ``routes.combine_routes`` combines with it."""
    return _routing(arch, 0)[2]


def _padded_x(p: Plan, x, width: int, num_experts: int):
    """``x``, or (a padded plan) its zero-padded ``[..., width]`` copy by the pad copy of :func:`_routing`: one
    launch; an aligned call asks nothing of the routing choice."""
    if x.shape[-1] == width:
        return x
    from .padding import pad_cols

    return pad_cols(x, width, _routing(p.arch, num_experts)[3])


def _gate_up(p: Plan, x, weights, ids, topk_weights, *, expert_offset: int):
    """Route prep + gate/up GEMM of plan ``p``: ``(family, h [T*k, Ip], routes, packed w2)`` (x copied into
    a zero-padded ``[T, Hp]`` buffer when the plan pads H)."""
    prepare_routes = _routing(p.arch, weights.num_experts)[0]
    tokens, top_k = ids.shape
    family = registry.get(p.family)
    up, down = p.configs
    _check_capture(family, p.arch, weights, p.configs, x.dtype, p.pad)
    p13 = _packed(family, weights, "w13", up, x.dtype, p.pad)
    p2 = _packed(family, weights, "w2", down, x.dtype, p.pad)
    r = tokens * top_k
    routes = prepare_routes(ids, weights.num_experts, expert_offset, up.tokens_per_tile, zeroed=p.counters)
    hp, ip, n13 = _sizes(p, weights)
    hbuf = torch.empty(r, ip, dtype=x.dtype, device=x.device)
    # (gate/up kernels never read topk_weights: with biases its slot carries the w13 bias table)
    tw_slot = _bias(weights, "w13", p.pad) if up.bias else topk_weights
    xp = _padded_x(p, x, hp, weights.num_experts)
    _launch(family, p.arch, up, p13, xp, hbuf, routes, tw_slot, weights.num_experts, n13,
            hp, r, top_k, p.max_tiles, p.splits[0], p.grid_tiles)
    return family, hbuf, routes, p2


#: the decode kernels' K-split scratch per device: ``(ws FP32, counters int32)``, counters zeroed once at
#: allocation (the kernels re-arm every counter they use); grown outside CUDA-graph capture only
_DECODE_SCRATCH: dict = {}
#: every scratch pair ever allocated stays alive (captured graphs keep their addresses)
_DECODE_SCRATCH_KEEP: list = []
#: per (device, sizes): the four views a decode call passes (gate_up ws, counters, down ws, counters)
_DECODE_SCRATCH_VIEWS: dict = {}
#: the smallest scratch allocated (FP32 partials, counters): more than any split the rule picks on a
#: 132-SM GPU needs (at most 2 * SMs CTAs of 64 partials each), so it is allocated once
DECODE_SCRATCH_MIN = (1 << 16, 1 << 12)


def _decode_scratch(device, wu: int, cu: int, wd: int, cd: int) -> tuple:
    """``(ws_up, counters_up, ws_down, counters_down)`` of a decode call whose kernels need ``wu`` / ``wd``
    FP32 partials and ``cu`` / ``cd`` counters (disjoint regions of the device's scratch; a kernel without a
    split gets the whole buffers, which it never reads). Allocates (counters zeroed) or grows the scratch
    when it is too small, which CUDA-graph capture refuses (``warmup`` sizes it first). One scratch per
    device: decode calls with a split must not run concurrently on two streams of one device."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    key = (device, wu, cu, wd, cd)
    hit = _DECODE_SCRATCH_VIEWS.get(key)
    if hit is not None:
        return hit
    have = _DECODE_SCRATCH.get(device)
    if have is None or have[0].numel() < wu + wd or have[1].numel() < cu + cd:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "fused_moe (provider cute): the decode kernels' K-split scratch must grow inside CUDA-graph "
                f"capture ({wu + wd} FP32 partials, {cu + cd} counters); call w4a16_moe.warmup(weights, ...) "
                "for the token counts you will capture before capturing")
        nws = max(wu + wd, DECODE_SCRATCH_MIN[0], 0 if have is None else have[0].numel())
        nct = max(cu + cd, DECODE_SCRATCH_MIN[1], 0 if have is None else have[1].numel())
        have = (torch.empty(nws, dtype=torch.float32, device=device), torch.zeros(nct, dtype=torch.int32, device=device))
        _DECODE_SCRATCH[device] = have
        _DECODE_SCRATCH_KEEP.append(have)
    ws, cnt = have
    views = (ws[:wu] if wu else ws, cnt[:cu] if cu else cnt, ws[wu:wu + wd] if wd else ws,
             cnt[cu:cu + cd] if cd else cnt)
    _DECODE_SCRATCH_VIEWS[key] = views
    return views


def _decode_scratch_of(p: Plan, weights, tokens: int, top_k: int, device) -> Optional[tuple]:
    """The scratch views of decode plan ``p`` (:func:`_decode_scratch`), or None when neither kernel splits."""
    su, sd = p.splits
    if su <= 1 and sd <= 1:
        return None
    dmod = _module(registry.get(p.family))
    hp, _, n13 = _sizes(p, weights)
    up, down = p.configs
    wu, cu = dmod.scratch_sizes(up, n13, tokens, top_k, su)
    wd, cd = dmod.scratch_sizes(down, hp, tokens, top_k, sd)
    return _decode_scratch(device, wu, cu, wd, cd)


def _decode_moe(p: Plan, x, weights, topk_weights, ids, *, expert_offset: int, out) -> None:
    """Route-major decode path (:mod:`.decode.gemv`): gate/up kernel into ``h [T*k, I]`` (by route),
    then the down kernel combining each token's routes in fixed order straight into ``out`` (padded plans:
    x in a zero-padded ``[T, Hp]`` copy, ``out`` through a ``[T, Hp]`` buffer). With a K split
    (``p.splits``) the kernels publish partials to the device's scratch (:func:`_decode_scratch`)."""
    from .padding import padded_out

    family = registry.get(p.family)
    tokens, top_k = ids.shape
    e = weights.num_experts
    h, i, n13 = _sizes(p, weights)
    r = tokens * top_k
    if ids.dtype != torch.int32:
        # the kernels read int32 ids; clamping keeps every out-of-range id out of [offset, offset + E)
        ids = ids.clamp(-1, 2**31 - 1).to(torch.int32)
    up, down = p.configs
    _check_capture(family, p.arch, weights, p.configs, x.dtype, p.pad)
    p13 = _packed(family, weights, "w13", up, x.dtype, p.pad)
    p2 = _packed(family, weights, "w2", down, x.dtype, p.pad)
    scratch = _decode_scratch_of(p, weights, tokens, top_k, x.device)
    # (without a split: topk_weights / ids in the scratch slots, never read)
    ws_up, cnt_up, ws_dn, cnt_dn = scratch or (topk_weights, ids, topk_weights, ids)
    hbuf = torch.empty(r, i, dtype=x.dtype, device=x.device)
    obuf = padded_out(out, h)
    xp = _padded_x(p, x, h, weights.num_experts)
    for cfg, packed, src, dst, n, k, splits, ws, cnt in (
            (up, p13, xp, hbuf, n13, h, p.splits[0], ws_up, cnt_up),
            (down, p2, hbuf, out if obuf is None else obuf, h, i, p.splits[1], ws_dn, cnt_dn)):
        # (decode ABI: ids in the sorted-routes slot and the unused routing slots; with biases the bias table
        # in the route_start slot)
        tab = _bias(weights, "w13" if cfg.mode == "gate_up" else "w2", p.pad) if cfg.bias else ids
        _run_kernel(family, p.arch, cfg, (packed.data, src, dst, ids, tab, ids, topk_weights, ws, cnt),
                    (e, n, k, r, top_k, expert_offset, splits))
    if obuf is not None:
        out.copy_(obuf[:, :out.shape[1]])


def cute_fused_moe(x, weights, topk_weights, topk_ids, *, call, out, plan: Optional[Plan] = None) -> None:
    """Run one validated ``fused_moe`` call (see the module docstring) into ``out``."""
    tokens, top_k = topk_ids.shape
    if tokens == 0:
        return
    p = plan if plan is not None else _plan_for(call, x.device)
    e, h = weights.num_experts, weights.hidden_size
    r = tokens * top_k
    ids = topk_ids.contiguous()
    tw = topk_weights.contiguous()
    if p.decode:
        # both finalize modes: the decode path's fixed-order FP32 combine is deterministic and needs no pass
        _decode_moe(p, x, weights, tw, ids, expert_offset=call.expert_offset, out=out)
        return
    family, hbuf, routes, p2 = _gate_up(p, x, weights, ids, tw, expert_offset=call.expert_offset)
    down = p.configs[1]
    hp, ip, _ = _sizes(p, weights)
    if call.finalize == "deterministic":
        # y [R, Hp]: the finalize reads its first H columns through the row stride
        y = torch.empty(r, hp, dtype=x.dtype, device=x.device)
        # (the y epilogue never reads topk_weights: with biases its slot carries the w2 bias table)
        tw_slot = _bias(weights, "w2", p.pad) if down.bias else tw
        _launch(family, p.arch, down, p2, hbuf, y, routes, tw_slot, e, hp, ip, r, top_k, p.max_tiles, p.splits[1],
                p.grid_tiles)
        _routing(p.arch, e)[2](y, tw, out, topk_ids=ids, num_experts=e, expert_offset=call.expert_offset)
    else:
        acc = _fused_acc(weights, tw, ids, call.expert_offset, hp, p.pad)  # zeros, or the weighted w2 biases
        _launch(family, p.arch, down, p2, hbuf, acc, routes, tw, e, hp, ip, r, top_k, p.max_tiles, p.splits[1],
                p.grid_tiles)
        out.copy_(acc if hp == h else acc[:, :h])


def _plan_for(call, device) -> Plan:
    from ...device import probe

    return plan(call, probe(device))


def cute_fused_moe_masked(x, weights, masked_m, *, call, out, plan: Optional[Plan] = None) -> None:
    """Masked (DeepEP low-latency) MoE into ``out``; arguments already validated.

    ``x [E, cap, H]`` contiguous, ``masked_m [E]`` int32 on the GPU, ``out`` like ``x``:
    ``out[e, r] = mlp_e(x[e, r])`` (unweighted) for ``r < clamp(masked_m[e], 0, cap)``, zeros elsewhere.
    The same two grouped GEMMs as the routed path with ``top_k = 1`` and the flat rows ``e*cap + r``
    as routes (the down GEMM's ``y`` epilogue writes them in place); no finalize pass.
    """
    from .padding import padded_out

    e, cap, h = x.shape
    if e == 0 or cap == 0:
        return
    p = plan if plan is not None else _plan_for(call, x.device)
    prepare_masked_routes = _routing(p.arch, e)[1]
    family = registry.get(p.family)
    hp, i, n13 = _sizes(p, weights)
    up, down = p.configs
    _check_capture(family, p.arch, weights, p.configs, x.dtype, p.pad)
    p13 = _packed(family, weights, "w13", up, x.dtype, p.pad)
    p2 = _packed(family, weights, "w2", down, x.dtype, p.pad)
    r = e * cap
    obuf = padded_out(out, hp)  # padded plans: the down GEMM writes [E, cap, Hp], copied into out
    dst = out if obuf is None else obuf
    routes = prepare_masked_routes(masked_m.contiguous(), cap, up.tokens_per_tile, dst, zeroed=p.counters)
    hbuf = torch.empty(r, i, dtype=x.dtype, device=x.device)
    dummy_w = routes.route_start  # read only by the atomic epilogue (the slot carries the biases, if any)
    _launch(family, p.arch, up, p13, _padded_x(p, x, hp, e).view(r, hp), hbuf, routes,
            _bias(weights, "w13", p.pad) if up.bias else dummy_w, e, n13, hp, r, 1, p.max_tiles, p.splits[0])
    _launch(family, p.arch, down, p2, hbuf, dst.view(r, hp), routes,
            _bias(weights, "w2", p.pad) if down.bias else dummy_w, e, hp, i, r, 1, p.max_tiles, p.splits[1])
    if obuf is not None:
        out.copy_(obuf[..., :h])


def cute_expert_routes(x, weights, local_ids, *, call, plan: Optional[Plan] = None):
    """Per-route expert outputs ``(y [T, k, H] in x's dtype, valid [T, k])`` (local ids, -1 = none):
    the first half of the deterministic path, bit-identical to what :func:`cute_fused_moe` computes for
    the same shapes; entries of invalid routes are unspecified. ``call`` is a ``routes_only`` call."""
    tokens, top_k = local_ids.shape
    e, h = weights.num_experts, weights.hidden_size
    valid = (local_ids >= 0) & (local_ids < e)
    y = torch.empty(tokens, top_k, h, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return y, valid
    p = plan if plan is not None else _plan_for(call, x.device)
    r = tokens * top_k
    ids = local_ids.contiguous()
    dummy_w = torch.empty(r, dtype=torch.float32, device=x.device)  # read only by the atomic epilogue
    family, hbuf, routes, p2 = _gate_up(p, x.contiguous(), weights, ids, dummy_w, expert_offset=0)
    hp, ip, _ = _sizes(p, weights)
    ybuf = y if hp == h else torch.empty(tokens, top_k, hp, dtype=x.dtype, device=x.device)
    down = p.configs[1]
    _launch(family, p.arch, down, p2, hbuf, ybuf.view(r, hp), routes,
            _bias(weights, "w2", p.pad) if down.bias else dummy_w, e, hp, ip, r, top_k, p.max_tiles, p.splits[1],
            p.grid_tiles)
    if ybuf is not y:
        y.copy_(ybuf[..., :h])
    return y, valid


def warmup_plans(info: DeviceInfo, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: torch.dtype,
                 device, activation, top_k: int, max_tokens: int, finalizes=("deterministic", "fused"),
                 has_bias: bool = False, global_experts: Optional[int] = None):
    """Yield ``(tokens, plan)`` of every call :func:`cute_warmup` prepares on ``info``: the selection grid up to
    ``max_tokens`` (:func:`.tiles.selection_grid`: every count up to 256, 16 points per octave above, through the
    first at or past ``max_tokens``, whose decisions every count up to ``max_tokens`` runs), ``max_tokens`` and the
    tuned table's token counts of the layer, in each finalize mode, and for the deterministic one also the grouped
    GEMMs' plan of the same shape (expert-parallel halves)."""
    from ...activations import get_activation
    from ...validate import MoECall

    act = get_activation(activation) if isinstance(activation, str) else activation
    e, h, i = num_experts, hidden, intermediate
    if global_experts == e:
        global_experts = None  # every expert local: the calls carry no hint (validate.check_global_experts)
    base, why = family_for(info)
    if base is None:
        raise RuntimeError(f"provider cute: {why}")
    mod = _module(base)
    tuned = (mod.tuned_token_counts(info.name, e, h, i, scheme, _DTYPES[dtype], top_k, global_experts)
             if hasattr(mod, "tuned_token_counts") else [])
    grid = sorted({*tiles_rule.selection_grid(max_tokens), max_tokens, *(t for t in tuned if t <= max_tokens)})
    for fin in finalizes:
        for t in grid:
            for routes_only in ((False, True) if fin == "deterministic" else (False,)):
                call = MoECall(t, top_k, h, i, e, dtype, device, act, fin, 0, scheme, routes_only, has_bias,
                               global_experts=global_experts)
                p, why = _plan_cached(call, info)
                if p is None:
                    raise RuntimeError(f"provider cute: {why}")
                yield t, p


def cute_warmup(weights, dtype: torch.dtype, activation: str, max_tokens: int, top_k: int,
                finalizes=("deterministic", "fused"), global_experts: Optional[int] = None) -> list:
    """Pack ``weights`` and load every kernel that a call of 1..``max_tokens`` tokens can select
    (the decode kernels when small calls use them, the rule's buckets and the tuned table's entries for this
    layer; ``global_experts``: the calls' expert-parallel hint): the plans of those calls (:func:`warmup_plans`),
    loaded."""
    from ...device import probe

    info = probe(weights.device)
    e = weights.num_experts
    seen, names = set(), []
    for t, p in warmup_plans(info, e, weights.hidden_size, weights.intermediate_size, weights.scheme.name, dtype,
                             weights.device, activation, top_k, max_tokens, finalizes, weights.has_bias,
                             global_experts):
        family = registry.get(p.family)
        if p.decode:  # the K-split scratch, allocated before any capture
            _decode_scratch_of(p, weights, t, top_k, weights.device)
        for cfg, which in zip(p.configs, ("w13", "w2")):
            if (p.family, cfg, p.pad) in seen:
                continue
            seen.add((p.family, cfg, p.pad))
            _packed(family, weights, which, cfg, dtype, p.pad)
            _kernel(family, p.arch, cfg).ensure_loaded()
            if cfg.name() not in names:
                names.append(cfg.name())
        for which in _biases_of(weights, p.configs):  # the kernels' FP32 bias tables
            _bias(weights, which, p.pad)
    base, _ = family_for(info)
    if cute_routing(_arch(base, info), e):  # the CuTe route preparation / finalize kernels of this layer
        from .routing import launch as rl

        names += rl.warm(e, weights.device)
    return names


class CuteProvider:
    """The CuTe DSL provider as a :class:`~w4a16_moe.providers.Provider`."""

    name = "cute"

    def unavailable_reason(self, call, info: DeviceInfo) -> Optional[str]:
        return unavailable_reason(call, info)

    def plan(self, call, info: DeviceInfo) -> Plan:
        return plan(call, info)

    def run(self, p: Plan, call, x, weights, topk_weights, topk_ids, out) -> None:
        cute_fused_moe(x, weights, topk_weights, topk_ids, call=call, out=out, plan=p)

    def run_masked(self, p: Plan, call, x, weights, masked_m, out) -> None:
        cute_fused_moe_masked(x, weights, masked_m, call=call, out=out, plan=p)

    def expert_routes(self, p: Plan, call, x, weights, local_ids):
        return cute_expert_routes(x, weights, local_ids, call=call, plan=p)


PROVIDER = CuteProvider()

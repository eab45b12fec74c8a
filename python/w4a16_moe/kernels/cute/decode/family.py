"""The route-major decode kernels as the loader sees them: specs, variant sets, and when a call uses them.

Every compiled kernel is a :class:`~w4a16_moe.loader.KernelSpec` of family ``w4a16_decode_gemv`` whose params
are all fields of :class:`~.config.DecodeGemvConfig`; the same specs feed JIT and AOT. The kernels
(:mod:`.gemv`) read the SM90 packed layout and use only ``mma.sync`` and plain global loads; they are
built for sm_90a (where they run next to the WGMMA family).

When (:func:`use_decode`): a routed call (not the masked layout) with ``T * top_k <= DECODE_MAX_ROUTES``
routes that reads each expert's weights about once (:func:`reread_factor` <= :data:`MAX_REREAD`, :data:`MAX_REREAD_FP4` for FP4 weights: the
decode kernels stream an expert's weights once per route that hits it, the grouped GEMMs once per expert)
and streams at most :data:`DECODE_MAX_WEIGHT_BYTES` of weights (the grouped GEMMs stream a large call faster),
unless ``W4A16_MOE_BATCH_INVARIANT=1`` (a route's result must then not depend on its batch; the
decode path combines in a different order than the grouped GEMMs) or ``W4A16_MOE_CUTE_DECODE=0``. The
tuned table may bound it per layer shape instead (a measured bound on ``T * top_k``, no re-read test), and names the knob set per token count
(``sm90/tuned.json``, ``"decode"``: key -> ``{"max_routes": R, "knobs": [[tokens, "w8u8/w8u4"], ...]}``, written
by ``python -m w4a16_moe tune --decode-knobs ...`` + ``scripts/merge_tuned.py``).
``W4A16_MOE_CUTE_DECODE=1`` forces it for every routed call that fits one launch (tests).

K split (:func:`num_splits`): at decode sizes the kernels' grids (one CTA per output tile: ``4 N / (64 X)``
per route for gate_up, per token for down) can hold fewer CTAs than the GPU has SMs (one token of H=4096:
64 down CTAs). The split spreads each tile's K range (and, for down, its routes) over ``S`` CTAs, which
publish FP32 partials that the tile's last CTA sums in split order (:mod:`.gemv`); the rule picks ``S``
from the SM count, the tile count and K, and a knob set can force it (``s<N>``, :func:`parse_knobs`). The
split is a launch parameter: it adds no kernel specs. The provider keeps the partials' workspace and the
arrival counters per device (``provider._decode_scratch``).

This module imports neither ``cutlass`` nor the kernel module.
"""

from __future__ import annotations

import functools
import itertools
from typing import Iterable, Optional

from .... import settings
from ....archs import SM90_ARCHS
from ....loader.spec import KernelSpec, config_codec
from ..sm90 import family as sm90_family
from ..sm90.family import group_param  # the decode kernels read the SM90 layout: same group convention
from ..tiles import expected_local

__all__ = ["FAMILY", "ARCHS", "LAYOUT", "DEFAULT_LAYOUT", "spec_for", "config_from_spec", "configs", "num_parts", "use_decode",
           "expected_experts", "reread_factor", "MAX_REREAD", "MAX_REREAD_FP4", "DECODE_MAX_WEIGHT_BYTES", "streamed_bytes", "decode_refusal", "variants", "aot_variants", "DECODE_MAX_ROUTES", "MAX_GRID_Y",
           "parse_knobs", "knob_items", "knob_text", "default_knobs", "default_knob_sets", "WIDE_KNOBS", "WIDE_TILES_PER_SM_EP", "EP_KNOBS", "NARROW_KNOBS", "NARROW_TILES_PER_SM", "forced_splits", "tile_ctas", "num_splits", "scratch_sizes", "SPLIT_WAVES",
           "MIN_UNITS_PER_WARP", "MAX_SPLITS", "SPLIT_CTA_WARPS"]

FAMILY = "w4a16_decode_gemv"
ARCHS = SM90_ARCHS
#: instructions every kernel of the family must contain (the AOT SASS check)
SASS_EXPECT = ("HMMA",)
MAX_GRID_Y = 65535
#: default bound on T * top_k for the decode path (the tuned table can say otherwise per layer shape); the
#: re-read and bytes bounds below decide before it on layers of up to ~400 experts; on 512 experts, top-10
#: (H200, docs/perf/2026-12-04-decode-bytes) the decode kernels were 0.90-0.96 x the grouped GEMMs' time at
#: 80-100 routes (re-read 1.07-1.09), so the bound is 128 (it was 64)
DECODE_MAX_ROUTES = 128

#: the largest expected re-read factor (:func:`reread_factor`) at which an untuned layer takes the decode path.
#: The decode kernels stream an expert's weights once per route that hits it, the grouped GEMMs once per
#: expert (plus route preparation and, deterministic, a finalize pass: a few us), so the decode path is for
#: calls that read each expert about once. Calibrated on the H200: W1's tuned decode bound (384 experts,
#: top-8) has the decode path faster at 8 tokens, re-read 1.08; the tile sweep of docs/perf/2026-12-01-selection
#: has it 1.51-1.83 x slower than the best grouped choice at re-read 1.55-1.60 (16 tokens of 128 / 60
#: experts) and 2.0-2.4 x at 1.9-2.3, about the re-read factor itself: the saved launches do not pay for
#: streaming an expert twice. (Those were the decode kernels before the K split; the split helps calls of 1-4
#: tokens, whose factor is near 1 anyway.) The autotuner measures both paths per layer.
MAX_REREAD = 1.1
#: the same bound for FP4 (E2M1) weights: on gpt-oss-120b's layer at 4 tokens (re-read 1.05) the decode
#: kernels took 1.19 x the SM90 TN 8 tile's time (their E2M1 decode on ``mma.sync`` streams slower than the
#: WGMMA kernels'), so FP4 calls take them only when every route hits its own expert (1-2 tokens there)
MAX_REREAD_FP4 = 1.02
#: the most 4-bit weight bytes (expected local routes x an expert's gate/up and down weights) a call the tuned
#: table does not bound streams on the decode kernels. Their cost is about 9 us + bytes / 3.0 TB/s on the H200,
#: the grouped path's about 20 us + bytes / 3.8 TB/s (fits over 147 rows of 16 layer shapes, INT4 g128 and g32,
#: 1-24 tokens, docs/perf/2026-12-04-decode-bytes): the saved launches pay up to ~150-200 MB. With this
#: bound (and the 4-warp threshold and route bound below), the default's time over the fastest timed choice,
#: geometric mean: 1.0248 -> 1.0137 on those 174 rows (the bound left out of the fit of each layer in turn is
#: the same for 19 of 20), 1.0210 -> 1.0199 on 64 rows of 8 layers held out
DECODE_MAX_WEIGHT_BYTES = 180_000_000

#: K split across CTAs (:func:`num_splits`): the split grid aims at this many CTAs per SM (about two waves of
#: one 8-warp CTA per SM, or one wave of two: every SM gets work, with 8-16 warps' loads in flight each)
SPLIT_WAVES = 2
#: ... counted in CTAs of this many warps: a kernel of ``W`` warps per CTA aims at ``SPLIT_WAVES * sms * 8 / W``
#: CTAs (264 of 8 warps, 528 of 4, 132 of 16 on an H200: the register file holds two 8-warp CTAs per SM, and a
#: 16-warp CTA split in two only queues its second half; H200, one token, E=32, H=7168, I=2048, top-8, EP hint:
#: 16-warp persistent gate/up 8.4 us at S = 1 against 13.0 at S = 2)
SPLIT_CTA_WARPS = 8
#: ... and keeps at least this many k64 units of work per warp of every CTA (a split CTA with less would
#: spend more on its launch, partial store and arrival than on its loads)
MIN_UNITS_PER_WARP = 2
#: the largest split the rule picks
MAX_SPLITS = 16

#: the packed layouts the decode kernels read (w13, w2): those of the WGMMA family's decode tile
#: (``sm90.family.CANDIDATES[9]``), so both paths share one packed copy of each matrix
LAYOUT = {"w13": dict(m64_per_block=2, k_tile=128), "w2": dict(m64_per_block=4, k_tile=64)}
#: :data:`LAYOUT` as the ``layout`` argument of :func:`configs`: ``((X, BK) of w13, (X, BK) of w2)``
DEFAULT_LAYOUT = tuple((LAYOUT[w]["m64_per_block"], LAYOUT[w]["k_tile"]) for w in ("w13", "w2"))
#: per-mode codegen knobs (warps per CTA, k64 units per load batch)
#: (the H200 sweep at revision 2cae0a5+: w8u8/w8u4 is within 8% of the best set at 1-16 tokens of W1 and
#: 1-8 tokens of W2; the tuned table names the best set per row)
KNOBS = {"gate_up": dict(warps=8, unroll=8), "down": dict(warps=8, unroll=4)}
#: the knob set of a call with the expert-parallel hint (:func:`default_knobs`): a persistent gate/up grid of at
#: most 264 CTAs (two per SM of a 132-SM H100 / H200; a grid-stride loop, correct on any SM count). The plain
#: grid holds a CTA for every route, valid or not; with a few local routes among many most CTAs exit at once
#: and the working ones land unevenly. H200 (docs/perf/2026-12-02-decode-defaults): 6-27% faster than
#: :data:`KNOBS` at one to four tokens of three EP layers
EP_KNOBS = "w8u8c264/w8u4"
#: the knob set of a call whose gate/up grid has at most one working tile per SM (:func:`default_knobs`) and a K
#: of at least 16 load batches (H >= 4096): one 16-warp CTA per SM (a persistent grid of at most 132 CTAs, as
#: :data:`EP_KNOBS`) splits each tile's K over 16 warps inside the CTA, where 8-warp CTAs would need a K split
#: across CTAs (a partial store and an arrival per CTA). H200, one token (docs/perf/2026-12-02-decode-defaults):
#: 11-18% faster on the five layers measured with 64-128 working tiles, EP and not. (Its FP32-scale variant
#: ``w16u4c132x/w16u2x`` was 0.96 x the time on 76 H200 rows, docs/perf/2026-12-02-decode-prefetch, but spills
#: at the 128 registers a 16-warp CTA leaves a thread, so it is not the default.)
WIDE_KNOBS = "w16u4c132/w16u2"
#: ... its grid bound with the expert-parallel hint, in working tiles per SM (without it: one). Chosen on three
#: H200 sweeps of 16-40 decode rows each (every knob set of :func:`default_knob_sets` timed per row): the
#: default's time over the row's best, geometric mean 1.021-1.024 with 2, 1.035-1.044 with 1 for every call
WIDE_TILES_PER_SM_EP = 2
#: the knob set of a gate/up kernel with 4-warp CTAs (:func:`default_knobs`): no warp idles where K has fewer
#: load batches than 8 warps (H < 4096), and where the grid is large anyway (:data:`NARROW_TILES_PER_SM`) more
#: CTAs fit on an SM (the decode kernels' CTAs are register-bound: two 8-warp or five 4-warp CTAs per SM)
NARROW_KNOBS = "w4u8/w8u4"
#: ... its grid bound: at least this many gate/up output tiles (CTAs without a split) per SM. H200: 9-20% faster
#: than 8 warps on every row of E=8, H=4096, I=14336 and E=16, H=5120, I=8192 (512-7168 tiles), within 1% on
#: Kimi-K2's shape at 512 tiles, and 13-17% slower at 128-256 tiles, where each warp's longer K range is the
#: latency; with the FP32-scale sets (docs/perf/2026-12-04-decode-bytes) 0.88-0.90 x the 8-warp set's time at
#: 384 tiles (2.9 per SM) on four layers, 1.08-1.11 x at 256 (1.9 per SM)
NARROW_TILES_PER_SM = 2.5

#: the knob set of each regime of :func:`default_knobs` for the weights of :func:`takes_fp32_scales` (INT4, one
#: scale group per k64 unit): the group scales applied in FP32 to each group's ``mma.sync`` sum (``x``,
#: ``fp32_scale``) with half the k64 units per load batch of the 16-bit-scale set (the 16-warp gate/up set; its
#: down kernel keeps 16-bit scales, with which it holds 128 registers without spilling). The expert-parallel set
#: keeps 16-bit scales: its FP32-scale variant (``w8u4c264x``) spills at the 128 registers of two CTAs per SM.
#: H200, 1-4 tokens of 16 layers (docs/perf/2026-12-04-decode-issue), time / the regime's 16-bit-scale set,
#: geometric mean: INT4 g128 BF16 0.971 (16-warp, 12 rows) / 0.934 (8-warp, 5) / 0.942 (4-warp, 19), FP16 0.972 /
#: 0.922 / 0.943, g128 with zero points 0.953 / 0.865 / 0.914, per channel 0.955 / 0.876 / 0.912. Group 32 keeps
#: the 16-bit-scale sets (two scale groups per unit: more live registers; 0.984 / 1.182 / 1.081 with these sets)
FP32_SCALE_KNOB_SETS = {"": "w8u4x/w8u2x", WIDE_KNOBS: "w16u2c132x/w16u2", NARROW_KNOBS: "w4u4x/w8u2x"}


def _compile(spec: KernelSpec, arch: str):
    """The family's compile function (registered in :mod:`w4a16_moe.loader.spec` with its source modules)."""
    from .gemv import Sm90W4A16DecodeGemv

    return Sm90W4A16DecodeGemv(config_from_spec(spec), arch).compile(arch)


def kernel_config(**fields):
    from .config import DecodeGemvConfig

    return DecodeGemvConfig(**fields)


spec_for, config_from_spec = config_codec(FAMILY, kernel_config)


@functools.lru_cache(maxsize=4096)
def configs(scheme, dtype: str, activation: str, knobs: tuple = (), bias: bool = False,
            layout: Optional[tuple] = None) -> tuple:
    """(gate_up, down) :class:`DecodeGemvConfig` of a call; ``knobs``: ``(("gate_up", {...}), ...)``
    items overriding :data:`KNOBS` (the tuner's variants; a ``splits`` item is a launch parameter, not a
    config field: :func:`forced_splits`); ``bias``: the layer has per-expert biases (both kernels add theirs;
    a matrix without one reads a zero table); ``layout``: ``((X, BK) of w13, (X, BK) of w2)``, the SM90 layouts
    read (None: :data:`LAYOUT`; a layout budget's kept pair, ``layout_budget.decode_pair``)."""
    # (the split is a launch parameter; FP4 codes have no FP32-scale variant: the knob means nothing for them)
    over = {m: tuple(kv for kv in v if kv[0] != "splits" and not (kv[0] == "fp32_scale" and scheme.is_fp4))
            for m, v in dict(knobs).items()}
    base = dict(dtype=dtype, group=group_param(scheme), zero_point=scheme.zero_point, fp4=scheme.is_fp4, bias=bias)
    lay = LAYOUT if layout is None else {w: dict(m64_per_block=x, k_tile=k) for w, (x, k) in zip(("w13", "w2"), layout)}
    up = kernel_config(mode="gate_up", activation=activation, **base, **lay["w13"],
                       **dict(KNOBS["gate_up"], **dict(over.get("gate_up", ()))))
    down = kernel_config(mode="down", **base, **lay["w2"], **dict(KNOBS["down"], **dict(over.get("down", ()))))
    return up, down


def _as_items(knobs: dict) -> tuple:
    """``{"gate_up": {...}, "down": {...}}`` as the hashable ``knobs`` argument of :func:`configs`."""
    return tuple((m, tuple(sorted(v.items()))) for m, v in sorted(knobs.items()))


def parse_knobs(text: str) -> dict:
    """``"w8u4/w8u2"`` (gate_up / down: warps ``w``, unroll ``u``; optional suffixes, in this order: ``c<N>``
    a persistent grid of at most N CTAs, on the gate_up part ``f`` for its L2 prefetch (``l2_prefetch``),
    ``x`` for the group scales applied in FP32 (``fp32_scale``; INT4 only: FP4 schemes ignore it), ``s<N>`` a K split over N CTAs per output tile (1..65535; without it the rule :func:`num_splits` picks),
    and on the down part ``p0`` to turn its programmatic dependent launch off) -> ``{"gate_up": {...},
    "down": {...}}`` (the split as ``"splits"``)."""
    import re

    out = {}
    for mode_, part in zip(("gate_up", "down"), text.split("/")):
        m = re.fullmatch(r"w(\d+)u(\d+)(?:c(\d+))?(f)?(x)?(?:s(\d+))?(p0)?", part.strip())
        if not m or (m.group(7) and mode_ != "down") or (m.group(4) and mode_ != "gate_up"):
            raise ValueError(f"decode knobs: expected wNuM[cN][f][x][sN][/wNuM[cN][x][sN][p0]], got {text!r}")
        out[mode_] = dict(warps=int(m.group(1)), unroll=int(m.group(2)))
        if m.group(3):
            out[mode_]["ctas"] = int(m.group(3))
        if m.group(4):
            out[mode_]["l2_prefetch"] = True
        if m.group(5):
            out[mode_]["fp32_scale"] = True
        if m.group(6):
            sp = int(m.group(6))
            if not 1 <= sp <= MAX_GRID_Y:
                raise ValueError(f"decode knobs: the split s<N> must be in 1..{MAX_GRID_Y}, got {sp} in {text!r}")
            out[mode_]["splits"] = sp
        if m.group(7):
            out[mode_]["pdl"] = False
    return out


def forced_splits(knobs: tuple) -> tuple:
    """``(gate_up split, down split)`` that knob items (:func:`knob_items`) force, None where the rule picks."""
    d = {m: dict(v) for m, v in dict(knobs).items()}
    return tuple(d.get(m, {}).get("splits") for m in ("gate_up", "down"))


def _local_routes(routes: int, top_k: int, num_experts: Optional[int], num_global_experts: Optional[int]) -> int:
    """``routes`` routes (of ``top_k`` per token) as the expected local ones under the expert-parallel hint
    (:func:`..tiles.expected_local`, at least one); ``routes`` itself without the hint."""
    if not (num_experts and num_global_experts and num_global_experts > num_experts):
        return routes
    return max(1, round(expected_local(routes, num_experts, top_k, num_global_experts)[0]))


def default_knobs(tokens: int, top_k: int, hidden: int, gate_up_rows: int, sms: int,
                  num_experts: Optional[int] = None, num_global_experts: Optional[int] = None,
                  fp32_scales: bool = False) -> str:
    """The knob set (:func:`parse_knobs`; ``""``: :data:`KNOBS`) of a call the tuned table names none for, from
    its gate/up grid: ``4 * gate_up_rows / 128`` output tiles per working route (``tokens * top_k``, or with
    the expert-parallel hint, ``num_experts`` local of ``num_global_experts``, the expected local routes, at
    least one) and its K (``hidden``): :data:`WIDE_KNOBS` for at most one tile per SM (with the hint
    :data:`WIDE_TILES_PER_SM_EP`) and at least 16 batches of 4 units; else :data:`EP_KNOBS` with the hint; else :data:`NARROW_KNOBS` for fewer batches of 8 units than 8
    warps or at least :data:`NARROW_TILES_PER_SM` tiles per SM; else the defaults. ``fp32_scales`` (weights
    :func:`takes_fp32_scales`): the regime's set of :data:`FP32_SCALE_KNOB_SETS` (the regimes are those of the
    16-bit-scale sets). The tiles are counted in :data:`LAYOUT`'s row blocks whatever layout a budget keeps (H100,
    docs/perf/2026-12-07-layouts: counted in x4 row blocks, 4 tokens of ``160,5120,192,8`` took the 16-warp set at
    1.58 x the time of the default layout's 4-warp set)."""
    ep = bool(num_experts and num_global_experts and num_global_experts > num_experts)
    routes = _local_routes(tokens * top_k, top_k, num_experts, num_global_experts)
    tiles = 4 * (gate_up_rows // (64 * LAYOUT["w13"]["m64_per_block"])) * routes
    units = hidden // 64

    def batches_cover_warps(knobs: dict) -> bool:  # at least one load batch of K per warp
        return -(-units // knobs["unroll"]) >= knobs["warps"]

    if tiles <= (WIDE_TILES_PER_SM_EP if ep else 1) * sms and batches_cover_warps(parse_knobs(WIDE_KNOBS)["gate_up"]):
        regime = WIDE_KNOBS
    elif ep:
        regime = EP_KNOBS
    else:
        short = not batches_cover_warps(KNOBS["gate_up"])
        regime = NARROW_KNOBS if short or tiles >= NARROW_TILES_PER_SM * sms else ""
    return FP32_SCALE_KNOB_SETS.get(regime, regime) if fp32_scales else regime


def takes_fp32_scales(scheme) -> bool:
    """Whether the default knob sets of ``scheme``'s calls are :data:`FP32_SCALE_KNOB_SETS`: INT4 weights of one
    scale group per k64 unit (group >= 64, or per channel)."""
    g = group_param(scheme)
    return not scheme.is_fp4 and (g == 0 or g >= 64)


def default_knob_sets(fp32_scales: bool) -> list:
    """Every knob set :func:`default_knobs` can return with (``fp32_scales``) or without FP32 scales: the AOT
    set and the tuner time each."""
    base = ["", WIDE_KNOBS, EP_KNOBS, NARROW_KNOBS]
    return [FP32_SCALE_KNOB_SETS.get(k, k) for k in base] if fp32_scales else base


def num_parts(cfg, k: int, splits: int = 1) -> int:
    """K parts per route: about ``unroll`` k64 units each (one load batch), at most one per warp of the
    route's ``splits`` CTAs. A long K (gate/up: K = H) gets one part per warp; a short one (down in a TP
    shard: K = I = 256 is 4 units) stays in one part, so the warps take different routes instead of one unit
    of every route each. The kernel derives the same count from ``k`` and its split (:mod:`.gemv`)."""
    units = k // 64
    return max(1, min(cfg.warps * splits, -(-units // cfg.unroll)))


def tile_ctas(cfg, n: int, rows: int) -> int:
    """Output tiles of one kernel = its CTAs without a split: ``4 n / (64 X)`` per route (gate_up, ``rows`` =
    ``T * top_k``) or per token (down, ``rows`` = ``T``)."""
    return 4 * (n // (64 * cfg.m64_per_block)) * rows


def num_splits(cfg, n: int, k: int, tokens: int, top_k: int, sms: int, num_experts: Optional[int] = None,
               num_global_experts: Optional[int] = None) -> int:
    """The K split of one decode kernel (gate_up: ``n`` = gate/up rows, ``k`` = H; down: ``n`` = H, ``k`` =
    I): the largest power of two ``S <= MAX_SPLITS`` with ``tiles * S <= SPLIT_WAVES * sms * 8 / warps`` CTAs
    (:data:`SPLIT_CTA_WARPS`) and at least
    :data:`MIN_UNITS_PER_WARP` k64 units per warp of each CTA (a tile's work: ``K / 64`` units of its route
    for gate_up, ``routes * I / 64`` for down), and more work items (gate_up: K parts ``num_parts(cfg, k, S)``;
    down: ``(route, part)`` items, ``routes`` times that) than the warps of ``S / 2`` CTAs: a split that only
    adds idle warps costs the partials and the arrival, and saves nothing. ``routes`` is ``top_k``, or with the
    expert-parallel hint (``num_experts`` local of ``num_global_experts``) the expected local routes of a token
    ``top_k * E / E_global`` (at least one); gate_up's ``tiles`` then count only the expected local routes
    ``T * top_k * E / E_global`` (the other routes' CTAs exit at once), so an EP rank's decode step splits its
    few working tiles. Without the hint every route counts as local (the host does not know how many are).

    On an H200 (132 SMs, 264 CTAs), default knobs (8 warps), one token: E=8, H=4096, I=14336, top-2: gate_up
    1792 tiles -> 1, down 64 tiles (448 units, 32 items at S=2) -> 4 (256 CTAs); Kimi-K2 TP8 (H=7168, I=256,
    top-8): gate_up 128 tiles (112 units) -> 2 (256 CTAs), down 112 tiles (8 routes of one 4-unit part: 8
    items, one per warp already) -> 1."""
    if cfg.mode == "gate_up":
        # with the expert-parallel hint only the expected local routes' CTAs work (the others exit at once)
        tiles = tile_ctas(cfg, n, _local_routes(tokens * top_k, top_k, num_experts, num_global_experts))
        routes = 1
    else:
        tiles = tile_ctas(cfg, n, tokens)
        routes = _local_routes(top_k, top_k, num_experts, num_global_experts)
    work = routes * (k // 64)
    s = 1
    while (2 * s <= MAX_SPLITS and tiles * 2 * s * cfg.warps <= SPLIT_WAVES * sms * SPLIT_CTA_WARPS
           and work >= 2 * s * cfg.warps * MIN_UNITS_PER_WARP
           and routes * num_parts(cfg, k, 2 * s) > s * cfg.warps):
        s *= 2
    return s


def scratch_sizes(cfg, n: int, tokens: int, top_k: int, splits: int) -> tuple:
    """``(ws FP32 elements, counters)`` one decode kernel uses at ``splits`` (``(0, 0)`` without a split):
    a ``16 X`` partial per split and output tile, one counter per tile."""
    if splits <= 1:
        return 0, 0
    rows = tokens * top_k if cfg.mode == "gate_up" else tokens
    tiles = tile_ctas(cfg, n, rows)
    return tiles * splits * 16 * cfg.m64_per_block, tiles


def mode() -> str:
    return settings.get().cute_decode


def expected_experts(tokens: int, top_k: int, num_experts: int, num_global_experts: Optional[int] = None) -> float:
    """Expected distinct local experts hit by ``tokens`` tokens of ``top_k`` routes each, under uniform routing
    over ``num_global_experts`` experts of which ``num_experts`` are local (None: every route local, the
    call's default when it carries no ``global_num_experts`` hint): ``D = E * (1 - (1 - k/E_global)^T)``.
    A token's ``k`` experts are distinct, so an expert misses one token with probability ``1 - k/E_global``;
    without the hint this is ``E * (1 - (1 - 1/E)^R)`` (``R = T * k`` independent routes) with the
    draws of one token taken without replacement: exact for one token (``D = k``), the same when ``k << E``."""
    if tokens <= 0 or num_experts <= 0:
        return 0.0
    g = max(num_experts, num_global_experts or num_experts)
    miss = max(0.0, 1.0 - min(top_k, g) / g)
    return num_experts * (1.0 - miss ** tokens)


def reread_factor(tokens: int, top_k: int, num_experts: int, num_global_experts: Optional[int] = None) -> float:
    """``R / D``: how many times the decode path streams each hit expert's weights (``R`` = the expected local
    routes ``T * top_k * E / E_global``, ``D`` = :func:`expected_experts`); 1.0 means every route hits its
    own expert."""
    d = expected_experts(tokens, top_k, num_experts, num_global_experts)
    g = max(num_experts, num_global_experts or num_experts)
    return tokens * top_k * num_experts / g / d if d > 0 else 1.0


def streamed_bytes(tokens: int, top_k: int, expert_bytes: int, num_experts: Optional[int] = None,
                   num_global_experts: Optional[int] = None) -> int:
    """The 4-bit weight bytes the decode kernels stream for a call: one expert's (``expert_bytes``) per
    expected local route (every route without the expert-parallel hint)."""
    return _local_routes(tokens * top_k, top_k, num_experts, num_global_experts) * expert_bytes


def use_decode(tokens: int, top_k: int, max_routes: Optional[int] = None,
               num_experts: Optional[int] = None, num_global_experts: Optional[int] = None,
               scheme=None, expert_bytes: Optional[int] = None) -> bool:
    """Whether a routed call of ``tokens`` x ``top_k`` runs on the decode kernels (see the module docstring);
    ``max_routes`` is the tuned bound on ``T * top_k`` for the layer shape, when there is one (0: never; it is
    then the only test). Without one: at most :data:`DECODE_MAX_ROUTES` routes and, when ``num_experts`` (the
    local experts) is given, a re-read factor of at most :data:`MAX_REREAD` (``num_global_experts``: the
    expert-parallel hint, routes uniform over that many experts; the route bound stays on ``T * top_k``,
    the launch's size, skipped routes included; ``scheme``: an FP4 scheme's bound is :data:`MAX_REREAD_FP4`)
    and, when ``expert_bytes`` (one expert's 4-bit gate/up and down weights, ``(N13 + I) * H / 2``) is given,
    at most :data:`DECODE_MAX_WEIGHT_BYTES` streamed by the expected local routes. :func:`decode_refusal` says
    why not."""
    return decode_refusal(tokens, top_k, max_routes, num_experts, num_global_experts, scheme, expert_bytes) is None


def decode_refusal(tokens: int, top_k: int, max_routes: Optional[int] = None,
                   num_experts: Optional[int] = None, num_global_experts: Optional[int] = None,
                   scheme=None, expert_bytes: Optional[int] = None) -> Optional[str]:
    """Why :func:`use_decode` (same arguments) declines a call, or None where the call takes the decode kernels:
    ``"W4A16_MOE_CUTE_DECODE=0"``, ``"batch-invariant mode"``, ``"no tokens"``, ``"<R> routes exceed one
    launch"``, ``"<R> routes > the tuned bound <B>"``, ``"<R> routes > <DECODE_MAX_ROUTES>"``,
    ``"<M> MB streamed > <DECODE_MAX_WEIGHT_BYTES> MB"`` or ``"re-read <F>x > <bound>"``."""
    s = settings.get()
    m = s.cute_decode
    routes = tokens * top_k
    if m == "0":
        return "W4A16_MOE_CUTE_DECODE=0"
    if s.batch_invariant:
        return "batch-invariant mode"
    if tokens == 0:
        return "no tokens"
    if routes > MAX_GRID_Y:
        return f"{routes} routes exceed one launch"
    if m == "1":
        return None
    if max_routes is not None:
        return None if routes <= max_routes else f"{routes} routes > the tuned bound {max_routes}"
    if routes > DECODE_MAX_ROUTES:
        return f"{routes} routes > {DECODE_MAX_ROUTES}"
    if expert_bytes is not None:
        streamed = streamed_bytes(tokens, top_k, expert_bytes, num_experts, num_global_experts)
        if streamed > DECODE_MAX_WEIGHT_BYTES:
            return f"{streamed / 1e6:.0f} MB streamed > {DECODE_MAX_WEIGHT_BYTES / 1e6:.0f} MB"
    if num_experts is None:
        return None
    bound = MAX_REREAD_FP4 if sm90_family._fp4(scheme) else MAX_REREAD
    reread = reread_factor(tokens, top_k, num_experts, num_global_experts)
    return None if reread <= bound else f"re-read {reread:.2f}x > {bound}"


def knob_items(text: Optional[str]) -> tuple:
    """A knob-set string (or None: the defaults) as the hashable ``knobs`` argument of :func:`configs`."""
    return _as_items(parse_knobs(text)) if text else ()


def knob_text(knobs: tuple) -> str:
    """Knob items (:func:`knob_items`) back to the :func:`parse_knobs` text (``""``: the defaults)."""
    if not knobs:
        return ""
    parts = []
    for mode_ in ("gate_up", "down"):
        d = dict(dict(knobs).get(mode_, ())) or dict(KNOBS[mode_])
        parts.append(f"w{d['warps']}u{d['unroll']}" + (f"c{d['ctas']}" if "ctas" in d else "")
                     + ("f" if d.get("l2_prefetch") else "") + ("x" if d.get("fp32_scale") else "")
                     + (f"s{d['splits']}" if "splits" in d else "")
                     + ("p0" if mode_ == "down" and d.get("pdl") is False else ""))
    return "/".join(parts)


def variants(schemes: Optional[Iterable] = None, dtypes=("bf16", "fp16"),
             activations=("swiglu", "geglu", "relu2", "silu"), knobs: Optional[Iterable[tuple]] = None,
             biases=(False,), layouts: Iterable = (None,)) -> list:
    """Every spec the provider can select for the given schemes (default: every scheme): the default knob sets
    (:func:`default_knob_sets`), plus the knob sets the tuned table names for that scheme and dtype (``knobs`` given: exactly those), for
    each bias setting of ``biases`` and each layout of ``layouts`` (:func:`configs`; None: :data:`LAYOUT`)."""
    from ....formats.schemes import SCHEMES

    if schemes is None:
        schemes = list(SCHEMES.values())
    out, seen = [], set()
    for sch in schemes:
        for dt in dtypes:
            sets = list(knobs) if knobs is not None else [
                knob_items(k) for k in default_knob_sets(takes_fp32_scales(sch))] + [
                knob_items(k) for k in sm90_family.tuned_decode_knob_sets(sch.name, dt)]
            for kn in sets:
                for act in activations:
                    for bias, lay in itertools.product(biases, layouts):
                        for cfg in configs(sch, dt, act, kn, bias, lay):
                            spec = spec_for(cfg)
                            if spec not in seen:
                                seen.add(spec)
                                out.append(spec)
    return out


def gpt_oss_variants(layouts: Iterable = (None,)) -> list:
    """The decode specs the gpt-oss experts (:data:`..sm90.family.GPT_OSS`: MXFP4, BF16, ``swiglu_oai``,
    with and without biases) select, with each default knob set (:func:`default_knob_sets`), on ``layouts``."""
    from ....formats.schemes import get_scheme

    g = sm90_family.GPT_OSS
    return variants(schemes=[get_scheme(g["scheme"])], dtypes=g["dtypes"], activations=g["activations"],
                    knobs=[knob_items(k) for k in default_knob_sets(takes_fp32_scales(get_scheme(g["scheme"])))],
                    biases=g["biases"], layouts=layouts)


def budget_layouts() -> list:
    """The ``layout`` arguments of :func:`configs` a layout budget can ask for (``layout_budget.DECODE_LAYOUTS``:
    each w13 layout with each w2 layout), :data:`LAYOUT`'s left out."""
    from ..layout_budget import DECODE_LAYOUTS

    return [lay for lay in itertools.product(DECODE_LAYOUTS["w13"], DECODE_LAYOUTS["w2"]) if lay != DEFAULT_LAYOUT]


def budget_variants() -> list:
    """The decode specs of ``W4A16_MOE_LAYOUTS=1|2`` (:func:`budget_layouts`): every scheme, dtype and activation
    with the default knob sets (the tuned table's knob sets are for every layout kept)."""
    from ....formats.schemes import SCHEMES

    out = [s for sch in SCHEMES.values() for s in variants(
        schemes=[sch], knobs=[knob_items(k) for k in default_knob_sets(takes_fp32_scales(sch))],
        layouts=budget_layouts())]
    return out + gpt_oss_variants(layouts=budget_layouts())


def aot_variants(subset: str) -> list:
    """``"smoke"``: int4_g32 + int4_g128, BF16, SwiGLU; ``"full"``: every scheme, dtype and activation, plus
    the gpt-oss experts' (:func:`gpt_oss_variants`)."""
    from ....formats.schemes import get_scheme

    if subset == "full":
        out = variants()
        out += [s for s in gpt_oss_variants() + budget_variants() if s not in set(out)]
        return list(dict.fromkeys(out))
    if subset == "smoke":
        return variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16",),
                        activations=("swiglu",))
    raise ValueError(f"subset: expected smoke or full, got {subset!r}")


#: local memory the SASS check accepts per kernel (:func:`w4a16_moe.loader.sass.budget_rules`): the NVFP4 gate/up
#: kernels of 16 warps at unroll 4 (:data:`WIDE_KNOBS`) spill 5 ``LDL`` / 2 ``STL`` at the 128 registers a
#: 16-warp CTA leaves a thread. H200 (docs/perf/2026-12-04-local-memory): unroll 2 without local memory is
#: 0.934-1.034 x their time at one and two tokens (1.005 on average)
SASS_LOCAL_BUDGET = (
    {"archs": ("sm_90a",), "params": {"mode": "gate_up", "fp4": True, "group": 16, "warps": 16, "unroll": 4},
     "LDL": 5, "STL": 2,
     "why": "NVFP4 16-warp unroll-4 decode gate/up: as fast as the spill-free unroll 2 "
            "(docs/perf/2026-12-04-local-memory)"},
)


class DecodeFamily:
    """The route-major decode kernels as :class:`~w4a16_moe.kernels.cute.registry.KernelFamily`: small
    routed calls beside the SM90 family, reading its packed layout."""

    name = "decode"
    spec_family = FAMILY
    archs = ARCHS
    role = "decode"
    beside = "sm90"
    compile_fn = f"{__name__}:_compile"
    sources = ("w4a16_moe.kernels.cute.decode.gemv", "w4a16_moe.kernels.cute.decode.config", "w4a16_moe.kernels.cute.decode.loads",
               "w4a16_moe.kernels.cute.common.ptx", "w4a16_moe.kernels.cute.common.codes",
               "w4a16_moe.kernels.cute.common.epilogue", "w4a16_moe.kernels.cute.common.grid", "w4a16_moe.kernels.cute.common.dequant")
    sass_expect = SASS_EXPECT
    sass_allow_local = ()
    sass_local_budget = SASS_LOCAL_BUDGET
    sass_serial_ok = ()
    max_grid_y = MAX_GRID_Y

    def __repr__(self) -> str:
        return "KernelFamily(decode)"

    def config_type(self) -> type:
        from .config import DecodeGemvConfig

        return DecodeGemvConfig

    def supports(self, capability, arch) -> Optional[str]:
        return None if arch in self.archs else f"the decode kernels are built for {', '.join(self.archs)} only"

    def can_implement(self, call) -> Optional[str]:
        from ...cute.registry import shape_reason
        from ....validate import MaskedCall

        if isinstance(call, MaskedCall):
            return "the decode kernels take routed calls only"
        if call.tokens * call.top_k > MAX_GRID_Y:
            return f"{call.tokens * call.top_k} routes exceed one launch"
        return shape_reason(call, bias=True, swiglu_oai=True)  # biases and swiglu_oai (any alpha / limit)

    def configs(self, scheme, dtype, activation, gated, finalize, tiles, bias=False):
        """``tiles``: ``{"knobs": knob items}`` (:func:`knob_items`; ``()``: the defaults) and optionally
        ``"layout"`` (:func:`configs`)."""
        return configs(scheme, dtype, activation, tiles.get("knobs", ()), bias, tiles.get("layout"))

    def spec_for(self, cfg):
        return spec_for(cfg)

    def aot_variants(self, subset):
        return aot_variants(subset)

    def layout_key(self, which, cfg, dtype) -> str:
        return sm90_family.layout_key(which, cfg, dtype)

    def pack(self, qm, cfg, dtype, interleave):
        return sm90_family.pack(qm, cfg, dtype, interleave)

    def rows_per_cta(self, cfg) -> int:
        return 64 * cfg.m64_per_block


DESCRIPTOR = DecodeFamily()

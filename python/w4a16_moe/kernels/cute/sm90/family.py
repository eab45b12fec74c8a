"""The SM90 kernel family as the loader sees it: specs, the variant set, and tile selection.

Every compiled kernel is a :class:`~w4a16_moe.loader.KernelSpec` of family ``sm90_w4a16_gemm`` whose
params are all fields of :class:`Sm90GemmConfig`, so the spec name encodes every codegen parameter;
the same specs feed JIT (on first use) and AOT (:func:`variants` enumerates them).

Tile selection uses only host-known sizes (``T * k``, ``E``, ``H``, ``I``, the expert-parallel hint), so a
call never synchronizes, and one compiled kernel per tile shape serves every token count. A call no tuned row
covers gets, for INT4 schemes, the **cost model**'s fastest of the rule tiles below and the warp family's tiles
(:func:`model_choice`, :mod:`..cost_model`: bytes streamed with each token tile's re-read, CTAs in waves,
epilogue, per tile shape and GEMM, fitted on an H200 sweep of 10 layer shapes; docs/perf/2026-12-01-cost-model and
2026-12-01-epilogue-t24; the ping-pong down tiles only where their activation tile stays resident, :func:`in_model_domain`).
FP4 calls, calls without the layer's sizes (masked layout) and a missing model use the routes-per-expert
rule (:func:`select_tiles`):

=====================  ====  ==  ===  ======  ====  =================================  ==========================
routes per expert r    TN    X   BK   stages  WGs   schedule                           with the warp family (auto)
=====================  ====  ==  ===  ======  ====  =================================  ==========================
r <= 4                 8     2   64   4       1     overlap, 4 CTAs/SM                 warp TN 8, BK 128
r <= 12                16    2   64   4       1     overlap, 3 CTAs/SM                 warp TN 16, BK 128
r <= 24                32    2   128  4       1     serial
r <= 48                48    4   64   4       2     overlap, 4 TN variants, PDL, f2
r <= 160               80    4   64   4       2     overlap, 4 TN variants, PDL, f2
r > 160                96    4   64   4       2     overlap                            (prefill)
=====================  ====  ==  ===  ======  ====  =================================  ==========================

(``f2``: two k16 blocks per WGMMA group, ``mma_kblocks``.) With ``W4A16_MOE_CUTE_FAMILY=auto`` (the default)
the two smallest buckets of INT4 calls run on the warp-MMA family's tiles (:data:`WARP_RULE`), which measured
faster there; FP4 calls keep the SM90 tiles, which measured faster for them (:data:`SM90_ONLY_FP4`).
The buckets and tiles come from an H200 sweep of every selectable tile and split-K choice on six layers that
are not presets (``scripts/sweep_tiles.py``; docs/perf/2026-12-01-selection): per bucket the tile with the
lowest geometric-mean time relative to each row's fastest choice.

``r = cdiv(T * k, min(E, T * k))`` (an upper bound under expert parallelism, where most routes belong
to other ranks), or with the ``global_num_experts`` hint ``ceil(R_local / D_local)``: the expected local routes
over the expected distinct local experts hit (:func:`.tiles.expected_local`). Split-K (``num_splits``, a
runtime argument; :func:`.tiles.split_k`) is used when the grid of row blocks x expected token tiles would
leave SMs without a CTA, and only while each split keeps 12 K tiles and its FP32 partials stay within a
quarter of the weight traffic, in both finalize modes: the partials are summed in fixed split order, so
deterministic calls stay bit-identical run to run (``W4A16_MOE_BATCH_INVARIANT=1`` turns split-K off for batch
invariance). ``EXTRA_TILES`` are further shapes (deeper weight pipelines for decode-sized batches) that only
the tuner selects.

A tuner (``python -m w4a16_moe tune``) measures every candidate (``CANDIDATES``) and split choice on a workload and stores the
best per token count in ``tuned.json`` (:mod:`.tuned`: rows name their candidate) keyed by GPU name and layer shape (with the versions it was
measured with); :func:`choose` prefers those entries and falls back to the rule above. This module only
selects among compiled kernels, so it is not part of the kernels' source hash.
"""

from __future__ import annotations

import functools
from typing import Iterable, Optional

from .... import settings
from ....archs import DEFAULT_SM_COUNT, SM90_ARCHS
from ....loader.spec import KernelSpec, config_codec
from .. import overrides
from .. import tiles as tiles_rule
from . import tuned
from .tuned import TUNED_PATH

__all__ = ["FAMILY", "TILES", "spec_for", "config_from_spec", "select_tiles", "variants", "kernel_config"]

FAMILY = "sm90_w4a16_gemm"
MAX_GRID_Y = 65535

# bucket upper bound of routes per expert -> tile parameters of Sm90GemmConfig
TILES = (
    (4, dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4)),
    (12, dict(tokens_per_tile=16, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=3)),
    (24, dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial")),
    (48, dict(tokens_per_tile=48, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, tn_variants=4,
              mma_kblocks=2, pdl=True)),
    (160, dict(tokens_per_tile=80, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, tn_variants=4,
               mma_kblocks=2, pdl=True)),
    (None, dict(tokens_per_tile=96, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2)),
)
#: the first buckets of :data:`TILES` that run on the warp-MMA family when it may be chosen
#: (``W4A16_MOE_CUTE_FAMILY=auto``, an INT4 scheme: :data:`SM90_ONLY_FP4`): bound -> the index of its tile in
#: ``warp.family.TILES``
WARP_RULE = ((4, 0), (12, 1))
#: FP4 (E2M1: NVFP4, MXFP4) calls keep the SM90 tiles in the :data:`WARP_RULE` buckets: on the two MXFP4
#: layers of the H200 sweep (gpt-oss-120b's shape and a 64-expert one, 4-256 tokens) the SM90 TN 8 / 16 tiles
#: took 0.62-0.76 x the warp-MMA tiles' time (docs/perf/2026-12-01-fp4-selection)
SM90_ONLY_FP4 = True


def _up2(tn: int, stages: int = 3) -> dict:
    """A gate/up tile of 256 weight rows over two consumer warpgroups, BK 128 (candidates 17, 18)."""
    return dict(tokens_per_tile=tn, m64_per_block=4, k_tile=128, stages=stages, consumer_wgs=2)


def _W2_K64(tn: int) -> dict:
    """256 weight rows over two consumer warpgroups at BK 64, 4 stages (candidates 14, 15, 18: the W2 rows)."""
    return dict(tokens_per_tile=tn, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2)


def _W2_V4(tn: int) -> dict:
    """:func:`_W2_K64` with four token widths, two k16 blocks per WGMMA group and PDL."""
    return {**_W2_K64(tn), "tn_variants": 4, "mma_kblocks": 2, "pdl": True}


def _W2_MR(tn: int) -> dict:
    """:func:`_W2_V4` with ``setmaxnreg`` (56 registers for the producer, 224 for each consumer thread): without it
    ptxas serializes the WGMMA pipeline of the widest of these tiles (docs/perf/2026-12-04-wgmma-serial)."""
    return {**_W2_V4(tn), "setmaxnreg": True, "producer_regs": 56, "consumer_regs": 224}


def _W4_V4(tn: int) -> dict:
    """512 weight rows over four consumer warpgroups at BK 64, 4 stages, four token widths: Humming's mid-size tile
    shape (docs/perf/2026-12-05-four-consumer-wg)."""
    return dict(tokens_per_tile=tn, m64_per_block=8, k_tile=64, stages=4, consumer_wgs=4, tn_variants=4)


def _W4_MR(tn: int, regs: tuple = (32, 112)) -> dict:
    """:func:`_W4_V4` with ``setmaxnreg``: ``regs`` = (producer, consumer) registers a thread, within the 96 that 640
    threads launch with (32 * 128 + 112 * 512 = 96 * 640). At TN <= 48, 32 / 112 keeps the WGMMAs in flight (at 96 or
    40 / 104 ptxas serializes them); at TN 64 no split within the budget does (docs/perf/2026-12-05-four-consumer-wg)."""
    return {**_W4_V4(tn), "setmaxnreg": True, "producer_regs": regs[0], "consumer_regs": regs[1]}


_UP_T32 = dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial")


def _pp_down(row_blocks: int, stages: int = 8, b_slots: int = 0, pingpong: int = 1) -> dict:
    """The ``down_*`` keys of a ping-pong down GEMM: 128-row blocks (two m64) over two consumer warpgroups,
    BK 64, ``row_blocks`` of them per CTA."""
    d = dict(down_m64_per_block=2, down_consumer_wgs=2, down_schedule="overlap", down_k_tile=64,
             down_stages=stages, down_row_blocks_per_cta=row_blocks, down_pingpong=pingpong)
    if b_slots:
        d["down_b_slots"] = b_slots
    return d


def _pp_wide(stages: int, b_slots: int, setmaxnreg: bool = False) -> dict:
    """The ping-pong down GEMM behind a wide gate/up tile (TN 96-128): :func:`_pp_down` of 28 row blocks per CTA,
    its activation tile resident in ``b_slots`` BK-64 slots (``I <= 64 * b_slots``), 72 registers for the producer
    and 216 for each consumer thread (with 56 / 224 the BK-64 producer's route loop spills); ``setmaxnreg`` for a
    gate/up tile without it (docs/perf/2026-12-05-wide-pp-down)."""
    d = {**_pp_down(28, stages=stages, b_slots=b_slots, pingpong=2), "down_producer_regs": 72,
         "down_consumer_regs": 216}
    if setmaxnreg:
        d["down_setmaxnreg"] = True
    return d


# Extra tile shapes only the tuner and the tuned table select; what each varies and measured:
# docs/perf/candidates.md (rows of the tuned table name them by candidate_name, not by position).
EXTRA_TILES = (
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=128, stages=8, consumer_wgs=1, min_ctas_per_sm=2),
    dict(tokens_per_tile=16, m64_per_block=2, k_tile=128, stages=8, consumer_wgs=1, min_ctas_per_sm=2),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=6, consumer_wgs=1, schedule="serial"),
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4,
         down_m64_per_block=4, down_min_ctas_per_sm=2),
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=128, stages=8, consumer_wgs=1, min_ctas_per_sm=2,
         down_m64_per_block=4, down_k_tile=64, down_stages=4),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial",
         down_m64_per_block=4),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=48, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial"),
    dict(tokens_per_tile=48, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1),
    dict(tokens_per_tile=96, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=48, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=32, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2),
    dict(tokens_per_tile=80, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=48, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=7),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=14),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=4),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, down_row_blocks_per_cta=7),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial",
         down_row_blocks_per_cta=7),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial",
         down_row_blocks_per_cta=14),
    dict(tokens_per_tile=80, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, down_row_blocks_per_cta=4),
    dict(tokens_per_tile=48, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, down_row_blocks_per_cta=4),
    dict(tokens_per_tile=96, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, down_row_blocks_per_cta=4),
    dict(tokens_per_tile=32, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, down_row_blocks_per_cta=7),
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4,
         down_row_blocks_per_cta=7),
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4,
         down_m64_per_block=4, down_min_ctas_per_sm=2, down_row_blocks_per_cta=7),
    dict(tokens_per_tile=48, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=7),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=7,
         down_k_tile=64, down_stages=8),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=7,
         down_k_tile=64, down_stages=6),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=7,
         down_stages=4),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2, down_row_blocks_per_cta=14,
         down_k_tile=64, down_stages=8),
    dict(tokens_per_tile=32, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2, down_row_blocks_per_cta=7,
         down_stages=8),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial",
         down_m64_per_block=4, down_consumer_wgs=2, down_schedule="overlap", down_k_tile=64, down_stages=8,
         down_row_blocks_per_cta=7),
    {**_up2(64), **_pp_down(14)},
    {**_up2(64), **_pp_down(28)},
    {**_up2(64), **_pp_down(8)},
    {**_up2(64), **_pp_down(56)},
    {**_UP_T32, **_pp_down(14)},
    {**_up2(48), **_pp_down(14)},
    {**_up2(64), **_pp_down(7)},
    {**_up2(56), **_pp_down(14)},
    {**_up2(56), **_pp_down(28)},
    {**_up2(56, stages=4), **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56, stages=6), **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(28, stages=12, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(28, stages=20, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(14, stages=16, b_slots=4)},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56), **_pp_down(28, pingpong=2)},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2)},
    {**_up2(56, stages=5), **_pp_down(14, stages=12, b_slots=4, pingpong=2)},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4, pingpong=2)},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 3},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 3, "pdl": True},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True,
     "mma_kblocks": 4},
    {**_up2(56, stages=4), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True,
     "mma_kblocks": 4},
    {**_up2(64, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True,
     "mma_kblocks": 4},
    {**_W2_K64(80), "mma_kblocks": 2, "pdl": True},
    {**_W2_K64(80), "mma_kblocks": 4, "pdl": True},
    _W2_V4(80),
    _W2_V4(48),
    {**_up2(56, stages=5), **_pp_down(28, stages=8, b_slots=2, pingpong=2), "down_k_tile": 128, "tn_variants": 4,
     "pdl": True, "mma_kblocks": 4},
    {**_UP_T32, **_pp_down(28, stages=8, b_slots=2, pingpong=2), "down_k_tile": 128, "tn_variants": 3, "pdl": True,
     "down_mma_kblocks": 4},
    _W2_V4(96),  # MODEL_TILES (docs/perf/2026-12-04-wide-tiles)
    _W2_V4(112),
    _W2_MR(112),  # MODEL_TILES (docs/perf/2026-12-05-setmaxnreg-tiles)
    _W2_MR(128),
    _W2_MR(144),
    {**_W2_MR(112), **_pp_wide(8, 4)},  # docs/perf/2026-12-05-wide-pp-down
    {**_W2_MR(128), **_pp_wide(4, 4)},
    # candidate 79: no model tile (withdrawn, docs/perf/2026-12-05-wide-pp-down: two unexplained launch failures of
    # 6-stage / 6-slot ping-pong down GEMMs under repeated CUDA-graph replay); only forcing or the tuned table select it
    {**_W2_V4(96), **_pp_wide(6, 6, setmaxnreg=True)},
    # candidates 80-82: four consumer warpgroups, 512 weight rows per CTA (docs/perf/2026-12-05-four-consumer-wg)
    _W4_MR(48),  # MODEL_TILES
    _W4_MR(64, (40, 104)),  # MODEL_TILES; WGMMAs serialized (SASS_SERIAL_OK)
    _W4_MR(40),
)
#: the rule's tiles before its re-fit (candidates 0-4; the new rule's tiles are candidates among these and
#: :data:`EXTRA_TILES`, so candidate indices, which the tuner's ``--buckets`` and docs/perf use, stay stable)
_FIRST_RULE_TILES = (
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4),
    dict(tokens_per_tile=16, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=3),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial"),
    dict(tokens_per_tile=64, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1),
    dict(tokens_per_tile=128, m64_per_block=4, k_tile=64, stages=3, consumer_wgs=2),
)
CANDIDATES = _FIRST_RULE_TILES + EXTRA_TILES
assert all(t in CANDIDATES for _, t in TILES), "every rule tile must be a candidate"
#: every candidate by its stable name (what tuned-table rows and ``forced`` use)
CANDIDATES_BY_NAME = {tuned.candidate_name(t): t for t in CANDIDATES}
assert len(CANDIDATES_BY_NAME) == len(CANDIDATES), "two candidates share a tile dict"


def _compile(spec: KernelSpec, arch: str):
    """The family's compile function (registered in :mod:`w4a16_moe.loader.spec` with its source modules)."""
    from .grouped_gemm import Sm90W4A16GroupedGemm

    return Sm90W4A16GroupedGemm(config_from_spec(spec)).compile(arch)


def kernel_config(**fields):
    from .config import Sm90GemmConfig

    return Sm90GemmConfig(**fields)


spec_for, config_from_spec = config_codec(FAMILY, kernel_config)


def select_tiles(num_routes: int, num_experts: int, top_k: Optional[int] = None,
                 global_experts: Optional[int] = None) -> dict:
    """Tile parameters for a call with ``num_routes = T * k`` routes over ``num_experts`` local experts
    (``global_experts``, with ``top_k``: the expert-parallel hint, :func:`.tiles.routes_per_expert`)."""
    return tiles_rule.select(TILES, num_routes, num_experts, top_k, global_experts)


group_param = tiles_rule.group_param


def gemm_configs(scheme, dtype: str, activation: str, gated: bool, finalize: str, tiles: dict, bias: bool = False):
    """(gate_up, down) :class:`Sm90GemmConfig` of one call; ``bias``: the layer has per-expert biases (the
    gate/up kernel adds the w13 bias, the deterministic down kernel the w2 bias; the fused finalize's
    accumulator starts from the weighted w2 biases, so its ``atomic_f32`` kernel is the one without)."""
    return _gemm_configs(scheme, dtype, activation, gated, finalize, tuple(sorted(tiles.items())), bias)


@functools.lru_cache(maxsize=4096)
def _gemm_configs(scheme, dtype, activation, gated, finalize, tiles_items, bias=False):
    tiles, down_tiles = _split_tiles(tiles_items)
    base = dict(dtype=dtype, group=group_param(scheme), zero_point=scheme.zero_point, fp4=scheme.is_fp4)
    up = kernel_config(mode="gate_up", activation=activation, bias=bias, **base, **tiles)
    det = finalize == "deterministic"
    if det and not bias:
        # the y epilogue without bias stages its accumulators in 16 bits unless the tile says otherwise
        # (``down_stage16: False``): bit for bit the same y, its down GEMM 0.84-0.99 x the time
        # (docs/perf/2026-12-06-stage16)
        down_tiles.setdefault("stage16", True)
    else:
        down_tiles.pop("stage16", None)  # the 16-bit staging tile is the y epilogue's without bias only
    down = kernel_config(mode="down", epilogue="y" if det else "atomic_f32", bias=bias and det, **base,
                         **down_tiles)
    return up, down


def _split_tiles(tiles_items) -> tuple:
    """``(gate/up fields, down fields)`` of a choice's tile items: the down GEMM's are its fields with each
    ``down_<field>`` in place of ``<field>``."""
    tiles = {k: v for k, v in tiles_items if not k.startswith("down_")}
    return tiles, dict(tiles, **{k[5:]: v for k, v in tiles_items if k.startswith("down_")})


#: the tuner's / profiler's / GPU tests' override of the choice (:func:`.overrides.forced`)
forced = overrides.forced


def candidate(name_or_index) -> dict:
    """A candidate's tile dict by :func:`~.tuned.candidate_name` (or, for the tuner's command line, its
    position in :data:`CANDIDATES`)."""
    if isinstance(name_or_index, int):
        return dict(CANDIDATES[name_or_index])
    try:
        return dict(CANDIDATES_BY_NAME[name_or_index])
    except KeyError:
        raise ValueError(f"unknown SM90 candidate {name_or_index!r}") from None


@functools.lru_cache(maxsize=None)
def _table(path: str = TUNED_PATH) -> tuned.TunedTable:
    """The tuned table, read and checked once (an unknown candidate name raises, naming the row)."""
    from ..warp.family import model_tiles

    return tuned.load(path, {"sm90": CANDIDATES_BY_NAME,
                             "warp": {tuned.candidate_name(t): t for t in model_tiles()}})


def _tuned_table(path: str = TUNED_PATH) -> dict:
    """key -> resolved rows (:class:`~.tuned.TunedRow`, sorted by tokens)."""
    return _table(path).entries


def _tuned_decode(path: str = TUNED_PATH) -> dict:
    return _table(path).decode


#: tuned-table keys already logged as not timed on the running kernel sources
_STALE_LOGGED: set = set()


def _current() -> tuple:
    """``(rows, decode)`` of the tuned table that were timed on the running kernel sources
    (:func:`~.tuned.is_current`); a key with any other row is left out whole (its rows were tuned together),
    and what is left out is logged once per key (INFO)."""
    from ..autotune_store import running_versions

    run, entries, dec = running_versions(), _tuned_table(), _tuned_decode()
    rows = {k: v for k, v in entries.items() if all(tuned.is_current(r.sources, r.family, run) for r in v)}
    decode = {k: e for k, e in dec.items() if tuned.is_current(tuned.source_hashes(e.get("versions")), "decode", run)}
    stale = [k for k in entries if k not in rows] + [f"{k} (decode)" for k in dec if k not in decode]
    new = [k for k in stale if k not in _STALE_LOGGED]
    if new:
        from ....log import logger

        _STALE_LOGGED.update(new)
        logger.info("tuned table: not timed on the running kernel sources, so not used (the cost model and the "
                    "rules decide there; `python -m w4a16_moe tune` re-measures): %s", "; ".join(new))
    return rows, decode


def _selection_rows() -> dict:
    """The tuned table's tile rows selection reads: those timed on the running kernel sources (none with
    ``W4A16_MOE_TUNED_TABLE=0``)."""
    return _current()[0] if settings.get().tuned_table else {}


def _selection_decode() -> dict:
    """The tuned table's decode entries selection reads: those timed on the running kernel sources (none with
    ``W4A16_MOE_TUNED_TABLE=0``)."""
    return _current()[1] if settings.get().tuned_table else {}


def decode_bound(gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
                 top_k: int, global_experts: Optional[int] = None) -> Optional[int]:
    """The tuned table's bound for the route-major decode kernels (:mod:`..decode.family`) on this layer
    shape: calls of at most that many routes (``T * top_k``) use them; None = no measurement (the rule)."""
    ent = _selection_decode().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k,
                                        global_experts))
    return None if ent is None else int(ent["max_routes"])


def decode_knobs(tokens: int, gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
                 top_k: int, global_experts: Optional[int] = None) -> Optional[str]:
    """The tuned decode-kernel knob set (``"w8u8/w8u4"``, see ``decode.family.parse_knobs``) for a call of
    ``tokens`` on this layer shape: the row with the largest token count <= ``tokens``; None = defaults."""
    ent = _selection_decode().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k,
                                        global_experts))
    best = None
    for t, kn in (ent or {}).get("knobs", []):
        if t <= tokens or best is None:
            best = kn
    return best


def tuned_decode_knob_sets(scheme: Optional[str] = None, dtype: Optional[str] = None) -> list:
    """Every decode knob set the tuned table uses (for ``scheme`` / ``dtype`` only, when given: a table key
    names both, so a set tuned for BF16 is never selected for an FP16 call)."""
    return sorted({kn for key, ent in _tuned_decode().items() for _, kn in ent.get("knobs", [])
                   if (scheme is None or f"|{scheme}|" in key) and (dtype is None or f"|{dtype}|" in key)})


tuned_key = tuned.tuned_key


def choose_with_family(tokens: int, top_k: int, num_experts: int, hidden: int, intermediate: int, scheme: str,
                       dtype: str, gpu: str, global_experts: Optional[int] = None, gated: bool = True,
                       sm_count: int = DEFAULT_SM_COUNT) -> tuple:
    """``(family, tiles, splits or None)`` for a call on an SM90 GPU: the override of
    :func:`~w4a16_moe.kernels.cute.overrides.forced` (tuner, profiler, tests), then the tuned table (largest
    measured token count <= ``tokens``), then :func:`rule_choice` (the cost model, else the rule). ``family`` is ``"sm90"`` (``tiles``
    from :data:`CANDIDATES`) or ``"warp"`` (a tuned row measured faster with the portable warp-MMA family;
    ``tiles`` from its ``TILES``): the plan then names that family. ``splits`` None means the family's
    ``num_splits`` rule. ``global_experts``: the expert-parallel hint (the tuned table's ``e<E>of<E_global>``
    key; the rule's expected local routes)."""
    force = overrides.current()
    if force.candidate is not None:
        return "sm90", candidate(force.candidate), force.splits
    rows = _selection_rows().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k, global_experts))
    if rows:
        best = None
        for row in rows:  # sorted by tokens
            if row.tokens <= tokens or best is None:
                best = row
        return best.family, dict(best.tiles), best.splits
    return rule_choice(tokens * top_k, num_experts, top_k, global_experts, scheme, hidden, intermediate, gated,
                       sm_count)


def _fp4(scheme) -> bool:
    from ....formats.schemes import get_scheme

    return scheme is not None and get_scheme(scheme).is_fp4


def rule_choice(num_routes: int, num_experts: int, top_k: Optional[int] = None,
                global_experts: Optional[int] = None, scheme=None, hidden: Optional[int] = None,
                intermediate: Optional[int] = None, gated: bool = True, sm_count: int = DEFAULT_SM_COUNT) -> tuple:
    """``(family, tiles, None)`` of a call no tuned row covers (``global_experts`` with ``top_k``: the
    expert-parallel hint). INT4 calls with the layer's ``hidden`` / ``intermediate``: the cost model's fastest
    of the rule tiles (:func:`model_choice`). Otherwise the routes-per-expert rule: the warp-MMA family's tile in
    the buckets of :data:`WARP_RULE` when the warp family may be chosen and ``scheme`` is not FP4
    (:data:`SM90_ONLY_FP4`; None: INT4), else :data:`TILES`."""
    if hidden is not None and intermediate is not None and not _fp4(scheme):
        got = model_choice(num_routes, num_experts, hidden, intermediate, gated, top_k, global_experts, sm_count,
                           scheme)
        if got is not None:
            return got[0], got[1], None
    if settings.get().cute_family == "auto" and not (SM90_ONLY_FP4 and _fp4(scheme)):
        from ..warp import family as warp

        r = tiles_rule.routes_per_expert(num_routes, num_experts, top_k, global_experts)
        for bound, idx in WARP_RULE:
            if r <= bound:
                return "warp", dict(warp.TILES[idx][1]), None
    return "sm90", select_tiles(num_routes, num_experts, top_k, global_experts), None


#: tile shapes beyond :data:`TILES` the cost model may choose for INT4 calls (in :func:`selectable_tiles`, so the
#: full AOT set has them for every INT4 scheme): gate/up TN 32 / 56 with the ping-pong down GEMM of 28 row
#: blocks per CTA, which streams a short K (I <= 512: TP-sharded experts) at 1.1-1.35 x the speed of the rule's
#: down tiles from 1024 tokens on (docs/perf/2026-12-01-cost-model); TN 96 with four token widths, for 90-130
#: routes per expert (docs/perf/2026-12-04-wide-tiles); TN 112 / 128 / 144 with four widths and setmaxnreg, whose
#: WGMMA pipelines ptxas then keeps overlapped: 0.74-0.96 x the time of the old default on 26 of 32 rows at
#: 1024-8192 tokens (docs/perf/2026-12-05-setmaxnreg-tiles); TN 112 / 128 with a ping-pong down GEMM of 28 row
#: blocks per CTA at their width (I <= 256): 0.82-0.94 x the old default's time where the model picks them, on 7
#: fitted and 4 held-out layers at 2048-8192 tokens (docs/perf/2026-12-05-wide-pp-down; its TN 96 tile, candidate
#: 79, is withdrawn there)
MODEL_TILES = (
    {**_UP_T32, **_pp_down(28, stages=8, b_slots=2, pingpong=2), "down_k_tile": 128, "tn_variants": 3, "pdl": True,
     "down_mma_kblocks": 4},
    {**_up2(56, stages=5), **_pp_down(28, stages=8, b_slots=2, pingpong=2), "down_k_tile": 128, "tn_variants": 4,
     "pdl": True, "mma_kblocks": 4},
    _W2_V4(96),
    _W2_MR(112),
    _W2_MR(128),
    _W2_MR(144),
    {**_W2_MR(112), **_pp_wide(8, 4)},
    {**_W2_MR(128), **_pp_wide(4, 4)},
    _W4_MR(48),
    _W4_MR(64, (40, 104)),
)
assert all(t in CANDIDATES for t in MODEL_TILES), "every model tile must be a candidate"


def model_candidates() -> list:
    """``[(family, tiles)]`` the cost model chooses among: the tiles of :data:`TILES` and :data:`MODEL_TILES`
    and, when the warp family may be chosen (``W4A16_MOE_CUTE_FAMILY=auto``), the warp family's ``TILES`` and
    ``MODEL_TILES``: shapes whose kernels every INT4 scheme, dtype and activation has in the full AOT set."""
    out = [("sm90", dict(t)) for _, t in TILES] + [("sm90", dict(t)) for t in MODEL_TILES]
    if settings.get().cute_family == "auto":
        from ..warp import family as warp

        out += [("warp", t) for t in warp.model_tiles()]
    return out


#: the most padding the four-consumer-warpgroup tiles (512 weight rows per CTA) may add to the gate/up GEMM's rows
WG4_MAX_PAD = 0.125


def scheme_ok(tiles: dict, scheme) -> bool:
    """Whether a model tile is built and chosen for ``scheme`` (None: any INT4 scheme): every tile but the
    four-consumer-warpgroup ones for INT4 g32 with zero points, whose per-group zero points do not fit the 112
    registers a consumer thread has (their kernels use local memory; docs/perf/2026-12-05-four-consumer-wg)."""
    if scheme is None or tiles.get("consumer_wgs") != 4:
        return True
    from ....formats.schemes import get_scheme

    sch = get_scheme(scheme)
    return not (sch.zero_point and group_param(sch) == 32)


def in_model_domain(family: str, tiles: dict, intermediate: int, gated: bool = True) -> bool:
    """Whether the cost model may choose ``family``'s ``tiles`` for a layer of ``intermediate`` (the down GEMM's
    K). An SM90 down GEMM of several row blocks per CTA (the ping-pong tiles) keeps its activation tile resident
    only while its ``ceil(I / BK)`` K tiles fit its B slots; past that it re-gathers the tile with every stage,
    where it measured slow and where its model entry is not fitted (``scripts/fit_cost_model.py`` skips those
    rows). The four-consumer-warpgroup tiles (512 rows per CTA) only where they pad the gate/up GEMM's ``2 I``
    (``I`` not gated) rows by at most :data:`WG4_MAX_PAD`: at ``I = 384`` (a third of the rows padding) they
    measured 1.06-1.14 x behind on every layer (docs/perf/2026-12-05-four-consumer-wg). Every other choice is in
    the domain."""
    if family != "sm90":
        return True
    if tiles.get("consumer_wgs") == 4:
        n, rows = (2 if gated else 1) * intermediate, 64 * tiles["m64_per_block"]
        if -(-n // rows) * rows > (1 + WG4_MAX_PAD) * n:
            return False
    down = kernel_config(mode="down", **_split_tiles(tiles.items())[1])
    if down.row_blocks_per_cta <= 1:
        return True
    return -(-intermediate // down.k_tile) <= (down.b_slots or down.stages)


#: the least extra weight bytes the K-128 buckets' padding must stream (their ``Hp * Ip`` over the K-tile-64 twins')
#: for the twins to replace them on a layer (H100, docs/perf/2026-12-07-k64: the twins 0.55-1.00 x their buckets'
#: call time where the padding adds 9-100% (``I`` = 704 ... 64), 0.94-1.19 x on ``32,2880,2880,4`` where it adds 4.5%:
#: a K-64 tile streams a byte at up to ~1.2 x a K-128 tile's cost where the call is bound by streaming)
K64_MIN_SAVING = 0.08


def k_tile_ok(family: str, tiles: dict, hidden: int, intermediate: int, gated: bool = True, scheme=None) -> bool:
    """Whether a warp K-tile-64 twin (:data:`..warp.family.K64_TILES`) or its K-128 bucket may be chosen for a
    layer: the twin where it is built for ``scheme`` (:func:`..warp.family.k64_scheme`) and the K-128 padding would
    stream at least :data:`K64_MIN_SAVING` more weight bytes (:func:`run_sizes`: gated layers of ``I % 128`` in
    ``(0, 64]``, ``I`` up to 704), its K-128 bucket everywhere else, so that a layer packs one warp layout for the
    two. Every other tile: True."""
    from ..warp import family as warp

    k64 = dict(tiles, k_tile=64)
    if family != "warp" or k64 not in warp.K64_TILES:
        return True  # no twin: TN 24 / 32 / 64, every SM90 tile
    h64, i64 = run_sizes(family, k64, hidden, intermediate, gated, scheme)
    h128, i128 = run_sizes(family, dict(tiles, k_tile=128), hidden, intermediate, gated, scheme)
    twin = warp.k64_scheme(scheme) and h128 * i128 >= (1 + K64_MIN_SAVING) * h64 * i64
    return twin if tiles["k_tile"] == 64 else not twin


def run_sizes(family: str, tiles: dict, hidden: int, intermediate: int, gated: bool = True, scheme=None) -> tuple:
    """``(Hp, Ip)``: the sizes ``family``'s ``tiles`` run a layer of ``hidden`` / ``intermediate`` at
    (:func:`..padding.padded_sizes`, the padding the plan applies; ``(H, I)`` where the tiles divide them), so the
    cost model prices each choice at the bytes and CTAs its kernels stream (``scheme`` None: any INT4 scheme, whose
    group divides a valid layer's sizes)."""
    return _run_sizes(family, tuple(sorted(tiles.items())), hidden, intermediate, gated, scheme)


@functools.lru_cache(maxsize=8192)
def _run_sizes(family, tiles_items, hidden, intermediate, gated, scheme):
    from ....formats.schemes import get_scheme
    from .. import registry
    from ..padding import padded_sizes

    sch = get_scheme(scheme or "int4_g32")
    fam_ = registry.get(family)
    up, down = fam_.configs(sch, "bf16", "swiglu" if gated else "relu2", gated, "deterministic", dict(tiles_items))
    return padded_sizes(fam_, up, down, hidden, intermediate, gated, sch)


def model_pool(hidden: int, intermediate: int, gated: bool = True, scheme=None) -> dict:
    """``{"<family> <candidate name>": (family, tiles)}``: the :func:`model_candidates` the cost model may choose for a
    layer (:func:`in_model_domain`, :func:`scheme_ok`, :func:`k_tile_ok`)."""
    return {name: (f, dict(t)) for name, f, t, _ in _pool(hidden, intermediate, gated, scheme,
                                                           settings.get().cute_family)}


@functools.lru_cache(maxsize=256)
def _pool(hidden: int, intermediate: int, gated: bool, scheme, _cute_family: str) -> tuple:
    """:func:`model_pool` as ``((name, family, tiles, run sizes), ...)``, per layer and ``W4A16_MOE_CUTE_FAMILY``
    (every plan of a call nobody tuned prices this pool: building it costs more than pricing it)."""
    return tuple((f"{f} {tuned.candidate_name(t)}", f, t, run_sizes(f, t, hidden, intermediate, gated, scheme))
                 for f, t in model_candidates()
                 if in_model_domain(f, t, intermediate, gated) and scheme_ok(t, scheme)
                 and k_tile_ok(f, t, hidden, intermediate, gated, scheme))


def model_choice(num_routes: int, num_experts: int, hidden: int, intermediate: int, gated: bool = True,
                 top_k: Optional[int] = None, global_experts: Optional[int] = None,
                 sm_count: int = DEFAULT_SM_COUNT, scheme=None) -> Optional[tuple]:
    """``(family, tiles, predicted us)`` of the cost model's (:mod:`..cost_model`) fastest
    :func:`model_candidates` choice for a call (of its :func:`model_pool`), each priced at the sizes it runs the layer
    at (:func:`run_sizes`), or None when the model knows none of them."""
    from .. import cost_model

    pool = _pool(hidden, intermediate, gated, scheme, settings.get().cute_family)
    by_name = {name: (f, t) for name, f, t, _ in pool}
    sizes = {name: sz for name, _, _, sz in pool}
    got = cost_model.best(by_name, num_routes, num_experts, hidden, intermediate, gated, top_k, global_experts,
                          sm_count, sizes=sizes)
    if got is None:
        return None
    f, t = by_name[got[0]]
    return f, dict(t), got[1]


def choose(tokens: int, top_k: int, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
           gpu: str, global_experts: Optional[int] = None) -> tuple:
    """``(tiles, splits or None)`` of this family for a call (:func:`choose_with_family`; a row that names
    the warp family falls back to the rule here)."""
    family, tiles, splits = choose_with_family(tokens, top_k, num_experts, hidden, intermediate, scheme, dtype, gpu,
                                               global_experts)
    if family != "sm90":
        return select_tiles(tokens * top_k, num_experts, top_k, global_experts), None
    return tiles, splits


def tuned_token_counts(gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
                       top_k: int, global_experts: Optional[int] = None) -> list:
    rows = _selection_rows().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k,
                                        global_experts)) or ()
    return [row.tokens for row in rows]


def num_splits(n: int, k: int, cfg, num_routes: int, num_experts: int, sm_count: int = DEFAULT_SM_COUNT,
               top_k: Optional[int] = None, global_experts: Optional[int] = None) -> int:
    """Split-K factor (:func:`.tiles.split_k`): enough CTAs for ``min_ctas_per_sm`` per SM when the grid of
    row blocks x expected token tiles (:func:`.tiles.expected_tiles`; ``global_experts``, with ``top_k``: the
    expert-parallel hint) is smaller, within the split's K-tile and partial-traffic limits."""
    tn = cfg.tokens_per_tile
    tiles = tiles_rule.expected_tiles(num_routes, num_experts, tn, top_k, global_experts)
    ctas = -(-(n // (64 * cfg.m64_per_block)) // cfg.row_blocks_per_cta) * max(1, round(tiles))
    return tiles_rule.split_k(ctas, max(1, cfg.min_ctas_per_sm) * sm_count, k, cfg.k_tile, tn)


def selectable_tiles(scheme: Optional[str] = None) -> list:
    """The tile shapes a call can select: the rule's buckets, the cost model's ping-pong down GEMMs for INT4
    schemes (:data:`MODEL_TILES`), and every candidate the tuned table uses (for ``scheme`` only, when given:
    tuned rows are keyed by scheme)."""
    rule = [t for _, t in TILES]
    if scheme is None or not _fp4(scheme):
        rule += [dict(t) for t in MODEL_TILES if t not in rule and scheme_ok(t, scheme)]
    used = {row.candidate for key, rows in _tuned_table().items() for row in rows
            if row.family == "sm90" and (scheme is None or f"|{scheme}|" in key)}
    extra = [t for t in CANDIDATES if tuned.candidate_name(t) in used and t not in rule]
    return rule + extra


def variants(schemes: Optional[Iterable] = None, dtypes=("bf16", "fp16"),
             activations=("swiglu", "geglu", "relu2", "silu"), finalizes=("deterministic", "fused"),
             tiles: Optional[Iterable[dict]] = None, biases=(False,)) -> list:
    """Every spec the provider can select for the given schemes (default: every scheme, each with the tile
    shapes of :func:`selectable_tiles` for it), activations (canonical names) and bias settings."""
    from ..common.codes import is_gated

    from ....formats.schemes import SCHEMES

    if schemes is None:
        schemes = list(SCHEMES.values())
    out, seen = [], set()
    for sch in schemes:
        for dt in dtypes:
            for t in (list(tiles) if tiles is not None else selectable_tiles(sch.name)):
                for act in activations:
                    for fin in finalizes:
                        for bias in biases:
                            for cfg in gemm_configs(sch, dt, act, is_gated("gate_up", act), fin, t, bias):
                                spec = spec_for(cfg)
                                if spec not in seen:
                                    seen.add(spec)
                                    out.append(spec)
    return out


#: the gpt-oss experts (MXFP4 weights, BF16 activations, per-expert biases, ``swiglu_oai``) the ``full`` subset
#: covers beyond :func:`variants`' defaults: their kernels with and without biases, SwiGLU with biases
GPT_OSS = dict(scheme="mxfp4", dtypes=("bf16",), activations=("swiglu", "swiglu_oai"), biases=(False, True))


def gpt_oss_variants() -> list:
    """The specs :data:`GPT_OSS` layers can select (every selectable tile shape, both finalize modes)."""
    from ....formats.schemes import get_scheme

    g = GPT_OSS
    return variants(schemes=[get_scheme(g["scheme"])], dtypes=g["dtypes"], activations=g["activations"],
                    biases=g["biases"])


def aot_variants(subset: str) -> list:
    """``"smoke"``: int4_g32 + int4_g128, BF16, SwiGLU, both finalize modes, every selectable tile shape;
    ``"full"``: every variant the provider can select (:func:`variants`) plus the gpt-oss experts'
    (:func:`gpt_oss_variants`)."""
    from ....formats.schemes import get_scheme

    if subset == "full":
        base = variants()
        seen = set(base)
        return base + [s for s in gpt_oss_variants() if s not in seen]
    if subset == "smoke":
        return variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16",),
                        activations=("swiglu",))
    raise ValueError(f"subset: expected smoke or full, got {subset!r}")


#: local memory the SASS check accepts per kernel (:func:`w4a16_moe.loader.sass.budget_rules`): the ping-pong down
#: GEMMs of :data:`MODEL_TILES` for INT4 g32 with zero points (BK 128, 2 B slots) spill 1-2 ``LDL`` / 1 ``STL``.
#: H200 (docs/perf/2026-12-04-local-memory): the BK 64 ping-pong without local memory (4 B slots, 16 stages) is
#: 1.027-1.067 x their time, the fastest tile without ping-pong 1.002-1.35 x (8 rows)
SASS_LOCAL_BUDGET = (
    {"archs": ("sm_90a",),
     "params": {"mode": "down", "pingpong": 2, "zero_point": True, "group": 32, "k_tile": 128, "b_slots": 2},
     "LDL": 2, "STL": 1,
     "why": "INT4 g32 zero-point ping-pong down GEMM: faster than the spill-free BK 64 ping-pong and the tiles "
            "without ping-pong (docs/perf/2026-12-04-local-memory)"},
)


#: kernels whose WGMMA pipeline ptxas serializes (every HGMMA its own commit group, waited to zero: the SASS
#: check's :func:`w4a16_moe.loader.sass.wgmma_serialized`), accepted as they are because they were timed and fitted
#: as built (docs/perf/2026-12-04-wgmma-serial: which kernels, why, and the setmaxnreg builds that are not serialized)
SASS_SERIAL_OK = (
    {"archs": ("sm_90a",), "params": {"tokens_per_tile": 8, "min_ctas_per_sm": 4},
     "why": "TN 8 at 4 CTAs per SM (64 registers a thread): timed and fitted as built, the decode-size tile of the "
            "rule and the cost model; no unserialized build measured (docs/perf/2026-12-04-wgmma-serial)"},
    {"archs": ("sm_90a",), "params": {"tokens_per_tile": 112, "m64_per_block": 4, "consumer_wgs": 2, "setmaxnreg": False},
     "why": "TN 112 over two warpgroups of two m64 blocks (158 registers): a tuner candidate, timed as built "
            "(docs/perf/2026-12-04-wide-tiles, docs/perf/2026-12-04-wgmma-serial); its setmaxnreg build is not "
            "serialized, 0.81-0.94 x its time, and the cost model's tile instead (docs/perf/2026-12-05-setmaxnreg-tiles)"},
    {"archs": ("sm_90a",), "params": {"tokens_per_tile": 128, "m64_per_block": 4, "consumer_wgs": 2, "setmaxnreg": False},
     "why": "TN 128 over two warpgroups of two m64 blocks: candidate 4, a tuner-only tile, timed as built "
            "(docs/perf/2026-12-04-wgmma-serial)"},
    {"archs": ("sm_90a",), "params": {"tokens_per_tile": 64, "m64_per_block": 8, "consumer_wgs": 4, "setmaxnreg": True,
                                      "producer_regs": 40, "consumer_regs": 104},
     "why": "TN 64 over four warpgroups of two m64 blocks (640 threads: 96 registers, setmaxnreg at most 32 / 112): "
            "no register split unserializes it; candidate 81, timed and fitted as built "
            "(docs/perf/2026-12-05-four-consumer-wg)"},
)


class Sm90Family:
    """The WGMMA grouped-GEMM family as :class:`~w4a16_moe.kernels.cute.registry.KernelFamily`."""

    name = "sm90"
    spec_family = FAMILY
    archs = SM90_ARCHS
    role = "grouped"
    beside = None
    compile_fn = f"{__name__}:_compile"
    sources = ("w4a16_moe.kernels.cute.sm90.grouped_gemm", "w4a16_moe.kernels.cute.sm90.config",
               "w4a16_moe.kernels.cute.common.ptx", "w4a16_moe.kernels.cute.common.codes",
               "w4a16_moe.kernels.cute.common.epilogue", "w4a16_moe.kernels.cute.common.grid", "w4a16_moe.kernels.cute.common.dequant")
    sass_expect = ("HGMMA",)
    sass_allow_local = ()
    sass_local_budget = SASS_LOCAL_BUDGET
    sass_serial_ok = SASS_SERIAL_OK
    max_grid_y = MAX_GRID_Y

    def __repr__(self) -> str:
        return "KernelFamily(sm90)"

    def config_type(self) -> type:
        from .config import Sm90GemmConfig

        return Sm90GemmConfig

    def supports(self, capability, arch) -> Optional[str]:
        if capability[0] != 9:
            return f"the SM90 family needs compute capability 9.x ({arch})"
        return None

    def can_implement(self, call) -> Optional[str]:
        from ..registry import shape_reason

        return shape_reason(call, bias=True, swiglu_oai=True)  # biases and swiglu_oai (any alpha / limit)

    def configs(self, scheme, dtype, activation, gated, finalize, tiles, bias=False):
        return gemm_configs(scheme, dtype, activation, gated, finalize, tiles, bias)

    def select_tiles(self, num_routes, num_experts, top_k=None, global_experts=None) -> dict:
        return select_tiles(num_routes, num_experts, top_k, global_experts)

    def choose(self, tokens, top_k, num_experts, hidden, intermediate, scheme, dtype, gpu, global_experts=None,
               gated=True, sm_count=DEFAULT_SM_COUNT) -> tuple:
        return choose_with_family(tokens, top_k, num_experts, hidden, intermediate, scheme, dtype, gpu, global_experts,
                                  gated, sm_count)

    def num_splits(self, n, k, cfg, num_routes, num_experts, sm_count, top_k=None, global_experts=None,
                   arch=None) -> int:
        return num_splits(n, k, cfg, num_routes, num_experts, sm_count, top_k, global_experts)

    def spec_for(self, cfg):
        return spec_for(cfg)

    def aot_variants(self, subset):
        return aot_variants(subset)

    def layout_key(self, which, cfg, dtype) -> str:
        return layout_key(which, cfg, dtype)

    def pack(self, qm, cfg, dtype, interleave):
        return pack(qm, cfg, dtype, interleave)

    def rows_per_cta(self, cfg) -> int:
        return 64 * cfg.m64_per_block


def layout_key(which: str, cfg, dtype) -> str:
    """Cache key of the SM90 packed layout (shared by the decode kernels): matrix, row block, K tile, dtype."""
    return f"cute-sm90:{which}:x{cfg.m64_per_block}:k{cfg.k_tile}:{dtype}"


def pack(qm, cfg, dtype, interleave: bool):
    from .pack import pack_sm90

    return pack_sm90(qm, m64_per_block=cfg.m64_per_block, k_tile=cfg.k_tile, compute_dtype=dtype,
                     interleave_gate_up=interleave)


DESCRIPTOR = Sm90Family()

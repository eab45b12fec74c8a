"""The SM90 kernel family as the loader sees it: specs, the variant set, and tile selection.

Every compiled kernel is a :class:`~w4a16_moe.loader.KernelSpec` of family ``sm90_w4a16_gemm`` whose
params are all fields of :class:`Sm90GemmConfig`, so the spec name encodes every codegen parameter;
the same specs feed JIT (on first use) and AOT (:func:`variants` enumerates them).

Tile selection (:func:`select_tiles`) uses only host-known sizes (``T * k``, ``E``, ``N``, ``K``), so a
call never synchronizes, and one compiled kernel per bucket serves every token count:

=====================  ====  ==  ===  ======  ====  ===========  =================================
routes per expert r    TN    X   BK   stages  WGs   schedule     note
=====================  ====  ==  ===  ======  ====  ===========  =================================
r <= 8                 8     2   64   4       1     overlap, o4  decode: weight-bandwidth bound
r <= 16                16    2   64   4       1     overlap, o3
r <= 32                32    2   128  4       1     serial
r <= 64                64    2   128  4       1     overlap
r > 64                 128   4   64   3       2     overlap      prefill: two consumer warpgroups
=====================  ====  ==  ===  ======  ====  ===========  =================================

``r = cdiv(T * k, min(E, T * k))`` (an upper bound under expert parallelism, where most routes belong
to other ranks). The table comes from the first H200 sweep of the kernel bundle (``docs/perf/``); split-K
(``num_splits``, a runtime argument) is used when the grid would not fill the GPU twice, in both finalize
modes: the partials are summed in fixed split order, so deterministic calls stay bit-identical run to run
(``W4A16_MOE_BATCH_INVARIANT=1`` turns split-K off for batch invariance). ``EXTRA_TILES`` are further
shapes (deeper weight pipelines for decode-sized batches) that only the tuner selects.

A tuner (``python -m w4a16_moe tune``) measures every candidate (``CANDIDATES``) and split choice on a workload and stores the
best per token count in ``tuned_sm90.json`` keyed by GPU name and layer shape (with the versions it was
measured with); :func:`choose` prefers those entries and falls back to the rule above. This module only
selects among compiled kernels, so it is not part of the kernels' source hash.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from typing import Iterable, Optional

from ....loader.spec import KernelSpec, config_codec

__all__ = ["FAMILY", "TILES", "spec_for", "config_from_spec", "select_tiles", "variants", "kernel_config"]

FAMILY = "sm90_w4a16_gemm"
SM_COUNT = 132  # H100 / H200 SXM; split-K targets two waves of CTAs
MAX_GRID_Y = 65535

# bucket upper bound of routes per expert -> tile parameters of Sm90GemmConfig
TILES = (
    (8, dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4)),
    (16, dict(tokens_per_tile=16, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=3)),
    (32, dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial")),
    (64, dict(tokens_per_tile=64, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1)),
    (None, dict(tokens_per_tile=128, m64_per_block=4, k_tile=64, stages=3, consumer_wgs=2)),
)


def _up2(tn: int, stages: int = 3) -> dict:
    """A gate/up tile of 256 weight rows over two consumer warpgroups, BK 128 (candidates 17, 18)."""
    return dict(tokens_per_tile=tn, m64_per_block=4, k_tile=128, stages=stages, consumer_wgs=2)


def _W2_K64(tn: int) -> dict:
    """256 weight rows over two consumer warpgroups at BK 64, 4 stages (candidates 14, 15, 18: the W2 rows)."""
    return dict(tokens_per_tile=tn, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2)


_UP_T32 = dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial")


def _pp_down(row_blocks: int, stages: int = 8, b_slots: int = 0, pingpong: int = 1) -> dict:
    """The ``down_*`` keys of a ping-pong down GEMM: 128-row blocks (two m64) over two consumer warpgroups,
    BK 64, ``row_blocks`` of them per CTA."""
    d = dict(down_m64_per_block=2, down_consumer_wgs=2, down_schedule="overlap", down_k_tile=64,
             down_stages=stages, down_row_blocks_per_cta=row_blocks, down_pingpong=pingpong)
    if b_slots:
        d["down_b_slots"] = b_slots
    return d


# Extra tile shapes the tuner measures beside the rule's buckets (deep weight pipelines for decode-sized
# batches: more bytes in flight per CTA). ``CANDIDATES`` = the rule's buckets, then these; tuned-table rows
# and ``FORCE["bucket"]`` index into it. (A TN=16 variant with 256-row down CTAs at 2 CTAs/SM was
# measured at revision e2a97df as candidate 10 and removed: slower, and its down kernels spill.)
EXTRA_TILES = (
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=128, stages=8, consumer_wgs=1, min_ctas_per_sm=2),
    dict(tokens_per_tile=16, m64_per_block=2, k_tile=128, stages=8, consumer_wgs=1, min_ctas_per_sm=2),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=6, consumer_wgs=1, schedule="serial"),
    # the same, with 256 weight rows per CTA in the down GEMM: a short reduction (K = I, e.g. 256 in a TP
    # shard) leaves each CTA only a few K tiles, so fewer, larger CTAs amortize their start-up
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=1, min_ctas_per_sm=4,
         down_m64_per_block=4, down_min_ctas_per_sm=2),
    dict(tokens_per_tile=8, m64_per_block=2, k_tile=128, stages=8, consumer_wgs=1, min_ctas_per_sm=2,
         down_m64_per_block=4, down_k_tile=64, down_stages=4),
    dict(tokens_per_tile=32, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial",
         down_m64_per_block=4),
    # prefill-sized rows of few routes per expert (W1 2048: ~43, W2 1024 / 2048: ~32 / ~64): one token tile
    # per expert where the rule's TN=32 needs two (each re-streaming the expert's weights), and 256 weight
    # rows per CTA over two consumer warpgroups (the activation tile gathered once for twice the rows)
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=48, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1, schedule="serial"),
    dict(tokens_per_tile=48, m64_per_block=2, k_tile=128, stages=4, consumer_wgs=1),
    dict(tokens_per_tile=96, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    # (measured at the first sweep: 256 rows over two consumer warpgroups won every such row; these vary TN
    # around the routes per expert and the K tile)
    dict(tokens_per_tile=48, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=32, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=64, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2),
    dict(tokens_per_tile=80, m64_per_block=4, k_tile=64, stages=4, consumer_wgs=2),
    dict(tokens_per_tile=48, m64_per_block=4, k_tile=128, stages=3, consumer_wgs=2),
    # several row blocks per down CTA (``row_blocks_per_cta``): the short-K down GEMM of a TP shard
    # (K = I = 256 in W1: two K tiles per row block) was latency-bound with one row block per CTA (ncu,
    # W1 2048 tokens: 495 us, 26% of DRAM and SM throughput). Gate/up tiles as in candidates 17, 11, 2,
    # 16, 0, 8 and 19 (W1 rows), 18, 15 and 14 (W2 rows).
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
    # (measured: W1 2048 821.5 us with candidate 23 vs 919.3 with 17; its down GEMM still only 38% of DRAM
    # throughput) deeper down rings, so that the producer runs more than one row block ahead; gate/up tiles
    # of candidates 17 (W1 2048), 16 (W1 1024) and 2
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
    # (measured: W1 2048 797.6 us with 34, but its down kernel spills) ping-pong down CTAs: the two consumer
    # warpgroups take alternate 128-row blocks, so one's epilogue runs under the other's mainloop; gate/up
    # tiles of candidates 17, 38 and 18
    {**_up2(64), **_pp_down(14)},
    {**_up2(64), **_pp_down(28)},
    {**_up2(64), **_pp_down(8)},
    {**_up2(64), **_pp_down(56)},
    {**_UP_T32, **_pp_down(14)},
    {**_up2(48), **_pp_down(14)},
    {**_up2(64), **_pp_down(7)},
    # 56-token tiles: W1 2048 has ~43 routes per expert (binomial, sd ~6.5), so TN 56 still gives ~98% of
    # the experts one tile, with an eighth less padding than TN 64
    {**_up2(56), **_pp_down(14)},
    {**_up2(56), **_pp_down(28)},
    # (measured: W1 2048 779.4 us with 47; ncu: gate/up 337 us at 53% of DRAM throughput, down 313 us at 41%)
    # more weight bytes in flight per SM: deeper gate/up rings, and down rings of 12-20 weight stages with
    # only 4 activation-tile slots (the resident tile needs K / BK = 4 of them)
    {**_up2(56, stages=4), **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56, stages=6), **_pp_down(28, stages=16, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(28, stages=12, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(28, stages=20, b_slots=4)},
    {**_up2(56, stages=5), **_pp_down(14, stages=16, b_slots=4)},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4)},
    # (measured: no gain from the deeper rings, 774-780 us; ncu source counters: both GEMMs are bound by their
    # consumers' decode + WGMMA issue, and the ping-pong warpgroups wait for their turn 13% of the time) the
    # two warpgroups' mainloops overlap as well (pingpong=2: safe with stages > K tiles)
    {**_up2(56), **_pp_down(28, pingpong=2)},
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2)},
    {**_up2(56, stages=5), **_pp_down(14, stages=12, b_slots=4, pingpong=2)},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4, pingpong=2)},
    # several token-tile widths in one kernel (tn_variants, both GEMMs): a tile runs the narrowest WGMMA N
    # that holds its routes, TN, TN - 8, ...; at W1 2048 (~43 +- 6.5 routes per expert) TN 56 pads ~24% of
    # the MMA columns, the narrowest fitting width of 56/48/40/32 about 9%. (Measured, docs/perf/2026-11-30-variants:
    # W1 2048 764.0 -> 750.9 us with 4 widths, 753.7 with 3, 748.7 for TN 64 with 4; W1 1024 587.6 -> 571.7 for 58
    # with 3 widths)
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 3},
    # programmatic dependent launch between the two GEMMs: the down kernel's CTAs take the SMs the gate/up
    # grid's tail frees and stream their first weight stages before waiting for h (measured: 0-3 us)
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True},
    {**_UP_T32, **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 3, "pdl": True},
    # four k16 blocks per WGMMA fence / commit group in both GEMMs (the down GEMM's BK 64 tile is then one
    # group): measured 741.8 -> 727.9 us at W1 2048; two blocks per group 734.3 (down) and 742.6 (both), the
    # whole gate/up tile per group 762.2; the 1024 row's serial gate/up and its down were indifferent
    {**_up2(56, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True,
     "mma_kblocks": 4},
    {**_up2(56, stages=4), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True,
     "mma_kblocks": 4},
    {**_up2(64, stages=5), **_pp_down(28, stages=16, b_slots=4, pingpong=2), "tn_variants": 4, "pdl": True,
     "mma_kblocks": 4},
    # the W2 (E 32, I 2048) prefill tiles of the table with two / four k16 blocks per fence group, and with
    # token-tile widths (W2 2048: ~64 +- 8 routes per expert against TN 80). Measured (run 9 of
    # docs/perf/2026-11-30-fences, tuner us): 1024 390.4 (15) -> 374.3 (69); 2048 511.9 (18) -> 488.5 (68);
    # 4096 991.8 (18) -> 959.0 (67). (Also measured and removed: 14 with two blocks per group at 8192, 1710.0
    # against 1680.2 for 14)
    {**_W2_K64(80), "mma_kblocks": 2, "pdl": True},
    {**_W2_K64(80), "mma_kblocks": 4, "pdl": True},
    {**_W2_K64(80), "tn_variants": 4, "mma_kblocks": 2, "pdl": True},
    {**_W2_K64(48), "tn_variants": 4, "mma_kblocks": 2, "pdl": True},
    # the W1 2048 tiles of 63 with a BK 128 down GEMM: half the K tiles per row block (two instead of four), so
    # half the full-barrier waits and shared-memory word loads, and with four k16 blocks per group two groups
    # per tile, whose decode overlaps the previous group's WGMMAs (at BK 64 a tile is one group, and its decode
    # waits for all of the previous tile's WGMMAs). Measured (docs/perf/2026-11-30-pdl-chain, run 2, tuner mean
    # over 3 routings on one H200): W1 2048 729.5 us (63) -> 713.8. Also measured there and not kept: 12 / 6
    # down stages 725.7 / 715.0, 14 row blocks per CTA 723.1, 4 / 6 gate/up stages 713.2 / 719.0 (within the
    # noise of 70), two k16 blocks per down group 714.3 (spilled then; eight blocks per group spill as well)
    {**_up2(56, stages=5), **_pp_down(28, stages=8, b_slots=2, pingpong=2), "down_k_tile": 128, "tn_variants": 4,
     "pdl": True, "mma_kblocks": 4},
    # the same BK 128 down GEMM with 62's tiles (W1 1024: TN 32, three widths). Measured in run 2 of
    # docs/perf/2026-11-30-pdl-chain: 577.4 -> 549.1 us (tuner, 2 routings), with a kernel that then spilled two
    # registers (the tile's first slot and route count, live across the width dispatch; the epilogue now
    # re-derives them)
    {**_UP_T32, **_pp_down(28, stages=8, b_slots=2, pingpong=2), "down_k_tile": 128, "tn_variants": 3, "pdl": True,
     "down_mma_kblocks": 4},
    # (measured in run 8 of docs/perf/2026-11-30-pingpong and removed: other gate/up tiles with 56's down tiles,
    # TN 56 at BK 64 with 8 / 6 stages, TN 64 and TN 48 at BK 128 with 5 stages: 789.7 / 789.8 / 800.4 / 837.5 us
    # against 767.6 for 56 on the same machine)
    # (also measured and removed, run 10: gate/up CTAs of four consumer warpgroups with 64 weight rows each,
    # 16 consumer warps per SM instead of 8, 58-93 registers, with 56's and 58's down tiles: W1 2048 749.4 us
    # at TN 56 / BK 128 / 5 stages, 774.5-804.5 with BK 64, against 741.4 for 56 on that machine; 1024 604.1
    # against 570.9 for 58. More warps to hide the decode's latency did not help: the consumers are bound by
    # throughput, not latency)
)
CANDIDATES = tuple(t for _, t in TILES) + EXTRA_TILES

def _compile(spec: KernelSpec, arch: str):
    """The family's compile function (registered in :mod:`w4a16_moe.loader.spec` with its source modules)."""
    from ..sm90_grouped_gemm import Sm90W4A16GroupedGemm

    return Sm90W4A16GroupedGemm(config_from_spec(spec)).compile(arch)


def kernel_config(**fields):
    from ..sm90_config import Sm90GemmConfig

    return Sm90GemmConfig(**fields)


spec_for, config_from_spec = config_codec(FAMILY, kernel_config)


def _bucket(rows_per_expert: int) -> dict:
    for bound, tiles in TILES:
        if bound is None or rows_per_expert <= bound:
            return tiles
    raise AssertionError  # pragma: no cover


def select_tiles(num_routes: int, num_experts: int) -> dict:
    """Tile parameters for a call with ``num_routes = T * k`` routes over ``num_experts`` local experts."""
    r = -(-num_routes // max(1, min(num_experts, num_routes)))
    return dict(_bucket(r))


def group_param(scheme) -> int:
    """``Sm90GemmConfig.group`` of a scheme: its group size, 0 for per-channel scales."""
    return 0 if scheme.group_size is None else scheme.group_size


def gemm_configs(scheme, dtype: str, activation: str, gated: bool, finalize: str, tiles: dict):
    """(gate_up, down) :class:`Sm90GemmConfig` of one call."""
    return _gemm_configs(scheme, dtype, activation, gated, finalize, tuple(sorted(tiles.items())))


@functools.lru_cache(maxsize=4096)
def _gemm_configs(scheme, dtype, activation, gated, finalize, tiles_items):
    tiles = {k: v for k, v in tiles_items if not k.startswith("down_")}
    down_tiles = dict(tiles, **{k[5:]: v for k, v in tiles_items if k.startswith("down_")})
    base = dict(dtype=dtype, group=group_param(scheme), zero_point=scheme.zero_point, fp4=scheme.is_fp4)
    up = kernel_config(mode="gate_up", activation=activation, **base, **tiles)
    down = kernel_config(mode="down", epilogue="y" if finalize == "deterministic" else "atomic_f32", **base,
                         **down_tiles)
    return up, down


# Tuner overrides (``python -m w4a16_moe tune``): {"bucket": index into CANDIDATES, "splits": int or None};
# set them with :func:`forced`
FORCE: dict = {}


@contextlib.contextmanager
def forced(bucket: Optional[int], splits: Optional[int] = None):
    """Within the block every SM90 call takes ``CANDIDATES[bucket]`` with ``splits`` split-K parts (None: the
    ``num_splits`` rule); ``bucket`` None forces nothing. For the tuner, the profiler and the GPU tests."""
    FORCE.clear()
    if bucket is not None:
        FORCE.update(bucket=bucket, splits=splits)
    try:
        yield
    finally:
        FORCE.clear()
TUNED_PATH = os.path.join(os.path.dirname(__file__), "tuned.json")


@functools.lru_cache(maxsize=None)
def _tuned_file(path: str = TUNED_PATH) -> dict:
    """The tuned table file, read once ({} when absent or unreadable)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _tuned_table(path: str = TUNED_PATH) -> dict:
    return _tuned_file(path).get("entries", {})


def _tuned_decode(path: str = TUNED_PATH) -> dict:
    return _tuned_file(path).get("decode", {})


def decode_bound(gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
                 top_k: int) -> Optional[int]:
    """The tuned table's bound for the route-major decode kernels (:mod:`.decode_family`) on this layer
    shape: calls of at most that many routes (``T * top_k``) use them; None = no measurement (the rule)."""
    ent = _tuned_decode().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k))
    return None if ent is None else int(ent["max_routes"])


def decode_knobs(tokens: int, gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
                 top_k: int) -> Optional[str]:
    """The tuned decode-kernel knob set (``"w8u8/w8u4"``, see ``decode_family.parse_knobs``) for a call of
    ``tokens`` on this layer shape: the row with the largest token count <= ``tokens``; None = defaults."""
    ent = _tuned_decode().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k))
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


def tuned_key(gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str, top_k: int) -> str:
    return f"{gpu}|e{num_experts}_h{hidden}_i{intermediate}|{scheme}|{dtype}|k{top_k}"


def choose_with_family(tokens: int, top_k: int, num_experts: int, hidden: int, intermediate: int, scheme: str,
                       dtype: str, gpu: str) -> tuple:
    """``(family, tiles, splits or None)`` for a call on an SM90 GPU: tuner override, then the tuned table
    (largest measured token count <= ``tokens``), then the routes-per-expert rule. ``family`` is
    ``"sm90"`` (``tiles`` from :data:`CANDIDATES`) or ``"warp"`` (a tuned row measured faster with the
    portable warp-MMA family; ``tiles`` from ``warp_family.TILES``). ``splits`` None means the family's
    ``num_splits`` rule."""
    if FORCE:
        return "sm90", dict(CANDIDATES[FORCE["bucket"]]), FORCE.get("splits")
    rows = _tuned_table().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k))
    if rows:
        best = None
        for row in rows:  # sorted by t: [t, bucket, splits] or [t, bucket, splits, family]
            if row[0] <= tokens or best is None:
                best = row
        family = best[3] if len(best) > 3 else "sm90"
        if family == "warp":
            from ..warp import family as warp_family

            return "warp", dict(warp_family.TILES[best[1]][1]), best[2]
        return "sm90", dict(CANDIDATES[best[1]]), best[2]
    return "sm90", select_tiles(tokens * top_k, num_experts), None


def choose(tokens: int, top_k: int, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
           gpu: str) -> tuple:
    """``(tiles, splits or None)`` of this family for a call (:func:`choose_with_family`; a row that names
    the warp family falls back to the rule here)."""
    family, tiles, splits = choose_with_family(tokens, top_k, num_experts, hidden, intermediate, scheme, dtype, gpu)
    if family != "sm90":
        return select_tiles(tokens * top_k, num_experts), None
    return tiles, splits


def tuned_token_counts(gpu: str, num_experts: int, hidden: int, intermediate: int, scheme: str, dtype: str,
                       top_k: int) -> list:
    rows = _tuned_table().get(tuned_key(gpu, num_experts, hidden, intermediate, scheme, dtype, top_k)) or []
    return [row[0] for row in rows]


def num_splits(n: int, k: int, cfg, num_routes: int, num_experts: int) -> int:
    """Split-K factor: enough CTAs for two waves when the (row block x token tile) grid is small."""
    tiles = max(1, min(num_experts, num_routes))  # at least one tile per active expert
    rb = cfg.row_blocks_per_cta
    ctas = -(-(n // (64 * cfg.m64_per_block)) // rb) * tiles
    k_tiles = k // cfg.k_tile
    if ctas >= SM_COUNT:
        return 1
    return max(1, min(8, k_tiles, (2 * SM_COUNT) // ctas))


def selectable_tiles(scheme: Optional[str] = None) -> list:
    """The tile shapes a call can select: the rule's buckets plus every candidate the tuned table uses
    (for ``scheme`` only, when given: tuned rows are keyed by scheme)."""
    used = {row[1] for key, rows in _tuned_table().items() for row in rows
            if (len(row) < 4 or row[3] == "sm90") and (scheme is None or f"|{scheme}|" in key)}
    return [t for _, t in TILES] + [CANDIDATES[b] for b in sorted(used) if b >= len(TILES)]


def variants(schemes: Optional[Iterable] = None, dtypes=("bf16", "fp16"),
             activations=("swiglu", "geglu", "relu2", "silu"), finalizes=("deterministic", "fused"),
             tiles: Optional[Iterable[dict]] = None) -> list:
    """Every spec the provider can select for the given schemes (default: every scheme, each with the tile
    shapes of :func:`selectable_tiles` for it)."""
    from ....formats.schemes import SCHEMES

    if schemes is None:
        schemes = list(SCHEMES.values())
    out, seen = [], set()
    for sch in schemes:
        for dt in dtypes:
            for t in (list(tiles) if tiles is not None else selectable_tiles(sch.name)):
                for act in activations:
                    for fin in finalizes:
                        gated = act in ("swiglu", "geglu")
                        for cfg in gemm_configs(sch, dt, act, gated, fin, t):
                            spec = spec_for(cfg)
                            if spec not in seen:
                                seen.add(spec)
                                out.append(spec)
    return out

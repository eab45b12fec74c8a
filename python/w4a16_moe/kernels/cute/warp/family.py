"""The portable warp-MMA kernel family as the loader sees it: specs, archs, variant sets and tile selection.

Every compiled kernel is a :class:`~w4a16_moe.loader.KernelSpec` of family ``warp_w4a16_gemm`` whose params
are all fields of :class:`~.config.WarpGemmConfig` (the spec name encodes every codegen parameter); the
same specs feed JIT and AOT. The kernel (:mod:`.grouped_gemm`) is one source for every arch in
:data:`ARCHS`; the arch only changes the ``atomic_f32`` reduction width and the shared-memory check.

Tile selection (:func:`select_tiles`) uses only host-known sizes, so a call never synchronizes; one compiled
kernel per bucket serves every token count:

=====================  ====  =====  ======  ===  ======  =============================================
routes per expert r    TN    warps  m16/w   BK   stages  note
=====================  ====  =====  ======  ===  ======  =============================================
r <= 8                 8     4      2       128  4       decode: weight-bandwidth bound, split-K
r <= 16                16    4      2       128  4
r <= 32                32    4      2       128  4
r > 32                 64    4      2       64   4       (bonus; WGMMA is expected to win here on SM90)
=====================  ====  =====  ======  ===  ======  =============================================

``r = cdiv(T * k, min(E, T * k))``, or with the ``global_num_experts`` hint the expected local routes over the
expected distinct local experts hit (:func:`..tiles.routes_per_expert`). On SM90 the SM90 family's cost model
chooses among these buckets and :data:`MODEL_TILES` (TN 24) for INT4 calls; this rule serves the other archs. Every bucket has 128 weight rows per CTA (128 threads) and needs at most
~75 KB of shared memory, so the same variants run on sm_86/89/120 (99 KB) as on sm_80/90/100.
This module imports neither ``cutlass`` nor the kernel module (run-time selection must not need the DSL).
"""

from __future__ import annotations

import functools
from typing import Iterable, Optional

from ....archs import ARCHS as ALL_ARCHS, DEFAULT_SM_COUNT
from .. import tiles as tiles_rule
from ....loader.spec import KernelSpec, config_codec

__all__ = ["FAMILY", "ARCHS", "REFUSED_ARCHS", "TILES", "MODEL_TILES", "K64_TILES", "k64_scheme", "k128_twin", "model_tiles", "spec_for", "config_from_spec", "select_tiles",
           "gemm_configs", "num_splits", "cta_slots", "UP_ROW_BLOCKS", "SPLIT_MIN_EXPERT_BYTES", "variants", "aot_variants", "kernel_config", "group_param",
           "OCCUPANCY_TOKENS", "occupancy"]

FAMILY = "warp_w4a16_gemm"

#: ``--gpu-arch`` values the CuTe DSL 4.8.1 accepts for this kernel (compile + export verified on the CPU box).
ARCHS = ALL_ARCHS
#: archs tried and refused, with the reason (none with DSL 4.8.1; sm_121a also compiles but is not listed).
REFUSED_ARCHS: dict = {}

MAX_GRID_Y = 65535

_BASE = dict(warps=4, m16_per_warp=2, stages=4)
# bucket upper bound of routes per expert -> tile parameters of WarpGemmConfig
TILES = (
    (8, dict(tokens_per_tile=8, k_tile=128, **_BASE)),
    (16, dict(tokens_per_tile=16, k_tile=128, **_BASE)),
    (32, dict(tokens_per_tile=32, k_tile=128, **_BASE)),
    (None, dict(tokens_per_tile=64, k_tile=64, **_BASE)),
)
#: tile shapes beyond the buckets of :data:`TILES` that only the SM90 family's cost model chooses, for INT4 calls
#: (:func:`model_tiles`; the full AOT set has them for every INT4 scheme): TN 24 sits between the 16 and 32
#: buckets, where experts get ~14-20 routes (one token tile each at TN 24, where TN 16 needs a second tile and
#: TN 32 pads a third of its MMA columns). H200, docs/perf/2026-12-01-epilogue-t24: 128,4096,384,8 at 256
#: tokens 161.3 (TN 16) / 159.9 (TN 32) -> 141.0 us; 128,5120,1024,1 at 2048 tokens 422.4 (SM90 TN 32) -> 401.5
MODEL_TILES = (dict(tokens_per_tile=24, k_tile=128, **_BASE),)
#: K-tile-64 twins of the TN 8 / 16 buckets, which the SM90 family's cost model takes instead of them on layers whose
#: sizes a K tile of 128 pads by at least 8% more bytes (``sm90.family.k_tile_ok``; ``I % 128 == 64`` up to 704: TP
#: shards such as ``I = 192 / 320``), for INT4 schemes of groups below 128 (a layer of larger groups has ``I % 128 == 0``). H100, docs/perf/2026-12-07-k64 (four layers,
#: 8-256 tokens, two runs): each 0.68-0.93 x its K-128 twin's time (geometric mean 0.85) on 23 of 24 pairs, 1.02 on one
K64_TILES = tuple(dict(tokens_per_tile=tn, k_tile=64, **_BASE) for tn in (8, 16))


def k64_scheme(scheme) -> bool:
    """Whether :data:`K64_TILES` are built and chosen for ``scheme`` (None: any INT4 scheme): INT4, per channel or
    groups of at most 64."""
    from ....formats.schemes import get_scheme

    if scheme is None:
        return True
    sch = get_scheme(scheme)
    return not sch.is_fp4 and (sch.group_size is None or sch.group_size <= 64)


def k128_twin(tiles: dict) -> Optional[dict]:
    """The K-128 bucket whose twin ``tiles`` is (one of :data:`K64_TILES`), else None."""
    return dict(tiles, k_tile=128) if tiles in K64_TILES else None


def model_tiles(scheme=None) -> list:
    """The tile shapes of this family a call of ``scheme`` (None: INT4) may run: the buckets of :data:`TILES`,
    for INT4 schemes :data:`MODEL_TILES` and, where :func:`k64_scheme`, :data:`K64_TILES`."""
    from ....formats.schemes import get_scheme

    out = [dict(t) for _, t in TILES]
    if scheme is None or not get_scheme(scheme).is_fp4:
        out += [dict(t) for t in MODEL_TILES]
    if k64_scheme(scheme):
        out += [dict(t) for t in K64_TILES]
    return out


def _compile(spec: KernelSpec, arch: str):
    """The family's compile function (registered in :mod:`w4a16_moe.loader.spec` with its source modules)."""
    from .grouped_gemm import WarpW4A16GroupedGemm

    return WarpW4A16GroupedGemm(config_from_spec(spec), arch).compile(arch)


def kernel_config(**fields):
    from .config import WarpGemmConfig

    return WarpGemmConfig(**fields)


spec_for, config_from_spec = config_codec(FAMILY, kernel_config)


def select_tiles(num_routes: int, num_experts: int, top_k: Optional[int] = None,
                 global_experts: Optional[int] = None) -> dict:
    """Tile parameters for a call with ``num_routes = T * k`` routes over ``num_experts`` local experts
    (``global_experts``, with ``top_k``: the expert-parallel hint)."""
    return tiles_rule.select(TILES, num_routes, num_experts, top_k, global_experts)


group_param = tiles_rule.group_param


#: row blocks per CTA of the gate/up kernels: 1, the K loop without the row-block streaming loop. Their K is the
#: hidden size (>= 2048 in every MoE model: 16 K tiles and more), where the kernels never stream (streaming runs
#: only up to ``STREAM_MAX_K_TILES`` = 4), yet the second loop cost them 1-8% (H200, docs/perf/2026-12-02-split-k:
#: e.g. ``32,7168,2048,8,256`` at 8 tokens, TN 16: 37.7 -> 34.6 us; ``256,7168,256,8``, TN 8: 33.8 -> 32.9 us).
#: The down kernels keep ``row_blocks = 8`` (K = the intermediate size, often 256-512: they stream).
UP_ROW_BLOCKS = 1

#: the family's kernels are launched with programmatic dependent launch (:attr:`.config.WarpGemmConfig.pdl`: gate/up
#: waits for the route preparation, down streams its first weight stages before it waits for h and lets the finalize
#: launch at once) on layers whose experts' gate/up weights are at most this many bytes, unless they loop over their
#: tiles (:func:`pdl_launch`). H100, docs/perf/2026-12-05-warp-decode-tiles section 5 (7 layers at 8-64 tokens, two
#: runs): 0.93-0.99 x on layers of small experts (``128,4096,384,8``: 1.6 MB; ``160,5120,1536,6``: 7.9 MB;
#: ``32,7168,2048,8,256``: 14.7 MB at 16-64 tokens), 1.01-1.03 x on ``16,4096,6400,2`` (26 MB) and
#: ``8,4096,14336,2`` (59 MB) at 8-16 tokens, 1.03-1.10 x with the tile-loop kernels (expert-parallel ranks at
#: 8 tokens)
PDL_MAX_EXPERT_BYTES = 16 << 20


def pdl_launch(gate_up_rows: int, hidden: int, tile_loop: bool) -> bool:
    """Whether a call's warp-MMA kernels are the PDL ones (:data:`PDL_MAX_EXPERT_BYTES`): ``gate_up_rows`` (2 I,
    or I ungated) x ``hidden`` 4-bit weights per expert, the tile loop off. SM90 and later (the provider asks)."""
    return not tile_loop and gate_up_rows * hidden // 2 <= PDL_MAX_EXPERT_BYTES


#: token tiles whose kernels are built with ``occupancy`` unless the tile dict says otherwise: a tile of an expert
#: with at most ``8 * ceil(TN / 16)`` routes runs the K loop of those token blocks only (half the MMAs, ldmatrix
#: loads and activation copies). H100, docs/perf/2026-12-06-occupancy (11 layers at 8-256 tokens, split-K rule, each
#: tile with and without): call time 0.962 / 0.950 / 0.853 x (geometric mean) at TN 16 / 24 / 32, 0.71-1.07 x per row
OCCUPANCY_TOKENS = (16, 24, 32)


def occupancy(tiles: dict) -> bool:
    """Whether the kernels of a tile dict are built with ``occupancy``: its own ``occupancy`` key, else
    ``tokens_per_tile`` in :data:`OCCUPANCY_TOKENS`."""
    if "occupancy" in tiles:
        return bool(tiles["occupancy"])
    return tiles.get("tokens_per_tile", 8) in OCCUPANCY_TOKENS


def gemm_configs(scheme, dtype: str, activation: str, gated: bool, finalize: str, tiles: dict, bias: bool = False):
    """(gate_up, down) :class:`~.config.WarpGemmConfig` of one call (``finalize``: deterministic | fused;
    ``bias``: per-expert biases, as in the SM90 family's ``gemm_configs``; ``occupancy``: :func:`occupancy`)."""
    return _gemm_configs(scheme, dtype, activation, gated, finalize, tuple(sorted(tiles.items())), bias)


@functools.lru_cache(maxsize=4096)
def _gemm_configs(scheme, dtype, activation, gated, finalize, tiles_items, bias=False):
    tiles = dict(tiles_items)
    tiles["occupancy"] = occupancy(tiles)
    common = dict(dtype=dtype, kind=scheme.kind, group=group_param(scheme), zero_point=scheme.zero_point, **tiles)
    up = kernel_config(mode="gate_up", activation=activation, bias=bias, **dict(common, row_blocks=UP_ROW_BLOCKS))
    det = finalize == "deterministic"
    down = kernel_config(mode="down", epilogue="y" if det else "atomic_f32", bias=bias and det, **common)
    if up.gated != gated:
        raise ValueError(f"activation {activation!r} and gated={gated} disagree")
    return up, down


#: the warp-MMA family's split-K target: this many CTAs per SM (4-warp CTAs; several fit on one SM)
SPLIT_CTAS_PER_SM = 4
#: split-K only where one expert's 4-bit weights of the GEMM (``n * k / 2`` bytes: what one token tile streams) are
#: at least this large. H200, docs/perf/2026-12-02-split-k (80 rows of 10 layers at 8-64 tokens, TN 8-64, splits
#: 1-4): every split of a GEMM with <= 5.2 MB per expert (``128,5120,1024,1``, ``128,4096,384,8``,
#: ``256,7168,256,8`` gate/up) was slower than the unsplit kernel (up to 1.32 x), while GEMMs of >= 7.9 MB per
#: expert with a small grid gain up to 25%; geometric mean over the rows the rule splits 0.988 -> 0.967 x unsplit
SPLIT_MIN_EXPERT_BYTES = 6 << 20
#: static shared memory of the family's kernels (``cuobjdump -res-usage`` of the sm_90a builds: 1 KB), beside
#: the dynamic ring / staging tile of :attr:`.config.WarpGemmConfig.stage_sizes`
STATIC_SMEM = 1 << 10


def cta_slots(cfg, sm_count: int = DEFAULT_SM_COUNT, arch: Optional[str] = None) -> int:
    """CTAs of ``cfg``'s kernel the GPU holds at once: ``sm_count`` x the CTAs one SM's shared memory fits
    (``arch``'s :data:`~w4a16_moe.archs.SMEM_PER_SM`, sm_90a when None; per CTA the kernel's dynamic shared
    memory, which :class:`.grouped_gemm.WarpW4A16GroupedGemm` sizes as ``smem_bytes`` = the ring or the staging
    tile + 16 bytes of flags and which the kernel module cannot be asked for without the DSL, plus
    :data:`STATIC_SMEM` and the runtime's reserve). Registers do not bind before shared memory
    for the TN 8 kernels (80-93 registers: 5-6 CTAs of 128 threads), which are the ones :func:`num_splits`'s tail
    split applies to (the partial-traffic limit keeps larger TN out at every K below 10240)."""
    from ....archs import CTA_SMEM_RESERVE, SMEM_PER_SM

    sz = cfg.stage_sizes
    per_cta = max(cfg.stages * sz["stage"], sz["epi"]) + 16 + STATIC_SMEM + CTA_SMEM_RESERVE
    return max(1, SMEM_PER_SM[arch or "sm_90a"] // per_cta) * max(1, sm_count)


def num_splits(n: int, k: int, cfg, num_routes: int, num_experts: int, sm_count: int = DEFAULT_SM_COUNT,
               top_k: Optional[int] = None, global_experts: Optional[int] = None, arch: Optional[str] = None) -> int:
    """Split-K factor: :func:`..tiles.split_k`, enough CTAs for :data:`SPLIT_CTAS_PER_SM` per SM when the
    grid of row blocks x expected token tiles (:func:`..tiles.expected_tiles`; ``global_experts``, with
    ``top_k``: the expert-parallel hint) is smaller, within the split's K-tile and partial-traffic limits,
    then moved out of the tail band by :func:`..tiles.tail_free_split` over the kernel's :func:`cta_slots` on
    ``arch`` (a grid of 1-1.6 waves: an unsplit one splits in two, a split one goes below one wave or past 1.6
    waves); 1 for GEMMs of less than :data:`SPLIT_MIN_EXPERT_BYTES` per expert."""
    if n * k // 2 < SPLIT_MIN_EXPERT_BYTES:
        return 1
    tn = cfg.tokens_per_tile
    tiles = tiles_rule.expected_tiles(num_routes, num_experts, tn, top_k, global_experts)
    ctas = (n // cfg.rows_per_cta) * max(1, round(tiles))
    target = SPLIT_CTAS_PER_SM * sm_count
    s = tiles_rule.split_k(ctas, target, k, cfg.k_tile, tn)
    return tiles_rule.tail_free_split(ctas, s, cta_slots(cfg, sm_count, arch), target, k, cfg.k_tile, tn)


def max_tiles(num_routes: int, num_experts: int, tn: int) -> int:
    """Grid y of a launch: an upper bound on ``block_start[E]`` for any routing of ``num_routes`` routes."""
    return -(-num_routes // tn) + min(num_experts, num_routes)


def variants(schemes: Optional[Iterable] = None, dtypes=("bf16", "fp16"),
             activations=("swiglu", "geglu", "relu2", "silu"), finalizes=("deterministic", "fused"),
             tiles: Optional[Iterable[dict]] = None, biases=(False,), loops=(False, True)) -> list:
    """Every spec a provider can select for the given schemes (default: every scheme, INT4 and FP4),
    activations (canonical names) and bias settings, each tile with and without the tile loop (``loops``: the
    provider's ``W4A16_MOE_TILE_LOOP=auto`` takes the loop kernels of any tile on expert-parallel ranks) and, without
    it, with and without programmatic dependent launch (:func:`pdl_launch`)."""
    from ....formats.schemes import SCHEMES
    from ..common.codes import is_gated

    if schemes is None:
        schemes = list(SCHEMES.values())
    out, seen = [], set()
    for sch in schemes:
        for dt in dtypes:
            # each tile as the provider launches it: plain, PDL (pdl_launch) or looping over its tiles (never PDL)
            for t in [dict(t, tile_loop=True) if loop else dict(t, pdl=pdl)
                      for t in (list(tiles) if tiles is not None else model_tiles(sch)) for loop in loops
                      for pdl in ((False,) if loop else (False, True))]:
                for act in activations:
                    for fin in finalizes:
                        for bias in biases:
                            for cfg in gemm_configs(sch, dt, act, is_gated("gate_up", act), fin, t, bias):
                                spec = spec_for(cfg)
                                if spec not in seen:
                                    seen.add(spec)
                                    out.append(spec)
    return out


def aot_variants(subset: str) -> list:
    """Specs of an AOT subset: ``"smoke"`` (int4_g32 + int4_g128, BF16, SwiGLU, both finalize modes, every
    bucket and :data:`MODEL_TILES`: 30 kernels) or ``"full"`` (every scheme incl. NVFP4/MXFP4, dtype, activation,
    finalize, bucket, the INT4 schemes' :data:`MODEL_TILES`,
    plus the gpt-oss experts' kernels: the SM90 family's :data:`~..sm90.family.GPT_OSS` set on every bucket)."""
    from ....formats.schemes import get_scheme
    from ..sm90.family import GPT_OSS

    if subset == "full":
        base = variants()
        seen = set(base)
        g = GPT_OSS
        oss = variants(schemes=[get_scheme(g["scheme"])], dtypes=g["dtypes"], activations=g["activations"],
                       biases=g["biases"])
        return base + [s for s in oss if s not in seen]
    if subset == "smoke":
        return variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16",),
                        activations=("swiglu",))
    raise ValueError(f"subset: expected smoke or full, got {subset!r}")


class WarpFamily:
    """The portable warp-MMA family as :class:`~w4a16_moe.kernels.cute.registry.KernelFamily`."""

    name = "warp"
    spec_family = FAMILY
    archs = ARCHS
    role = "grouped"
    beside = None
    compile_fn = f"{__name__}:_compile"
    sources = ("w4a16_moe.kernels.cute.warp.grouped_gemm", "w4a16_moe.kernels.cute.warp.config",
               "w4a16_moe.kernels.cute.common.ptx", "w4a16_moe.kernels.cute.common.codes",
               "w4a16_moe.kernels.cute.common.epilogue", "w4a16_moe.kernels.cute.common.grid")
    sass_expect = ("HMMA",)
    sass_allow_local = ()
    sass_local_budget = ()
    sass_serial_ok = ()
    max_grid_y = MAX_GRID_Y

    def __repr__(self) -> str:
        return "KernelFamily(warp)"

    def config_type(self) -> type:
        from .config import WarpGemmConfig

        return WarpGemmConfig

    def supports(self, capability, arch) -> Optional[str]:
        if arch not in self.archs:
            return f"no CuTe kernel family for {arch} (the warp-MMA family is built for {', '.join(self.archs)})"
        return None

    def can_implement(self, call) -> Optional[str]:
        from ..registry import shape_reason

        return shape_reason(call, bias=True, swiglu_oai=True)  # biases and swiglu_oai (any alpha / limit)

    def configs(self, scheme, dtype, activation, gated, finalize, tiles, bias=False):
        return gemm_configs(scheme, dtype, activation, gated, finalize, tiles, bias)

    def select_tiles(self, num_routes, num_experts, top_k=None, global_experts=None) -> dict:
        return select_tiles(num_routes, num_experts, top_k, global_experts)

    def choose(self, tokens, top_k, num_experts, hidden, intermediate, scheme, dtype, gpu, global_experts=None,
               gated=True, sm_count=None) -> tuple:
        return self.name, select_tiles(tokens * top_k, num_experts, top_k, global_experts), None

    def num_splits(self, n, k, cfg, num_routes, num_experts, sm_count, top_k=None, global_experts=None,
                   arch=None) -> int:
        return num_splits(n, k, cfg, num_routes, num_experts, sm_count, top_k, global_experts, arch)

    def spec_for(self, cfg):
        return spec_for(cfg)

    def aot_variants(self, subset):
        return aot_variants(subset)

    def layout_key(self, which, cfg, dtype) -> str:
        return f"cute-warp:{which}:w{cfg.warps}:m{cfg.m16_per_warp}:k{cfg.k_tile}:{dtype}"

    def pack(self, qm, cfg, dtype, interleave):
        from .pack import layout_for, pack_warp

        return pack_warp(qm, **layout_for(cfg), compute_dtype=dtype, interleave_gate_up=interleave)

    def rows_per_cta(self, cfg) -> int:
        return cfg.rows_per_cta


DESCRIPTOR = WarpFamily()

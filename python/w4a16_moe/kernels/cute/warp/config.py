"""Static configuration of one portable warp-MMA (``mma.sync``) W4A16 grouped-GEMM kernel (no CuTe DSL import).

Kept apart from the kernel module so that selecting kernels and looking up prebuilt ones at run time never
imports ``cutlass`` (a prebuilt wheel runs without the DSL). The kernel itself is
:mod:`.grouped_gemm`; the packed weight layout it reads is :mod:`.pack`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.codes import act_tag, is_gated, resolve_epilogue

__all__ = ["WarpGemmConfig", "KINDS", "e2m1_prmt_tables", "STREAM_MAX_K_TILES", "STREAM_CTAS", "stream_row_blocks"]

KINDS = ("int4", "nvfp4", "mxfp4")

#: Row-block streaming (``row_blocks > 1``): a launch streams several row blocks per CTA only when its reduction
#: is at most this many K tiles (a short-K down GEMM: every CTA of a one-row-block grid spends most of its life
#: waiting for its first loads and storing its tile) and it runs without split-K ...
STREAM_MAX_K_TILES = 4
#: ... and then as many row blocks per CTA as keep about this many CTAs in the grid (row blocks x the launch's
#: token-tile bound ``max_tiles``, which over-counts the tiles that run), at most ``row_blocks``. H200,
#: docs/perf/2026-12-01-row-streaming: Kimi-K2 TP8 shape (56 row blocks, K = 256) at 512 tokens, TN 16: down GEMM
#: 173.8 us with one row block per CTA, 148.1 / 130.5 / 125.9 with 2 / 4 / 8; small grids lose with streaming
#: (`64,4096,256,8` at 64 tokens: 16.0 us unstreamed, 19.1 at 3 row blocks per CTA), which this target keeps unstreamed
STREAM_CTAS = 3072


def stream_row_blocks(cfg, n: int, k: int, max_tiles: int, num_splits: int) -> int:
    """Row blocks per CTA of a launch of ``cfg`` (``n`` weight rows, reduction ``k``): the kernel's run-time rule,
    mirrored on the host. 1 unless the kernel streams (:attr:`WarpGemmConfig.streams`), ``k / k_tile <=``
    :data:`STREAM_MAX_K_TILES` and ``num_splits == 1``; else ``clamp(n / rows_per_cta * max_tiles //``
    :data:`STREAM_CTAS` ``, 1, row_blocks)``."""
    if not cfg.streams or k // cfg.k_tile > STREAM_MAX_K_TILES or num_splits > 1:
        return 1
    return max(1, min((n // cfg.rows_per_cta) * max_tiles // STREAM_CTAS, cfg.row_blocks))


def e2m1_prmt_tables(is_bf16: bool) -> tuple:
    """``((H0, H1), (L0, L1))``: the high and low bytes of the 16-bit patterns (bf16 or fp16) of the E2M1
    magnitudes ``{0, .5, 1, 1.5, 2, 3, 4, 6}`` (code & 7), as two 8-byte ``prmt`` tables (byte ``j`` of the
    pair ``(X0, X1)`` = entry ``j``). fp16 patterns have all-zero low bytes (the kernel then skips ``L``)."""
    import struct

    vals = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    if is_bf16:
        bits = [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in vals]
    else:
        bits = [struct.unpack("<H", struct.pack("<e", v))[0] for v in vals]

    def words(t):
        return (t[0] | t[1] << 8 | t[2] << 16 | t[3] << 24, t[4] | t[5] << 8 | t[6] << 16 | t[7] << 24)

    return words([b >> 8 for b in bits]), words([b & 0xFF for b in bits])


@dataclass(frozen=True)
class WarpGemmConfig:
    """Static configuration of one compiled warp-MMA kernel (every field shapes the generated code).

    Tile: a CTA of ``warps`` warps computes ``rows_per_cta = 16 * m16_per_warp * warps`` weight rows
    (``mma.sync`` M) x ``tokens_per_tile`` routed tokens (``mma.sync`` N, multiple of 8), streaming K in
    ``k_tile`` steps through a ``stages``-deep ``cp.async`` ring.
    """

    mode: str = "gate_up"  # "gate_up" | "down"
    dtype: str = "bf16"  # activation / compute dtype: "bf16" | "fp16"
    kind: str = "int4"  # weight code kind: "int4" | "nvfp4" | "mxfp4"
    group: int = 32  # scale group along K; 0 = per channel (any group >= k_tile behaves the same)
    zero_point: bool = False  # int4 only
    warps: int = 4  # warps per CTA (each owns 16 * m16_per_warp weight rows)
    m16_per_warp: int = 2  # m16 blocks per warp
    tokens_per_tile: int = 8  # TN: tokens per tile, multiple of 8 in [8, 128]
    k_tile: int = 128  # BK: K per pipeline stage, multiple of 64
    stages: int = 4
    activation: str = "swiglu"  # gate_up only: a canonical activation name ("swiglu_oai(alpha=A,limit=L)" too)
    # per-expert FP32 bias added in the epilogue (gate_up: w13 bias before the activation; down: the "y"
    # epilogue only), read from the launch ABI's topk_weights slot (see common.epilogue)
    bias: bool = False
    epilogue: str = "auto"  # gate_up: "h"; down: "y" | "atomic_f32"
    evict_first: bool = True  # L2 evict-first cache hint on the streamed weights
    min_ctas_per_sm: int = 1  # > 1: ptxas caps registers so that this many CTAs fit on an SM
    # row-block streaming: a CTA of a short-K launch runs up to this many consecutive row blocks of its token
    # tile as one weight stream (1 = off; the run-time rule is the kernel module's ``stream_row_blocks``)
    row_blocks: int = 8
    # INT4: apply the scales to FP32 partial sums of each scale group instead of to every decoded weight pair
    # where that saves packed multiplies (``scales_in_acc``: groups of >= 64 and few token columns)
    acc_scales: bool = True
    # the launch's grid y may be smaller than the token-tile bound: each CTA loops over tiles y, y + gridDim.y, ...
    # below block_start[E] (the host sizes the grid from the expected tiles, see tiles.loop_grid)
    tile_loop: bool = False
    # programmatic dependent launch (SM90 and later; ignored by the sm_80-89 builds): gate/up waits for the route
    # preparation before reading the routing tables, then lets the down kernel launch; down lets the finalize
    # launch at once and streams its first weight stages before it waits for h
    pdl: bool = False
    # TN 16-32: the K loop is built twice, for all TN / 8 token blocks of 8 and for the first ceil(TN / 16) of them,
    # and a tile with at most 8 * ceil(TN / 16) routes runs the second (half the MMAs, ldmatrix loads and
    # activation copies; see ``occupancy_levels``)
    occupancy: bool = False

    @property
    def occupancy_levels(self) -> tuple:
        """The n8 token blocks each build of the K loop computes, ascending: ``(ceil(TN / 16), TN / 8)`` with
        ``occupancy`` (TN 16: 1 / 2, TN 24: 2 / 3, TN 32: 2 / 4), else ``(TN / 8,)``. A tile runs the first level
        that holds its routes."""
        nb8 = self.tokens_per_tile // 8
        if not self.occupancy:
            return (nb8,)
        return ((nb8 + 1) // 2, nb8)

    @property
    def gated(self) -> bool:
        return is_gated(self.mode, self.activation)

    @property
    def epi(self) -> str:
        return resolve_epilogue(self.mode, self.epilogue)

    @property
    def rows_per_cta(self) -> int:
        """Weight rows per CTA (grid x = N / rows_per_cta)."""
        return 16 * self.m16_per_warp * self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def stage_sizes(self) -> dict:
        """Bytes of one pipeline stage's parts and of the epilogue staging tile: ``code``, ``scale`` and ``bias``
        (zero-point biases) of the weight chunk, ``chunk`` (their sum), ``w_stage`` (the chunk padded to 128),
        ``b_stage`` (the activation tile), ``stage`` and ``epi`` (``TN x (rows + 4)`` FP32)."""
        rb, bk, g = self.rows_per_cta, self.k_tile, self.group
        gpt = (bk // g) if (g and g <= bk) else 1
        code, scale = rb * bk // 2, rb * gpt * 2
        bias = scale if self.zero_point else 0
        chunk = code + scale + bias
        w_stage = -(-chunk // 128) * 128
        b_stage = self.tokens_per_tile * bk * 2
        epi = self.tokens_per_tile * (rb + 4) * 4
        stage = w_stage + b_stage
        if self._streams(stage, epi):
            stage = max(stage, epi)  # pads TN 32 stages by 256 bytes
        return dict(code=code, scale=scale, bias=bias, chunk=chunk, w_stage=w_stage, b_stage=b_stage,
                    stage=stage, epi=epi)

    def _streams(self, stage: int, epi: int) -> bool:
        return self.row_blocks > 1 and 8 * epi <= 9 * stage

    @property
    def scales_in_acc(self) -> bool:
        """Whether the kernel scales FP32 partial sums per scale group (``acc_scales``, INT4): a K tile then saves
        the ``4 * k_tile / 16`` packed scale multiplies of each thread's m16 block and costs ``groups * (4 *
        TN / 8 + 2)`` FP32 multiply-adds and conversions; used where that saves at least 12 (group >= 128 up to
        TN 32, group 64 up to TN 16, never group 32 or FP4)."""
        if not self.acc_scales or self.kind != "int4":
            return False
        kb = self.k_tile // 16
        groups = (self.k_tile // self.group) if (self.group and self.group <= self.k_tile) else 1
        return 4 * kb - groups * (4 * (self.tokens_per_tile // 8) + 2) >= 12

    @property
    def streams(self) -> bool:
        """Whether the kernel can stream several row blocks per CTA: ``row_blocks > 1`` and a finished row block's
        staging tile fits the ring stage it was consumed from (stages are padded by up to 1/8 for it)."""
        sz = self.stage_sizes
        return self._streams(sz["w_stage"] + sz["b_stage"], sz["epi"])

    def ws_floats(self, n: int, max_tiles: int, num_splits: int) -> int:
        """FP32 elements of the split-K workspace ``ws`` a launch needs (0 when ``num_splits == 1``)."""
        if num_splits <= 1:
            return 0
        return (n // self.rows_per_cta) * max_tiles * num_splits * self.tokens_per_tile * self.rows_per_cta

    def counters_len(self, n: int, max_tiles: int) -> int:
        """int32 elements of the split-K ``counters`` (zeroed once at allocation; the kernel re-arms them)."""
        return (n // self.rows_per_cta) * max_tiles

    def name(self) -> str:
        g = "ch" if self.group == 0 else str(self.group)
        act = ("_" + act_tag(self.activation)) if self.mode == "gate_up" else ""
        act += "_bias" if self.bias else ""
        zp = "zp" if self.zero_point else ""
        kind = "" if self.kind == "int4" else f"_{self.kind}"
        extra = ("" if self.evict_first else "_noef") + (f"_o{self.min_ctas_per_sm}" if self.min_ctas_per_sm > 1 else "")
        extra += f"_r{self.row_blocks}" if self.row_blocks != 8 else ""
        extra += "" if self.acc_scales else "_sw"
        extra += "_tl" if self.tile_loop else ""
        extra += "_pdl" if self.pdl else ""
        extra += "_occ" if self.occupancy else ""
        return (
            f"warp_{self.mode}_{self.dtype}{kind}_g{g}{zp}_w{self.warps}m{self.m16_per_warp}_t{self.tokens_per_tile}"
            f"_k{self.k_tile}_s{self.stages}_{self.epi}{act}{extra}"
        )

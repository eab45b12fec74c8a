"""Portable warp-MMA (``mma.sync``) CuTe DSL grouped GEMM of the fused W4A16 MoE (sm_80 .. sm_120a).

Same call ABI and routing contract as :class:`..sm90.grouped_gemm.Sm90W4A16GroupedGemm`, but built only on
instructions every arch from Ampere on has: ``mma.sync.aligned.m16n8k16`` (bf16/f16 in, FP32 accumulate),
``ldmatrix``, 16-byte ``cp.async`` (with an L2 evict-first cache hint) and packed ``fma.rn.{bf16,f16}x2``.
The same source compiles for sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_103a, sm_120a (see
:mod:`.family`); only the ``atomic_f32`` epilogue differs (``red.global.add.v4.f32`` from sm_90 on,
scalar ``red.global.add.f32`` before).

Formulation (swap-AB, Marlin-style): ``D^T[N, M] = W[N, K] . X^T[K, M]``. Weight rows are the MMA ``M``
(operand A: 16 rows per instruction, INT4/FP4 dequantized in registers, never stored dequantized), routed
tokens the MMA ``N`` (operand B: 8 per instruction, gathered activation rows in shared memory). FP32
accumulation.

Tile and threads
----------------
CTA = ``W`` warps (``cfg.warps``, ``32 W`` threads). Warp ``w`` owns ``MW`` (``cfg.m16_per_warp``) m16 blocks
(weight rows ``16 (w MW + m) .. + 15`` of the CTA's row block of ``RB = 16 MW W`` rows) and all ``TN``
(``cfg.tokens_per_tile``) tokens of the tile: ``MW * TN/8`` accumulator fragments of 4 FP32 per lane.
No reduction between warps.

Shared memory per pipeline stage (``S = cfg.stages`` stages)::

    [ weight chunk (CHUNK bytes, padded to 128) | activation tile TN x BK bf16/f16 ]

* the weight chunk is the packed chunk of :mod:`.pack` (codes, then scales, then zero-point biases),
  copied verbatim: every thread issues 16-byte ``cp.async.cg ... L2::cache_hint`` (evict-first) pieces
  ``t, t + 32W, ...``; lane ``l`` of warp ``w`` then reads its code words of m16 block ``mb = w MW + m``
  and k64 sub-tile ``c`` with one ``ld.shared.v4`` at ``((mb * BK/64 + c) * 32 + l) * 16`` (conflict
  free) and its ``GPT`` scale words (pairs for rows ``l//4`` and ``l//4 + 8``) at
  ``CODE + ((mb * 8 + l//4) * GPT) * 4``.
* the activation tile: row ``r`` (token ``r`` of the tile) = ``BK`` values of x (gate_up: row
  ``sorted_routes[slot] // top_k``) or h (down: row ``slot``), 16-byte chunk ``c`` stored at
  ``r * 2BK + ((c ^ (r % 8)) * 16)`` (XOR swizzle: ``ldmatrix`` is conflict free). Thread ``t`` copies
  chunk ``t % (BK/8)`` of rows ``t // (BK/8) + j * (32W / (BK/8))``. Rows past the tile's ``count`` tokens
  repeat the last valid row (their results are never stored).

Fragments (PTX ISA, m16n8k16): A (weights) as in :mod:`.pack`; B: ``ldmatrix.x4`` with lanes
``8q .. 8q+7`` addressing tokens ``8 nb + (l % 8)`` at 16-byte chunk ``2 kb + q`` (``q = 0..3``) returns
``b0, b1`` of k16 steps ``kb`` and ``kb + 1`` of n8 block ``nb``; C/D: ``c0, c1`` = (row ``l//4``, tokens
``2 (l%4) + {0, 1}``), ``c2, c3`` = row ``l//4 + 8``.

Dequantization per A register ``a_i`` (``x = word >> 4i``): INT4 ``lop3(x & 0x000F000F | magic)``,
``fma(t, 1.0, bias)`` (bias ``-(magic + 8)`` or the stored ``-(magic + zero)``: exact), then either
``fma(t, scale, -0.0)`` (one rounding to bf16/f16: the same operand values as the SM90 kernel), or, where
:attr:`.config.WarpGemmConfig.scales_in_acc` (INT4, groups >= 64, up to TN 32 / 16), nothing: the MMAs of
one scale group accumulate the exact integers ``q - 8`` / ``q - zero`` times the activations into FP32 partial
sums (started from zero), which then join the accumulators as ``acc += scale * partial`` with the row's FP32
scale. Per K tile of 128 and m16 block a thread then runs 32 packed multiplies fewer and ``groups * 4 * TN/8``
FP32 multiply-adds more (W1-type down GEMM, TN 16: 48 of ~300 instructions per K tile fewer), and the products
are exact before one FP32 scaling (more accurate than rounding every weight to bf16). FP4 (E2M1): the
magnitude is looked up with ``prmt`` from the exact 16-bit patterns of ``{0, .5, 1, 1.5, 2, 3, 4, 6}``
(two byte tables: high and low bytes), the sign is OR-ed in, then the same scale FMA (E2M1 x E4M3/E8M0
products are exact). NVFP4's FP32 per-row global scale multiplies the FP32 accumulators in the epilogue.

Pipeline (per CTA, ``cp.async`` groups, one ``bar.sync`` per K tile)::

    prologue: for s in 0 .. S-2: issue(s) if s < nk; commit
    for it in 0 .. nk-1:
        cp.async.wait_group(S - 2)      # this thread's copies of tile `it` landed
        bar.sync                        # everyone's landed; everyone finished computing tile it-1
        issue(it + S - 1) into stage (it - 1) % S if it + S - 1 < nk; commit
        compute(stage it % S)           # LDS codes/scales, per k32: ldmatrix.x4 per n8 block, decode,
                                        # mma.sync per (m16 block, n8 block, k16)
    cp.async.wait_group(0); bar.sync    # the ring is reused as the epilogue staging tile

Row-block streaming (static ``cfg.row_blocks > 1`` where a finished row block's staging tile fits one ring
stage, :attr:`.config.WarpGemmConfig.streams`; run-time ``rbc`` row blocks per CTA by the rule of
:func:`.config.stream_row_blocks`: short K, no split-K, a large grid): CTA ``x`` runs row blocks ``x * rbc ..``
(grid x = ``cdiv(N / RB, rbc)``, the last CTA of a tile may get fewer) as one sequence of ``rbc * nk`` stages
(stage ``q`` = weight chunk ``q`` of the pack, which stores an expert's row blocks one after the other, with the
activations of K tile ``q % nk``). After the last K tile of a row block that is not the CTA's last, all threads
synchronize, stage the accumulators in the ring stage just consumed (the next ``cp.async`` into it is issued
after the next iteration's barrier), store the row block and clear the accumulators while the next row block's
first stages are in flight; the CTA's last row block ends as above. For a K = 256 down GEMM a one-row-block CTA
streams only two stages and spends most of its life on its expert search, first loads and stores.

Occupancy (static ``cfg.occupancy``, TN 16-32; :attr:`.config.WarpGemmConfig.occupancy_levels`): the K loop is built
twice, for all ``TN / 8`` token blocks of 8 and for the first ``lo = ceil(TN / 16)``; a tile with at most ``8 lo``
routes (``count``, uniform over the CTA: one branch before the loop) runs the second, which copies, loads
(``ldmatrix``) and multiplies only those rows; the other accumulators stay zero and their rows are never stored. A
TN 16 tile of an expert with 1-8 routes then does the MMA work of a TN 8 tile (at the TN 16 kernel's registers),
while an expert with 9-16 routes still streams its weights once. The occupied blocks run the same MMAs in the same
order as without ``occupancy`` (bit-identical results).

Epilogue (all threads): FP32 accumulators -> shared staging ``[TN][RB + 4]`` (conflict-free ``st.shared``)
-> optional split-K fixup -> (NVFP4 global scale) -> activation (gate and up columns ``j`` and ``RB/2 + j``
of a staging row) -> 16-byte coalesced stores of 8 outputs, or FP32 reductions (``atomic_f32``). Everything
after the staging tile is :mod:`..common.epilogue` (shared with the SM90 kernel).

Split-K (runtime ``num_splits > 1``, grid z): every split stores its FP32 partial tile (rows ``< count``)
to ``ws``, then bumps a per-tile counter; the last split to arrive sums all partials in fixed split order
``0..S-1`` (bit-identical results whatever the arrival order) and runs the epilogue; it re-arms the counter
to 0 (``counters`` zeroed once at allocation). ``ws`` holds ``(N/RB) * max_tiles * num_splits * TN * RB``
FP32 (``WarpGemmConfig.ws_floats``), ``counters`` ``(N/RB) * max_tiles`` int32.

Routing contract (identical to the SM90 kernel): ``sorted_routes`` int32 ``[R]`` route ids
``token * top_k + j`` grouped by local expert; ``route_start`` int32 ``[E+1]``; ``block_start`` int32
``[E+1]`` = exclusive cumsum of ``cdiv(count_e, TN)`` with this kernel's ``TN``. Grid = ``(N / RB,
max_tiles, num_splits)``; CTA ``(nb, tile, s)`` finds its expert ``e`` with ``block_start[e] <= tile <
block_start[e+1]`` (searched by all threads in parallel); CTAs with ``tile >= block_start[E]`` exit (grid x is
``cdiv(N / RB, rbc)`` when streaming).

Modes (static): ``gate_up``: B rows ``x[sorted_routes[slot] // top_k]``, ``h[slot, :]`` ([R, I], x's dtype)
= act(gate) * up for swiglu/geglu (interleaved w13 pack) or act(h) for relu2/silu; ``down``: B rows
``h[slot]``, epilogue ``y`` (``y[sorted_routes[slot], :]`` in x's dtype) or ``atomic_f32``
(``out[token, :] += topk_weights[route] * y``, FP32 reductions into an FP32 ``out``).

Constraints: every size is a runtime ``Int32`` (one compiled kernel serves every token count and every
E/N/K) with ``N % RB == 0`` (gated gate_up: ``(N/2) % (RB/2) == 0``), ``K % BK == 0``, group and BK
dividing one another; pointers 16-byte aligned; ``act`` rows contiguous (row stride K); ``out`` rows
contiguous (stride I for h, N for y / out).

Resources (DSL 4.8.1, 128 threads, ``ptxas --minnctapersm 1``, see :data:`PTXAS_MIN_CTAS`): INT4 TN=8
~78-90 registers, TN=16 ~94-118, TN=32 ~126-160, TN=64 ~164-168, FP4 TN=8 ~110-122; all 432 variants of
the family have zero local memory on sm_90a and sm_120a (70-168 registers); 42-74 KB of dynamic shared memory (every variant of :mod:`.family` fits the 99 KB of sm_86/89/120). Per K tile of
128 and m16 block: 8 code-word LDS (2 x v4), 2-8 scale words, 4 LDSM.x4 per n8 block, 8 HMMA per n8 block.

Verification status: the index mappings are checked on the CPU by ``tests/test_warp_pack.py`` (bit-exact
fragment recipe, FP4 ``prmt`` decode, a torch emulation of one CTA); GPU correctness only where the lead
runs ``tests/test_warp_kernel.py`` (H200, sm_90a). The sm_80/86/89/100a/103a/120a builds are
compile-verified (SASS checked: HMMA present, no local memory), not run.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..common import ptx
from ..common.codes import (INT4_MAGIC, INT4_SYM_BIAS, NEG_ZERO_X2, ONE_X2, check_activation, check_bias,
                            check_epilogue, check_mode_dtype)
from ..common.epilogue import EpilogueShape, finish_store, publish_split
from ..common.grid import fake_launch_args, occupancy_kwargs, split_k_range, tile_expert
from .config import STREAM_CTAS, STREAM_MAX_K_TILES, WarpGemmConfig, e2m1_prmt_tables

__all__ = ["WarpW4A16GroupedGemm", "WarpGemmConfig", "smem_limit", "arch_major"]

# largest dynamic shared memory per block (bytes) the DSL may ask for on each arch
_SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024,
               103: 227 * 1024, 110: 227 * 1024, 120: 99 * 1024, 121: 99 * 1024}


#: Without launch bounds ptxas's register heuristic spills a few loop invariants to local memory in some
#: low-pressure variants (8-16 byte stack at 56-80 registers: sm_120a t8/g128, sm_90a t16/g128 down, ...).
#: ``--minnctapersm 1`` (the launch-bounds register model with no occupancy demand) gives every variant of
#: the family zero local memory on every arch (checked: smoke set + FP4 on sm_80/90a/100a/120a), at a few
#: more registers. Kernels with ``min_ctas_per_sm > 1`` carry their own ``.minnctapersm``.
PTXAS_MIN_CTAS = "--ptxas-options='--minnctapersm 1'"


def arch_major(arch: str) -> int:
    """``"sm_90a"`` -> 90."""
    digits = "".join(ch for ch in arch.split("_", 1)[1] if ch.isdigit())
    return int(digits)


def smem_limit(arch: str) -> int:
    return _SMEM_LIMIT.get(arch_major(arch), 99 * 1024)


# ------------------------------------------------------------------------------------------------------------

@dsl_user_op
def _opaque_i32(v, *, loc=None, ip=None) -> Int32:
    """``v`` through a volatile ``mov``: the compiler cannot hoist what derives from it out of the tile loop (an
    invariant hoisted out of the loop body stays live, in registers, across the whole mainloop)."""
    r = llvm.inline_asm(T.i32(), [Int32(v).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)

class WarpW4A16GroupedGemm:
    """One warp-MMA W4A16 grouped-GEMM kernel (static config in ``__init__``; see the module docstring).

    ``__call__(w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
    num_experts, n, k, num_routes, top_k, max_tiles, num_splits, stream)``: exactly the SM90 kernel's
    parameters. ``w`` packed weights (uint8, :func:`.pack.pack_warp`); ``act`` B source (x for gate_up,
    h for down); ``out`` h / y / FP32 out; ``topk_weights`` FP32 ``[T*top_k]`` (``atomic_f32`` only; with
    ``cfg.bias`` the FP32 bias table ``[E, n]``, :mod:`..common.epilogue`); ``ws``
    FP32 / ``counters`` int32 split-K scratch (read only when ``num_splits > 1``); ``n`` weight rows (2I / I /
    H); ``k`` the reduction size; ``num_routes`` the route capacity (``T*top_k``).
    """

    def __init__(self, cfg: WarpGemmConfig, arch: str = "sm_90a"):
        c = cfg
        check_mode_dtype(c.mode, c.dtype)
        if c.kind not in ("int4", "nvfp4", "mxfp4"):
            raise ValueError(f"kind {c.kind!r}")
        if c.kind != "int4" and (c.zero_point or c.group != {"nvfp4": 16, "mxfp4": 32}[c.kind]):
            raise ValueError(f"{c.kind}: group must be {16 if c.kind == 'nvfp4' else 32} and no zero point")
        if c.k_tile not in (64, 128, 256):
            raise ValueError("k_tile must be 64, 128 or 256")
        if c.tokens_per_tile % 8 or not 8 <= c.tokens_per_tile <= 128:
            raise ValueError("tokens_per_tile must be a multiple of 8 in [8, 128]")
        if c.warps not in (1, 2, 4, 8) or c.m16_per_warp not in (1, 2, 3, 4):
            raise ValueError("warps must be 1, 2, 4 or 8 and m16_per_warp 1..4")
        if c.group and c.group not in (16, 32, 64, 128, 256, 512, 1024):
            raise ValueError(f"group {c.group}")
        if c.gated and c.rows_per_cta % 32:
            raise ValueError("gated gate_up needs rows_per_cta % 32 == 0")
        epi = c.epi
        check_epilogue(c.mode, epi)
        check_activation(c.mode, c.activation)
        check_bias(c.mode, epi, c.bias)
        if (32 * c.warps) % (c.k_tile // 8):
            raise ValueError("32 * warps must be a multiple of k_tile / 8 (activation copy mapping)")
        if c.stages < 2:
            raise ValueError("stages must be >= 2")
        if not 1 <= c.row_blocks <= 64:
            raise ValueError("row_blocks must be in [1, 64]")
        if c.occupancy and not 16 <= c.tokens_per_tile <= 32:
            raise ValueError("occupancy needs tokens_per_tile in 16..32 (two builds of the K loop)")
        self.cfg = c
        self.is_bf16 = c.dtype == "bf16"
        self.W, self.MW, self.TN, self.BK, self.S = c.warps, c.m16_per_warp, c.tokens_per_tile, c.k_tile, c.stages
        self.T = 32 * self.W
        self.RB = c.rows_per_cta
        self.NB8 = self.TN // 8
        self.C = self.BK // 64
        self.KB = self.BK // 16
        g = c.group
        self.gpt = (self.BK // g) if (g and g <= self.BK) else 1
        sz = c.stage_sizes
        self.code_bytes, self.scale_bytes, self.bias_bytes = sz["code"], sz["scale"], sz["bias"]
        self.chunk, self.w_stage, self.b_stage, self.stage_bytes = sz["chunk"], sz["w_stage"], sz["b_stage"], sz["stage"]
        self.cols = self.RB
        self.rs = self.cols + 4  # padded FP32 staging row stride: conflict-free accumulator writes
        self.epi_bytes = sz["epi"]
        self.region = max(self.S * self.stage_bytes, self.epi_bytes)
        self.smem_bytes = self.region + 16
        # row-block streaming stages a finished row block's accumulators in the ring stage it just consumed
        self.stream = c.streams
        # INT4 scales applied to FP32 partial sums per scale group (cfg.scales_in_acc) instead of to the weights
        self.acc_scale = c.scales_in_acc
        self.magic = INT4_MAGIC[c.dtype]
        self.sym_bias = INT4_SYM_BIAS[c.dtype]  # -(magic + 8) in both halves
        self.one2 = ONE_X2[c.dtype]
        self.neg0 = ptx.signed32(NEG_ZERO_X2)
        self._set_arch(arch)

    def _set_arch(self, arch: str) -> None:
        self.arch = arch
        # griddepcontrol exists from sm_90 on: older builds of a ``pdl`` config are the plain kernel
        self.use_pdl = self.cfg.pdl and arch_major(arch) >= 90
        self.pdl_prefetch = self.use_pdl and self.cfg.mode == "down" and not self.cfg.tile_loop
        self.epi_shape = EpilogueShape(tokens=self.TN, cols=self.cols, threads=self.T, mode=self.cfg.mode,
                                       epi=self.cfg.epi, activation=self.cfg.activation, gated=self.cfg.gated,
                                       is_bf16=self.is_bf16, vec_red=arch_major(arch) >= 90,
                                       global_scale=self.cfg.kind == "nvfp4", bias=self.cfg.bias)
        self._check_smem(arch)

    def _check_smem(self, arch: str) -> None:
        if self.smem_bytes > smem_limit(arch):
            raise ValueError(f"{self.cfg.name()}: needs {self.smem_bytes} bytes of shared memory, {arch} allows "
                             f"{smem_limit(arch)}")

    # ------------------------------------------------------------------------------------------------------
    def fake_args(self) -> list:
        """Compile-time stand-ins for ``__call__``'s arguments (null pointers with their alignment, Int32
        sizes, a fake stream): one compile serves every size."""
        ab = cutlass.BFloat16 if self.is_bf16 else cutlass.Float16
        return fake_launch_args(ab, Float32 if self.cfg.epi == "atomic_f32" else ab)

    def compile(self, arch: str = "sm_90a"):
        """Cross-compile for ``arch`` (no GPU needed); export with ``compiled.export_to_c(dir, name, prefix)``."""
        self._set_arch(arch)
        extra = PTXAS_MIN_CTAS if self.cfg.min_ctas_per_sm <= 1 else ""
        return cute.compile(self, *self.fake_args(), options=f"--gpu-arch {arch} {extra}")

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        w: cute.Pointer,
        act: cute.Pointer,
        out: cute.Pointer,
        sorted_routes: cute.Pointer,
        route_start: cute.Pointer,
        block_start: cute.Pointer,
        topk_weights: cute.Pointer,
        ws: cute.Pointer,
        counters: cute.Pointer,
        num_experts: Int32,
        n: Int32,
        k: Int32,
        num_routes: Int32,
        top_k: Int32,
        max_tiles: Int32,
        num_splits: Int32,
        stream: cuda.CUstream,
    ):
        @cute.struct
        class Storage:
            misc: cute.struct.MemRange[Int32, 4]
            buf: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.region], 128]

        self.storage_cls = Storage
        nbc = n // self.RB
        rbc = self._row_blocks(nbc, k, max_tiles, num_splits)
        self.kernel(
            w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
            num_experts, n, k, num_routes, top_k, num_splits,
        ).launch(
            grid=[(nbc + rbc - 1) // rbc, max_tiles, num_splits],
            block=[self.T, 1, 1],
            stream=stream,
            use_pdl=self.use_pdl,
            **occupancy_kwargs(self.cfg.min_ctas_per_sm),
        )

    def _row_blocks(self, nbc, k, max_tiles, num_splits):
        """Row blocks per CTA (run-time ``Int32``; the rule of :func:`.config.stream_row_blocks`, branch-free)."""
        if const_expr(not self.stream):
            return Int32(1)
        want = cutlass.max(cutlass.min(nbc * max_tiles // STREAM_CTAS, self.cfg.row_blocks), 1)
        short = cutlass.min(cutlass.max(STREAM_MAX_K_TILES + 1 - k // self.BK, 0), 1)  # 1: k_tiles <= max
        unsplit = cutlass.min(cutlass.max(2 - num_splits, 0), 1)  # 1: num_splits == 1
        return 1 + (want - 1) * short * unsplit

    # ------------------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        w: cute.Pointer,
        act: cute.Pointer,
        out: cute.Pointer,
        sorted_routes: cute.Pointer,
        route_start: cute.Pointer,
        block_start: cute.Pointer,
        topk_weights: cute.Pointer,
        ws: cute.Pointer,
        counters: cute.Pointer,
        num_experts: Int32,
        n: Int32,
        k: Int32,
        num_routes: Int32,
        top_k: Int32,
        num_splits: Int32,
    ):
        TN, BK, T = self.TN, self.BK, self.T
        tidx, _, _ = cute.arch.thread_idx()
        nb, tile, split = cute.arch.block_idx()
        g_bs = cute.make_tensor(block_start, cute.make_layout(num_experts + 1))
        g_rs = cute.make_tensor(route_start, cute.make_layout(num_experts + 1))
        g_routes = cute.make_tensor(sorted_routes, cute.make_layout(num_routes))

        if const_expr(self.use_pdl and self.cfg.mode == "down"):
            # every CTA of this grid has started: the finalize (launched with PDL) may take the SMs this grid's
            # last CTAs free, and waits there for the whole grid before reading y
            cute.arch.griddepcontrol_launch_dependents()
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        misc_addr = st.misc.data_ptr().toint()
        buf = st.buf.data_ptr().toint()
        if const_expr(self.use_pdl and self.cfg.mode == "gate_up"):
            # the route preparation may still run: its tables are complete and visible once the wait returns.
            # Only then may the down kernel start (it reads the routing tables before its own wait)
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        if const_expr(self.use_pdl and self.cfg.mode == "down" and self.cfg.tile_loop):
            cute.arch.griddepcontrol_wait()  # the loop kernels wait before their first tile (no prefetch)
        e = Int32(-1)
        if const_expr(not self.cfg.tile_loop):
            if tidx == 0:
                ptx.st_shared_b32(misc_addr, -1)
            cute.arch.sync_threads()
            # the expert owning this tile: block_start[e] <= tile < block_start[e + 1] (parallel search)
            e = tile_expert(g_bs, tile, num_experts, tidx, T, misc_addr)
        nb_count = n // self.RB
        # row blocks nb0 .. nb0 + nrb - 1 (streaming: rbc per CTA, the grid being cdiv(nb_count, rbc); else one)
        nb0 = nb
        nrb = Int32(1)
        if const_expr(self.stream):
            gx, _, _ = cute.arch.grid_dim()
            rbc = (nb_count + gx - 1) // gx
            nb0 = nb * rbc
            nrb = cutlass.min(rbc, nb_count - nb0)
        if const_expr(self.cfg.tile_loop):
            # tiles y, y + gridDim.y, ... below block_start[E]; CTAs past the last tile leave at once
            _, gy, _ = cute.arch.grid_dim()
            for t in cutlass.range(tile, g_bs[num_experts], gy, unroll=1):
                # (through an opaque move: what derives from the thread index is not hoisted out of the loop,
                # where it would stay live across the mainloop)
                ti = _opaque_i32(tidx)
                cute.arch.sync_threads()  # the previous tile's epilogue is done with the ring and the misc words
                if ti == 0:
                    ptx.st_shared_b32(misc_addr, -1)
                cute.arch.sync_threads()
                e = tile_expert(g_bs, t, num_experts, ti, T, misc_addr)
                o = _opaque_i32
                self._tile(ti, e, t, o(nb0), o(nrb), o(nb_count), w, act, out, g_rs, g_bs, g_routes, topk_weights, ws,
                           counters, o(n), o(k), o(num_experts), o(num_routes), o(top_k), o(num_splits), o(split), buf,
                           o(misc_addr))
        else:
            self._tile(tidx, e, tile, nb0, nrb, nb_count, w, act, out, g_rs, g_bs, g_routes, topk_weights, ws,
                       counters, n, k, num_experts, num_routes, top_k, num_splits, split, buf, misc_addr)

    @cute.jit
    def _tile(self, tidx, e, tile, nb0, nrb, nb_count, w, act, out, g_rs, g_bs, g_routes, topk_weights, ws, counters,
              n, k, num_experts, num_routes, top_k, num_splits, split, buf, misc_addr):
        """Token tile ``tile`` of expert ``e`` (-1: none, nothing to do): row blocks ``nb0 .. nb0 + nrb - 1``."""
        TN, BK = self.TN, self.BK
        if e >= 0:
            if nrb > 0:
                kt_total, kt0, nk = split_k_range(k, BK, split, num_splits)
                slot0 = g_rs[e] + (tile - g_bs[e]) * TN
                count = cutlass.min(g_rs[e + 1] - slot0, TN)
                w_base = w.toint() + ((Int64(e) * Int64(nb_count) + Int64(nb0)) * Int64(kt_total) + Int64(kt0)) * self.chunk
                epi_args = (w, out, g_routes, topk_weights, e, n, k, num_experts, num_routes, top_k, slot0, count, nb0)
                acc = self._mainloop(tidx, w_base, act, g_routes, slot0, count, k, top_k, kt0, nk, nrb, buf, epi_args)
                self._epilogue(tidx, acc, buf, misc_addr, w, out, g_routes, topk_weights, ws, counters, e,
                               nb0 + nrb - 1, tile, split, n, k, num_experts, num_routes, top_k, num_splits, slot0, count)

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def _mainloop(self, tidx, w_base, act, g_routes, slot0, count, k, top_k, kt0, nk, nrb, buf, epi_args):
        """The weight stream of ``nrb`` row blocks x ``nk`` K tiles (stage ``q`` = row block ``q // nk``, K tile
        ``q % nk``: consecutive chunks of the pack); the accumulators of the last row block are returned, those of
        the others stored on the way (:meth:`_row_epilogue`)."""
        TN, BK, S, T = self.TN, self.BK, self.S, self.T
        # weight pieces (16 B) of a chunk: thread t copies pieces t, t + T, ...
        P = self.chunk // 16
        NWP = (P + T - 1) // T
        # activation tile: thread t copies 16-byte chunk t % CPR of rows t // CPR + j * RSTEP
        CPR = BK // 8
        RSTEP = T // CPR
        total = TN * CPR
        NIT = (total + T - 1) // T
        cc = tidx % CPR
        r0 = tidx // CPR
        src_off = cute.make_rmem_tensor((NIT,), Int64)
        dst_off = cute.make_rmem_tensor((NIT,), Int32)
        row_bytes = Int64(k) * 2
        for j in cutlass.range_constexpr(NIT):
            r = r0 + j * RSTEP
            ii = cutlass.min(r, count - 1)  # rows past the tile's tokens repeat the last one
            if const_expr(self.cfg.mode == "gate_up"):
                src_off[j] = Int64(g_routes[slot0 + ii] // top_k) * row_bytes
            else:
                src_off[j] = Int64(slot0 + ii) * row_bytes
            dst_off[j] = self.w_stage + r * (BK * 2) + ((cc ^ (r % 8)) * 16)
        act_base = act.toint() + Int64(cc * 16) + Int64(kt0) * (BK * 2)
        policy = Int64(0)
        if const_expr(self.cfg.evict_first):
            policy = ptx.evict_first_policy()

        acc = cute.make_rmem_tensor((self.MW * self.NB8 * 4,), Float32)
        acc.fill(0.0)
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32

        issue = (tidx, w_base, act_base, src_off, dst_off, policy, buf, P, NWP)  # + (activation pieces, NIT)
        lo = self.cfg.occupancy_levels[0]
        if const_expr(lo == self.NB8):
            self._loops(acc, issue + (total, NIT), nk, nrb, buf, warp, lane, epi_args, self.NB8)
        else:
            # the tile's occupied n8 token blocks: the smaller build when they fit it (copying, loading and
            # multiplying only its rows), else the full one (the branch is uniform over the CTA)
            if (count + 7) // 8 <= lo:
                lo_total = 8 * lo * CPR
                self._loops(acc, issue + (lo_total, (lo_total + T - 1) // T), nk, nrb, buf, warp, lane, epi_args, lo)
            else:
                self._loops(acc, issue + (total, NIT), nk, nrb, buf, warp, lane, epi_args, self.NB8)
        ptx.cp_async_wait(0)
        cute.arch.sync_threads()
        return acc

    @cute.jit
    def _loops(self, acc, issue, nk, nrb, buf, warp, lane, epi_args, nb8: cutlass.Constexpr):
        """The K loop of ``nb8`` token blocks of 8 (row-block streaming where the kernel streams)."""
        if const_expr(self.stream):
            if nrb > 1:
                self._stream_loop(acc, issue, nk, nrb, buf, warp, lane, epi_args, nb8)
            else:
                self._loop(acc, issue, nk, buf, warp, lane, nb8)
        else:
            self._loop(acc, issue, nk, buf, warp, lane, nb8)

    @cute.jit
    def _loop(self, acc, issue, nk, buf, warp, lane, nb8: cutlass.Constexpr):
        """The ``nk`` K tiles of one row block (stage ``it`` = chunk ``it``, activations of K tile ``it``)."""
        S = self.S
        # prologue: S - 1 tiles in flight
        self._prologue(nk, issue)
        for it in cutlass.range(nk, unroll=1):
            ptx.cp_async_wait(S - 2)
            cute.arch.sync_threads()
            nxt = it + (S - 1)
            if nxt < nk:
                self._issue(nxt, nxt % S, nxt, *issue)
            ptx.cp_async_commit()
            self._compute(acc, buf + (it % S) * self.stage_bytes, warp, lane, nb8)

    @cute.jit
    def _stream_loop(self, acc, issue, nk, nrb, buf, warp, lane, epi_args, nb8: cutlass.Constexpr):
        """``nrb`` row blocks x ``nk`` K tiles as one sequence (stage ``q`` = chunk ``q``, activations of K tile
        ``q % nk``, tracked with counters: no run-time division per stage); every row block but the last is
        stored from the stage its last K tile was consumed from (:meth:`_row_epilogue`)."""
        S = self.S
        n_seq = nk * nrb
        kt_i = self._prologue(n_seq, issue, nk)  # K tile of the next stage to issue
        kt_c = Int32(0)  # K tile of the stage being computed
        rb = Int32(0)
        for it in cutlass.range(n_seq, unroll=1):
            ptx.cp_async_wait(S - 2)
            cute.arch.sync_threads()
            nxt = it + (S - 1)
            if nxt < n_seq:
                self._issue(nxt, nxt % S, kt_i, *issue)
                kt_i = kt_i + 1
                if kt_i == nk:
                    kt_i = Int32(0)
            ptx.cp_async_commit()
            self._compute(acc, buf + (it % S) * self.stage_bytes, warp, lane, nb8)
            kt_c = kt_c + 1
            if kt_c == nk:
                kt_c = Int32(0)
                if it + 1 < n_seq:  # a row block done, more to come: store it from the stage just consumed
                    self._row_epilogue(issue[0], acc, buf + (it % S) * self.stage_bytes, rb, epi_args)
                rb = rb + 1

    @cute.jit
    def _prologue(self, n_seq, issue, nk=None):
        """Stages ``0 .. S - 2`` of a stream of ``n_seq`` stages in flight (stage ``s``: weight chunk ``s``,
        activations of K tile ``s`` modulo ``nk`` when given): one ``cp.async`` group per stage. With PDL (the down
        GEMM) the weight chunks go first, one group each, before ``griddepcontrol.wait``, and the activations (h,
        which the previous grid writes) after it, one group each: the loop's ``wait_group(S - 2)`` at iteration
        ``it`` then still finds stage ``it``'s groups complete (its weight group is older than its activation
        group). Returns the K tile of the next stage to issue (streaming)."""
        S = self.S
        kt_i = Int32(0)
        if const_expr(self.pdl_prefetch):
            for s in cutlass.range_constexpr(S - 1):
                if s < n_seq:
                    self._issue_w(s, s, *issue)
                ptx.cp_async_commit()
            cute.arch.griddepcontrol_wait()
            for s in cutlass.range_constexpr(S - 1):
                if s < n_seq:
                    self._issue_a(s, kt_i, *issue)
                    kt_i = kt_i + 1
                    if const_expr(nk is not None):
                        if kt_i == nk:
                            kt_i = Int32(0)
                ptx.cp_async_commit()
        else:
            for s in cutlass.range_constexpr(S - 1):
                if s < n_seq:
                    self._issue(s, s, kt_i, *issue)
                    kt_i = kt_i + 1
                    if const_expr(nk is not None):
                        if kt_i == nk:
                            kt_i = Int32(0)
                ptx.cp_async_commit()
        return kt_i

    @cute.jit
    def _issue(self, it, stage, kt, tidx, w_base, act_base, src_off, dst_off, policy, buf, P: cutlass.Constexpr,
               NWP: cutlass.Constexpr, total: cutlass.Constexpr, NIT: cutlass.Constexpr):
        """cp.async of stream stage ``it`` (weight chunk ``it``, activations of K tile ``kt``) into ring stage
        ``stage``."""
        self._issue_w(it, stage, tidx, w_base, act_base, src_off, dst_off, policy, buf, P, NWP, total, NIT)
        self._issue_a(stage, kt, tidx, w_base, act_base, src_off, dst_off, policy, buf, P, NWP, total, NIT)

    @cute.jit
    def _issue_w(self, it, stage, tidx, w_base, act_base, src_off, dst_off, policy, buf, P: cutlass.Constexpr,
                 NWP: cutlass.Constexpr, total: cutlass.Constexpr, NIT: cutlass.Constexpr):
        """The weight part of :meth:`_issue`: chunk ``it`` into ring stage ``stage``."""
        T = self.T
        sbase = buf + stage * self.stage_bytes
        src_w = w_base + Int64(it) * self.chunk + Int64(tidx * 16)
        dst_w = sbase + tidx * 16
        for j in cutlass.range_constexpr(NWP):
            if const_expr(P % T == 0):
                self._cp_w(dst_w + j * T * 16, src_w + j * T * 16, policy)
            else:
                if tidx + j * T < P:
                    self._cp_w(dst_w + j * T * 16, src_w + j * T * 16, policy)

    @cute.jit
    def _issue_a(self, stage, kt, tidx, w_base, act_base, src_off, dst_off, policy, buf, P: cutlass.Constexpr,
                 NWP: cutlass.Constexpr, total: cutlass.Constexpr, NIT: cutlass.Constexpr):
        """The activation part of :meth:`_issue`: K tile ``kt`` of the tile's rows into ring stage ``stage``."""
        T = self.T
        sbase = buf + stage * self.stage_bytes
        src_a = act_base + Int64(kt) * (self.BK * 2)
        for j in cutlass.range_constexpr(NIT):
            if const_expr(total % T == 0):
                ptx.cp_async_16(sbase + dst_off[j], src_a + src_off[j])
            else:
                if tidx + j * T < total:
                    ptx.cp_async_16(sbase + dst_off[j], src_a + src_off[j])

    @cute.jit
    def _cp_w(self, dst, src, policy):
        if const_expr(self.cfg.evict_first):
            ptx.cp_async_16_hint(dst, src, policy)
        else:
            ptx.cp_async_16(dst, src)

    # ------------------------------------------------------------------------------------------------------
    def _lds_words(self, addr, nwords: int):
        res = []
        off = 0
        while off < nwords:
            step = min(4, nwords - off)
            if step == 4:
                res.extend(ptx.ld_shared_v4(addr + off * 4))
            elif step == 2:
                res.extend(ptx.ld_shared_v2(addr + off * 4))
            else:
                res.append(ptx.ld_shared_b32(addr + off * 4))
            off += step
        return res

    @cute.jit
    def _compute(self, acc, sbase, warp, lane, nb8_used: cutlass.Constexpr):
        """All MMAs of one K tile from ring stage ``sbase``, on the first ``nb8_used`` token blocks of 8 (the
        accumulators of the others stay as they are: zero)."""
        cfg = self.cfg
        MW, C, KB, BK, gpt = self.MW, self.C, self.KB, self.BK, self.gpt
        NB8 = nb8_used
        is_bf16 = self.is_bf16
        q = lane // 4
        words, s_words, s_lo, s_hi, b_lo, b_hi = [], [], [], [], [], []
        for m in cutlass.range_constexpr(MW):
            mb = warp * MW + m
            words.append([ptx.ld_shared_v4(sbase + ((mb * C + c) * 32 + lane) * 16) for c in range(C)])
            saddr = sbase + self.code_bytes + (mb * 8 + q) * (gpt * 4)
            sw = self._lds_words(saddr, gpt)
            s_words.append(sw)
            if const_expr(not self.acc_scale):
                s_lo.append([ptx.prmt_imm(v, 0x1010) for v in sw])
                s_hi.append([ptx.prmt_imm(v, 0x3232) for v in sw])
            if const_expr(cfg.zero_point):
                bw = self._lds_words(saddr + self.scale_bytes, gpt)
                b_lo.append([ptx.prmt_imm(v, 0x1010) for v in bw])
                b_hi.append([ptx.prmt_imm(v, 0x3232) for v in bw])
        # ldmatrix lane addressing: token row 8*nb8 + lane % 8, 16-byte chunk (4*kb2 + lane // 8) ^ (lane % 8)
        lrow = sbase + self.w_stage + (lane % 8) * (BK * 2)
        lx = lane % 8
        lq = lane // 8
        g = cfg.group
        acc_scale = self.acc_scale
        KG = (g // 16) if (g and g <= BK) else KB  # k16 blocks per scale group inside the tile
        sf_lo, sf_hi = [], []
        if const_expr(acc_scale):  # FP32 row scales (rows lane // 4 and lane // 4 + 8) per group
            for m in cutlass.range_constexpr(MW):
                sf_lo.append([ptx.half_to_f32(v, False, is_bf16) for v in s_words[m]])
                sf_hi.append([ptx.half_to_f32(v, True, is_bf16) for v in s_words[m]])
        part = [[None] * NB8 for _ in range(MW)]  # the current group's partial sums (acc_scale)
        zero = Float32(0.0)
        for kb2 in cutlass.range_constexpr(KB // 2):
            bfr = []
            for nb8 in cutlass.range_constexpr(NB8):
                bfr.append(ptx.ldmatrix_x4(lrow + nb8 * (8 * BK * 2) + (((4 * kb2 + lq) ^ lx) * 16)))
            for kk in cutlass.range_constexpr(2):
                kb = 2 * kb2 + kk
                gi = (kb * 16) // g if (g and g <= BK) else 0
                for m in cutlass.range_constexpr(MW):
                    word = words[m][kb // 4][kb % 4]
                    a = []
                    for i in cutlass.range_constexpr(4):
                        sc = None
                        if const_expr(not acc_scale):
                            sc = s_lo[m][gi] if i % 2 == 0 else s_hi[m][gi]
                        if const_expr(cfg.kind == "int4"):
                            bias = None
                            if const_expr(cfg.zero_point):
                                bias = b_lo[m][gi] if i % 2 == 0 else b_hi[m][gi]
                            a.append(self._dequant_int4(word, i, sc, bias))
                        else:
                            a.append(self._dequant_fp4(word, i, sc))
                    for nb8 in cutlass.range_constexpr(NB8):
                        base = (m * self.NB8 + nb8) * 4
                        if const_expr(acc_scale):
                            c = [zero] * 4
                            if const_expr(kb % KG != 0):
                                c = part[m][nb8]
                            d = ptx.mma_16816(a[0], a[1], a[2], a[3], bfr[nb8][2 * kk], bfr[nb8][2 * kk + 1],
                                              c[0], c[1], c[2], c[3], is_bf16)
                            if const_expr(kb % KG == KG - 1):  # group complete: acc += scale * partial (FP32)
                                for v in cutlass.range_constexpr(4):
                                    sf = sf_lo[m][gi] if v < 2 else sf_hi[m][gi]
                                    acc[base + v] = acc[base + v] + sf * d[v]
                            else:
                                part[m][nb8] = [d[0], d[1], d[2], d[3]]
                        else:
                            d = ptx.mma_16816(a[0], a[1], a[2], a[3], bfr[nb8][2 * kk], bfr[nb8][2 * kk + 1],
                                              acc[base], acc[base + 1], acc[base + 2], acc[base + 3], is_bf16)
                            for v in cutlass.range_constexpr(4):
                                acc[base + v] = d[v]

    def _dequant_int4(self, word, i: int, sc, bias):
        """Nibbles ``i`` / ``i + 4`` of ``word`` as ``(q - 8)`` or ``(q - zero)`` (exact), times the scale pair
        ``sc`` (one rounding) unless ``sc`` is None (scales applied to the FP32 partial sums)."""
        src = word if i == 0 else ptx.shr_u32(word, 4 * i)
        t = ptx.lop3_and_or(src, 0x000F000F, Int32(ptx.signed32(self.magic)))
        b = Int32(ptx.signed32(self.sym_bias)) if bias is None else bias
        t = ptx.hfma2(t, Int32(ptx.signed32(self.one2)), b, self.is_bf16)
        if sc is None:
            return t
        return ptx.hfma2(t, sc, Int32(self.neg0), self.is_bf16)

    def _dequant_fp4(self, word, i: int, sc):
        """E2M1 pair of register ``a_i`` (nibble ``i``: lo half, nibble ``i + 4``: hi half) -> packed 16-bit
        values times the scale (exact E2M1 patterns from ``prmt`` byte tables, :func:`.config.e2m1_prmt_tables`).

        fp16: ``m = (word << 4 >> 4i) & 0x00700070`` puts the magnitudes in bits 4..6 and 20..22; ``prmt_imm(m,
        0x0020)`` moves byte 2 to byte 1, giving the selector nibbles ``(0, m_lo, 0, m_hi)``; ``prmt`` over the
        high-byte table yields ``(0x00, H[m_lo], 0x00, H[m_hi])`` (fp16 E2M1 values have zero low bytes).
        bf16: selector ``(m_lo, 0, m_hi, 0)`` over the high- and low-byte tables, merged with one ``prmt``.
        The sign bits (bit 3 of each nibble) are shifted to bits 15 and 31 and OR-ed in."""
        (h0, h1), (l0, l1) = e2m1_prmt_tables(self.is_bf16)
        sg = self._shl(word, 12 - 4 * i)  # lo sign -> bit 15, hi sign -> bit 31
        if self.is_bf16:
            m = ptx.and_imm(self._shl(word, -4 * i), 0x00070007)
            sel = ptx.prmt_imm(m, 0x0020)
            hb = ptx.prmt_pair(Int32(ptx.signed32(h0)), Int32(ptx.signed32(h1)), sel)
            lb = ptx.prmt_pair(Int32(ptx.signed32(l0)), Int32(ptx.signed32(l1)), sel)
            v = ptx.prmt_pair(lb, hb, Int32(0x6240))
        else:
            m = ptx.and_imm(self._shl(word, 4 - 4 * i), 0x00700070)
            sel = ptx.prmt_imm(m, 0x0020)
            v = ptx.prmt_pair(Int32(ptx.signed32(h0)), Int32(ptx.signed32(h1)), sel)
        v = ptx.lop3_or_and(v, sg, 0x80008000)
        return ptx.hfma2(v, sc, Int32(self.neg0), self.is_bf16)

    def _shl(self, x, s: int):
        """``x << s`` for a constant ``s`` of either sign (logical shift right when negative)."""
        if s > 0:
            return x << s
        if s < 0:
            return ptx.shr_u32(x, -s)
        return x

    @cute.jit
    def _row_epilogue(self, tidx, acc, stg, rb, epi_args):
        """Store row block ``nb0 + rb`` of a streaming CTA (no split-K) from the staging tile at ``stg`` (the ring
        stage its last K tile was consumed from; the next issue into it follows the next iteration's barrier),
        then clear the accumulators."""
        w, out, g_routes, topk_weights, e, n, k, num_experts, num_routes, top_k, slot0, count, nb0 = epi_args
        cute.arch.sync_threads()  # every warp is done with the stage's activation tile
        self._stage_acc(tidx, acc, stg)
        cute.arch.sync_threads()
        self._finish(tidx, stg, Int64(0), Int32(1), w, out, g_routes, topk_weights, e, nb0 + rb, n, k, num_experts,
                     num_routes, top_k, slot0, count)
        acc.fill(0.0)

    @cute.jit
    def _stage_acc(self, tidx, acc, stg):
        """FP32 accumulators -> shared staging ``[TN][cols]`` at ``stg`` (column = weight row of the row block)."""
        MW, NB8, rs = self.MW, self.NB8, self.rs
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        for m in cutlass.range_constexpr(MW):
            for rh in cutlass.range_constexpr(2):
                col = (warp * MW + m) * 16 + lane // 4 + 8 * rh
                for nb8 in cutlass.range_constexpr(NB8):
                    for v in cutlass.range_constexpr(2):
                        tok = 8 * nb8 + 2 * (lane % 4) + v
                        ptx.st_shared_f32(stg + (tok * rs + col) * 4, acc[(m * NB8 + nb8) * 4 + 2 * rh + v])

    @cute.jit
    def _finish(self, tidx, stg, ws_base, num_splits, w, out, g_routes, topk_weights, e, nb, n, k, num_experts,
                num_routes, top_k, slot0, count):
        """:func:`..common.epilogue.finish_store` of row block ``nb`` (NVFP4 global scales, bias row)."""
        cfg = self.cfg
        nb_count = n // self.RB
        gs_base = Int64(0)
        if const_expr(cfg.kind == "nvfp4"):
            chunks = Int64(num_experts) * Int64(nb_count) * Int64(k // self.BK) * self.chunk
            gs_base = w.toint() + chunks + (Int64(e) * Int64(n) + Int64(nb * self.cols)) * 4
        bias_base = Int64(0)
        if const_expr(cfg.bias):  # the bias table [E, n] rides in the topk_weights slot
            bias_base = topk_weights.toint() + Int64(e) * Int64(n) * 4
        finish_store(self.epi_shape, tidx, stg, ws_base, num_splits, count, slot0, out, g_routes, topk_weights,
                     num_routes, top_k, n, nb, gs_base, bias_base)

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def _epilogue(self, tidx, acc, buf, misc_addr, w, out, g_routes, topk_weights, ws, counters, e, nb, tile, split,
                  n, k, num_experts, num_routes, top_k, num_splits, slot0, count):
        # (A) accumulators -> FP32 staging [TN][cols] (column = weight row in the CTA's row block)
        self._stage_acc(tidx, acc, buf)
        cute.arch.sync_threads()

        # (B) split-K: publish this split's partial tile; the last split to arrive finishes
        ws_base, nb_count, is_last = publish_split(self.epi_shape, tidx, buf, misc_addr, 4, ws, counters, n, nb, tile,
                                                   split, num_splits, count, None)

        # (C) finish: 8 output columns per item
        if is_last != 0:
            self._finish(tidx, buf, ws_base, num_splits, w, out, g_routes, topk_weights, e, nb, n, k, num_experts,
                         num_routes, top_k, slot0, count)

"""Hopper (sm_90a) CuTe DSL grouped GEMM of the fused W4A16 MoE.

Swap-AB formulation: ``D^T[N, M] = W[N, K] . X^T[K, M]``. Weight rows are the WGMMA ``M`` dimension
(``m64`` blocks, register operand A, INT4 dequantized in registers), routed tokens the WGMMA ``N``
dimension (``TN`` tokens per tile, shared-memory operand B: gathered rows of x or h, 128-byte
swizzled, K-major). FP32 accumulation. Weights come pre-permuted by
:func:`.pack.pack_sm90` (one contiguous chunk of codes + scales per (expert, row block of
``64*X`` rows, K tile of ``BK``)).

CTA = ``128 * (1 + consumer_wgs)`` threads:

* warpgroup 0, producer: thread 0 streams the weight chunk of each stage with one 1-D
  ``cp.async.bulk`` (``mbarrier::complete_tx``, L2 evict-first); all 128 threads gather the
  ``TN x BK`` activation tile with 16-byte ``cp.async`` straight into the swizzled layout WGMMA reads
  (TMA cannot gather on SM90) and signal the same full barrier with
  ``cp.async.mbarrier.arrive.noinc``. A ``stages``-deep ring of full/empty mbarriers.
* warpgroups 1.., consumers: each owns ``X / consumer_wgs`` m64 blocks. Per K tile: wait full ->
  ``fence.proxy.async`` (cp.async writes are generic-proxy, WGMMA reads async-proxy) -> one 16-byte
  ``ld.shared`` of codes per (m64 block, k64) and one 4/8/16-byte load of scales -> per k16 block:
  LOP3 magic-exponent decode, packed add of ``-(magic + 8)`` (or of the stored ``-(magic + zero)``),
  packed scale multiply -> ``wgmma.mma_async`` RS, one commit group per ``mma_kblocks`` k16 blocks
  (default 1). ``schedule="overlap"``: the fragment slots of group ``q`` are rewritten only after
  ``wait_group(NG - 1)`` (``NG = KB / mma_kblocks`` groups per tile) retired the previous tile's group ``q``,
  so decoding overlaps the WGMMAs in flight (up to 7 groups); a stage is released once all its WGMMAs
  retired. Each group costs one warpgroup-wide ``wgmma.fence``: on the H200 four k16 blocks per group beat one
  (W1 2048: ~18 us less per call), the whole tile (no overlap inside the warpgroup) lost. ``schedule="serial"``: decode the
  whole tile, issue its WGMMAs, ``wait_group(0)``, release (simple reference schedule).
* epilogue (consumers): FP32 accumulators -> shared staging tile ``[TN][64*X]`` (reusing the
  B ring) -> optional split-K fixup -> activation (gate and up columns of an output element are in
  the same staging row) -> 16-byte coalesced global stores or ``red.global.add.v4.f32``. Everything after
  the staging tile is :mod:`..common.epilogue` (shared with the warp-MMA kernel). ``stage16`` (the down GEMM's
  ``y`` epilogue without bias): the staging tile holds the accumulators already rounded to x's dtype ``[TN][64X + 8]``
  (half the bytes; the same values: that epilogue adds nothing before rounding), copied to ``y`` in 16-byte rows;
  split-K partials then go from the accumulators to ``ws``.

Split-K (runtime ``num_splits > 1``, grid z): every split stores its FP32 partial tile to ``ws``,
then bumps a per-tile counter; the last split to arrive sums all partials in fixed split order
``0..S-1`` (deterministic: independent of arrival order) and runs the epilogue; it resets the
counter to 0 for the next launch (``counters`` must be zeroed once at allocation).
``ws`` holds ``grid_x * max_tiles * S * TN * 64X`` FP32; ``counters`` ``grid_x * max_tiles`` int32.

Routing contract (from the routing step): ``sorted_routes`` int32 ``[R]`` route ids
``token * top_k + j`` grouped by local expert; ``route_start`` int32 ``[E+1]``; ``block_start``
int32 ``[E+1]`` = exclusive cumsum of ``cdiv(count_e, TN)``. Grid = ``(N / (64*X), max_tiles,
num_splits)``; CTA ``(nb, tile, s)`` finds its expert (``block_start[e] <= tile < block_start[e+1]``,
searched in parallel by the CTA's threads); CTAs with ``tile >= block_start[E]`` exit at once.
``max_tiles >= cdiv(R, TN) + min(E, R)`` always suffices (``R <= T * top_k``: no host sync).

Modes (static):

* ``gate_up``: B rows ``x[sorted_routes[slot] // top_k]``. Gated activations (swiglu, geglu) use an
  interleaved w13 pack (row block ``nb`` = gate rows ``[nb*32X, (nb+1)*32X)`` then the matching up
  rows); ``h[slot, :]`` (x's dtype, ``[R, I]``) = act(gate) * up. Non-gated (relu2, silu): act(h).
* ``down``: B rows ``h[slot]``. Epilogue ``y``: ``y[sorted_routes[slot], :]`` in x's dtype (a
  deterministic finalize pass reads it); ``atomic_f32``: ``out[token, :] += topk_weight * y`` with
  ``red.global.add.v4.f32`` into an FP32 ``out`` (fused finalize, order-nondeterministic).
* ``bias`` (static, gate_up and down ``y``): the CTA's expert's FP32 bias row (the table ``[E, n]`` in the
  ``topk_weights`` slot) is added to the accumulators before the activation / rounding
  (:mod:`..common.epilogue`); ``swiglu_oai`` (static ``alpha`` / ``limit`` from the activation name) is one
  more gated activation.

Every size is a runtime ``Int32``: one compiled kernel serves every token count and every ``E/N/K``
with ``N % (64*X) == 0`` (``(N/2) % (32*X) == 0`` for gated gate_up) and ``K % BK == 0``.

Tuning knobs (static): ``m64_per_block`` x ``consumer_wgs`` (weight rows per CTA and how they split
over consumer warpgroups), ``tokens_per_tile``, ``k_tile``, ``stages``, ``min_ctas_per_sm`` (caps
registers so that several small CTAs share an SM: latency hiding for decode-sized batches),
``row_blocks_per_cta`` (``RB``: a CTA runs ``RB`` consecutive row blocks of its token tile, grid x =
``cdiv(N / (64*X), RB)``. Its producer streams the weight chunks of all of them as one ring sequence, so
the next row block's weights are in flight while the consumers run the current one's epilogue, which
then stages in a buffer of its own instead of the ring. For the down GEMM of a TP shard, whose
reduction ``K = I`` is only a few K tiles, a one-row-block CTA spends most of its life waiting for its
first loads: ncu measured W1's at 2048 tokens at 26% of DRAM and of SM throughput). With ``RB > 1`` the
activation tile, the same for every row block of the CTA, stays resident when the split's K tiles fit the
``b_slots`` B slots (default ``S``; gathered once by the first row block, otherwise re-gathered with every
stage), so the weight ring can run deeper than the B slots (more weight bytes in flight per SM), and
``pingpong`` (two consumer warpgroups) gives each warpgroup whole row blocks, alternately: their mainloops
take turns (named barriers 3 and 4), so one warpgroup's epilogue (in a staging tile of its own) runs under
the other's mainloop instead of idling the tensor cores; each stage is then consumed by one warpgroup.
``pingpong=2`` lets the two mainloops also overlap each other where that is sound (``S`` a multiple of
``2 nk``, :func:`.config.pingpong_unordered`: the stage a warpgroup waits on was last filled for one of its
own row blocks, so its parity wait cannot pass a phase early), and takes turns otherwise.
``tn_variants`` compiles the consumers' mainloop and epilogue staging for WGMMA N = ``TN, TN - 8, ...``
(up to 4 widths) into one kernel; each CTA runs the narrowest width that holds its tile's routes (the
producer gathers only those rows). The routing's token tile, the shared-memory plan and the staging tile
stay those of ``TN``. Where experts get fewer routes than ``TN`` (W1 2048: ~43 per expert against TN 56) the
tensor cores skip most of the padding columns; registers stay those of the widest variant.
``pdl`` (programmatic dependent launch; both kernels are launched with the PDL attribute): the gate/up
kernel's CTAs set up their barriers while the route preparation finishes, then every thread executes
``griddepcontrol.wait`` before reading the routing tables, then ``griddepcontrol.launch_dependents``. The down
kernel may therefore start on SMs the gate/up grid's tail frees: its producer issues the first weight stages
(which do not depend on h), then every thread executes ``griddepcontrol.wait`` before reading h or writing
anything. What it reads before that wait (the routing tables) was complete before any gate/up CTA triggered
it (each triggers only after its own wait). The down kernel triggers its dependents at once (the
deterministic finalize, launched with PDL, waits for the whole down grid before reading y); launched after a
kernel that does not trigger, either kernel starts when that kernel's CTAs have exited, and its wait
returns when that grid's writes are visible.
Compile with :meth:`Sm90W4A16GroupedGemm.compile` (no GPU needed).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32, Int64, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import dsl_user_op

from ..common import ptx
from ..common.codes import INT4_MAGIC, INT4_SYM_BIAS, check_activation, check_bias, check_epilogue, check_mode_dtype
from ..common.dequant import e2m1_pair
from ..common.epilogue import EpilogueShape, finish_store, publish_split, split_verdict, split_workspace
from ..common.grid import fake_launch_args, occupancy_kwargs, split_k_range, tile_expert
from .config import Sm90GemmConfig, check_setmaxnreg, pingpong_unordered

__all__ = ["Sm90W4A16GroupedGemm", "Sm90GemmConfig", "check_setmaxnreg"]


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


@dsl_user_op
def _st_global_f32(addr, v, *, loc=None, ip=None) -> None:
    """One FP32 value to global memory (kept here, not in ``common.ptx``: only ``stage16`` kernels use it, and
    every family hashes that module)."""
    llvm.inline_asm(None, [Int64(addr).ir_value(loc=loc, ip=ip), Float32(v).ir_value(loc=loc, ip=ip)],
                    "st.global.f32 [$0], $1;", "l,f", has_side_effects=True, loc=loc, ip=ip)


class Sm90W4A16GroupedGemm:
    """One SM90 W4A16 grouped-GEMM kernel (static config in ``__init__``; see the module docstring).

    ``__call__(w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
    num_experts, n, k, num_routes, top_k, max_tiles, num_splits, stream)``: raw pointers + ``Int32``
    sizes. ``w`` packed weights (uint8); ``act`` B source (x for gate_up, h for down); ``out`` h / y
    / FP32 out; ``topk_weights`` FP32 ``[T*top_k]`` (read by ``atomic_f32`` only; with ``cfg.bias`` the FP32
    bias table ``[E, n]`` instead, :mod:`..common.epilogue`); ``ws`` FP32 and
    ``counters`` int32 split-K scratch (read only when ``num_splits > 1``); ``n`` weight rows of the
    matrix (2I / I / H); ``k`` the reduction size; ``num_routes`` the route capacity (``T*top_k``).
    """

    def __init__(self, cfg: Sm90GemmConfig):
        c = cfg
        check_mode_dtype(c.mode, c.dtype)
        if c.k_tile not in (64, 128):
            # the activation gather gives each producer thread rows r0 + j * (128 // (BK / 8)), which
            # must keep r0 % 8 (its swizzle phase) fixed: BK <= 128
            raise ValueError("k_tile must be 64 or 128")
        if c.tokens_per_tile % 8 or not 8 <= c.tokens_per_tile <= 256:
            raise ValueError("tokens_per_tile must be a multiple of 8 in [8, 256]")
        if not 1 <= c.tn_variants <= 4 or c.tokens_per_tile - 8 * (c.tn_variants - 1) < 8:
            raise ValueError("tn_variants must be in [1, 4] with tokens_per_tile - 8 * (tn_variants - 1) >= 8")
        if c.consumer_wgs not in (1, 2, 4) or c.m64_per_block % c.consumer_wgs:
            raise ValueError("consumer_wgs must be 1, 2 or 4 and divide m64_per_block")
        if c.gated and c.m64_per_block % 2:
            raise ValueError("gated gate_up needs an even m64_per_block (gate + up halves)")
        entry = (65536 // (128 * (1 + c.consumer_wgs))) // 8 * 8  # the most registers a thread can launch with
        if c.setmaxnreg and (c.consumer_wgs < 2 or c.producer_regs * 128 + c.consumer_regs * 128 * c.consumer_wgs
                             > entry * 128 * (1 + c.consumer_wgs)):
            raise ValueError(f"setmaxnreg needs consumer_wgs >= 2 and budgets within {entry} registers x "
                             f"{128 * (1 + c.consumer_wgs)} threads")
        if c.pingpong not in (0, 1, 2):
            raise ValueError("pingpong must be 0, 1 or 2")
        if c.pingpong and (c.consumer_wgs != 2 or c.row_blocks_per_cta < 2):
            raise ValueError("pingpong needs consumer_wgs == 2 and row_blocks_per_cta >= 2")
        if c.schedule not in ("overlap", "serial"):
            raise ValueError(f"schedule {c.schedule!r}")
        if c.mma_kblocks < 1 or (c.k_tile // 16) % c.mma_kblocks or (c.mma_kblocks > 1 and c.schedule != "overlap"):
            raise ValueError("mma_kblocks must divide k_tile / 16 (and be 1 with the serial schedule)")
        epi = c.epi
        check_epilogue(c.mode, epi)
        check_activation(c.mode, c.activation)
        check_bias(c.mode, epi, c.bias)
        g = c.group
        if g and not (c.k_tile % g == 0 or g % c.k_tile == 0):
            raise ValueError("group and k_tile: one must divide the other")
        if g and g % 16:
            raise ValueError("group must be a multiple of 16 (or 0 = per channel)")
        if c.fp4 and c.zero_point:
            raise ValueError("FP4 (E2M1) weights have no zero points")
        if c.stage16 and (c.mode != "down" or epi != "y" or c.bias):
            raise ValueError("stage16 needs the down GEMM's y epilogue without bias (the only epilogue that rounds "
                             "the accumulators to 16 bits unchanged)")
        if g and c.k_tile // g > 16:
            raise ValueError("at most 16 scale groups per K tile")
        self.cfg = c
        self.is_bf16 = c.dtype == "bf16"
        self.ab_dtype = cutlass.BFloat16 if self.is_bf16 else cutlass.Float16
        self.X = c.m64_per_block
        self.ncwg = c.consumer_wgs
        self.PP = c.pingpong != 0
        # m64 blocks per consumer warpgroup (ping-pong: the whole row block) and the first one's index
        self.XW = self.X if self.PP else self.X // self.ncwg
        self.TN = c.tokens_per_tile
        # WGMMA N of each compiled variant, widest first (a tile runs the narrowest that holds its routes)
        self.tns = tuple(self.TN - 8 * v for v in range(c.tn_variants))
        self.pdl_wait = c.pdl and c.mode == "down"
        self.RB = c.row_blocks_per_cta
        if self.RB < 1:
            raise ValueError("row_blocks_per_cta must be >= 1")
        self.BK = c.k_tile
        self.S = c.stages
        if c.b_slots and (self.RB == 1 or not 1 <= c.b_slots <= c.stages):
            raise ValueError("b_slots needs row_blocks_per_cta >= 2 and 1 <= b_slots <= stages")
        if c.schedule == "overlap" and (self.S < 2 or c.b_slots == 1):
            # a consumer releases K tile g - 1 only once tile g is full: one stage (or one re-gathered B slot)
            # would wait on itself
            raise ValueError("the overlap schedule needs stages >= 2 and b_slots != 1")
        self.BS = c.b_slots or c.stages  # activation-tile slots
        self.C = self.BK // 64
        self.KB = self.BK // 16
        self.gpt = (self.BK // g) if (g and g <= self.BK) else 1
        self.code_bytes = self.X * self.C * 2048
        self.scale_bytes = self.X * 32 * self.gpt * 4
        self.bias_bytes = self.scale_bytes if c.zero_point else 0
        self.chunk = self.code_bytes + self.scale_bytes + self.bias_bytes
        self.w_stage = _round_up(self.chunk, 128)
        self.b_stage = self.TN * self.BK * 2
        self.threads = 128 * (1 + self.ncwg)
        self.ncons = 128 * self.ncwg
        self.nepi = 128 if self.PP else self.ncons  # threads that consume one stage / share one epilogue
        # epilogue: FP32 staging [TN][64X + 4] reusing the B ring (stage16: 16-bit [TN][64X + 8])
        self.cols = 64 * self.X  # accumulator columns (weight rows) per CTA
        self.rs = self.cols + 4  # padded staging row stride (FP32 elements): conflict-free writes
        self.S16 = c.stage16
        self.rs16 = self.cols + 8  # stage16: row stride in 16-bit elements (16-byte rows, conflict-free writes)
        self.epi_bytes = self.TN * self.rs16 * 2 if self.S16 else self.TN * self.rs * 4
        # one row block per CTA: the epilogue stages in the B ring (the producer is done by then);
        # several: the ring is already filling with the next row block's tiles, so staging has its own
        self.b_region = max(self.S * self.b_stage, self.epi_bytes) if self.RB == 1 else self.BS * self.b_stage
        self.e_region = 0 if self.RB == 1 else self.epi_bytes * (2 if self.PP else 1)
        smem = self.S * self.w_stage + self.b_region + self.e_region + 2048 + 16 * self.S
        if smem > 227 * 1024:
            raise ValueError(f"{c.name()}: needs about {smem} bytes of shared memory")
        self.smem_bytes = smem
        self.magic = INT4_MAGIC[c.dtype]
        self.sym_bias = INT4_SYM_BIAS[c.dtype]  # -(magic + 8) in both halves
        self.epi_shape = EpilogueShape(tokens=self.TN, cols=self.cols, threads=self.nepi, mode=c.mode, epi=epi,
                                       activation=c.activation, gated=c.gated, is_bf16=self.is_bf16, bias=c.bias)

    # ------------------------------------------------------------------------------------------
    def fake_args(self) -> list:
        """Compile-time stand-ins for ``__call__``'s arguments (null pointers with their alignment,
        Int32 sizes, a fake stream): one compile serves every size."""
        return fake_launch_args(self.ab_dtype, Float32 if self.cfg.epi == "atomic_f32" else self.ab_dtype)

    def compile(self, arch: str = "sm_90a"):
        """Cross-compile (no GPU needed); export with ``compiled.export_to_c(dir, name, prefix)``."""
        return cute.compile(self, *self.fake_args(), options=f"--gpu-arch {arch}")

    # ------------------------------------------------------------------------------------------
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
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, self.ab_dtype)
        b_layout = cute.tile_to_shape(atom, (self.TN, self.BK, self.BS), order=(0, 1, 2))

        # shared memory: barrier rings, misc words, the weight ring, the B ring, and (RB > 1) the
        # epilogue's staging tile
        if const_expr(self.RB == 1):
            @cute.struct
            class Storage:
                full: cute.struct.MemRange[Int64, self.S]
                empty: cute.struct.MemRange[Int64, self.S]
                misc: cute.struct.MemRange[Int32, 4]
                sW: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.S * self.w_stage], 128]
                sB: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.b_region], 1024]

            self.storage_cls = Storage
        else:
            @cute.struct
            class StorageRB:
                full: cute.struct.MemRange[Int64, self.S]
                empty: cute.struct.MemRange[Int64, self.S]
                misc: cute.struct.MemRange[Int32, 4]
                sW: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.S * self.w_stage], 128]
                sB: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.b_region], 1024]
                sE: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, self.e_region], 128]

            self.storage_cls = StorageRB
        nb_count = n // (64 * self.X)
        self.kernel(
            w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
            num_experts, n, k, num_routes, top_k, num_splits, b_layout,
        ).launch(
            grid=[(nb_count + self.RB - 1) // self.RB, max_tiles, num_splits],
            block=[self.threads, 1, 1],
            stream=stream,
            use_pdl=self.cfg.pdl,
            **occupancy_kwargs(self.cfg.min_ctas_per_sm),
        )

    # ------------------------------------------------------------------------------------------
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
        b_layout: cute.ComposedLayout,
    ):
        TN, BK, S = self.TN, self.BK, self.S
        tidx, _, _ = cute.arch.thread_idx()
        nbx, tile, split = cute.arch.block_idx()
        nb0 = nbx * self.RB  # this CTA's row blocks: nb0 .. nb0 + nrb - 1
        nrb = cutlass.min(n // (64 * self.X) - nb0, self.RB)
        wg = cute.arch.make_warp_uniform(tidx // 128)
        if const_expr(self.cfg.pdl and self.cfg.mode == "down"):
            # every CTA of this grid has started: the finalize (launched with PDL) may take the SMs this
            # grid's last CTAs free, and waits there for the whole grid before reading y
            cute.arch.griddepcontrol_launch_dependents()

        g_bs = cute.make_tensor(block_start, cute.make_layout(num_experts + 1))
        g_rs = cute.make_tensor(route_start, cute.make_layout(num_experts + 1))
        g_routes = cute.make_tensor(sorted_routes, cute.make_layout(num_routes))

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        full0 = st.full.data_ptr()
        empty0 = st.empty.data_ptr()
        misc_addr = st.misc.data_ptr().toint()
        sW_addr = st.sW.data_ptr().toint()
        sB_ptr = st.sB.data_ptr()
        sB_addr = sB_ptr.toint()
        stg_addr = sB_addr  # epilogue staging
        if const_expr(self.RB > 1):
            stg_addr = st.sE.data_ptr().toint()
        if tidx == 0:
            ptx.st_shared_b32(misc_addr, -1)
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full0 + s, 1 + 128)
                cute.arch.mbarrier_init(empty0 + s, self.nepi)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if const_expr(self.cfg.pdl and self.cfg.mode == "gate_up"):
            # launched with PDL: the route preparation may still run; its tables are complete and visible
            # once the wait returns. Only then may the down kernel (launched with PDL) start: it reads the
            # routing tables before its own wait
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
        # which expert owns this tile: block_start[e] <= tile < block_start[e + 1], searched by all
        # threads in parallel (one round trip); no owner (tile >= block_start[E]) -> the CTA exits
        e = tile_expert(g_bs, tile, num_experts, tidx, self.threads, misc_addr)
        if e >= 0:
            _, kt0, nk = split_k_range(k, BK, split, num_splits)  # K range of this split
            if wg == 0:
                if const_expr(self.ncwg >= 2 and self.cfg.setmaxnreg):
                    cute.arch.setmaxregister_decrease(self.cfg.producer_regs)
                self._producer(tidx, w, act, g_rs, g_bs, g_routes, e, tile, nb0, nrb, n, k, top_k, kt0, nk,
                               full0, empty0, sW_addr, sB_addr)
            else:
                if const_expr(self.ncwg >= 2 and self.cfg.setmaxnreg):
                    cute.arch.setmaxregister_increase(self.cfg.consumer_regs)
                if const_expr(self.pdl_wait):
                    # (the consumers read h only through the producer's tiles; waiting here as well orders
                    # their epilogue stores after the previous grid, whatever it wrote)
                    cute.arch.griddepcontrol_wait()
                ct = tidx % 128  # thread index inside its consumer warpgroup
                cw = wg - 1
                # (each epilogue re-derives the tile's routes from the tables: kept live across the mainloops,
                # they spilled in the widest kernels)
                _, count = self._tile_routes(misc_addr, g_rs, g_bs, tile)
                args = (ct, cw, b_layout, sB_ptr, sW_addr, full0, empty0, nk, stg_addr, misc_addr, out, g_routes,
                        topk_weights, ws, counters, nb0, nrb, tile, split, n, num_routes, top_k, num_splits, g_rs,
                        g_bs)
                # the narrowest compiled token-tile width that holds this tile's routes (the producer picks
                # the same, see _tile_width)
                NV = len(self.tns)
                if const_expr(NV == 1):
                    self._consume(self.TN, *args)
                else:
                    for v in cutlass.range_constexpr(NV):
                        if const_expr(v == 0):
                            if count > self.tns[1]:
                                self._consume(self.tns[0], *args)
                        elif const_expr(v == NV - 1):
                            if count <= self.tns[v]:
                                self._consume(self.tns[v], *args)
                        else:
                            if count <= self.tns[v]:
                                if count > self.tns[v + 1]:
                                    self._consume(self.tns[v], *args)

    @cute.jit
    def _consume(self, tn: cutlass.Constexpr, ct, cw, b_layout, sB_ptr, sW_addr, full0, empty0, nk, stg_addr,
                 misc_addr, out, g_routes, topk_weights, ws, counters, nb0, nrb, tile, split, n, num_routes, top_k,
                 num_splits, g_rs, g_bs):
        """A consumer warpgroup's whole share of the CTA (every row block's mainloop and epilogue) with WGMMA
        N = ``tn`` (>= the tile's route count)."""
        S = self.S
        tiled_mma = self._tiled_mma(tn)
        b_layout = self._b_layout_n(b_layout, tn)
        if const_expr(self.RB == 1):
            acc = self._mainloop(ct, cw, tn, tiled_mma, b_layout, sB_ptr, sW_addr, full0, empty0, 0, nk,
                                 Int32(S))
            self._epilogue(ct, cw, tn, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws, counters,
                           nb0, tile, split, n, num_routes, top_k, num_splits, g_rs, g_bs)
        else:
            bmod = self._b_slots(nk)
            if const_expr(self.PP):
                # row blocks cw, cw + 2, ...; the mainloops alternate (named barrier 3 + w: "warpgroup
                # w may start its next mainloop"), so one warpgroup's epilogue runs under the other's
                # mainloop, and a warpgroup never waits on a stage more than one phase ahead
                stg = stg_addr + cw * self.epi_bytes
                order = Int32(1)
                if const_expr(self.cfg.pingpong == 2):
                    # unordered only where that is sound (config.pingpong_unordered: S a multiple of 2 nk;
                    # S = 4 with nk = 3 ran unordered before and faulted, docs/perf/2026-12-07-autotune-behind)
                    for d in cutlass.range_constexpr(1, S + 1):
                        if const_expr(pingpong_unordered(S, d)):
                            if nk == d:
                                order = Int32(0)
                for j in cutlass.range(cw, nrb, 2, unroll=1):
                    if order != 0:
                        if j > 0:
                            cute.arch.barrier(barrier_id=3 + cw, number_of_threads=256)
                    acc = self._mainloop(ct, cw, tn, tiled_mma, b_layout, sB_ptr, sW_addr, full0, empty0,
                                         j * nk, nk, bmod)
                    if order != 0:
                        if j + 1 < nrb:
                            cute.arch.barrier_arrive(barrier_id=4 - cw, number_of_threads=256)
                    self._epilogue(ct, cw, tn, acc, stg, misc_addr, out, g_routes, topk_weights, ws,
                                   counters, nb0 + j, tile, split, n, num_routes, top_k, num_splits,
                                   g_rs, g_bs)
            else:
                # the ring sequence runs on across row blocks: block j's K tiles are j*nk .. j*nk+nk-1
                for j in cutlass.range(nrb, unroll=1):
                    acc = self._mainloop(ct, cw, tn, tiled_mma, b_layout, sB_ptr, sW_addr, full0, empty0,
                                         j * nk, nk, bmod)
                    self._epilogue(ct, cw, tn, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws,
                                   counters, nb0 + j, tile, split, n, num_routes, top_k, num_splits,
                                   g_rs, g_bs)

    @cute.jit
    def _b_slots(self, nk):
        """RB > 1: the activation tile is the same for every row block of the CTA. When the split's ``nk`` K
        tiles fit the ``BS`` B slots, they stay resident (gathered once, by the first row block; ring sequence
        ``g`` reads B slot ``g % nk``); otherwise B is re-gathered with every stage (slot ``g % BS``)."""
        bmod = Int32(self.BS)
        if nk <= self.BS:
            bmod = nk
        return bmod

    def _tiled_mma(self, tn: int):
        """The consumer warpgroup's WGMMA: ``64 x tn x 16``, A (weights) from registers, B from shared memory."""
        return sm90_utils.make_trivial_tiled_mma(
            self.ab_dtype,
            self.ab_dtype,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.K,
            Float32,
            (1, 1, 1),
            (64, tn),
            warpgroup.OperandSource.RMEM,
        )

    def _b_layout_n(self, b_layout, tn: int):
        """The first ``tn`` token rows of the ``(TN, BK, slots)`` B ring layout: the same swizzle and strides
        (8-row swizzle atoms 1024 bytes apart, K atoms ``TN * 128`` bytes apart), ``tn / 8`` atoms along N."""
        if tn == self.TN:
            return b_layout
        o = b_layout.outer
        shape = ((8, tn // 8), o.shape[1], o.shape[2])
        return cute.make_composed_layout(b_layout.inner, b_layout.offset, cute.make_layout(shape, stride=o.stride))

    @cute.jit
    def _tile_routes(self, misc_addr, g_rs, g_bs, tile):
        """``(slot0, count)``: the first sorted-route slot of token tile ``tile`` and its number of routes
        (expert from misc word 0)."""
        e = ptx.ld_shared_b32(misc_addr)
        slot0 = g_rs[e] + (tile - g_bs[e]) * self.TN
        return slot0, cutlass.min(g_rs[e + 1] - slot0, self.TN)

    @cute.jit
    def _tile_width(self, count):
        """The narrowest compiled WGMMA N (``self.tns``) that holds ``count`` routes."""
        nsel = Int32(self.TN)
        for v in cutlass.range_constexpr(1, len(self.tns)):
            if count <= self.tns[v]:
                nsel = Int32(self.tns[v])
        return nsel

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def _producer(self, pt, w, act, g_rs, g_bs, g_routes, e, tile, nb0, nrb, n, k, top_k, kt0, nk,
                  full0, empty0, sW_addr, sB_addr):
        """Fill the ring with ring sequence numbers ``g = j * nk + it``: K tile ``kt0 + it`` of row block
        ``nb0 + j`` (``j < nrb``)."""
        TN, BK, S = self.TN, self.BK, self.S
        nb_count = n // (64 * self.X)
        kt_total = k // BK
        # chunk (e, nb0, kt0): chunks are laid out (expert, row block, K tile), contiguous
        w_base = w.toint() + ((Int64(e) * Int64(nb_count) + Int64(nb0)) * Int64(kt_total) + Int64(kt0)) * self.chunk
        n_seq = nrb * nk  # ring sequence numbers of this CTA
        # start streaming weights at once (the first S stages are free): they do not depend on the routes
        if pt == 0:
            for g in cutlass.range(cutlass.min(n_seq, S), unroll=1):
                self._issue_w(g, self._chunk_addr(w_base, g, nk, kt_total), full0, sW_addr)
        if const_expr(self.pdl_wait):
            # launched with PDL: the previous grid (the gate/up GEMM writing h) may still run; the routing
            # tables read so far were complete before it started
            cute.arch.griddepcontrol_wait()
        # this thread's activation rows (16-byte chunk c of rows r0, r0 + RSTEP, ...)
        CPR = BK // 8  # 16-byte chunks per activation row
        total = TN * CPR
        NIT = (total + 127) // 128
        RSTEP = 128 // CPR  # a multiple of 8
        c = pt % CPR
        r0 = pt // CPR
        rsw = r0 % 8  # row % 8 is the same for all of this thread's rows
        dst_const = (c // 8) * (TN * 128) + rsw * 128 + (((c % 8) ^ rsw) * 16)
        act_base = act.toint() + Int64(c * 16)
        row_bytes = Int64(k) * 2
        slot0 = g_rs[e] + (tile - g_bs[e]) * TN
        count = cutlass.min(g_rs[e + 1] - slot0, TN)
        nsel = self._tile_width(count)  # rows the consumers' WGMMA reads
        rows = cute.make_rmem_tensor((NIT,), Int32)
        for j in cutlass.range_constexpr(NIT):
            ii = cutlass.min(r0 + j * RSTEP, count - 1)  # rows past the tile's tokens repeat the last one
            if const_expr(self.cfg.mode == "gate_up"):
                rows[j] = g_routes[slot0 + ii] // top_k
            else:
                rows[j] = slot0 + ii
        bmod = Int32(S)
        fetch_lim = n_seq
        if const_expr(self.RB > 1):
            bmod = self._b_slots(nk)
            if nk <= self.BS:
                fetch_lim = nk  # resident activation tile: gathered by the first row block only
        for g in cutlass.range(n_seq, unroll=1):
            stage = g % S
            it = g % nk if const_expr(self.RB > 1) else g
            if g >= S:
                cute.arch.mbarrier_wait(empty0 + stage, ((g // S) & 1) ^ 1)
                if pt == 0:
                    self._issue_w(g, self._chunk_addr(w_base, g, nk, kt_total), full0, sW_addr)
            if const_expr(self.BS < S):
                # re-gathered B (nk > BS): slot g % BS was last read by ring sequence g - BS, whose stage
                # release the empty wait above (g - S) does not cover
                if nk > self.BS:
                    if g >= self.BS:
                        h = g - self.BS
                        cute.arch.mbarrier_wait(empty0 + h % S, (h // S) & 1)
            if g < fetch_lim:
                kofs = act_base + Int64((kt0 + it) * (BK * 2))
                bslot = stage if const_expr(self.RB == 1) else g % bmod
                dst_stage = sB_addr + bslot * self.b_stage + dst_const
                for j in cutlass.range_constexpr(NIT):
                    src = kofs + Int64(rows[j]) * row_bytes
                    dst = dst_stage + ((r0 + j * RSTEP) // 8) * 1024
                    if const_expr(len(self.tns) > 1):
                        # only the rows the selected WGMMA width reads (nsel <= TN also bounds the last item)
                        if r0 + j * RSTEP < nsel:
                            ptx.cp_async_16(dst, src)
                    elif const_expr(total % 128 == 0):
                        ptx.cp_async_16(dst, src)
                    else:
                        if pt + 128 * j < total:
                            ptx.cp_async_16(dst, src)
            cute.arch.cp_async_mbarrier_arrive_noinc(full0 + stage)

    @cute.jit
    def _chunk_addr(self, w_base, g, nk, kt_total):
        """Global address of ring sequence ``g``'s weight chunk (row block ``g // nk`` after ``nb0``)."""
        if const_expr(self.RB == 1):
            addr = w_base + Int64(g) * self.chunk
        else:
            j = g // nk
            addr = w_base + (Int64(j) * Int64(kt_total) + Int64(g - j * nk)) * self.chunk
        return addr

    @cute.jit
    def _issue_w(self, g, src, full0, sW_addr):
        """Thread 0: arm stage ``g % S`` with the chunk's byte count and bulk-copy the weight chunk."""
        stage = g % self.S
        cute.arch.mbarrier_arrive_and_expect_tx(full0 + stage, self.chunk)
        ptx.bulk_g2s(
            sW_addr + stage * self.w_stage,
            src,
            self.chunk,
            (full0 + stage).toint(),
            evict_first=self.cfg.evict_first,
        )

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def _load_tile_words(self, ct, cw, stage, sW_addr):
        """This thread's raw code words and (broadcast) scale / bias pairs of one K tile (LDS)."""
        XW, C = self.XW, self.C
        gpt = self.gpt
        q = ct // 4
        wbase = sW_addr + stage * self.w_stage
        raw, s_lo, s_hi, b_lo, b_hi = [], [], [], [], []
        for xl in cutlass.range_constexpr(XW):
            x = xl if const_expr(self.PP) else cw * XW + xl
            saddr = wbase + self.code_bytes + (x * 32 + q) * (gpt * 4)
            sw = self._lds_words(saddr, gpt)
            s_lo.append([ptx.prmt_imm(v, 0x1010) for v in sw])
            s_hi.append([ptx.prmt_imm(v, 0x3232) for v in sw])
            if const_expr(self.cfg.zero_point):
                bw = self._lds_words(saddr + self.scale_bytes, gpt)
                b_lo.append([ptx.prmt_imm(v, 0x1010) for v in bw])
                b_hi.append([ptx.prmt_imm(v, 0x3232) for v in bw])
            words = []
            for cc in cutlass.range_constexpr(C):
                words.append(ptx.ld_shared_v4(wbase + ((x * C + cc) * 128 + ct) * 16))
            raw.append(words)
        return raw, s_lo, s_hi, b_lo, b_hi

    @cute.jit
    def _lds_words(self, addr, nwords: cutlass.Constexpr):
        if const_expr(nwords > 4):
            words = ()
            for v in cutlass.range_constexpr(nwords // 4):
                words = words + tuple(ptx.ld_shared_v4(addr + 16 * v))
            return words
        elif const_expr(nwords == 4):
            return ptx.ld_shared_v4(addr)
        elif const_expr(nwords == 2):
            return ptx.ld_shared_v2(addr)
        else:
            return (ptx.ld_shared_b32(addr),)

    @cute.jit
    def _decode_block(self, tw_, kb: cutlass.Constexpr, frag):
        """Dequantize k16 block ``kb`` of every local m64 block into fragment slot ``kb``."""
        raw, s_lo, s_hi, b_lo, b_hi = tw_
        g = self.cfg.group
        gi = (kb * 16) // g if (g and g <= self.BK) else 0
        magic = Int32(ptx.signed32(self.magic))
        sym = Int32(ptx.signed32(self.sym_bias))
        for xl in cutlass.range_constexpr(self.XW):
            word = raw[xl][kb // 4][kb % 4]
            if const_expr(self.cfg.fp4):
                for i in cutlass.range_constexpr(4):
                    rh = i % 2
                    frag[(0, rh, i // 2), xl, kb] = ptx.packed_mul(
                        e2m1_pair(word, i, self.is_bf16), s_lo[xl][gi] if rh == 0 else s_hi[xl][gi], self.is_bf16)
            else:
                for i in cutlass.range_constexpr(4):
                    rh = i % 2
                    src = word if i == 0 else (word >> (4 * i))
                    t = ptx.lop3_and_or(src, 0x000F000F, magic)
                    if const_expr(self.cfg.zero_point):
                        bias = b_lo[xl][gi] if rh == 0 else b_hi[xl][gi]
                    else:
                        bias = sym
                    t = ptx.packed_add(t, bias, self.is_bf16)
                    t = ptx.packed_mul(t, s_lo[xl][gi] if rh == 0 else s_hi[xl][gi], self.is_bf16)
                    frag[(0, rh, i // 2), xl, kb] = t

    @cute.jit
    def _mainloop(self, ct, cw, tn: cutlass.Constexpr, tiled_mma, b_layout, sB_ptr, sW_addr, full0, empty0, g0, nk,
                  bmod):
        """The accumulators of ring sequence numbers ``g0 .. g0 + nk - 1`` (one row block's K tiles); ring
        sequence ``g`` reads B slot ``g % bmod`` (see ``_b_slots``)."""
        BK, S, XW, KB = self.BK, self.S, self.XW, self.KB
        sB = cute.make_tensor(cute.recast_ptr(sB_ptr, b_layout.inner, dtype=self.ab_dtype), b_layout.outer)
        thr_mma = tiled_mma.get_slice(ct)
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((64 * XW, tn)), Float32)
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_shape_A((64 * XW, BK)))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        frag = cute.recast_tensor(tCrA, Int32)
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        if const_expr(self.cfg.schedule == "serial"):
            for it in cutlass.range(nk, unroll=1):
                g = g0 + it
                stage = g % S
                cute.arch.mbarrier_wait(full0 + stage, (g // S) & 1)
                ptx.fence_proxy_async_smem()
                tw_ = self._load_tile_words(ct, cw, stage, sW_addr)
                for kb in cutlass.range_constexpr(KB):
                    self._decode_block(tw_, kb, frag)
                warpgroup.fence()
                for kb in cutlass.range_constexpr(KB):
                    cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb, self._bslot(g, bmod)], acc)
                warpgroup.commit_group()
                warpgroup.wait_group(0)
                cute.arch.mbarrier_arrive(empty0 + stage)
        else:
            for it in cutlass.range(nk, unroll=1):
                g = g0 + it
                stage = g % S
                cute.arch.mbarrier_wait(full0 + stage, (g // S) & 1)
                ptx.fence_proxy_async_smem()
                tw_ = self._load_tile_words(ct, cw, stage, sW_addr)
                bslot = self._bslot(g, bmod)
                # groups of MK k16 blocks: decode MK blocks, one fence, their WGMMAs, one commit
                MK = self.cfg.mma_kblocks
                NG = KB // MK
                for q in cutlass.range_constexpr(NG):
                    # group q's slots were last read by group q of the previous tile: NG - 1 groups were
                    # committed after it, so wait_group(NG - 1) retires it (no-op during the first tile); the
                    # hardware counts at most 7 pending groups, a smaller bound only waits longer
                    warpgroup.wait_group(min(NG - 1, 7))
                    if const_expr(q == NG - 1):
                        # every WGMMA of the previous tile has retired now: release its stage
                        if it > 0:
                            cute.arch.mbarrier_arrive(empty0 + (g + S - 1) % S)
                    for kb in cutlass.range_constexpr(q * MK, (q + 1) * MK):
                        self._decode_block(tw_, kb, frag)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(q * MK, (q + 1) * MK):
                        cute.gemm(tiled_mma, acc, tCrA[None, None, kb], tCrB[None, None, kb, bslot], acc)
                    warpgroup.commit_group()
            warpgroup.wait_group(0)
            if nk > 0:
                cute.arch.mbarrier_arrive(empty0 + (g0 + nk - 1) % S)
        return acc

    @cute.jit
    def _bslot(self, g, bmod):
        res = g % self.S
        if const_expr(self.RB > 1):
            res = g % bmod
        return res

    # ------------------------------------------------------------------------------------------
    def _acc_crd(self, v, rh, j, x, tn):
        """Coordinate of accumulator element (col pair v, row half rh, n8 block j, m64 block x) of a WGMMA
        N = ``tn`` accumulator."""
        if tn == 8:
            return ((v, rh), x, 0)
        return ((v, rh, j), x, 0)

    def _epi_threads(self, ct, cw):
        """``(tid, bar_id, last_ofs)`` of a consumer thread's epilogue: its index among the threads that share the
        epilogue, their named barrier, and the misc word of their split-K verdict (ping-pong: per warpgroup)."""
        if self.PP:
            return ct, 1 + cw, 4 + 4 * cw
        return cw * 128 + ct, 1, 4

    def _acc_elems(self, ct, cw, tn: int) -> list:
        """``[(token, column, accumulator coordinate)]`` of the thread's accumulator elements in the CTA's tile
        (column = 64 * m64 block + row in block), for the staging loops to unroll."""
        xoff = 0 if self.PP else cw * self.XW
        w_, l_ = ct // 32, ct % 32
        out = []
        for xl in range(self.XW):
            for rh in range(2):
                col = (xoff + xl) * 64 + 16 * w_ + l_ // 4 + 8 * rh
                for j in range(tn // 8):
                    for v in range(2):
                        out.append((8 * j + 2 * (l_ % 4) + v, col, self._acc_crd(v, rh, j, xl, tn)))
        return out

    @cute.jit
    def _epilogue(self, ct, cw, tn: cutlass.Constexpr, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws, counters,
                  nb, tile, split, n, num_routes, top_k, num_splits, g_rs, g_bs):
        if const_expr(self.S16):
            self._epilogue16(ct, cw, tn, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws, counters, nb,
                             tile, split, n, num_routes, top_k, num_splits, g_rs, g_bs)
        else:
            self._epilogue32(ct, cw, tn, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws, counters, nb,
                             tile, split, n, num_routes, top_k, num_splits, g_rs, g_bs)

    @cute.jit
    def _epilogue32(self, ct, cw, tn: cutlass.Constexpr, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws,
                    counters, nb, tile, split, n, num_routes, top_k, num_splits, g_rs, g_bs):
        slot0, count = self._tile_routes(misc_addr, g_rs, g_bs, tile)
        rs, nthr = self.rs, self.nepi
        tid, bar_id, last_ofs = self._epi_threads(ct, cw)
        # (A) accumulators -> FP32 staging [TN][cols]
        ptx.fence_proxy_async_smem()
        # every consumer is done with the ring (RB == 1: staging reuses it) and with the previous row
        # block's staging tile (RB > 1)
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthr)
        elems = self._acc_elems(ct, cw, tn)
        for a in cutlass.range_constexpr(2 * self.XW):  # nested: one flat loop of > 64 steps warns
            for b in cutlass.range_constexpr(tn // 4):
                tok, col, crd = elems[a * (tn // 4) + b]
                ptx.st_shared_f32(stg_addr + (tok * rs + col) * 4, acc[crd])
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthr)

        # (B) split-K: publish this split's partial tile, the last split to arrive finishes
        ws_base, _, is_last = publish_split(self.epi_shape, tid, stg_addr, misc_addr, last_ofs, ws, counters, n, nb,
                                            tile, split, num_splits, count, bar_id)

        # (C) finish: 8 output columns per item
        if is_last != 0:
            bias_base = Int64(0)
            if const_expr(self.cfg.bias):
                # the bias table [E, n] rides in the topk_weights slot; the CTA's expert is misc word 0
                bias_base = topk_weights.toint() + Int64(ptx.ld_shared_b32(misc_addr)) * Int64(n) * 4
            finish_store(self.epi_shape, tid, stg_addr, ws_base, num_splits, count, slot0, out, g_routes, topk_weights,
                         num_routes, top_k, n, nb, None, bias_base)

    @cute.jit
    def _epilogue16(self, ct, cw, tn: cutlass.Constexpr, acc, stg_addr, misc_addr, out, g_routes, topk_weights, ws,
                    counters, nb, tile, split, n, num_routes, top_k, num_splits, g_rs, g_bs):
        """``stage16`` (down, ``y``, no bias): the accumulators rounded to x's dtype in a 16-bit staging tile
        ``[TN][cols + 8]``, whose rows then go to ``y`` as 16-byte copies (the same values as the FP32 path:
        one rounding, nothing added before it). Split-K: every split stores its FP32 partial from the
        accumulators to ``ws``; the last to arrive sums them in split order (:func:`..common.epilogue.finish_store`,
        which reads only ``ws`` then)."""
        slot0, count = self._tile_routes(misc_addr, g_rs, g_bs, tile)
        nthr, cols, rs16 = self.nepi, self.cols, self.rs16
        tid, bar_id, last_ofs = self._epi_threads(ct, cw)
        elems = self._acc_elems(ct, cw, tn)
        ptx.fence_proxy_async_smem()
        # every consumer is done with the ring (RB == 1: staging reuses it) and with the previous row block's
        # staging tile (RB > 1)
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthr)
        if num_splits > 1:
            ws_base, _, tile_id = split_workspace(self.epi_shape, ws, n, nb, tile, num_splits)
            part = ws_base + Int64(split * self.epi_shape.tile_elems * 4)
            for a in cutlass.range_constexpr(2 * self.XW):
                for b in cutlass.range_constexpr(tn // 4):
                    tok, col, crd = elems[a * (tn // 4) + b]
                    _st_global_f32(part + Int64((tok * cols + col) * 4), acc[crd])
            is_last = split_verdict(tid, misc_addr, last_ofs, counters, tile_id, num_splits, bar_id, nthr)
            if is_last != 0:
                finish_store(self.epi_shape, tid, stg_addr, ws_base, num_splits, count, slot0, out, g_routes,
                             topk_weights, num_routes, top_k, n, nb, None, Int64(0))
        else:
            for a in cutlass.range_constexpr(2 * self.XW):
                for b in cutlass.range_constexpr(tn // 4):
                    tok, col, crd = elems[a * (tn // 4) + b]
                    ptx.st_shared_cvt16(stg_addr + (tok * rs16 + col) * 2, acc[crd], self.is_bf16)
            cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthr)
            # 8 columns (16 bytes) per item; every item's route id loaded up front (see finish_store)
            vpo = cols // 8
            n_items = (self.TN * vpo + nthr - 1) // nthr
            routes = cute.make_rmem_tensor((n_items,), Int32)
            for it in cutlass.range_constexpr(n_items):
                routes[it] = g_routes[slot0 + cutlass.min((tid + it * nthr) // vpo, count - 1)]
            out_base = out.toint()
            for it in cutlass.range_constexpr(n_items):
                idx = tid + it * nthr
                i = idx // vpo
                vv = idx % vpo
                if i < count:
                    d = ptx.ld_shared_v4(stg_addr + (i * rs16 + vv * 8) * 2)
                    off = Int64(routes[it]) * Int64(n) + Int64(nb * cols + vv * 8)
                    ptx.st_global_v4(out_base + off * 2, d[0], d[1], d[2], d[3])

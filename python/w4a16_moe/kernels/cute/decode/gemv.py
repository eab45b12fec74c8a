"""Route-major decode kernels of the fused W4A16 MoE (CuTe DSL; ``mma.sync`` + direct global loads).

For decode-sized batches (a few tokens) the MoE is a stream of weight bytes: every route reads its
expert's matrices once and the arithmetic is negligible. The grouped GEMMs then pay for what a GEMV does
not need: route preparation (a sort by expert), a tile -> expert search, the split-K fixup, a finalize
pass and the launches between them. These two kernels skip all of it and work *route-major*: a CTA
reads its expert id straight from ``topk_ids``.

* ``gate_up``: grid ``(4 * N / (64 X), R)``; CTA ``(4 nb + s, r)`` computes ``h[r, cols]`` of route
  ``r`` for the 16-row slice ``s`` of every m64 block of row block ``nb`` (gated: the gate and up halves
  sit in the same thread, see :mod:`..sm90.pack`), its ``warps`` warps splitting K into ``num_parts``
  parts (warp ``w`` takes parts ``w, w + warps, ...``; see the K split below). Invalid routes (expert id outside
  ``[expert_offset, expert_offset + E)``) exit at once; their ``h`` rows are never read.
* ``down``: grid ``(4 * H / (64 X), T)``; CTA ``(4 nb + s, t)`` computes ``out[t, cols]`` =
  ``sum_j topk_weights[t, j] * (W2_{e_j} h[t * top_k + j])`` over the token's valid routes. The work
  items ``(j, part)`` (``top_k * num_parts`` of them) are dealt to the warps round-robin; each warp keeps
  an FP32 running sum ``sum w_j * partial``, and the warps' sums are added in warp order at the end: a
  fixed order, so results are bit-identical run to run (there are no atomics and no finalize pass; a
  token without valid routes gets zeros).

Math: a warp reads, per k64 unit and m64 block, the 16 bytes of codes that WGMMA thread
``32 s + lane`` would read (the SM90 layout is the WGMMA register fragment, and warp ``s``'s 16 rows of
it are exactly the ``mma.sync.m16n8k16`` A fragment), dequantizes them with the SM90 kernel's
instructions (LOP3 magic decode, packed add, packed scale multiply: bit-identical weights) and runs
``mma.sync.aligned.m16n8k16`` with all eight B columns set to the activation (so every lane holds its rows'
result; no shuffles). FP32 accumulation. Weights and scales are loaded straight into registers with
``ld.global.nc.L1::no_allocate`` + an L2 evict-first policy, ``unroll`` k64 units per batch (all loads of a
batch are issued before any is used); units past the part's end are predicated off (zero codes, zero
scales, zero activations: they add exact zeros).

FP32 scales (``fp32_scale``, INT4 only, static): the codes are decoded to ``c - z`` (exact in 16 bits) without the
scale multiply, each scale group's ``mma.sync`` products are summed from zero in FP32, and the group's scale
(exact in FP32) multiplies that sum as it is added to the accumulator: one packed multiply per two weights and
the scales' byte permutes fewer, and no 16-bit rounding of the scaled weight (so its weights are not those of
the WGMMA kernels bit for bit; each result is closer to the FP32 reference).

Persistent grid (``ctas`` > 0): the grids above hold a CTA for every route (token), valid or not, and the
hardware deals them to the SMs as they come; with a few valid routes among many (an EP rank's decode
step) most CTAs exit at once and the working ones land unevenly. With ``ctas`` the grid is at most that
many CTAs (one wave on the GPU the value was tuned for); every CTA compacts the routes (gate_up: the valid
ones; down: the tokens with a valid route first, then the others, which get zeros) of each window of
``32 * warps`` routes (tokens) into shared memory with a warp ballot, and takes the window's work units
(route or token, row block, slice) ``blockIdx.x, blockIdx.x + gridDim.x, ...``. The units are the same as
above, so the results are bit-identical to the one-CTA-per-unit grid.

K split across CTAs (runtime ``S = num_splits``, grid z; persistent grids deal ``S`` adjacent units per
output tile): the ``S`` CTAs of one output tile (route or token, row block, slice) share its work. The K parts
are sized for ``warps * S`` warps (``num_parts = max(1, min(warps * S, cdiv(K / 64, unroll)))``, the same as
above when ``S = 1``), and split ``z``'s warp ``w`` takes the parts (gate_up) or ``(j, part)`` items (down)
``w * S + z, w * S + z + warps * S, ...``. With ``S > 1`` each CTA adds its warps' sums in warp order,
stores that FP32 partial (``16 X`` values: the gate and up sums for gate_up, the weighted route sum for
down) to ``ws``, fences, and bumps the tile's arrival counter (``atom.add``); the last arrival re-arms the
counter to 0, sums the ``S`` partials in split order ``0..S-1`` and stores the outputs (the activation for
gate_up, the combined token row for down): bit-identical run to run for a given ``S`` (the protocol of
:func:`..common.epilogue.publish_split`). ``S = 1`` touches neither ``ws`` nor ``counters``. Output tiles
are numbered ``row * (4 n / (64 X)) + 4 nb + s`` (``row``: route for gate_up, token for down).

Programmatic dependent launch (``pdl``, down only): every gate/up CTA triggers its dependents at once, the
down kernel is launched with the PDL attribute, and each down CTA, before ``griddepcontrol.wait``, reads its
token's expert ids (written before the gate/up kernel started) and prefetches a quarter of every valid
route's row block into L2 (``cp.async.bulk.prefetch.L2``; the row block of an expert is contiguous; with a
K split, split ``z`` takes the routes ``j = z (mod S)``), so the down kernel's launch and its weight fetch
overlap the gate/up kernel.

L2 prefetch (``l2_prefetch``, gate_up only, static): before its loads, thread 0 of each CTA asks L2 for one
contiguous ``1 / (4 S)`` of its route's row block (one ``cp.async.bulk.prefetch.L2`` request; the ``4 S`` CTAs of
the row block, slices and splits, together cover it once), and a persistent CTA asks for its next unit's part
while it works on the current one. The warps' loads then wait for L2 rather than for DRAM, and the whole unit's
DRAM traffic is requested at once instead of one load batch per warp at a time; at most two units per CTA are
ahead in L2. The results are those without it.

Biases (``bias``, static): the kernel adds the layer's per-expert FP32 biases where it stores: gate_up adds
``b13[e, col]`` (gated: the gate and up columns, the up half at ``n / 2``) to the FP32 sums before the
activation; down adds ``sum_j topk_weights[t, j] * b2[e_j, col]`` over the token's valid routes in top-k
order after its route sum (split: the last arrival, after the partials). The table ``[E, n]`` rides in the
``route_start`` slot (the provider's padded bias table, zeros where the layer has no bias of that matrix).

Launch ABI: the grouped GEMM's (one op, one loader), with these meanings:
``(w, act, out, sorted_routes = topk_ids [T*k] int32, route_start = the bias table FP32 ``[E, n]`` with
``bias`` (else unused), block_start (unused),
topk_weights [T*k] FP32 (down), ws = split partials FP32 [tiles * S * 16 X] (read only when S > 1),
counters = per-tile arrival counters int32 [tiles] (zeroed once at allocation, re-armed by the kernel;
read only when S > 1), num_experts = local E, n, k, num_routes = T*k, top_k, max_tiles = expert_offset,
num_splits = S, stream)``, ``tiles = (4 n / (64 X)) * (R or T)``. ``act`` is ``x [T, H]`` (gate_up) or
``h [T*k, I]`` (down, indexed by route); ``out`` is ``h`` or ``out [T, H]``, both in the compute dtype.
Constraints: ``n % (64 X) == 0``, ``k % BK == 0`` (the packed layout's), ``1 <= S <= 65535``. The grid comes
from these sizes (``__call__``): ``(4 n / (64 X), R or T, S)``, or ``(min(units * S, ctas),)`` when
persistent.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from ..common import ptx
from ..common.codes import INT4_MAGIC, INT4_SYM_BIAS, check_activation, check_mode_dtype
from ..common.dequant import e2m1_pair
from ..common.epilogue import act, split_arrive
from ..common.grid import fake_launch_args
from .loads import INT4_SYM_BIAS_X16, ld_act, ld_stream
from .config import DecodeGemvConfig

__all__ = ["Sm90W4A16DecodeGemv", "DecodeGemvConfig", "PTXAS_OPTIONS"]

#: ptxas options of every decode kernel (one CTA per SM is enough to budget registers for)
PTXAS_OPTIONS = "--ptxas-options='--minnctapersm 1'"


class Sm90W4A16DecodeGemv:
    """One route-major decode kernel (static config in ``__init__``; see the module docstring).

    ``__call__(w, act, out, topk_ids, _, _, topk_weights, ws, counters, num_experts, n, k, num_routes, top_k,
    expert_offset, num_splits, stream)``: raw pointers + ``Int32`` sizes (the grouped GEMM's launch ABI).
    """

    def __init__(self, cfg: DecodeGemvConfig, arch: str = "sm_90a"):
        c = cfg
        check_mode_dtype(c.mode, c.dtype)
        check_activation(c.mode, c.activation)
        if c.k_tile not in (64, 128) or c.m64_per_block not in (1, 2, 4, 8):
            raise ValueError("k_tile must be 64 or 128 and m64_per_block 1, 2, 4 or 8 (the SM90 layouts)")
        if c.gated and c.m64_per_block % 2:
            raise ValueError("gated gate_up needs an even m64_per_block (gate + up halves)")
        g = c.group
        if g and (g % 16 or not (64 % g == 0 or g % 64 == 0)):
            raise ValueError("group must be 16, 32, 64 or a multiple of 64 (or 0 = per channel)")
        if g and not (c.k_tile % g == 0 or g % c.k_tile == 0):
            raise ValueError("group and k_tile: one must divide the other")
        if c.fp4 and c.zero_point:
            raise ValueError("FP4 (E2M1) weights have no zero points")
        if c.warps not in (1, 2, 4, 8, 16) or c.unroll not in (1, 2, 3, 4, 6, 8):
            raise ValueError("warps must be 1, 2, 4, 8 or 16 and unroll 1, 2, 3, 4, 6 or 8")
        if c.fp32_scale and c.fp4:
            raise ValueError("fp32_scale is for INT4 codes (FP4 codes are scaled in 16 bits: the pack folds "
                             "2**14 / 2**126 into their scales)")
        if c.l2_prefetch and c.mode != "gate_up":
            raise ValueError("l2_prefetch is a gate_up knob (the down kernel prefetches under PDL)")
        self.cfg = c
        self.arch = arch
        self.is_bf16 = c.dtype == "bf16"
        self.X, self.BK = c.m64_per_block, c.k_tile
        self.C = self.BK // 64
        self.W, self.U = c.warps, c.unroll
        self.threads = 32 * self.W
        self.gpt = (self.BK // g) if (g and g <= self.BK) else 1
        self.wpu = (64 // g) if (g and g <= 64) else 1  # scale words a k64 unit uses
        self.code_bytes = self.X * self.C * 2048
        self.scale_bytes = self.X * 32 * self.gpt * 4
        self.bias_bytes = self.scale_bytes if c.zero_point else 0
        self.chunk = self.code_bytes + self.scale_bytes + self.bias_bytes
        self.magic = INT4_MAGIC[c.dtype]
        self.sym_bias = INT4_SYM_BIAS[c.dtype]  # -(magic + 8) in both halves
        self.outs = (self.X // 2 if c.gated else self.X) * 16  # outputs per CTA
        self.pdl = c.pdl and c.mode == "down"
        # lean load batches, with FP32 scales of one group per k64 unit (g >= 64: the default knob sets of INT4 g >= 64):
        # whole batches with plain loads (the part's last one predicated) and their K tile from a shift and a mask.
        # Not with 16-bit scales (H100: the unroll-8 knob sets 1.14-1.30 x slower with it, docs/perf/2026-12-05-decode-
        # lean-batches) nor with FP32 scales of several groups per unit (254-255 registers: they spill); those
        # kernels are main's code before the change
        self.plain_batches = c.fp32_scale and self.wpu == 1
        # FP16 with lean batches and no zero points: the nibbles at bits 4..7 of each half (A fragment registers 1 and
        # 3: rows g + 8) are decoded in place as 16 (c - 8), one shift a code word instead of three; those rows' group
        # sums are then 16 x and their scale is taken / 16 in FP32 (exact): bit-identical results
        self.x16 = self.plain_batches and c.dtype == "fp16" and not c.zero_point
        self.ctas = c.ctas
        if c.ctas < 0 or c.ctas > 65535:
            raise ValueError("ctas must be 0 (one CTA per work unit) or a CTA count in 1..65535")

    # ------------------------------------------------------------------------------------------------------
    def fake_args(self) -> list:
        ab = cutlass.BFloat16 if self.is_bf16 else cutlass.Float16
        return fake_launch_args(ab, ab)

    def compile(self, arch: str = "sm_90a"):
        """Cross-compile for ``arch`` (no GPU needed)."""
        self.arch = arch
        return cute.compile(self, *self.fake_args(), options=f"--gpu-arch {arch} {PTXAS_OPTIONS}")

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
            red: cute.struct.Align[cute.struct.MemRange[Float32, self.W * self.X * 16], 16]
            lst: cute.struct.Align[cute.struct.MemRange[Int32, self.threads], 16]
            wtot: cute.struct.Align[cute.struct.MemRange[Int32, 16], 16]
            flag: cute.struct.Align[cute.struct.MemRange[Int32, 4], 16]
            part: cute.struct.Align[cute.struct.MemRange[Float32, self.X * 16], 16]

        self.storage_cls = Storage
        rows = num_routes if const_expr(self.cfg.mode == "gate_up") else num_routes // top_k
        upr = (n // (64 * self.X)) * 4
        if const_expr(self.ctas > 0):
            grid = [cutlass.max(cutlass.min(upr * rows * num_splits, Int32(self.ctas)), Int32(1)), 1, 1]
        else:
            grid = [upr, rows, num_splits]
        self.kernel(w, act, out, sorted_routes, route_start, topk_weights, ws, counters, num_experts, n, k,
                    num_routes, top_k, max_tiles, num_splits).launch(
            grid=grid,
            block=[self.threads, 1, 1],
            stream=stream,
            use_pdl=self.pdl,
        )

    # ------------------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        w: cute.Pointer,
        act: cute.Pointer,
        out: cute.Pointer,
        ids: cute.Pointer,
        bias_tab: cute.Pointer,
        topk_weights: cute.Pointer,
        ws: cute.Pointer,
        counters: cute.Pointer,
        num_experts: Int32,
        n: Int32,
        k: Int32,
        num_routes: Int32,
        top_k: Int32,
        expert_offset: Int32,
        num_splits: Int32,
    ):
        X = self.X
        tidx, _, _ = cute.arch.thread_idx()
        bx, by, bz = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        g_ids = cute.make_tensor(ids, cute.make_layout(num_routes))
        g_tw = cute.make_tensor(topk_weights, cute.make_layout(num_routes))
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        red = st.red.data_ptr().toint()
        tot = cute.make_rmem_tensor((2 * X,), Float32)
        acc = cute.make_rmem_tensor((4 * X,), Float32)
        units = k // 64
        # K parts per route: about one load batch each, at most one per warp of the route's S CTAs
        # (decode.family.num_parts)
        num_parts = cutlass.max(cutlass.min(Int32(self.W) * num_splits, (units + (self.U - 1)) // self.U), 1)
        per = (units + num_parts - 1) // num_parts
        sp = (ws, counters, num_splits, st.flag.data_ptr().toint(), st.part.data_ptr().toint(),
              (bias_tab, g_ids, g_tw, top_k, expert_offset, num_experts))
        wrow = Int64(n // (64 * X)) * Int64(k // self.BK) * Int64(self.chunk)  # bytes per expert
        up = const_expr(self.cfg.mode == "gate_up")
        if const_expr(up):
            # let the down kernel (launched with programmatic dependent launch) start its prologue
            cute.arch.griddepcontrol_launch_dependents()
        upr = (n // (64 * X)) * 4
        if const_expr(self.ctas == 0):
            s = bx % 4
            nb = bx // 4
            tile = by * upr + bx
            if const_expr(up):
                if const_expr(self.cfg.l2_prefetch):
                    if tidx == 0:
                        self._prefetch_up(w, g_ids, num_experts, k, expert_offset, wrow, by, nb, s, bz, num_splits)
                self._up_unit(w, act, out, g_ids, tot, acc, red, num_experts, n, k, top_k, expert_offset,
                              num_parts, units, per, wrow, warp, lane, tidx, by, nb, s, bz, tile, sp)
            else:
                if const_expr(self.pdl):
                    self._prefetch(w, g_ids, num_experts, k, top_k, expert_offset, wrow, tidx, by, nb, s, bz,
                                   num_splits)
                    cute.arch.griddepcontrol_wait()
                self._down_unit(w, act, out, g_ids, g_tw, tot, acc, red, num_experts, n, k, top_k, expert_offset,
                                num_parts, units, per, wrow, warp, lane, tidx, by, nb, s, bz, tile, sp)
        else:
            # persistent: the work of the valid routes (gate_up) / of the tokens with a valid route first
            # (down), compacted per window of `threads` routes / tokens, dealt to the CTAs round-robin
            lst = st.lst.data_ptr().toint()
            wtot = st.wtot.data_ptr().toint()
            # (with a K split the S units of one output tile are adjacent: unit u = tile unit u // S, split u % S)
            rows = num_routes if const_expr(up) else num_routes // top_k
            nctas = cute.arch.grid_dim()[0]
            for w0 in cutlass.range(0, rows, self.threads, unroll=1):
                nvalid, nwin = self._compact(g_ids, rows, w0, num_experts, top_k, expert_offset, lst, wtot,
                                             warp, lane, tidx)
                cnt = (nvalid if const_expr(up) else nwin) * upr * num_splits
                if const_expr(not up and self.pdl):
                    for u in cutlass.range(bx, cnt, nctas, unroll=1):
                        q = u // num_splits
                        z = u - q * num_splits
                        v = q // upr
                        rem = q - v * upr
                        nb = rem // 4
                        t = ptx.ld_shared_b32(lst + v * 4)
                        self._prefetch(w, g_ids, num_experts, k, top_k, expert_offset, wrow, tidx, t, nb,
                                       rem - nb * 4, z, num_splits)
                    cute.arch.griddepcontrol_wait()
                if const_expr(up and self.cfg.l2_prefetch):
                    if tidx == 0:
                        if bx < cnt:
                            self._prefetch_up_unit(w, g_ids, num_experts, k, expert_offset, wrow, lst, upr, bx,
                                                   num_splits)
                for u in cutlass.range(bx, cnt, nctas, unroll=1):
                    if const_expr(up and self.cfg.l2_prefetch):
                        if tidx == 0:
                            if u + nctas < cnt:  # this CTA's next unit of the window, while it works on this one
                                self._prefetch_up_unit(w, g_ids, num_experts, k, expert_offset, wrow, lst, upr,
                                                       u + nctas, num_splits)
                    q = u // num_splits
                    z = u - q * num_splits
                    v = q // upr
                    rem = q - v * upr
                    nb = rem // 4
                    s = rem - nb * 4
                    rr = ptx.ld_shared_b32(lst + v * 4)
                    tile = rr * upr + rem
                    if const_expr(up):
                        self._up_unit(w, act, out, g_ids, tot, acc, red, num_experts, n, k, top_k, expert_offset,
                                      num_parts, units, per, wrow, warp, lane, tidx, rr, nb, s, z, tile, sp)
                    else:
                        self._down_unit(w, act, out, g_ids, g_tw, tot, acc, red, num_experts, n, k, top_k,
                                        expert_offset, num_parts, units, per, wrow, warp, lane, tidx, rr, nb, s, z,
                                        tile, sp)
                    cute.arch.sync_threads()  # `red` is rewritten by the next unit
                cute.arch.sync_threads()  # `lst` is rewritten by the next window

    @cute.jit
    def _compact(self, g_ids, rows, w0, num_experts, top_k, expert_offset, lst, wtot, warp, lane, tidx):
        """Window ``[w0, w0 + threads)`` of the routes (gate_up) or tokens (down), compacted into ``lst``:
        the valid routes / the tokens with at least one valid route first (in order), then (down) the
        others. Returns ``(valid count, window size)``."""
        i = w0 + tidx
        ok = Int32(0)
        if i < rows:
            if const_expr(self.cfg.mode == "gate_up"):
                e = g_ids[i] - expert_offset
                if e >= 0:
                    if e < num_experts:
                        ok = Int32(1)
            else:
                for j in cutlass.range(top_k, unroll=1):
                    e = g_ids[i * top_k + j] - expert_offset
                    if e >= 0:
                        if e < num_experts:
                            ok = Int32(1)
        bal = ptx.ballot(ok)
        pre = cute.arch.popc(bal & ptx.lanemask_lt())
        if lane == 0:
            ptx.st_shared_b32(wtot + warp * 4, cute.arch.popc(bal))
        cute.arch.sync_threads()
        off = Int32(0)
        nvalid = Int32(0)
        for ww in cutlass.range_constexpr(self.W):
            c = ptx.ld_shared_b32(wtot + ww * 4)
            nvalid = nvalid + c
            if ww < warp:
                off = off + c
        if i < rows:
            if ok != 0:
                ptx.st_shared_b32(lst + (off + pre) * 4, i)
            else:
                if const_expr(self.cfg.mode == "down"):
                    ptx.st_shared_b32(lst + (nvalid + tidx - off - pre) * 4, i)
        cute.arch.sync_threads()
        return nvalid, cutlass.min(rows - w0, Int32(self.threads))

    @cute.jit
    def _up_unit(self, w, act, out, g_ids, tot, acc, red, num_experts, n, k, top_k, expert_offset, num_parts,
                 units, per, wrow, warp, lane, tidx, r, nb, s, z, tile, sp):
        """gate_up: ``h[r, cols]`` of route ``r``'s 16-row slice ``s`` of row block ``nb`` (CTA-wide), K split
        ``z`` of ``S``: this CTA's warps take parts ``warp * S + z``, stepping ``warps * S``."""
        X = self.X
        w_nb = w.toint() + Int64(nb) * Int64(k // self.BK) * Int64(self.chunk)
        e = g_ids[r] - expert_offset
        if e >= 0:
            if e < num_experts:
                tot.fill(0.0)
                row = act.toint() + Int64(r // top_k) * Int64(k) * 2
                nsp = sp[2]
                for p in cutlass.range(warp * nsp + z, num_parts, self.W * nsp, unroll=1):
                    self._item(acc, w_nb + Int64(e) * wrow, row, p, per, units, s, lane)
                    for x in cutlass.range_constexpr(X):
                        tot[2 * x] = tot[2 * x] + acc[4 * x]
                        tot[2 * x + 1] = tot[2 * x + 1] + acc[4 * x + 2]
                self._finish(tot, red, out, warp, lane, tidx, s, nb, n, r, z, tile, sp)

    @cute.jit
    def _prefetch_up(self, w, g_ids, num_experts, k, expert_offset, wrow, r, nb, s, z, num_splits):
        """gate_up (``l2_prefetch``, one thread): bring part ``s S + z`` of route ``r``'s row block ``nb``
        into L2: the ``4 S`` CTAs of a row block (slices ``s``, splits ``z``) each ask for one contiguous
        ``1 / (4 S)`` of it, so that together they fetch it once, in one bulk request each."""
        e = g_ids[r] - expert_offset
        if e >= 0:
            if e < num_experts:
                w_nb = w.toint() + Int64(nb) * Int64(k // self.BK) * Int64(self.chunk) + Int64(e) * wrow
                span = Int32(k // self.BK) * Int32(self.chunk)
                part = ((span // (4 * num_splits) + 15) // 16) * 16
                lo = (s * num_splits + z) * part
                size = cutlass.min(part, span - lo)
                if size > 0:
                    ptx.prefetch_l2_bulk(w_nb + Int64(lo), size)

    @cute.jit
    def _prefetch_up_unit(self, w, g_ids, num_experts, k, expert_offset, wrow, lst, upr, u, num_splits):
        """:meth:`_prefetch_up` of persistent work unit ``u`` of the current window (compacted routes in ``lst``)."""
        q = u // num_splits
        z = u - q * num_splits
        v = q // upr
        rem = q - v * upr
        nb = rem // 4
        rr = ptx.ld_shared_b32(lst + v * 4)
        self._prefetch_up(w, g_ids, num_experts, k, expert_offset, wrow, rr, nb, rem - nb * 4, z, num_splits)

    @cute.jit
    def _prefetch(self, w, g_ids, num_experts, k, top_k, expert_offset, wrow, tidx, t, nb, s, z, num_splits):
        """down, before ``griddepcontrol.wait``: bring quarter ``s`` of every valid route's row block ``nb``
        of token ``t`` into L2 (the row block of an expert is contiguous in the packed layout); with a K split,
        the split ``z`` CTA takes routes ``z, z + S, ...`` (the S CTAs of a tile together fetch it once)."""
        w_nb = w.toint() + Int64(nb) * Int64(k // self.BK) * Int64(self.chunk)
        span = Int32(k // self.BK) * Int32(self.chunk)
        quarter = ((span // 4 + 15) // 16) * 16
        lo = s * quarter
        size = cutlass.min(quarter, span - lo)
        for j in cutlass.range(tidx * num_splits + z, top_k, self.threads * num_splits, unroll=1):
            ej = g_ids[t * top_k + j] - expert_offset
            if ej >= 0:
                if ej < num_experts:
                    if size > 0:
                        ptx.prefetch_l2_bulk(w_nb + Int64(ej) * wrow + Int64(lo), size)

    @cute.jit
    def _down_unit(self, w, act, out, g_ids, g_tw, tot, acc, red, num_experts, n, k, top_k, expert_offset,
                   num_parts, units, per, wrow, warp, lane, tidx, t, nb, s, z, tile, sp):
        """down: ``out[t, cols]`` of token ``t``'s 16-row slice ``s`` of row block ``nb`` (CTA-wide), K split
        ``z`` of ``S``: this CTA's warps take the items ``(j, part)`` ``warp * S + z``, stepping ``warps * S``."""
        X = self.X
        w_nb = w.toint() + Int64(nb) * Int64(k // self.BK) * Int64(self.chunk)
        tot.fill(0.0)
        nsp = sp[2]
        for it in cutlass.range(warp * nsp + z, top_k * num_parts, self.W * nsp, unroll=1):
            j = it // num_parts
            p = it - j * num_parts
            r = t * top_k + j
            e = g_ids[r] - expert_offset
            if e >= 0:
                if e < num_experts:
                    wt = g_tw[r]
                    row = act.toint() + Int64(r) * Int64(k) * 2
                    self._item(acc, w_nb + Int64(e) * wrow, row, p, per, units, s, lane)
                    for x in cutlass.range_constexpr(X):
                        tot[2 * x] = tot[2 * x] + wt * acc[4 * x]
                        tot[2 * x + 1] = tot[2 * x + 1] + wt * acc[4 * x + 2]
        self._finish(tot, red, out, warp, lane, tidx, s, nb, n, t, z, tile, sp)

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def _item(self, acc, wb, row, p, per, units, s, lane):
        """``acc`` = this warp's 16-row slice ``s`` of every m64 block times the activation row at ``row``
        over k64 units ``[p * per, min(units, (p + 1) * per))`` of the expert whose row block starts at
        ``wb`` (C fragment: ``acc[4x]`` row ``lane // 4``, ``acc[4x + 2]`` row ``lane // 4 + 8``)."""
        U = self.U
        acc.fill(0.0)
        u0 = p * per
        u1 = cutlass.min(units, u0 + per)
        nbat = (cutlass.max(u1 - u0, 0) + (U - 1)) // U
        t = 32 * s + lane  # the WGMMA thread whose fragment this lane reads
        q = t // 4
        pol = ptx.evict_first_policy()
        magic = Int32(ptx.signed32(self.magic))
        sym = Int32(ptx.signed32(self.sym_bias))
        xoff = (lane % 4) * 4
        if const_expr(self.plain_batches):
            nfull = cutlass.max(u1 - u0, 0) // U  # batches whose units are all in range: plain loads
            for b in cutlass.range(nfull, unroll=1):
                bt = self._load_batch_lean(wb, row, u0 + b * U, u1, t, q, xoff, pol, True)
                self._mma_batch(acc, bt, magic, sym)
            if nbat > nfull:
                bt = self._load_batch_lean(wb, row, u0 + nfull * U, u1, t, q, xoff, pol, False)
                self._mma_batch(acc, bt, magic, sym)
        else:
            for b in cutlass.range(nbat, unroll=1):
                bt = self._load_batch(wb, row, u0 + b * U, u1, t, q, xoff, pol)
                self._mma_batch(acc, bt, magic, sym)

    @cute.jit
    def _load_batch(self, wb, row, ub, u1, t, q, xoff, pol):
        """One load batch: k64 units ``ub .. ub + unroll`` (those at or past ``u1`` predicated off, zeros):
        ``(codes[ii][x][4], scales[ii][x][wpu], zero points[ii][x][wpu], activations[ii][8])``."""
        X, C, U, BK = self.X, self.C, self.U, self.BK
        cfg = self.cfg
        g = cfg.group
        codes, scl, bia, xw = [], [], [], []
        for ii in cutlass.range_constexpr(U):
            u = ub + ii
            ok = Int32(0)
            if u < u1:
                ok = Int32(1)
            kt = u // C
            c = u - kt * C
            cb = wb + Int64(kt) * Int64(self.chunk)
            gi0 = (c * 64) // g if const_expr(g and g <= BK) else 0
            cw, sw, bw = [], [], []
            for x in cutlass.range_constexpr(X):
                cw.append(ptx.ld_stream_pred(cb + Int64(((x * C + c) * 128 + t) * 16), ok, pol, 4))
                sa = cb + Int64(self.code_bytes + ((x * 32 + q) * self.gpt + gi0) * 4)
                sw.append(ptx.ld_stream_pred(sa, ok, pol, self.wpu))
                if const_expr(cfg.zero_point):
                    bw.append(ptx.ld_stream_pred(sa + self.scale_bytes, ok, pol, self.wpu))
            codes.append(cw)
            scl.append(sw)
            bia.append(bw)
            xa = row + Int64(u * 128 + xoff)
            xw.append([ptx.ld_act_pred(xa + (32 * (v // 2) + 16 * (v % 2)), ok) for v in range(8)])
        return codes, scl, bia, xw

    @cute.jit
    def _load_batch_lean(self, wb, row, ub, u1, t, q, xoff, pol, full: cutlass.Constexpr):
        """:meth:`_load_batch` of the lean kernels (:attr:`plain_batches`): the K tile from a shift and a mask, and
        with ``full`` (every unit before ``u1``) plain loads, no predicate and no zero fill."""
        X, C, U, BK = self.X, self.C, self.U, self.BK
        cfg = self.cfg
        g = cfg.group
        codes, scl, bia, xw = [], [], [], []
        for ii in cutlass.range_constexpr(U):
            u = ub + ii
            ok = Int32(1)
            if const_expr(not full):
                ok = Int32(0)
                if u < u1:
                    ok = Int32(1)
            # u >= 0 and C is 1 or 2: a shift and a mask (a signed division costs ~6 instructions a unit)
            if const_expr(C == 1):
                kt = u
                c = 0
            else:
                kt = u >> 1
                c = u & 1
            # the unit's first scale word in its K tile: (c * 64) // g, 0 when the group spans the tile
            gi0 = c * (64 // g) if const_expr(g and g <= 64) else 0
            cb = wb + Int64(kt) * Int64(self.chunk)
            cw, sw, bw = [], [], []
            for x in cutlass.range_constexpr(X):
                ca = cb + Int64(((x * C + c) * 128 + t) * 16)
                sa = cb + Int64(self.code_bytes + ((x * 32 + q) * self.gpt + gi0) * 4)
                if const_expr(full):
                    cw.append(ld_stream(ca, pol, 4))
                    sw.append(ld_stream(sa, pol, self.wpu))
                    if const_expr(cfg.zero_point):
                        bw.append(ld_stream(sa + self.scale_bytes, pol, self.wpu))
                else:
                    cw.append(ptx.ld_stream_pred(ca, ok, pol, 4))
                    sw.append(ptx.ld_stream_pred(sa, ok, pol, self.wpu))
                    if const_expr(cfg.zero_point):
                        bw.append(ptx.ld_stream_pred(sa + self.scale_bytes, ok, pol, self.wpu))
            codes.append(cw)
            scl.append(sw)
            bia.append(bw)
            xa = row + Int64(u * 128 + xoff)
            if const_expr(full):
                xw.append([ld_act(xa + (32 * (v // 2) + 16 * (v % 2))) for v in range(8)])
            else:
                xw.append([ptx.ld_act_pred(xa + (32 * (v // 2) + 16 * (v % 2)), ok) for v in range(8)])
        return codes, scl, bia, xw

    @cute.jit
    def _mma_batch(self, acc, bt, magic, sym):
        """Dequantize one load batch and accumulate its ``mma.sync`` products into ``acc``."""
        X, U = self.X, self.U
        cfg = self.cfg
        g = cfg.group
        codes, scl, bia, xw = bt
        if const_expr(cfg.fp32_scale):
            self._mma_batch_fp32_scale(acc, bt, magic, sym)
            return
        for ii in cutlass.range_constexpr(U):
            for x in cutlass.range_constexpr(X):
                for jj in cutlass.range_constexpr(4):
                    lg = (16 * jj) // g if const_expr(g and g <= 64) else 0
                    sv = scl[ii][x][lg]
                    s_lo = ptx.prmt_imm(sv, 0x1010)
                    s_hi = ptx.prmt_imm(sv, 0x3232)
                    word = codes[ii][x][jj]
                    a = []
                    for i in cutlass.range_constexpr(4):
                        rh = i % 2
                        if const_expr(cfg.fp4):
                            v = ptx.packed_mul(e2m1_pair(word, i, self.is_bf16), s_lo if rh == 0 else s_hi,
                                               self.is_bf16)
                        else:
                            src = word if i == 0 else (word >> (4 * i))
                            v = ptx.lop3_and_or(src, 0x000F000F, magic)
                            if const_expr(cfg.zero_point):
                                bv = bia[ii][x][lg]
                                bias = ptx.prmt_imm(bv, 0x1010) if rh == 0 else ptx.prmt_imm(bv, 0x3232)
                            else:
                                bias = sym
                            v = ptx.packed_add(v, bias, self.is_bf16)
                            v = ptx.packed_mul(v, s_lo if rh == 0 else s_hi, self.is_bf16)
                        a.append(v)
                    d = ptx.mma_16816(a[0], a[1], a[2], a[3], xw[ii][2 * jj], xw[ii][2 * jj + 1],
                                  acc[4 * x], acc[4 * x + 1], acc[4 * x + 2], acc[4 * x + 3], self.is_bf16)
                    for v in cutlass.range_constexpr(4):
                        acc[4 * x + v] = d[v]

    @cute.jit
    def _mma_batch_fp32_scale(self, acc, bt, magic, sym):
        """:meth:`_mma_batch` with ``fp32_scale`` (INT4): the codes become ``c - z`` in 16 bits (exact), each scale
        group's ``mma.sync`` products are summed from zero, and that FP32 sum times the group's scale (exact in
        FP32) is added to ``acc``: per group of one unit (g >= 64 or per channel: the unit; g = 32: two halves;
        g = 16: each k16 step). Only the C fragment's columns 0 and 2 are kept (all eight B columns are the
        activation: ``acc[4x + 1]`` / ``acc[4x + 3]`` would repeat ``acc[4x]`` / ``acc[4x + 2]``)."""
        X, U = self.X, self.U
        cfg = self.cfg
        g = cfg.group
        codes, scl, bia, xw = bt
        ngr = self.wpu  # scale groups per k64 unit
        if const_expr(self.x16):
            sym16 = Int32(ptx.signed32(INT4_SYM_BIAS_X16[cfg.dtype]))
        for ii in cutlass.range_constexpr(U):
            for x in cutlass.range_constexpr(X):
                for gi in cutlass.range_constexpr(ngr):
                    ua = [Float32(0.0), Float32(0.0), Float32(0.0), Float32(0.0)]
                    for jj in cutlass.range_constexpr(gi * 4 // ngr, (gi + 1) * 4 // ngr):
                        word = codes[ii][x][jj]
                        a = []
                        if const_expr(self.x16):
                            # registers 0 / 2: magic + c (bits 0..3); 1 / 3: magic + 16 c (bits 4..7), of word, word >> 8
                            w8 = word >> 8
                            for i in cutlass.range_constexpr(4):
                                src = word if i < 2 else w8
                                v = ptx.lop3_and_or(src, 0x00F000F0 if i % 2 else 0x000F000F, magic)
                                a.append(ptx.packed_add(v, sym16 if i % 2 else sym, self.is_bf16))
                        else:
                            for i in cutlass.range_constexpr(4):
                                src = word if i == 0 else (word >> (4 * i))
                                v = ptx.lop3_and_or(src, 0x000F000F, magic)
                                if const_expr(cfg.zero_point):
                                    bv = bia[ii][x][gi]
                                    bias = ptx.prmt_imm(bv, 0x1010) if i % 2 == 0 else ptx.prmt_imm(bv, 0x3232)
                                else:
                                    bias = sym
                                a.append(ptx.packed_add(v, bias, self.is_bf16))
                        d = ptx.mma_16816(a[0], a[1], a[2], a[3], xw[ii][2 * jj], xw[ii][2 * jj + 1],
                                          ua[0], ua[1], ua[2], ua[3], self.is_bf16)
                        ua = [d[0], d[1], d[2], d[3]]
                    sv = scl[ii][x][gi]
                    s_hi = ptx.half_to_f32(sv, True, self.is_bf16)
                    if const_expr(self.x16):
                        s_hi = s_hi * Float32(0.0625)  # rows g + 8 summed 16 (c - 8) x: exact in FP32
                    acc[4 * x] = acc[4 * x] + ptx.half_to_f32(sv, False, self.is_bf16) * ua[0]
                    acc[4 * x + 2] = acc[4 * x + 2] + s_hi * ua[2]

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def _finish(self, tot, red, out, warp, lane, tidx, s, nb, n, orow, z, tile, sp):
        """Add the warps' sums in warp order and store this CTA's outputs of output row ``orow``; with a K
        split (``S > 1``), publish them as split ``z``'s partial of output tile ``tile`` and let the tile's
        last CTA sum the ``S`` partials in split order and store the outputs."""
        X, W = self.X, self.W
        ws, counters, num_splits, flag, part, bctx = sp
        va = cute.make_rmem_tensor((4,), Float32)
        ua = cute.make_rmem_tensor((4,), Float32)
        if lane % 4 == 0:
            for x in cutlass.range_constexpr(X):
                for rh in cutlass.range_constexpr(2):
                    ptx.st_shared_f32(red + ((warp * X + x) * 16 + lane // 4 + 8 * rh) * 4, tot[2 * x + rh])
        cute.arch.sync_threads()
        if num_splits == 1:
            if tidx < self.outs:
                x = tidx // 16
                rr = tidx % 16
                v = Float32(0.0)
                for kk in cutlass.range_constexpr(W):
                    v = v + ptx.i32_as_f32(ptx.ld_shared_b32(red + ((kk * X + x) * 16 + rr) * 4))
                u = Float32(0.0)
                if const_expr(self.cfg.gated):
                    for kk in cutlass.range_constexpr(W):
                        u = u + ptx.i32_as_f32(ptx.ld_shared_b32(red + ((kk * X + x + X // 2) * 16 + rr) * 4))
                self._store(out, v, u, x, rr, s, nb, n, orow, bctx)
        else:
            # split-K across CTAs (the grouped GEMMs' protocol, common.epilogue.publish_split): partial
            # (staged in `part`) -> ws, fence, per-tile arrival counter; the last arrival re-arms it and sums
            # the partials in split order
            nv = X * 16
            base = ws.toint() + Int64(tile) * Int64(num_splits) * Int64(nv * 4)
            if tidx < nv:
                x = tidx // 16
                rr = tidx % 16
                v = Float32(0.0)
                for kk in cutlass.range_constexpr(W):
                    v = v + ptx.i32_as_f32(ptx.ld_shared_b32(red + ((kk * X + x) * 16 + rr) * 4))
                ptx.st_shared_f32(part + tidx * 4, v)
            cute.arch.sync_threads()
            if tidx < nv // 4:
                d = ptx.ld_shared_v4(part + tidx * 16)
                ptx.st_global_v4(base + Int64((z * nv + tidx * 4) * 4), d[0], d[1], d[2], d[3])
            ptx.fence_acq_rel_gpu()
            cute.arch.sync_threads()
            if tidx == 0:
                split_arrive(counters, tile, num_splits, flag)
            cute.arch.sync_threads()
            is_last = ptx.ld_shared_b32(flag)
            ptx.fence_acq_rel_gpu()
            if is_last != 0:
                # 4 outputs per thread: rows r0 .. r0 + 3 of m64 block x (16-byte loads of each partial)
                if tidx < self.outs // 4:
                    x = tidx // 4
                    r0 = (tidx % 4) * 4
                    va.fill(0.0)
                    ua.fill(0.0)
                    for zz in cutlass.range(num_splits, unroll=1):
                        pz = base + Int64((zz * nv + x * 16 + r0) * 4)
                        a = ptx.ld_global_cg_v4(pz)
                        for q in cutlass.range_constexpr(4):
                            va[q] = va[q] + ptx.i32_as_f32(a[q])
                        if const_expr(self.cfg.gated):
                            b = ptx.ld_global_cg_v4(pz + (X // 2) * 16 * 4)
                            for q in cutlass.range_constexpr(4):
                                ua[q] = ua[q] + ptx.i32_as_f32(b[q])
                    for q in cutlass.range_constexpr(4):
                        self._store(out, va[q], ua[q], x, r0 + q, s, nb, n, orow, bctx)

    @cute.jit
    def _store(self, out, v, u, x, rr, s, nb, n, orow, bctx):
        """Output ``(x, rr)`` of this CTA (row ``rr`` of m64 block ``x``'s slice ``s``): the activation of the
        gate sum ``v`` (and up sum ``u``, gated) for gate_up, ``v`` for down, to ``out[orow, col]``; with
        ``bias``, the expert's bias first (``bctx``: bias table, ids, topk_weights, top_k, expert_offset, E)."""
        X = self.X
        cfg = self.cfg
        if const_expr(cfg.gated):
            col = nb * (32 * X) + 64 * x + 16 * s + rr
        else:
            col = nb * (64 * X) + 64 * x + 16 * s + rr
        if const_expr(cfg.bias):
            tab, g_ids, g_tw, top_k, expert_offset, num_experts = bctx
            if const_expr(cfg.mode == "gate_up"):
                e = g_ids[orow] - expert_offset  # a valid route: invalid ones exit before storing
                g_b = cute.make_tensor(tab, cute.make_layout((e + 1) * n))
                v = v + ptx.i32_as_f32(g_b[e * n + col])
                if const_expr(cfg.gated):
                    u = u + ptx.i32_as_f32(g_b[e * n + n // 2 + col])
            else:
                g_b = cute.make_tensor(tab, cute.make_layout(num_experts * n))
                for j in cutlass.range(top_k, unroll=1):
                    r = orow * top_k + j
                    ej = g_ids[r] - expert_offset
                    if ej >= 0:
                        if ej < num_experts:
                            v = v + g_tw[r] * ptx.i32_as_f32(g_b[ej * n + col])
        if const_expr(cfg.gated):
            val = act(cfg.activation, v, u)
            ldo = n // 2
        else:
            val = act(cfg.activation, v, v) if const_expr(cfg.mode == "gate_up") else v
            ldo = n
        g_out = cute.make_tensor(out, cute.make_layout((orow + 1) * ldo))
        g_out[orow * ldo + col] = val.to(g_out.element_type)

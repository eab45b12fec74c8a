"""Route preparation and the deterministic finalize as CuTe DSL kernels (the Triton kernels' contract).

Every kernel takes the family launch ABI (nine pointers, seven ``Int32``, the stream; see
:mod:`.launch` for what each slot carries per mode), so one torch op / ctypes path launches all of them.
All sizes are run-time ints: one compiled kernel serves every size. Global memory is addressed with
64-bit byte addresses and inline PTX (plain ``ld.global`` / ``st.global``, so data written by the kernel
before a ``griddepcontrol.wait`` is read coherently); the per-expert tables live in shared memory and are
updated with ``atom.shared.add`` (no global workspace besides ``hist`` of the two-kernel path).

* :class:`RoutePrepSingle` (``single``, one CTA): zero ``zeroed``, count the valid routes per local expert
  (shared atomics), scan the counts (route and row-block prefix sums), write ``route_start`` /
  ``block_start`` / ``block_info`` (every table entry by a thread of its own: block ``b`` finds its expert
  by a binary search of the block prefix sums), then scatter the routes with shared atomics on cursors.
* :class:`RouteHist` (``hist``, P CTAs): CTA ``p`` counts the routes of its span into row ``p`` of
  ``hist [P, E_PAD]`` (every entry written) and zeroes its share of ``zeroed``.
* :class:`RoutePlace` (``place``, P CTAs, launched with PDL): sums the ``hist`` rows (all: the totals;
  those before ``p``: where its routes of each expert start), scans, writes its share of ``block_info``
  (CTA 0 also ``route_start`` / ``block_start``) and scatters its span.
* :class:`MaskedRoutePrep` (``masked``, grid ``(E, cdiv(cap, 16))``): the masked layout's prefix sums,
  route ids and zeroed dead rows of ``out``; also zeroes ``zeroed`` (the Triton path memsets it).
* :class:`Finalize` (``finalize``, grid ``(T, cdiv(H, 32 * warps * vec))``): ``out[t] = sum_j w[t, j] *
  y[t*k + j]`` over the valid routes, ``j = 0 .. k-1``, in FP32, one ``cvt.rn`` at the end: the operations
  of the Triton finalize's PTX in its order (``j = 0``: ``valid ? fma.rn(w, y, 0) : 0``; then ``acc +
  (valid ? w * y : 0)`` with ``mul.rn`` and ``add.rn``; an invalid route adds ``+0.0``). ``y`` rows are read
  through their stride ``ld >= H`` (a padded plan's down GEMM writes ``Hp`` columns).
* :class:`PadCopy` (``pad``, grid ``(M, cdiv(W, 32 * warps * vec))``): ``out [M, W] = x [M, C]`` then zeros
  (``W >= C``), every element of ``out`` written once: a padded plan's activation buffer in one launch.

``block_info`` rows are written as 16 bytes ``(expert, row_begin, row_end, 0)``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..common import ptx
from ..common.ptx import half_to_f32
from .config import RoutingConfig

__all__ = ["RoutePrepSingle", "RouteHist", "RoutePlace", "MaskedRoutePrep", "Finalize", "PadCopy", "kernel_class",
           "MASKED_ROWS"]

#: rows of one expert handled by a CTA of the masked preparation
MASKED_ROWS = 16
#: routes per thread whose ids are loaded together before the shared atomics that use them
ROUTE_UNROLL = 8


def _i32(x, loc, ip):
    return Int32(x).ir_value(loc=loc, ip=ip)


def _i64(x, loc, ip):
    return Int64(x).ir_value(loc=loc, ip=ip)


# ----------------------------------------------------------------------------------------------------------
# PTX helpers (side-effecting: they keep their order relative to barriers and griddepcontrol)
# ----------------------------------------------------------------------------------------------------------
@dsl_user_op
def ld_b32(addr, *, loc=None, ip=None) -> Int32:
    r = llvm.inline_asm(T.i32(), [_i64(addr, loc, ip)], "ld.global.b32 $0, [$1];", "=r,l",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def ld_b64(addr, *, loc=None, ip=None) -> Int64:
    r = llvm.inline_asm(T.i64(), [_i64(addr, loc, ip)], "ld.global.b64 $0, [$1];", "=l,l",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int64(r)


@dsl_user_op
def ld_u8(addr, *, loc=None, ip=None) -> Int32:
    r = llvm.inline_asm(T.i32(), [_i64(addr, loc, ip)],
                        "{ .reg .b16 t; ld.global.u8 t, [$1]; cvt.u32.u16 $0, t; }", "=r,l",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def ld_u16(addr, *, loc=None, ip=None) -> Int32:
    r = llvm.inline_asm(T.i32(), [_i64(addr, loc, ip)],
                        "{ .reg .b16 t; ld.global.u16 t, [$1]; cvt.u32.u16 $0, t; }", "=r,l",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def ld_v4(addr, *, loc=None, ip=None):
    st = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
    r = llvm.inline_asm(st, [_i64(addr, loc, ip)], "ld.global.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
                        has_side_effects=True, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def st_b16(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i64(addr, loc, ip), _i32(v, loc, ip)],
                    "{ .reg .b16 t; cvt.u16.u32 t, $1; st.global.b16 [$0], t; }", "l,r",
                    has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def atom_shared_add(addr, v, *, loc=None, ip=None) -> Int32:
    """``atom.shared.add.u32`` (``addr`` a 32-bit shared address); returns the old value."""
    r = llvm.inline_asm(T.i32(), [_i32(addr, loc, ip), _i32(v, loc, ip)], "atom.shared.add.u32 $0, [$1], $2;",
                        "=r,r,r", has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def mul_rn(a, b, *, loc=None, ip=None) -> Float32:
    r = llvm.inline_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                        "mul.rn.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


@dsl_user_op
def fma_rn(a, b, c, *, loc=None, ip=None) -> Float32:
    r = llvm.inline_asm(T.f32(), [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c)],
                        "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


@dsl_user_op
def add_rn(a, b, *, loc=None, ip=None) -> Float32:
    r = llvm.inline_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
                        "add.rn.f32 $0, $1, $2;", "=f,f,f", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


@dsl_user_op
def cvt16(v, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """FP32 -> bf16 / f16 bits (round to nearest even) in the low half of an Int32."""
    cvt = "cvt.rn.bf16.f32" if is_bf16 else "cvt.rn.f16.f32"
    r = llvm.inline_asm(T.i32(), [Float32(v).ir_value(loc=loc, ip=ip)],
                        f"{{ .reg .b16 h; {cvt} h, $1; cvt.u32.u16 $0, h; }}", "=r,f",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


# ----------------------------------------------------------------------------------------------------------
class _Base:
    """Static config + fake arguments + compile; subclasses define ``ptr_types`` (the dtypes of the nine
    pointers), ``__call__`` and the kernel."""

    def __init__(self, cfg: RoutingConfig, arch: str = "sm_90a"):
        self.cfg = cfg
        self.arch = arch
        self.W = cfg.warps
        self.threads = 32 * cfg.warps
        self.pdl = cfg.pdl
        if cfg.pdl and arch in ("sm_80", "sm_86", "sm_89"):
            raise ValueError(f"pdl: programmatic dependent launch needs SM90 or later, not {arch}")

    def ptr_types(self) -> list:
        return [Int32] * 9

    def fake_args(self) -> list:
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        return ([make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=4) for dt in self.ptr_types()]
                + [Int32(1)] * 7 + [make_fake_stream()])

    def compile(self, arch: str = "sm_90a"):
        """Cross-compile for ``arch`` (no GPU needed)."""
        self.arch = arch
        return cute.compile(self, *self.fake_args(), options=f"--gpu-arch {arch}")

    @cute.jit
    def _zero(self, addr, begin, end, step, start):
        """``addr[i] = 0`` (int32) for ``i`` in ``begin + start, begin + start + step, ...`` below ``end``."""
        for i in cutlass.range(begin + start, end, step, unroll=1):
            ptx.st_global_b32(addr + Int64(i) * 4, Int32(0))


class _RouteBase(_Base):
    """Shared pieces of the three route-preparation kernels (``e_pad`` shared-memory tables)."""

    def __init__(self, cfg: RoutingConfig, arch: str = "sm_90a"):
        super().__init__(cfg, arch)
        self.E_PAD = cfg.e_pad
        self.PER = max(1, self.E_PAD // self.threads)  # scan entries per thread
        self.ids64 = cfg.ids == "int64"

    def ptr_types(self) -> list:
        return [Int64 if self.ids64 else Int32] + [Int32] * 8

    @cute.jit
    def _local(self, ids_addr, r, expert_offset, num_experts):
        """``(valid, local expert)`` of route ``r``; compares in the ids' own width."""
        ok = Int32(0)
        local = Int32(0)
        if const_expr(self.ids64):
            v = ld_b64(ids_addr + Int64(r) * 8)
            off = Int64(expert_offset)
            if v >= off:
                if v < off + Int64(num_experts):
                    ok = Int32(1)
                    local = Int32(v - off)
        else:
            v = ld_b32(ids_addr + Int64(r) * 4)
            if v >= expert_offset:
                if v < expert_offset + num_experts:
                    ok = Int32(1)
                    local = v - expert_offset
        return ok, local

    @cute.jit
    def _batch(self, ids_addr, r0, end, expert_offset, num_experts, oks, locs, tidx):
        """Validity and local expert of routes ``r0 + i * threads + tidx`` (``i < ROUTE_UNROLL``; past ``end``:
        invalid), all loads issued before any result is used."""
        for i in cutlass.range_constexpr(ROUTE_UNROLL):
            r = r0 + i * self.threads + tidx
            ok = Int32(0)
            local = Int32(0)
            if r < end:
                ok, local = self._local(ids_addr, r, expert_offset, num_experts)
            oks[i] = ok
            locs[i] = local

    @cute.jit
    def _count(self, ids_addr, start, end, expert_offset, num_experts, cnt, tidx):
        """``cnt[local expert] += 1`` (shared) for every valid route in ``[start, end)``."""
        oks = cute.make_rmem_tensor((ROUTE_UNROLL,), Int32)
        locs = cute.make_rmem_tensor((ROUTE_UNROLL,), Int32)
        for r0 in cutlass.range(start, end, self.threads * ROUTE_UNROLL, unroll=1):
            self._batch(ids_addr, r0, end, expert_offset, num_experts, oks, locs, tidx)
            for i in cutlass.range_constexpr(ROUTE_UNROLL):
                if oks[i] != 0:
                    atom_shared_add(cnt + locs[i] * 4, 1)

    @cute.jit
    def _scatter(self, ids_addr, start, end, expert_offset, num_experts, cur, sorted_addr, tidx):
        """Every valid route ``r`` of ``[start, end)`` to ``sorted[cur[local]++]`` (shared atomics)."""
        oks = cute.make_rmem_tensor((ROUTE_UNROLL,), Int32)
        locs = cute.make_rmem_tensor((ROUTE_UNROLL,), Int32)
        for r0 in cutlass.range(start, end, self.threads * ROUTE_UNROLL, unroll=1):
            self._batch(ids_addr, r0, end, expert_offset, num_experts, oks, locs, tidx)
            for i in cutlass.range_constexpr(ROUTE_UNROLL):
                if oks[i] != 0:
                    pos = atom_shared_add(cur + locs[i] * 4, 1)
                    ptx.st_global_b32(sorted_addr + Int64(pos) * 4, r0 + i * self.threads + tidx)

    @cute.jit
    def _scan(self, cnt, rbeg, bbeg, wsum, block_m, tidx):
        """Exclusive prefix sums over the ``E_PAD`` shared counts ``cnt`` (zero past E): routes into
        ``rbeg``, row blocks (``cdiv(count, block_m)``) into ``bbeg``. Thread ``t`` owns entries
        ``t*PER .. t*PER+PER-1``; a warp scan with shuffles, then the warp totals from ``wsum``."""
        PER = self.PER
        lane = tidx % 32
        warp = tidx // 32
        base = tidx * PER
        rs = Int32(0)
        bs = Int32(0)
        if base < self.E_PAD:
            for i in cutlass.range_constexpr(PER):
                c = ptx.ld_shared_b32(cnt + (base + i) * 4)
                rs = rs + c
                bs = bs + (c + block_m - 1) // block_m
        ri = rs
        bi = bs
        for s in cutlass.range_constexpr(5):
            o = 1 << s
            rv = cute.arch.shuffle_sync_up(ri, o)
            bv = cute.arch.shuffle_sync_up(bi, o)
            if lane >= o:
                ri = ri + rv
                bi = bi + bv
        if lane == 31:
            ptx.st_shared_b32(wsum + warp * 8, ri)
            ptx.st_shared_b32(wsum + warp * 8 + 4, bi)
        cute.arch.sync_threads()
        rp = ri - rs
        bp = bi - bs
        for ww in cutlass.range_constexpr(self.W):
            if ww < warp:
                rp = rp + ptx.ld_shared_b32(wsum + ww * 8)
                bp = bp + ptx.ld_shared_b32(wsum + ww * 8 + 4)
        if base < self.E_PAD:
            for i in cutlass.range_constexpr(PER):
                c = ptx.ld_shared_b32(cnt + (base + i) * 4)
                ptx.st_shared_b32(rbeg + (base + i) * 4, rp)
                ptx.st_shared_b32(bbeg + (base + i) * 4, bp)
                rp = rp + c
                bp = bp + (c + block_m - 1) // block_m
        cute.arch.sync_threads()

    @cute.jit
    def _write_tables(self, rbeg, bbeg, cnt, num_experts, block_m, route_start, block_start, block_info,
                      num_blocks, tidx, cta, b_first, b_step):
        """``route_start`` / ``block_start`` (entries ``0 .. E``; by CTA ``cta == 0``) and the rows ``b_first,
        b_first + b_step, ...`` of ``block_info``: block ``b`` below the block total belongs to the last expert
        ``e < E`` with ``bbeg[e] <= b``."""
        if cta == 0:
            for e in cutlass.range(tidx, num_experts + 1, self.threads, unroll=1):
                ptx.st_global_b32(route_start + Int64(e) * 4, ptx.ld_shared_b32(rbeg + e * 4))
                ptx.st_global_b32(block_start + Int64(e) * 4, ptx.ld_shared_b32(bbeg + e * 4))
        total = ptx.ld_shared_b32(bbeg + num_experts * 4)
        for b in cutlass.range(b_first, num_blocks, b_step, unroll=1):
            ex = num_experts
            r0 = Int32(0)
            r1 = Int32(0)
            if b < total:
                pos = Int32(0)
                for s in cutlass.range_constexpr(self.E_PAD.bit_length() - 1):
                    nxt = pos + (self.E_PAD >> (s + 1))
                    if nxt < num_experts:
                        if ptx.ld_shared_b32(bbeg + nxt * 4) <= b:
                            pos = nxt
                ex = pos
                rb = ptx.ld_shared_b32(rbeg + pos * 4)
                r0 = rb + (b - ptx.ld_shared_b32(bbeg + pos * 4)) * block_m
                r1 = rb + ptx.ld_shared_b32(cnt + pos * 4)
            ptx.st_global_v4(block_info + Int64(b) * 16, ex, r0, r1, Int32(0))


class RoutePrepSingle(_RouteBase):
    """The whole route preparation in one CTA.

    Slots: ``(ids [R] int32|int64, block_info [B, 4], sorted [R], zeroed [num_zero], route_start [E+1],
    block_start [E+1], -, -, -; num_experts, expert_offset, block_m, R, num_zero, num_blocks, -)``.
    Constraints: ``1 <= num_experts < e_pad``, ``block_m >= 1``, ``R >= 0``, ``block_info`` 16-byte aligned.
    Grid ``(1,)``; triggers its dependents at once when ``pdl``.
    """

    @cute.jit
    def __call__(self, w: cute.Pointer, act: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
                 route_start: cute.Pointer, block_start: cute.Pointer, topk_weights: cute.Pointer,
                 ws: cute.Pointer, counters: cute.Pointer, num_experts: Int32, n: Int32, k: Int32,
                 num_routes: Int32, top_k: Int32, max_tiles: Int32, num_splits: Int32, stream: cuda.CUstream):
        # the family launch ABI (parameter names included: the torch op checks them); slots per the docstring
        ids, block_info, zeroed = w, act, sorted_routes
        sorted_ = out
        expert_offset, block_m, num_zero, num_blocks = n, k, top_k, max_tiles
        @cute.struct
        class Storage:
            cnt: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            rbeg: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            bbeg: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            cur: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            wsum: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.W], 16]

        self.storage_cls = Storage
        self.kernel(ids, block_info, sorted_, zeroed, route_start, block_start, num_experts, expert_offset,
                    block_m, num_routes, num_zero, num_blocks).launch(
            grid=[1, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, ids: cute.Pointer, block_info: cute.Pointer, sorted_routes: cute.Pointer,
               zeroed: cute.Pointer, route_start: cute.Pointer, block_start: cute.Pointer, num_experts: Int32,
               expert_offset: Int32, block_m: Int32, num_routes: Int32, num_zero: Int32, num_blocks: Int32):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()  # a GEMM launched with PDL sets up, then waits
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        cnt = st.cnt.data_ptr().toint()
        rbeg = st.rbeg.data_ptr().toint()
        bbeg = st.bbeg.data_ptr().toint()
        cur = st.cur.data_ptr().toint()
        wsum = st.wsum.data_ptr().toint()
        self._zero(zeroed.toint(), Int32(0), num_zero, self.threads, tidx)
        for e in cutlass.range(tidx, self.E_PAD, self.threads, unroll=1):
            ptx.st_shared_b32(cnt + e * 4, Int32(0))
        cute.arch.sync_threads()
        self._count(ids.toint(), Int32(0), num_routes, expert_offset, num_experts, cnt, tidx)
        cute.arch.sync_threads()
        self._scan(cnt, rbeg, bbeg, wsum, block_m, tidx)
        self._write_tables(rbeg, bbeg, cnt, num_experts, block_m, route_start.toint(), block_start.toint(),
                           block_info.toint(), num_blocks, tidx, Int32(0), tidx, Int32(self.threads))
        for e in cutlass.range(tidx, self.E_PAD, self.threads, unroll=1):
            ptx.st_shared_b32(cur + e * 4, ptx.ld_shared_b32(rbeg + e * 4))
        cute.arch.sync_threads()
        self._scatter(ids.toint(), Int32(0), num_routes, expert_offset, num_experts, cur, sorted_routes.toint(),
                      tidx)


class RouteHist(_RouteBase):
    """Kernel 1 of the two-kernel path: per-span expert histograms.

    Slots: ``(ids, -, -, zeroed [num_zero], -, -, -, hist [P, e_pad], -; num_experts, expert_offset, -, R,
    num_zero, -, span)``. Grid ``(P = cdiv(R, span),)``; CTA ``p`` writes all ``e_pad`` entries of
    ``hist[p]`` and zeroes ``zeroed[p*z : (p+1)*z]`` with ``z = cdiv(num_zero, P)``.
    Constraints: ``1 <= num_experts < e_pad``, ``span >= 1``, ``R >= 1``. Triggers its dependents at once.
    """

    @cute.jit
    def __call__(self, w: cute.Pointer, act: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
                 route_start: cute.Pointer, block_start: cute.Pointer, topk_weights: cute.Pointer,
                 ws: cute.Pointer, counters: cute.Pointer, num_experts: Int32, n: Int32, k: Int32,
                 num_routes: Int32, top_k: Int32, max_tiles: Int32, num_splits: Int32, stream: cuda.CUstream):
        # the family launch ABI (parameter names included: the torch op checks them); slots per the docstring
        ids, zeroed, hist = w, sorted_routes, ws
        expert_offset, num_zero, span = n, top_k, num_splits
        @cute.struct
        class Storage:
            cnt: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]

        self.storage_cls = Storage
        programs = (num_routes + span - 1) // span
        self.kernel(ids, zeroed, hist, num_experts, expert_offset, num_routes, num_zero, span).launch(
            grid=[programs, 1, 1], block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, ids: cute.Pointer, zeroed: cute.Pointer, hist: cute.Pointer, num_experts: Int32,
               expert_offset: Int32, num_routes: Int32, num_zero: Int32, span: Int32):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()  # the place kernel (PDL) waits for this grid
        tidx, _, _ = cute.arch.thread_idx()
        p, _, _ = cute.arch.block_idx()
        nprog, _, _ = cute.arch.grid_dim()
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        cnt = st.cnt.data_ptr().toint()
        zper = (num_zero + nprog - 1) // nprog
        z0 = p * zper
        self._zero(zeroed.toint(), z0, cutlass.min(z0 + zper, num_zero), self.threads, tidx)
        for e in cutlass.range(tidx, self.E_PAD, self.threads, unroll=1):
            ptx.st_shared_b32(cnt + e * 4, Int32(0))
        cute.arch.sync_threads()
        start = p * span
        self._count(ids.toint(), start, cutlass.min(start + span, num_routes), expert_offset, num_experts, cnt,
                    tidx)
        cute.arch.sync_threads()
        row = hist.toint() + Int64(p) * (self.E_PAD * 4)
        for e in cutlass.range(tidx, self.E_PAD, self.threads, unroll=1):
            ptx.st_global_b32(row + Int64(e) * 4, ptx.ld_shared_b32(cnt + e * 4))


class RoutePlace(_RouteBase):
    """Kernel 2 of the two-kernel path: totals, tables (CTA 0) and the scatter of each span.

    Slots: ``(ids, block_info [B, 4], sorted [R], -, route_start, block_start, -, hist [P, e_pad], -;
    num_experts, expert_offset, block_m, R, -, num_blocks, span)``. Grid ``(P,)`` as :class:`RouteHist`.
    Launched with PDL when ``pdl``: ``griddepcontrol.wait`` before reading ``hist``, then triggers its
    dependents. Every CTA scans the totals; CTA ``p`` writes ``block_info`` rows ``p*threads + i*P*threads
    + tid``. Constraints: those of :class:`RoutePrepSingle` and :class:`RouteHist`.
    """

    @cute.jit
    def __call__(self, w: cute.Pointer, act: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
                 route_start: cute.Pointer, block_start: cute.Pointer, topk_weights: cute.Pointer,
                 ws: cute.Pointer, counters: cute.Pointer, num_experts: Int32, n: Int32, k: Int32,
                 num_routes: Int32, top_k: Int32, max_tiles: Int32, num_splits: Int32, stream: cuda.CUstream):
        # the family launch ABI (parameter names included: the torch op checks them); slots per the docstring
        ids, block_info, sorted_, hist = w, act, out, ws
        expert_offset, block_m, num_blocks, span = n, k, max_tiles, num_splits
        @cute.struct
        class Storage:
            cnt: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            rbeg: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            bbeg: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            cur: cute.struct.Align[cute.struct.MemRange[Int32, self.E_PAD], 16]
            wsum: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.W], 16]

        self.storage_cls = Storage
        programs = (num_routes + span - 1) // span
        self.kernel(ids, block_info, sorted_, route_start, block_start, hist, num_experts, expert_offset,
                    block_m, num_routes, num_blocks, span).launch(
            grid=[programs, 1, 1], block=[self.threads, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, ids: cute.Pointer, block_info: cute.Pointer, sorted_routes: cute.Pointer,
               route_start: cute.Pointer, block_start: cute.Pointer, hist: cute.Pointer, num_experts: Int32,
               expert_offset: Int32, block_m: Int32, num_routes: Int32, num_blocks: Int32, span: Int32):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # hist is complete and visible once this returns
            cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        p, _, _ = cute.arch.block_idx()
        nprog, _, _ = cute.arch.grid_dim()
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        cnt = st.cnt.data_ptr().toint()
        rbeg = st.rbeg.data_ptr().toint()
        bbeg = st.bbeg.data_ptr().toint()
        cur = st.cur.data_ptr().toint()
        wsum = st.wsum.data_ptr().toint()
        h = hist.toint()
        for e in cutlass.range(tidx, self.E_PAD, self.threads, unroll=1):
            tot = Int32(0)
            bef = Int32(0)
            if e < num_experts:  # entries past E are zero in every row
                for q in cutlass.range(nprog, unroll=4):
                    v = ld_b32(h + (Int64(q) * self.E_PAD + Int64(e)) * 4)
                    tot = tot + v
                    if q < p:
                        bef = bef + v
            ptx.st_shared_b32(cnt + e * 4, tot)
            ptx.st_shared_b32(cur + e * 4, bef)
        cute.arch.sync_threads()
        self._scan(cnt, rbeg, bbeg, wsum, block_m, tidx)
        # every CTA holds the whole scan: the block table is split over the CTAs, CTA 0 writes the starts
        self._write_tables(rbeg, bbeg, cnt, num_experts, block_m, route_start.toint(), block_start.toint(),
                           block_info.toint(), num_blocks, tidx, p, p * self.threads + tidx,
                           nprog * self.threads)
        for e in cutlass.range(tidx, self.E_PAD, self.threads, unroll=1):
            ptx.st_shared_b32(cur + e * 4, ptx.ld_shared_b32(cur + e * 4) + ptx.ld_shared_b32(rbeg + e * 4))
        cute.arch.sync_threads()
        start = p * span
        self._scatter(ids.toint(), start, cutlass.min(start + span, num_routes), expert_offset, num_experts, cur,
                      sorted_routes.toint(), tidx)


class MaskedRoutePrep(_Base):
    """The masked (DeepEP low-latency) layout: expert ``e``'s routes are rows ``e*cap + r``, ``r < m_e =
    clamp(masked_m[e], 0, cap)``.

    Slots: ``(masked_m [E] int32, -, out [E, cap, H] (16-bit), sorted [E*cap], route_start [E+1],
    block_start [E+1], -, zeroed [num_zero], -; E, H, block_m, cap, num_zero, -, -)``.
    Grid ``(E, cdiv(cap, MASKED_ROWS))``: CTA ``(e, c)`` sums ``m`` and ``cdiv(m, block_m)`` over the experts
    before ``e``, writes (``c == 0``) ``route_start[e]`` / ``block_start[e]`` (and entry E from the last
    expert), the route ids of its rows below ``m_e`` and zeros into its rows at or past ``m_e``; all CTAs
    together zero ``zeroed``. Constraints: ``E >= 1``, ``cap >= 1``, ``block_m >= 1``.
    Triggers its dependents at once when ``pdl``.
    """

    @cute.jit
    def __call__(self, w: cute.Pointer, act: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
                 route_start: cute.Pointer, block_start: cute.Pointer, topk_weights: cute.Pointer,
                 ws: cute.Pointer, counters: cute.Pointer, num_experts: Int32, n: Int32, k: Int32,
                 num_routes: Int32, top_k: Int32, max_tiles: Int32, num_splits: Int32, stream: cuda.CUstream):
        # the family launch ABI (parameter names included: the torch op checks them); slots per the docstring
        masked_m, sorted_, zeroed = w, sorted_routes, ws
        hidden, block_m, cap, num_zero = n, k, num_routes, top_k
        @cute.struct
        class Storage:
            wsum: cute.struct.Align[cute.struct.MemRange[Int32, 2 * self.W], 16]

        self.storage_cls = Storage
        self.kernel(masked_m, out, sorted_, route_start, block_start, zeroed, num_experts, hidden, block_m,
                    cap, num_zero).launch(
            grid=[num_experts, (cap + MASKED_ROWS - 1) // MASKED_ROWS, 1], block=[self.threads, 1, 1],
            stream=stream)

    @cute.jit
    def _clamped(self, mm, e, cap):
        m = ld_b32(mm + Int64(e) * 4)
        m = cutlass.max(m, Int32(0))
        return cutlass.min(m, cap)

    @cute.kernel
    def kernel(self, masked_m: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
               route_start: cute.Pointer, block_start: cute.Pointer, zeroed: cute.Pointer, num_experts: Int32,
               hidden: Int32, block_m: Int32, cap: Int32, num_zero: Int32):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_launch_dependents()  # a GEMM launched with PDL sets up, then waits
        tidx, _, _ = cute.arch.thread_idx()
        e, c, _ = cute.arch.block_idx()
        gx, gy, _ = cute.arch.grid_dim()
        lane = tidx % 32
        warp = tidx // 32
        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        wsum = st.wsum.data_ptr().toint()
        mm = masked_m.toint()
        # zeroed: a grid-stride loop over all CTAs
        cta = e * gy + c
        self._zero(zeroed.toint(), cta * self.threads, num_zero, gx * gy * self.threads, tidx)
        # prefix sums over the experts before e
        br = Int32(0)
        bb = Int32(0)
        for i in cutlass.range(tidx, e, self.threads, unroll=1):
            m = self._clamped(mm, i, cap)
            br = br + m
            bb = bb + (m + block_m - 1) // block_m
        for s in cutlass.range_constexpr(5):
            br = br + cute.arch.shuffle_sync_bfly(br, 16 >> s)
            bb = bb + cute.arch.shuffle_sync_bfly(bb, 16 >> s)
        if lane == 0:
            ptx.st_shared_b32(wsum + warp * 8, br)
            ptx.st_shared_b32(wsum + warp * 8 + 4, bb)
        cute.arch.sync_threads()
        before_r = Int32(0)
        before_b = Int32(0)
        for ww in cutlass.range_constexpr(self.W):
            before_r = before_r + ptx.ld_shared_b32(wsum + ww * 8)
            before_b = before_b + ptx.ld_shared_b32(wsum + ww * 8 + 4)
        me = self._clamped(mm, e, cap)
        if c == 0:
            if tidx == 0:
                ptx.st_global_b32(route_start.toint() + Int64(e) * 4, before_r)
                ptx.st_global_b32(block_start.toint() + Int64(e) * 4, before_b)
                if e == num_experts - 1:
                    ptx.st_global_b32(route_start.toint() + Int64(num_experts) * 4, before_r + me)
                    ptx.st_global_b32(block_start.toint() + Int64(num_experts) * 4,
                                      before_b + (me + block_m - 1) // block_m)
        r0 = c * MASKED_ROWS
        if tidx < MASKED_ROWS:
            row = r0 + tidx
            if row < me:
                ptx.st_global_b32(sorted_routes.toint() + Int64(before_r + row) * 4, e * cap + row)
        # rows max(me, r0) .. min(r0 + ROWS, cap) - 1 are one contiguous span of 16-bit zeros
        d0 = cutlass.max(me, r0)
        d1 = cutlass.min(r0 + MASKED_ROWS, cap)
        if d0 < d1:
            base = out.toint() + (Int64(e) * Int64(cap) + Int64(d0)) * Int64(hidden) * 2
            n = (d1 - d0) * hidden  # at most MASKED_ROWS * H elements
            head = Int32(((Int64(16) - (base & 15)) & 15) // 2)
            if Int32(base & 1) != 0:
                head = n  # not 2-byte aligned (never for a torch tensor): no vector stores
            head = cutlass.min(head, n)
            body = ((n - head) // 8) * 8
            for i in cutlass.range(tidx, head, self.threads, unroll=1):
                st_b16(base + Int64(i) * 2, Int32(0))
            vb = base + Int64(head) * 2
            for i in cutlass.range(tidx * 8, body, self.threads * 8, unroll=1):
                ptx.st_global_v4(vb + Int64(i) * 2, Int32(0), Int32(0), Int32(0), Int32(0))
            for i in cutlass.range(head + body + tidx, n, self.threads, unroll=1):
                st_b16(base + Int64(i) * 2, Int32(0))


class Finalize(_Base):
    """Deterministic combine ``out[t, :] = sum_j w[t, j] * y[t*k + j, :]`` over valid routes (FP32, fixed j
    order, ``mul.rn`` + ``add.rn``, one RN cast at the end; an invalid route adds ``+0.0`` and its ``y`` row
    is never read).

    Slots: ``(ids [T, k] int32|int64, ybuf [T*k, ld], out [T, H], valid [T, k] uint8, -, -, topk_weights
    [T, k] fp32, -, -; num_experts, H, ld, T, top_k, expert_offset, -)``: ``ybuf``'s rows are ``ld >= H``
    elements apart (its first ``H`` columns are read). Grid ``(T, cdiv(H, 32 * warps * vec))``. Constraints:
    ``T >= 1``, ``H >= 1``, ``top_k >= 1``, ``ld >= H``; ``vec == 8`` needs ``H % 8 == 0``, ``ld % 8 == 0`` and
    16-byte aligned ``ybuf`` / ``out``. Launched with PDL when ``pdl``: ``griddepcontrol.wait`` first.
    """

    def __init__(self, cfg: RoutingConfig, arch: str = "sm_90a"):
        super().__init__(cfg, arch)
        self.is_bf16 = cfg.dtype == "bf16"
        self.V = cfg.vec
        self.ids64 = cfg.ids == "int64"
        self.from_mask = cfg.from_mask

    def ptr_types(self) -> list:
        half = cutlass.BFloat16 if self.is_bf16 else cutlass.Float16
        ids = Int64 if self.ids64 else Int32
        return [ids, half, half, cutlass.Uint8, Int32, Int32, Float32, Int32, Int32]

    @cute.jit
    def __call__(self, w: cute.Pointer, act: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
                 route_start: cute.Pointer, block_start: cute.Pointer, topk_weights: cute.Pointer,
                 ws: cute.Pointer, counters: cute.Pointer, num_experts: Int32, n: Int32, k: Int32,
                 num_routes: Int32, top_k: Int32, max_tiles: Int32, num_splits: Int32, stream: cuda.CUstream):
        # the family launch ABI (parameter names included: the torch op checks them); slots per the docstring
        ids, ybuf, valid = w, act, sorted_routes
        hidden, ld, tokens, expert_offset = n, k, num_routes, max_tiles
        cols = self.threads * self.V
        self.kernel(ids, ybuf, out, valid, topk_weights, num_experts, hidden, ld, top_k, expert_offset).launch(
            grid=[tokens, (hidden + cols - 1) // cols, 1], block=[self.threads, 1, 1], stream=stream,
            use_pdl=self.pdl)

    @cute.jit
    def _valid(self, ids_addr, valid_addr, route, num_experts, expert_offset):
        ok = Int32(0)
        if const_expr(self.from_mask):
            if ld_u8(valid_addr + route) != 0:
                ok = Int32(1)
        if const_expr(not self.from_mask and self.ids64):
            v = ld_b64(ids_addr + route * 8)
            off = Int64(expert_offset)
            if v >= off:
                if v < off + Int64(num_experts):
                    ok = Int32(1)
        if const_expr(not self.from_mask and not self.ids64):
            v32 = ld_b32(ids_addr + route * 4)
            if v32 >= expert_offset:
                if v32 < expert_offset + num_experts:
                    ok = Int32(1)
        return ok

    @cute.jit
    def _term(self, acc, ids, ybuf, valid, topk_weights, num_experts, ld, expert_offset, route, col,
              first: cutlass.Constexpr):
        """Add route ``route``'s term to ``acc`` (``first``: ``acc`` holds zeros; see the kernel)."""
        V = self.V
        ok = self._valid(ids.toint(), valid.toint(), route, num_experts, expert_offset)
        w = ptx.i32_as_f32(ld_b32(topk_weights.toint() + route * 4))
        if ok != 0:
            src = ybuf.toint() + (route * Int64(ld) + Int64(col)) * 2
            ys = cute.make_rmem_tensor((V,), Float32)
            if const_expr(V == 8):
                words = ld_v4(src)
                for i in cutlass.range_constexpr(4):
                    ys[2 * i] = half_to_f32(words[i], False, self.is_bf16)
                    ys[2 * i + 1] = half_to_f32(words[i], True, self.is_bf16)
            else:
                ys[0] = half_to_f32(ld_u16(src), False, self.is_bf16)
            for i in cutlass.range_constexpr(V):
                if const_expr(first):
                    acc[i] = fma_rn(w, ys[i], Float32(0.0))
                else:
                    acc[i] = add_rn(acc[i], mul_rn(w, ys[i]))
        else:
            if const_expr(not first):
                for i in cutlass.range_constexpr(V):
                    acc[i] = add_rn(acc[i], Float32(0.0))

    @cute.kernel
    def kernel(self, ids: cute.Pointer, ybuf: cute.Pointer, out: cute.Pointer, valid: cute.Pointer,
               topk_weights: cute.Pointer, num_experts: Int32, hidden: Int32, ld: Int32, top_k: Int32,
               expert_offset: Int32):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()  # the previous kernel's writes (ybuf) are visible once this returns
        V = self.V
        tidx, _, _ = cute.arch.thread_idx()
        t, cb, _ = cute.arch.block_idx()
        col = (cb * self.threads + tidx) * V
        if col < hidden:
            acc = cute.make_rmem_tensor((V,), Float32)
            acc.fill(0.0)
            # j = 0 peeled: Triton folds its zero-initialized accumulator into that term (``0 + where(v, w*y,
            # 0)`` becomes ``v ? fma.rn(w, y, 0) : 0``, which differs from ``(w*y) + 0`` when w*y underflows
            # to -0); the later terms are ``acc + (v ? w*y : 0)`` with a separate multiply and add
            self._term(acc, ids, ybuf, valid, topk_weights, num_experts, ld, expert_offset,
                       Int64(t) * Int64(top_k), col, True)
            for j in cutlass.range(1, top_k, unroll=1):
                self._term(acc, ids, ybuf, valid, topk_weights, num_experts, ld, expert_offset,
                           Int64(t) * Int64(top_k) + Int64(j), col, False)
            dst = out.toint() + (Int64(t) * Int64(hidden) + Int64(col)) * 2
            if const_expr(V == 8):
                ptx.st_global_v4(dst, ptx.pack2_16(acc[0], acc[1], self.is_bf16),
                                 ptx.pack2_16(acc[2], acc[3], self.is_bf16),
                                 ptx.pack2_16(acc[4], acc[5], self.is_bf16),
                                 ptx.pack2_16(acc[6], acc[7], self.is_bf16))
            else:
                st_b16(dst, cvt16(acc[0], self.is_bf16))


class PadCopy(_Base):
    """Zero-padded copy ``out [M, W] = [x [M, C] | 0]`` of 16-bit elements (any 16-bit dtype: bits are copied).

    Slots: ``(x [M, C], -, out [M, W], -, -, -, -, -, -; -, W, C, M, -, -, -)``. Grid ``(M, cdiv(W, 32 * warps *
    vec))``; thread columns ``[col, col + vec)``: copied below ``C``, zeros from ``C`` on. Constraints: ``M >= 1``,
    ``W >= C >= 1``; ``vec == 8`` needs ``C % 8 == 0``, ``W % 8 == 0`` and 16-byte aligned ``x`` / ``out``.
    Launched with PDL when ``pdl``: ``griddepcontrol.wait`` first (it may follow a kernel writing ``x``).
    """

    def __init__(self, cfg: RoutingConfig, arch: str = "sm_90a"):
        super().__init__(cfg, arch)
        self.V = cfg.vec

    @cute.jit
    def __call__(self, w: cute.Pointer, act: cute.Pointer, out: cute.Pointer, sorted_routes: cute.Pointer,
                 route_start: cute.Pointer, block_start: cute.Pointer, topk_weights: cute.Pointer,
                 ws: cute.Pointer, counters: cute.Pointer, num_experts: Int32, n: Int32, k: Int32,
                 num_routes: Int32, top_k: Int32, max_tiles: Int32, num_splits: Int32, stream: cuda.CUstream):
        # the family launch ABI (parameter names included: the torch op checks them); slots per the docstring
        width, cols_in, rows = n, k, num_routes
        cols = self.threads * self.V
        self.kernel(w, out, width, cols_in).launch(grid=[rows, (width + cols - 1) // cols, 1],
                                                   block=[self.threads, 1, 1], stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, x: cute.Pointer, out: cute.Pointer, width: Int32, cols_in: Int32):
        if const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
        tidx, _, _ = cute.arch.thread_idx()
        r, cb, _ = cute.arch.block_idx()
        col = (cb * self.threads + tidx) * self.V
        if col < width:
            dst = out.toint() + (Int64(r) * Int64(width) + Int64(col)) * 2
            src = x.toint() + (Int64(r) * Int64(cols_in) + Int64(col)) * 2
            if const_expr(self.V == 8):  # C % 8 == 0: a thread's 8 columns are all below C or all above
                if col < cols_in:
                    words = ld_v4(src)
                    ptx.st_global_v4(dst, words[0], words[1], words[2], words[3])
                else:
                    ptx.st_global_v4(dst, Int32(0), Int32(0), Int32(0), Int32(0))
            else:
                if col < cols_in:
                    st_b16(dst, ld_u16(src))
                else:
                    st_b16(dst, Int32(0))


_CLASSES = {"single": RoutePrepSingle, "hist": RouteHist, "place": RoutePlace, "masked": MaskedRoutePrep,
            "finalize": Finalize, "pad": PadCopy}


def kernel_class(mode: str):
    return _CLASSES[mode]

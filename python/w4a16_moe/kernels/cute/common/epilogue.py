"""Epilogue blocks shared by the SM90 WGMMA and the warp-MMA grouped GEMMs (CuTe DSL device code).

Both kernels end a CTA's tile the same way once its FP32 accumulators sit in a shared staging tile
``[TN][cols + 4]`` (row = token of the tile, column = weight row of the CTA's row block; the padding keeps
the accumulator writes conflict free):

1. :func:`publish_split` (split-K, runtime ``num_splits > 1``): every split stores its partial tile (rows
   ``< count``) to ``ws`` and bumps the tile's counter; the last split to arrive re-arms the counter and
   alone goes on (``is_last``);
2. :func:`finish_store`: 8 output columns per item: :func:`gather8` (the staging row, or the fixed-order
   sum ``0..S-1`` of every split's partial: bit-identical whatever the arrival order; NVFP4 global scales),
   the expert's FP32 bias (``EpilogueShape.bias``: :func:`add_bias8`), :func:`act` (gate and up columns ``j``
   and ``cols / 2 + j`` of a staging row), then :func:`store8` (16-byte stores of h / y) or FP32 reductions
   into ``out`` (``atomic_f32``, scaled by the route's weight).

Biases (``bias``: gate_up and the down GEMM's ``y`` epilogue): ``bias_base`` is the FP32 row ``[n]`` of the
CTA's expert (gate/up: the padded, un-interleaved ``[gate rows | up rows]`` order, so a CTA's row block ``nb``
reads gate rows ``nb * cols_out + j`` and up rows ``n / 2 + nb * cols_out + j``; down: rows ``nb * cols + j``).
The kernels receive the bias table ``[E, n]`` in the ``topk_weights`` slot of the launch ABI, which only
``atomic_f32`` reads (and that epilogue takes no bias: the provider starts its accumulator from the weighted
biases).

The static shape of a kernel's epilogue is one :class:`EpilogueShape`; the threads that share it
synchronize with ``bar.sync 0`` (``bar_id`` None) or a named barrier.
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr

from . import ptx

__all__ = ["EpilogueShape", "act", "cta_sync", "publish_split", "split_workspace", "split_verdict", "finish_store", "gather8", "store8", "add_bias8"]


@dataclass(frozen=True)
class EpilogueShape:
    """Static shape of one kernel's epilogue (every field shapes the generated code)."""

    tokens: int  # TN: staging rows (routes of a token tile)
    cols: int  # accumulator columns (weight rows) of a CTA's row block
    threads: int  # threads sharing one epilogue
    mode: str  # "gate_up" | "down"
    epi: str  # "h" | "y" | "atomic_f32"
    activation: str  # gate_up only
    gated: bool
    is_bf16: bool
    vec_red: bool = True  # atomic_f32 with red.global.add.v4.f32 (sm_90+), else scalar reductions
    global_scale: bool = False  # NVFP4: FP32 per-row global scales multiply the accumulators
    bias: bool = False  # add the expert's FP32 bias row (gate_up, down "y") before the activation / rounding

    @property
    def rs(self) -> int:
        """Padded staging row stride (FP32 elements)."""
        return self.cols + 4

    @property
    def cols_out(self) -> int:
        """Output columns per CTA (gated: half the accumulator columns)."""
        return self.cols // 2 if self.gated else self.cols

    @property
    def tile_elems(self) -> int:
        """FP32 elements of one split's partial tile in ``ws``."""
        return self.tokens * self.cols


def _oai(activation: str) -> tuple:
    """``(alpha * log2(e), limit)`` of a ``swiglu_oai`` activation name (trace time)."""
    from .codes import act_params

    alpha, limit = act_params(activation)
    return alpha * 1.4426950408889634, limit


@cute.jit
def act(activation: cutlass.Constexpr, gate, up):
    """The fused activation in FP32: ``act(gate) * up`` (swiglu, geglu), ``act(gate)`` (relu2, silu), or gpt-oss's
    ``swiglu_oai``: ``g = min(gate, limit)``, ``u = clamp(up, -limit, limit)``, ``g * sigmoid(alpha g) * (u + 1)``
    (``alpha`` and ``limit`` static, from the activation name)."""
    if const_expr(activation.startswith("swiglu_oai")):
        a2, lim = _oai(activation)
        g = cutlass.min(gate, Float32(lim))
        u = cutlass.max(cutlass.min(up, Float32(lim)), Float32(-lim))
        return g * cute.arch.rcp_approx(1.0 + cute.arch.exp2(g * Float32(-a2))) * (u + 1.0)
    elif const_expr(activation == "swiglu"):
        return gate * cute.arch.rcp_approx(1.0 + cute.arch.exp2(gate * -1.4426950408889634)) * up
    elif const_expr(activation == "geglu"):
        return 0.5 * gate * (1.0 + cute.math.erf(gate * 0.7071067811865476)) * up
    elif const_expr(activation == "relu2"):
        r = cutlass.max(gate, Float32(0.0))
        return r * r
    else:  # silu
        return gate * cute.arch.rcp_approx(1.0 + cute.arch.exp2(gate * -1.4426950408889634))


@cute.jit
def cta_sync(bar_id, nthr: cutlass.Constexpr):
    """``bar.sync 0`` over the CTA (``bar_id`` None) or named barrier ``bar_id`` over ``nthr`` threads."""
    if const_expr(bar_id is None):
        cute.arch.sync_threads()
    else:
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthr)


@cute.jit
def split_arrive(counters, tile_id, num_splits, flag_addr):
    """One thread's arrival at output tile ``tile_id`` of a split-K launch (after its partial is stored and
    fenced): bump the tile's counter; the last of the ``num_splits`` arrivals re-arms it to 0 for the next
    launch. Writes the verdict (1: this CTA sums the partials) to the shared word at ``flag_addr``."""
    cnt_addr = counters.toint() + Int64(tile_id) * 4
    old = ptx.atom_add_gpu(cnt_addr, 1)
    last = Int32(0)
    if old == num_splits - 1:
        last = Int32(1)
        ptx.st_global_b32(cnt_addr, 0)  # re-arm for the next launch
    ptx.fence_acq_rel_gpu()
    ptx.st_shared_b32(flag_addr, last)


@cute.jit
def publish_split(shape: cutlass.Constexpr, tid, stg_addr, misc_addr, last_ofs, ws, counters, n, nb,
                  tile, split, num_splits, count, bar_id):
    """Split-K step of the tile ``(nb, tile)``: ``(ws_base, nb_count, is_last)``.

    With ``num_splits > 1`` every split stores its partial tile (staging rows ``< count``) to its slice of
    ``ws`` (``ws_base`` + split * tile), then thread ``tid == 0`` bumps the tile's counter; the last split to
    arrive re-arms it to 0 for the next launch. The verdict travels through the shared word at
    ``misc_addr + last_ofs``; ``is_last`` is 1 without split-K."""
    TN, cols, rs, nthr = shape.tokens, shape.cols, shape.rs, shape.threads
    tile_elems = shape.tile_elems
    ws_base, nb_count, tile_id = split_workspace(shape, ws, n, nb, tile, num_splits)
    is_last = Int32(1)
    if num_splits > 1:
        vpr = cols // 4
        for it in cutlass.range_constexpr((TN * vpr + nthr - 1) // nthr):
            idx = tid + it * nthr
            i = idx // vpr
            vv = idx % vpr
            if i < count:
                d = ptx.ld_shared_v4(stg_addr + (i * rs + vv * 4) * 4)
                dst = ws_base + Int64((split * tile_elems + i * cols + vv * 4) * 4)
                ptx.st_global_v4(dst, d[0], d[1], d[2], d[3])
        is_last = split_verdict(tid, misc_addr, last_ofs, counters, tile_id, num_splits, bar_id, nthr)
    return ws_base, nb_count, is_last


@cute.jit
def split_workspace(shape: cutlass.Constexpr, ws, n, nb, tile, num_splits):
    """``(ws_base, nb_count, tile_id)`` of output tile ``(nb, tile)``: its row-block count, its id, and where its
    ``num_splits`` partial tiles (``shape.tile_elems`` FP32 each, in split order) start in ``ws``."""
    nb_count = n // shape.cols
    tile_id = tile * nb_count + nb
    ws_base = ws.toint() + Int64(tile_id) * Int64(num_splits) * Int64(shape.tile_elems * 4)
    return ws_base, nb_count, tile_id


@cute.jit
def split_verdict(tid, misc_addr, last_ofs, counters, tile_id, num_splits, bar_id, nthr: cutlass.Constexpr):
    """After every thread stored its share of this split's partial tile: fence, arrive at the tile's counter
    (thread ``tid == 0``, :func:`split_arrive`) and return the verdict to every thread (1: this CTA sums the
    partials), through the shared word at ``misc_addr + last_ofs``."""
    ptx.fence_acq_rel_gpu()
    cta_sync(bar_id, nthr)
    if tid == 0:
        split_arrive(counters, tile_id, num_splits, misc_addr + last_ofs)
    cta_sync(bar_id, nthr)
    is_last = ptx.ld_shared_b32(misc_addr + last_ofs)
    ptx.fence_acq_rel_gpu()
    return is_last


@cute.jit
def gather8(shape: cutlass.Constexpr, res, stg_addr, ws_base, num_splits, i, col, gs_base):
    """``res`` (8 FP32, rmem) = staging row ``i`` from column ``col``: this CTA's tile, or the fixed-order sum
    of every split's partial with split-K; times the NVFP4 global scales at ``gs_base`` (``global_scale``)."""
    if num_splits > 1:
        res.fill(0.0)
        for s in cutlass.range(num_splits, unroll=1):
            base = ws_base + Int64((s * shape.tile_elems + i * shape.cols + col) * 4)
            a = ptx.ld_global_cg_v4(base)
            b = ptx.ld_global_cg_v4(base + 16)
            for q in cutlass.range_constexpr(4):
                res[q] = res[q] + ptx.i32_as_f32(a[q])
                res[4 + q] = res[4 + q] + ptx.i32_as_f32(b[q])
    else:
        a = ptx.ld_shared_v4(stg_addr + (i * shape.rs + col) * 4)
        b = ptx.ld_shared_v4(stg_addr + (i * shape.rs + col + 4) * 4)
        for q in cutlass.range_constexpr(4):
            res[q] = ptx.i32_as_f32(a[q])
            res[4 + q] = ptx.i32_as_f32(b[q])
    if const_expr(shape.global_scale):
        ga = ptx.ld_global_nc_v4(gs_base + col * 4)
        gb = ptx.ld_global_nc_v4(gs_base + col * 4 + 16)
        for q in cutlass.range_constexpr(4):
            res[q] = res[q] * ptx.i32_as_f32(ga[q])
            res[4 + q] = res[4 + q] * ptx.i32_as_f32(gb[q])


@cute.jit
def store8(addr, vals, is_bf16: cutlass.Constexpr):
    """Round 8 FP32 values to bf16 / f16 and store them as 16 bytes at global ``addr``."""
    p = [ptx.pack2_16(vals[2 * q], vals[2 * q + 1], is_bf16) for q in range(4)]
    ptx.st_global_v4(addr, p[0], p[1], p[2], p[3])


@cute.jit
def add_bias8(res, bias_base, row):
    """``res[q] += bias[row + q]`` for ``q < 8``: two 16-byte read-only loads of the FP32 bias row at global
    ``bias_base`` (``row`` a multiple of 8)."""
    addr = bias_base + Int64(row) * 4
    a = ptx.ld_global_nc_v4(addr)
    b = ptx.ld_global_nc_v4(addr + 16)
    for q in cutlass.range_constexpr(4):
        res[q] = res[q] + ptx.i32_as_f32(a[q])
        res[4 + q] = res[4 + q] + ptx.i32_as_f32(b[q])


@cute.jit
def finish_store(shape: cutlass.Constexpr, tid, stg_addr, ws_base, num_splits, count, slot0, out, g_routes,
                 topk_weights, num_routes, top_k, n, nb, gs_base, bias_base):
    """The last split's (or the only) tile to ``out``: 8 output columns per item, items ``tid, tid + threads,
    ...`` over the tile's ``count`` routes (slots ``slot0 ..``). ``h``: ``out[slot, :]``; ``y``:
    ``out[sorted_routes[slot], :]``; ``atomic_f32``: ``out[token, :] += topk_weights[route] * y`` (FP32).
    ``shape.bias``: the expert's FP32 bias row at global ``bias_base`` (``[n]``, see the module docstring) is
    added first."""
    TN, nthr = shape.tokens, shape.threads
    cols_out = shape.cols_out
    vpo = cols_out // 8
    n_items = (TN * vpo + nthr - 1) // nthr
    out_base = out.toint()
    r_a = cute.make_rmem_tensor((8,), Float32)
    r_b = cute.make_rmem_tensor((8,), Float32)
    # y / atomic_f32: every item's route id (and routing weight) loaded up front, all in flight at once; in the
    # store loop each load would wait behind the previous item's stores (one L2 round trip per item)
    routes = cute.make_rmem_tensor((n_items,), Int32)
    weights = cute.make_rmem_tensor((n_items,), Float32)
    if const_expr(shape.epi != "h"):
        for it in cutlass.range_constexpr(n_items):
            i_c = cutlass.min((tid + it * nthr) // vpo, count - 1)  # in bounds; rows >= count store nothing
            routes[it] = g_routes[slot0 + i_c]
        if const_expr(shape.epi == "atomic_f32"):
            g_tw = cute.make_tensor(topk_weights, cute.make_layout(num_routes))
            for it in cutlass.range_constexpr(n_items):
                weights[it] = g_tw[routes[it]]
    for it in cutlass.range_constexpr(n_items):
        idx = tid + it * nthr
        i = idx // vpo
        vv = idx % vpo
        if i < count:
            gather8(shape, r_a, stg_addr, ws_base, num_splits, i, vv * 8, gs_base)
            if const_expr(shape.bias):
                add_bias8(r_a, bias_base, nb * cols_out + vv * 8)
            if const_expr(shape.gated):
                gather8(shape, r_b, stg_addr, ws_base, num_splits, i, cols_out + vv * 8, gs_base)
                if const_expr(shape.bias):
                    add_bias8(r_b, bias_base, n // 2 + nb * cols_out + vv * 8)
                vals = [act(shape.activation, r_a[q], r_b[q]) for q in range(8)]
            elif const_expr(shape.mode == "gate_up"):
                vals = [act(shape.activation, r_a[q], r_a[q]) for q in range(8)]
            else:
                vals = [r_a[q] for q in range(8)]
            slot = slot0 + i
            if const_expr(shape.epi == "h"):
                ldo = n // 2 if const_expr(shape.gated) else n
                off = Int64(slot) * Int64(ldo) + Int64(nb * cols_out + vv * 8)
                store8(out_base + off * 2, vals, shape.is_bf16)
            elif const_expr(shape.epi == "y"):
                off = Int64(routes[it]) * Int64(n) + Int64(nb * cols_out + vv * 8)
                store8(out_base + off * 2, vals, shape.is_bf16)
            else:  # atomic_f32
                tok = routes[it] // top_k
                twt = weights[it]
                addr = out_base + (Int64(tok) * Int64(n) + Int64(nb * cols_out + vv * 8)) * 4
                if const_expr(shape.vec_red):
                    ptx.red_add_v4_f32(addr, vals[0] * twt, vals[1] * twt, vals[2] * twt, vals[3] * twt)
                    ptx.red_add_v4_f32(addr + 16, vals[4] * twt, vals[5] * twt, vals[6] * twt, vals[7] * twt)
                else:
                    for q in cutlass.range_constexpr(8):
                        ptx.red_add_f32(addr + 4 * q, vals[q] * twt)

"""The launch ABI and grid mapping shared by the CuTe W4A16 kernels.

Every kernel (SM90 WGMMA and warp-MMA grouped GEMMs, decode GEMV) takes the same ``__call__`` arguments:
``(w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters, num_experts, n, k,
num_routes, top_k, max_tiles, num_splits, stream)``. This module holds

* :func:`fake_launch_args`: compile-time stand-ins for them (host side; one compile serves every size);
* :func:`occupancy_kwargs`: the launch options of a kernel that asks for several CTAs per SM;
* :func:`tile_expert` (device): the expert owning token tile ``tile`` (``block_start[e] <= tile <
  block_start[e + 1]``), searched by all threads in parallel, -1 when the tile is past the last expert's;
* :func:`split_k_range` (device): the K tiles of split ``split`` of ``num_splits``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from . import ptx

__all__ = ["fake_launch_args", "occupancy_kwargs", "tile_expert", "split_k_range"]


def fake_launch_args(ab_dtype, out_dtype) -> list:
    """Stand-ins for ``__call__``'s arguments: null pointers with their alignment (``act`` in ``ab_dtype``,
    ``out`` in ``out_dtype``), ``Int32`` sizes and a fake stream."""
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def ptr(dt, align=16):
        return make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=align)

    return [
        ptr(cutlass.Uint8), ptr(ab_dtype), ptr(out_dtype), ptr(Int32, 4), ptr(Int32, 4), ptr(Int32, 4),
        ptr(Float32, 4), ptr(Float32), ptr(Int32, 4),
    ] + [Int32(1)] * 7 + [make_fake_stream()]


def occupancy_kwargs(min_ctas_per_sm: int) -> dict:
    """``launch()`` keywords for ``min_ctas_per_sm > 1`` (``.minnctapersm``, full shared-memory carveout; an
    explicit carveout also keeps the DSL from querying a device at compile time), else none."""
    if min_ctas_per_sm > 1:
        return dict(min_blocks_per_mp=min_ctas_per_sm, preferred_smem_carveout=100)
    return {}


@cute.jit
def tile_expert(g_bs, tile, num_experts, tid, nthr: cutlass.Constexpr, misc_addr):
    """The expert owning token tile ``tile`` (``g_bs`` = block_start), or -1. Shared word ``misc_addr`` must
    hold -1 and be visible to the CTA before the call; every thread of the CTA takes part (``bar.sync 0``)."""
    for e_ in cutlass.range(tid, num_experts, nthr, unroll=1):
        if g_bs[e_] <= tile:
            if tile < g_bs[e_ + 1]:
                ptx.st_shared_b32(misc_addr, e_)
    cute.arch.sync_threads()
    return ptx.ld_shared_b32(misc_addr)


@cute.jit
def split_k_range(k, BK: cutlass.Constexpr, split, num_splits):
    """``(kt_total, kt0, nk)``: the ``k // BK`` K tiles, and the first and number of those of split ``split``
    (``cdiv(kt_total, num_splits)`` per split; the last ones may get fewer or none)."""
    kt_total = k // BK
    per_split = (kt_total + num_splits - 1) // num_splits
    kt0 = split * per_split
    nk = cutlass.max(cutlass.min(kt_total, kt0 + per_split) - kt0, 0)
    return kt_total, kt0, nk

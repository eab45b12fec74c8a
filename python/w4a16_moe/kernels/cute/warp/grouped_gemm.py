"""Portable warp-MMA (``mma.sync``) CuTe DSL grouped GEMM of the fused W4A16 MoE (sm_80 .. sm_120a).

Same call ABI and routing contract as :class:`..sm90.grouped_gemm.Sm90W4A16GroupedGemm`, but built only on
instructions every arch from Ampere on has: ``mma.sync.aligned.m16n8k16`` (bf16/f16 in, FP32 accumulate),
``ldmatrix``, 16-byte ``cp.async`` (with an L2 evict-first cache hint) and packed ``fma.rn.{bf16,f16}x2``.
The same source compiles for sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_103a, sm_120a (see
:mod:`..warp_family`); only the ``atomic_f32`` epilogue differs (``red.global.add.v4.f32`` from sm_90 on,
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

* the weight chunk is the packed chunk of :mod:`..warp_pack` (codes, then scales, then zero-point biases),
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

Fragments (PTX ISA, m16n8k16): A (weights) as in :mod:`..warp_pack`; B: ``ldmatrix.x4`` with lanes
``8q .. 8q+7`` addressing tokens ``8 nb + (l % 8)`` at 16-byte chunk ``2 kb + q`` (``q = 0..3``) returns
``b0, b1`` of k16 steps ``kb`` and ``kb + 1`` of n8 block ``nb``; C/D: ``c0, c1`` = (row ``l//4``, tokens
``2 (l%4) + {0, 1}``), ``c2, c3`` = row ``l//4 + 8``.

Dequantization per A register ``a_i`` (``x = word >> 4i``): INT4 ``lop3(x & 0x000F000F | magic)``,
``fma(t, 1.0, bias)`` (bias ``-(magic + 8)`` or the stored ``-(magic + zero)``: exact), ``fma(t, scale,
-0.0)`` (one rounding to bf16/f16: the same operand values as the SM90 kernel). FP4 (E2M1): the
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

Epilogue (all threads): FP32 accumulators -> shared staging ``[TN][RB + 4]`` (conflict-free ``st.shared``)
-> optional split-K fixup -> (NVFP4 global scale) -> activation (gate and up columns ``j`` and ``RB/2 + j``
of a staging row) -> 16-byte coalesced stores of 8 outputs, or FP32 reductions (``atomic_f32``).

Split-K (runtime ``num_splits > 1``, grid z): every split stores its FP32 partial tile (rows ``< count``)
to ``ws``, then bumps a per-tile counter; the last split to arrive sums all partials in fixed split order
``0..S-1`` (bit-identical results whatever the arrival order) and runs the epilogue; it re-arms the counter
to 0 (``counters`` zeroed once at allocation). ``ws`` holds ``(N/RB) * max_tiles * num_splits * TN * RB``
FP32 (``WarpGemmConfig.ws_floats``), ``counters`` ``(N/RB) * max_tiles`` int32.

Routing contract (identical to the SM90 kernel): ``sorted_routes`` int32 ``[R]`` route ids
``token * top_k + j`` grouped by local expert; ``route_start`` int32 ``[E+1]``; ``block_start`` int32
``[E+1]`` = exclusive cumsum of ``cdiv(count_e, TN)`` with this kernel's ``TN``. Grid = ``(N / RB,
max_tiles, num_splits)``; CTA ``(nb, tile, s)`` finds its expert ``e`` with ``block_start[e] <= tile <
block_start[e+1]`` (searched by all threads in parallel); CTAs with ``tile >= block_start[E]`` exit.

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
the family have zero local memory on sm_90a and sm_120a (70-168 registers); 42-74 KB of dynamic shared memory (every variant of :mod:`..warp_family` fits the 99 KB of sm_86/89/120). Per K tile of
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
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .config import ACT_CODES, WarpGemmConfig, e2m1_prmt_tables

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


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _u32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


# ------------------------------------------------------------------------------------------------------------
# inline PTX (pure arithmetic without side effects; memory / async ops with side effects, in program order)
# ------------------------------------------------------------------------------------------------------------
def _i32(x, loc, ip):
    return Int32(x).ir_value(loc=loc, ip=ip)


def _i64(x, loc, ip):
    return Int64(x).ir_value(loc=loc, ip=ip)


def _struct(n: int, ty: str = "i32"):
    return ir.Type.parse("!llvm.struct<(" + ", ".join([ty] * n) + ")>")


@dsl_user_op
def lop3_and_or(a, mask: int, c, *, loc=None, ip=None) -> Int32:
    """``(a & mask) | c`` in one LOP3 (``mask`` an immediate)."""
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip), _i32(c, loc, ip)],
                        f"lop3.b32 $0, $1, {mask & 0xFFFFFFFF:#x}, $2, 0xEA;", "=r,r,r",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def and_imm(a, mask: int, *, loc=None, ip=None) -> Int32:
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip)], f"and.b32 $0, $1, {mask & 0xFFFFFFFF:#x};", "=r,r",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def lop3_sel(a, b, mask: int, *, loc=None, ip=None) -> Int32:
    """``(a & mask) | (b & ~mask)`` in one LOP3 (bitwise select, ``mask`` an immediate)."""
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)],
                        f"lop3.b32 $0, $1, $2, {mask & 0xFFFFFFFF:#x}, 0xE4;", "=r,r,r",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def lop3_or_and(a, b, mask: int, *, loc=None, ip=None) -> Int32:
    """``a | (b & mask)`` in one LOP3 (``mask`` an immediate)."""
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)],
                        f"lop3.b32 $0, $1, $2, {mask & 0xFFFFFFFF:#x}, 0xF8;", "=r,r,r",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def shr_u32(a, s: int, *, loc=None, ip=None) -> Int32:
    """Logical shift right by an immediate."""
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip)], f"shr.u32 $0, $1, {s};", "=r,r",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def hfma2(a, b, c, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Packed ``a * b + c`` (bf16x2 / f16x2, round to nearest; sm_80+)."""
    op = "fma.rn.bf16x2" if is_bf16 else "fma.rn.f16x2"
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(c, loc, ip)],
                        f"{op} $0, $1, $2, $3;", "=r,r,r,r", has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def prmt(a, b, sel, *, loc=None, ip=None) -> Int32:
    """``prmt.b32 d, a, b, sel`` (runtime selector)."""
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(sel, loc, ip)],
                        "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def prmt_imm(a, sel: int, *, loc=None, ip=None) -> Int32:
    """Byte permute of ``a`` with itself (``sel`` an immediate), e.g. 0x1010 / 0x3232 broadcast a half."""
    r = llvm.inline_asm(T.i32(), [_i32(a, loc, ip)], f"prmt.b32 $0, $1, $1, {sel:#x};", "=r,r",
                        has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, is_bf16: bool, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32``; returns (d0, d1, d2, d3)."""
    ty = "bf16" if is_bf16 else "f16"
    r = llvm.inline_asm(
        _struct(4, "f32"),
        [_i32(v, loc, ip) for v in (a0, a1, a2, a3, b0, b1)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in (c0, c1, c2, c3)],
        f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, "
        "{$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", has_side_effects=False, loc=loc, ip=ip)
    return tuple(Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def ldmatrix_x4(addr, *, loc=None, ip=None):
    r = llvm.inline_asm(_struct(4), [_i32(addr, loc, ip)],
                        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r",
                        has_side_effects=True, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def evict_first_policy(*, loc=None, ip=None) -> Int64:
    r = llvm.inline_asm(T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int64(r)


@dsl_user_op
def cp_async_16(dst_smem, src_gmem, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i32(dst_smem, loc, ip), _i64(src_gmem, loc, ip)],
                    "cp.async.cg.shared.global [$0], [$1], 16;", "r,l", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def cp_async_16_hint(dst_smem, src_gmem, policy, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i32(dst_smem, loc, ip), _i64(src_gmem, loc, ip), _i64(policy, loc, ip)],
                    "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2;", "r,l,l",
                    has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], "cp.async.commit_group;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def cp_async_wait(n: int, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], f"cp.async.wait_group {n};", "", has_side_effects=True, loc=loc, ip=ip)


def _ld_shared(n: int, addr, loc, ip):
    if n == 1:
        r = llvm.inline_asm(T.i32(), [_i32(addr, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r",
                            has_side_effects=True, loc=loc, ip=ip)
        return (Int32(r),)
    regs = ", ".join(f"${i}" for i in range(n))
    r = llvm.inline_asm(_struct(n), [_i32(addr, loc, ip)], f"ld.shared.v{n}.b32 {{{regs}}}, [${n}];",
                        ",".join(["=r"] * n) + ",r", has_side_effects=True, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(n))


@dsl_user_op
def ld_shared_v4(addr, *, loc=None, ip=None):
    return _ld_shared(4, addr, loc, ip)


@dsl_user_op
def ld_shared_v2(addr, *, loc=None, ip=None):
    return _ld_shared(2, addr, loc, ip)


@dsl_user_op
def ld_shared_b32(addr, *, loc=None, ip=None):
    return _ld_shared(1, addr, loc, ip)[0]


@dsl_user_op
def st_shared_b32(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i32(addr, loc, ip), _i32(v, loc, ip)], "st.shared.b32 [$0], $1;", "r,r",
                    has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def st_shared_f32(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i32(addr, loc, ip), Float32(v).ir_value(loc=loc, ip=ip)], "st.shared.f32 [$0], $1;",
                    "r,f", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def i32_as_f32(v, *, loc=None, ip=None) -> Float32:
    r = llvm.inline_asm(T.f32(), [_i32(v, loc, ip)], "mov.b32 $0, $1;", "=f,r", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


@dsl_user_op
def pack2_16(lo, hi, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Round two FP32 values to a packed bf16x2 / f16x2 word (``lo`` in the low half)."""
    op = "cvt.rn.bf16x2.f32" if is_bf16 else "cvt.rn.f16x2.f32"
    r = llvm.inline_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
                        f"{op} $0, $1, $2;", "=r,f,f", has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def st_global_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i64(addr, loc, ip)] + [_i32(v, loc, ip) for v in (a, b, c, d)],
                    "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_global_cg_v4(addr, *, loc=None, ip=None):
    """16-byte L2-coherent global load (split-K partials written by other CTAs)."""
    r = llvm.inline_asm(_struct(4), [_i64(addr, loc, ip)], "ld.global.cg.v4.b32 {$0, $1, $2, $3}, [$4];",
                        "=r,=r,=r,=r,l", has_side_effects=True, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def ld_global_nc_v4(addr, *, loc=None, ip=None):
    """16-byte read-only global load (NVFP4 global scales)."""
    r = llvm.inline_asm(_struct(4), [_i64(addr, loc, ip)], "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
                        "=r,=r,=r,=r,l", has_side_effects=True, loc=loc, ip=ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def atom_add_gpu(addr, v, *, loc=None, ip=None) -> Int32:
    r = llvm.inline_asm(T.i32(), [_i64(addr, loc, ip), _i32(v, loc, ip)],
                        "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)


@dsl_user_op
def st_global_b32(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i64(addr, loc, ip), _i32(v, loc, ip)], "st.global.b32 [$0], $1;", "l,r",
                    has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], "fence.acq_rel.gpu;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def red_add_v4_f32(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """``red.global.add.v4.f32`` (sm_90+)."""
    llvm.inline_asm(None, [_i64(addr, loc, ip)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c, d)],
                    "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def red_add_f32(addr, a, *, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [_i64(addr, loc, ip), Float32(a).ir_value(loc=loc, ip=ip)], "red.global.add.f32 [$0], $1;",
                    "l,f", has_side_effects=True, loc=loc, ip=ip)


# ------------------------------------------------------------------------------------------------------------
class WarpW4A16GroupedGemm:
    """One warp-MMA W4A16 grouped-GEMM kernel (static config in ``__init__``; see the module docstring).

    ``__call__(w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
    num_experts, n, k, num_routes, top_k, max_tiles, num_splits, stream)``: exactly the SM90 kernel's
    parameters. ``w`` packed weights (uint8, :func:`..warp_pack.pack_warp`); ``act`` B source (x for gate_up,
    h for down); ``out`` h / y / FP32 out; ``topk_weights`` FP32 ``[T*top_k]`` (``atomic_f32`` only); ``ws``
    FP32 / ``counters`` int32 split-K scratch (read only when ``num_splits > 1``); ``n`` weight rows (2I / I /
    H); ``k`` the reduction size; ``num_routes`` the route capacity (``T*top_k``).
    """

    def __init__(self, cfg: WarpGemmConfig, arch: str = "sm_90a"):
        c = cfg
        if c.mode not in ("gate_up", "down"):
            raise ValueError(f"mode {c.mode!r}")
        if c.dtype not in ("bf16", "fp16"):
            raise ValueError(f"dtype {c.dtype!r}")
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
        if c.mode == "gate_up" and epi != "h":
            raise ValueError(f"gate_up epilogue {epi!r}")
        if c.mode == "down" and epi not in ("y", "atomic_f32"):
            raise ValueError(f"down epilogue {epi!r}")
        if c.mode == "gate_up" and c.activation not in ACT_CODES:
            raise ValueError(f"activation {c.activation!r}")
        if (32 * c.warps) % (c.k_tile // 8):
            raise ValueError("32 * warps must be a multiple of k_tile / 8 (activation copy mapping)")
        if c.stages < 2:
            raise ValueError("stages must be >= 2")
        self.cfg = c
        self.arch = arch
        self.is_bf16 = c.dtype == "bf16"
        self.W, self.MW, self.TN, self.BK, self.S = c.warps, c.m16_per_warp, c.tokens_per_tile, c.k_tile, c.stages
        self.T = 32 * self.W
        self.RB = c.rows_per_cta
        self.NB8 = self.TN // 8
        self.C = self.BK // 64
        self.KB = self.BK // 16
        g = c.group
        self.gpt = (self.BK // g) if (g and g <= self.BK) else 1
        self.code_bytes = self.RB * self.BK // 2
        self.scale_bytes = self.RB * self.gpt * 2
        self.bias_bytes = self.scale_bytes if c.zero_point else 0
        self.chunk = self.code_bytes + self.scale_bytes + self.bias_bytes
        self.w_stage = _round_up(self.chunk, 128)
        self.b_stage = self.TN * self.BK * 2
        self.stage_bytes = self.w_stage + self.b_stage
        self.cols = self.RB
        self.cols_out = self.cols // 2 if c.gated else self.cols
        self.rs = self.cols + 4  # padded FP32 staging row stride: conflict-free accumulator writes
        self.epi_bytes = self.TN * self.rs * 4
        self.region = max(self.S * self.stage_bytes, self.epi_bytes)
        self.smem_bytes = self.region + 16
        self.magic = 0x43004300 if self.is_bf16 else 0x64006400
        self.sym_bias = 0xC308C308 if self.is_bf16 else 0xE408E408  # -(magic + 8) in both halves
        self.one2 = 0x3F803F80 if self.is_bf16 else 0x3C003C00
        self.neg0 = _u32(0x80008000)
        self._check_smem(arch)

    def _check_smem(self, arch: str) -> None:
        if self.smem_bytes > smem_limit(arch):
            raise ValueError(f"{self.cfg.name()}: needs {self.smem_bytes} bytes of shared memory, {arch} allows "
                             f"{smem_limit(arch)}")

    # ------------------------------------------------------------------------------------------------------
    def fake_args(self) -> list:
        """Compile-time stand-ins for ``__call__``'s arguments (null pointers with their alignment, Int32
        sizes, a fake stream): one compile serves every size."""
        from cutlass.cute.runtime import make_fake_stream, make_ptr

        ab = cutlass.BFloat16 if self.is_bf16 else cutlass.Float16

        def ptr(dt, align=16):
            return make_ptr(dt, 0, cute.AddressSpace.gmem, assumed_align=align)

        out_dt = Float32 if self.cfg.epi == "atomic_f32" else ab
        return [
            ptr(cutlass.Uint8), ptr(ab), ptr(out_dt), ptr(Int32, 4), ptr(Int32, 4), ptr(Int32, 4),
            ptr(Float32, 4), ptr(Float32), ptr(Int32, 4),
        ] + [Int32(1)] * 7 + [make_fake_stream()]

    def compile(self, arch: str = "sm_90a"):
        """Cross-compile for ``arch`` (no GPU needed); export with ``compiled.export_to_c(dir, name, prefix)``."""
        self.arch = arch
        self._check_smem(arch)
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
        self.kernel(
            w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
            num_experts, n, k, num_routes, top_k, num_splits,
        ).launch(
            grid=[n // self.RB, max_tiles, num_splits],
            block=[self.T, 1, 1],
            stream=stream,
            **self._occupancy_kwargs(),
        )

    def _occupancy_kwargs(self) -> dict:
        if self.cfg.min_ctas_per_sm > 1:
            return dict(min_blocks_per_mp=self.cfg.min_ctas_per_sm, preferred_smem_carveout=100)
        return {}

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

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage_cls)
        misc_addr = st.misc.data_ptr().toint()
        buf = st.buf.data_ptr().toint()
        if tidx == 0:
            st_shared_b32(misc_addr, -1)
        cute.arch.sync_threads()
        # the expert owning this tile: block_start[e] <= tile < block_start[e + 1] (parallel search)
        for e_ in cutlass.range(tidx, num_experts, T, unroll=1):
            if g_bs[e_] <= tile:
                if tile < g_bs[e_ + 1]:
                    st_shared_b32(misc_addr, e_)
        cute.arch.sync_threads()
        e = ld_shared_b32(misc_addr)
        if e >= 0:
            kt_total = k // BK
            per_split = (kt_total + num_splits - 1) // num_splits
            kt0 = split * per_split
            nk = cutlass.max(cutlass.min(kt_total, kt0 + per_split) - kt0, 0)
            slot0 = g_rs[e] + (tile - g_bs[e]) * TN
            count = cutlass.min(g_rs[e + 1] - slot0, TN)
            nb_count = n // self.RB
            w_base = w.toint() + ((Int64(e) * Int64(nb_count) + Int64(nb)) * Int64(kt_total) + Int64(kt0)) * self.chunk
            acc = self._mainloop(tidx, w_base, act, g_routes, slot0, count, k, top_k, kt0, nk, buf)
            self._epilogue(tidx, acc, buf, misc_addr, w, out, g_routes, topk_weights, ws, counters, e, nb, tile,
                           split, n, k, num_experts, num_routes, top_k, num_splits, slot0, count)

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def _mainloop(self, tidx, w_base, act, g_routes, slot0, count, k, top_k, kt0, nk, buf):
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
            policy = evict_first_policy()

        acc = cute.make_rmem_tensor((self.MW * self.NB8 * 4,), Float32)
        acc.fill(0.0)
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32

        # prologue: S - 1 tiles in flight
        for s in cutlass.range_constexpr(S - 1):
            if s < nk:
                self._issue(s, s, tidx, w_base, act_base, src_off, dst_off, policy, buf, P, NWP, total, NIT)
            cp_async_commit()
        for it in cutlass.range(nk, unroll=1):
            cp_async_wait(S - 2)
            cute.arch.sync_threads()
            nxt = it + (S - 1)
            if nxt < nk:
                self._issue(nxt, nxt % S, tidx, w_base, act_base, src_off, dst_off, policy, buf, P, NWP, total, NIT)
            cp_async_commit()
            self._compute(acc, buf + (it % S) * self.stage_bytes, warp, lane)
        cp_async_wait(0)
        cute.arch.sync_threads()
        return acc

    @cute.jit
    def _issue(self, it, stage, tidx, w_base, act_base, src_off, dst_off, policy, buf, P: cutlass.Constexpr,
               NWP: cutlass.Constexpr, total: cutlass.Constexpr, NIT: cutlass.Constexpr):
        """cp.async of K tile ``it`` (weights + gathered activations) into ring stage ``stage``."""
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
        src_a = act_base + Int64(it) * (self.BK * 2)
        for j in cutlass.range_constexpr(NIT):
            if const_expr(total % T == 0):
                cp_async_16(sbase + dst_off[j], src_a + src_off[j])
            else:
                if tidx + j * T < total:
                    cp_async_16(sbase + dst_off[j], src_a + src_off[j])

    @cute.jit
    def _cp_w(self, dst, src, policy):
        if const_expr(self.cfg.evict_first):
            cp_async_16_hint(dst, src, policy)
        else:
            cp_async_16(dst, src)

    # ------------------------------------------------------------------------------------------------------
    def _lds_words(self, addr, nwords: int):
        res = []
        off = 0
        while off < nwords:
            step = min(4, nwords - off)
            if step == 4:
                res.extend(ld_shared_v4(addr + off * 4))
            elif step == 2:
                res.extend(ld_shared_v2(addr + off * 4))
            else:
                res.append(ld_shared_b32(addr + off * 4))
            off += step
        return res

    @cute.jit
    def _compute(self, acc, sbase, warp, lane):
        """All MMAs of one K tile from ring stage ``sbase``."""
        cfg = self.cfg
        MW, C, KB, NB8, BK, gpt = self.MW, self.C, self.KB, self.NB8, self.BK, self.gpt
        is_bf16 = self.is_bf16
        q = lane // 4
        words, s_lo, s_hi, b_lo, b_hi = [], [], [], [], []
        for m in cutlass.range_constexpr(MW):
            mb = warp * MW + m
            words.append([ld_shared_v4(sbase + ((mb * C + c) * 32 + lane) * 16) for c in range(C)])
            saddr = sbase + self.code_bytes + (mb * 8 + q) * (gpt * 4)
            sw = self._lds_words(saddr, gpt)
            s_lo.append([prmt_imm(v, 0x1010) for v in sw])
            s_hi.append([prmt_imm(v, 0x3232) for v in sw])
            if const_expr(cfg.zero_point):
                bw = self._lds_words(saddr + self.scale_bytes, gpt)
                b_lo.append([prmt_imm(v, 0x1010) for v in bw])
                b_hi.append([prmt_imm(v, 0x3232) for v in bw])
        # ldmatrix lane addressing: token row 8*nb8 + lane % 8, 16-byte chunk (4*kb2 + lane // 8) ^ (lane % 8)
        lrow = sbase + self.w_stage + (lane % 8) * (BK * 2)
        lx = lane % 8
        lq = lane // 8
        g = cfg.group
        for kb2 in cutlass.range_constexpr(KB // 2):
            bfr = []
            for nb8 in cutlass.range_constexpr(NB8):
                bfr.append(ldmatrix_x4(lrow + nb8 * (8 * BK * 2) + (((4 * kb2 + lq) ^ lx) * 16)))
            for kk in cutlass.range_constexpr(2):
                kb = 2 * kb2 + kk
                gi = (kb * 16) // g if (g and g <= BK) else 0
                for m in cutlass.range_constexpr(MW):
                    word = words[m][kb // 4][kb % 4]
                    a = []
                    for i in cutlass.range_constexpr(4):
                        sc = s_lo[m][gi] if i % 2 == 0 else s_hi[m][gi]
                        if const_expr(cfg.kind == "int4"):
                            bias = None
                            if const_expr(cfg.zero_point):
                                bias = b_lo[m][gi] if i % 2 == 0 else b_hi[m][gi]
                            a.append(self._dequant_int4(word, i, sc, bias))
                        else:
                            a.append(self._dequant_fp4(word, i, sc))
                    for nb8 in cutlass.range_constexpr(NB8):
                        base = (m * NB8 + nb8) * 4
                        d = mma_16816(a[0], a[1], a[2], a[3], bfr[nb8][2 * kk], bfr[nb8][2 * kk + 1],
                                      acc[base], acc[base + 1], acc[base + 2], acc[base + 3], is_bf16)
                        for v in cutlass.range_constexpr(4):
                            acc[base + v] = d[v]

    def _dequant_int4(self, word, i: int, sc, bias):
        src = word if i == 0 else shr_u32(word, 4 * i)
        t = lop3_and_or(src, 0x000F000F, Int32(_u32(self.magic)))
        b = Int32(_u32(self.sym_bias)) if bias is None else bias
        t = hfma2(t, Int32(_u32(self.one2)), b, self.is_bf16)
        return hfma2(t, sc, Int32(self.neg0), self.is_bf16)

    def _dequant_fp4(self, word, i: int, sc):
        """E2M1 pair of register ``a_i`` (nibble ``i``: lo half, nibble ``i + 4``: hi half) -> packed 16-bit
        values times the scale (exact E2M1 patterns from ``prmt`` byte tables, :func:`.config.e2m1_prmt_tables`).

        fp16: ``m = (word << 4 >> 4i) & 0x00700070`` puts the magnitudes in bits 4..6 and 20..22; ``prmt(m,
        0x0020)`` moves byte 2 to byte 1, giving the selector nibbles ``(0, m_lo, 0, m_hi)``; ``prmt`` over the
        high-byte table yields ``(0x00, H[m_lo], 0x00, H[m_hi])`` (fp16 E2M1 values have zero low bytes).
        bf16: selector ``(m_lo, 0, m_hi, 0)`` over the high- and low-byte tables, merged with one ``prmt``.
        The sign bits (bit 3 of each nibble) are shifted to bits 15 and 31 and OR-ed in."""
        (h0, h1), (l0, l1) = e2m1_prmt_tables(self.is_bf16)
        sg = self._shl(word, 12 - 4 * i)  # lo sign -> bit 15, hi sign -> bit 31
        if self.is_bf16:
            m = and_imm(self._shl(word, -4 * i), 0x00070007)
            sel = prmt_imm(m, 0x0020)
            hb = prmt(Int32(_u32(h0)), Int32(_u32(h1)), sel)
            lb = prmt(Int32(_u32(l0)), Int32(_u32(l1)), sel)
            v = prmt(lb, hb, Int32(0x6240))
        else:
            m = and_imm(self._shl(word, 4 - 4 * i), 0x00700070)
            sel = prmt_imm(m, 0x0020)
            v = prmt(Int32(_u32(h0)), Int32(_u32(h1)), sel)
        v = lop3_or_and(v, sg, 0x80008000)
        return hfma2(v, sc, Int32(self.neg0), self.is_bf16)

    def _shl(self, x, s: int):
        """``x << s`` for a constant ``s`` of either sign (logical shift right when negative)."""
        if s > 0:
            return x << s
        if s < 0:
            return shr_u32(x, -s)
        return x

    # ------------------------------------------------------------------------------------------------------
    @cute.jit
    def _act(self, gate, up):
        a = self.cfg.activation
        if const_expr(a == "swiglu"):
            return gate * cute.arch.rcp_approx(1.0 + cute.arch.exp2(gate * -1.4426950408889634)) * up
        elif const_expr(a == "geglu"):
            return 0.5 * gate * (1.0 + cute.math.erf(gate * 0.7071067811865476)) * up
        elif const_expr(a == "relu2"):
            r = cutlass.max(gate, Float32(0.0))
            return r * r
        else:  # silu
            return gate * cute.arch.rcp_approx(1.0 + cute.arch.exp2(gate * -1.4426950408889634))

    @cute.jit
    def _epilogue(self, tidx, acc, buf, misc_addr, w, out, g_routes, topk_weights, ws, counters, e, nb, tile, split,
                  n, k, num_experts, num_routes, top_k, num_splits, slot0, count):
        cfg = self.cfg
        TN, MW, NB8, T = self.TN, self.MW, self.NB8, self.T
        rs, cols = self.rs, self.cols
        warp = cute.arch.make_warp_uniform(tidx // 32)
        lane = tidx % 32
        # (A) accumulators -> FP32 staging [TN][cols] (column = weight row in the CTA's row block)
        for m in cutlass.range_constexpr(MW):
            for rh in cutlass.range_constexpr(2):
                col = (warp * MW + m) * 16 + lane // 4 + 8 * rh
                for nb8 in cutlass.range_constexpr(NB8):
                    for v in cutlass.range_constexpr(2):
                        tok = 8 * nb8 + 2 * (lane % 4) + v
                        st_shared_f32(buf + (tok * rs + col) * 4, acc[(m * NB8 + nb8) * 4 + 2 * rh + v])
        cute.arch.sync_threads()

        # (B) split-K: publish this split's partial tile; the last split to arrive finishes
        nb_count = n // cols
        tile_id = tile * nb_count + nb
        tile_elems = TN * cols
        ws_base = ws.toint() + Int64(tile_id) * Int64(num_splits) * Int64(tile_elems * 4)
        is_last = Int32(1)
        if num_splits > 1:
            vpr = cols // 4
            for it in cutlass.range_constexpr((TN * vpr + T - 1) // T):
                idx = tidx + it * T
                i = idx // vpr
                vv = idx % vpr
                if i < count:
                    d = ld_shared_v4(buf + (i * rs + vv * 4) * 4)
                    dst = ws_base + Int64((split * tile_elems + i * cols + vv * 4) * 4)
                    st_global_v4(dst, d[0], d[1], d[2], d[3])
            fence_acq_rel_gpu()
            cute.arch.sync_threads()
            if tidx == 0:
                cnt_addr = counters.toint() + Int64(tile_id) * 4
                old = atom_add_gpu(cnt_addr, 1)
                last = Int32(0)
                if old == num_splits - 1:
                    last = Int32(1)
                    st_global_b32(cnt_addr, 0)  # re-arm for the next launch
                fence_acq_rel_gpu()
                st_shared_b32(misc_addr + 4, last)
            cute.arch.sync_threads()
            is_last = ld_shared_b32(misc_addr + 4)
            fence_acq_rel_gpu()

        # (C) finish: 8 output columns per item
        if is_last != 0:
            cols_out = self.cols_out
            vpo = cols_out // 8
            out_base = out.toint()
            r_a = cute.make_rmem_tensor((8,), Float32)
            r_b = cute.make_rmem_tensor((8,), Float32)
            gs_base = Int64(0)
            if const_expr(cfg.kind == "nvfp4"):
                chunks = Int64(num_experts) * Int64(nb_count) * Int64(k // self.BK) * self.chunk
                gs_base = w.toint() + chunks + (Int64(e) * Int64(n) + Int64(nb * cols)) * 4
            for it in cutlass.range_constexpr((TN * vpo + T - 1) // T):
                idx = tidx + it * T
                i = idx // vpo
                vv = idx % vpo
                if i < count:
                    self._gather8(r_a, buf, ws_base, num_splits, tile_elems, i, vv * 8, gs_base)
                    if const_expr(cfg.gated):
                        self._gather8(r_b, buf, ws_base, num_splits, tile_elems, i, cols_out + vv * 8, gs_base)
                        vals = [self._act(r_a[q], r_b[q]) for q in range(8)]
                    elif const_expr(cfg.mode == "gate_up"):
                        vals = [self._act(r_a[q], r_a[q]) for q in range(8)]
                    else:
                        vals = [r_a[q] for q in range(8)]
                    slot = slot0 + i
                    if const_expr(cfg.epi == "h"):
                        ldo = n // 2 if const_expr(cfg.gated) else n
                        off = Int64(slot) * Int64(ldo) + Int64(nb * cols_out + vv * 8)
                        self._store8(out_base + off * 2, vals)
                    elif const_expr(cfg.epi == "y"):
                        route = g_routes[slot]
                        off = Int64(route) * Int64(n) + Int64(nb * cols_out + vv * 8)
                        self._store8(out_base + off * 2, vals)
                    else:  # atomic_f32
                        route = g_routes[slot]
                        tok = route // top_k
                        twt = cute.make_tensor(topk_weights, cute.make_layout(num_routes))[route]
                        addr = out_base + (Int64(tok) * Int64(n) + Int64(nb * cols_out + vv * 8)) * 4
                        if const_expr(self._vec_red()):
                            red_add_v4_f32(addr, vals[0] * twt, vals[1] * twt, vals[2] * twt, vals[3] * twt)
                            red_add_v4_f32(addr + 16, vals[4] * twt, vals[5] * twt, vals[6] * twt, vals[7] * twt)
                        else:
                            for q in cutlass.range_constexpr(8):
                                red_add_f32(addr + 4 * q, vals[q] * twt)

    def _vec_red(self) -> bool:
        return arch_major(self.arch) >= 90

    @cute.jit
    def _gather8(self, res, buf, ws_base, num_splits, tile_elems, i, col, gs_base):
        """``res`` (8 FP32) = staging row ``i`` from column ``col``: this CTA's tile, or the fixed-order sum of
        every split's partial with split-K; times the NVFP4 global scales of those rows."""
        if num_splits > 1:
            res.fill(0.0)
            for s in cutlass.range(num_splits, unroll=1):
                base = ws_base + Int64((s * tile_elems + i * self.cols + col) * 4)
                a = ld_global_cg_v4(base)
                b = ld_global_cg_v4(base + 16)
                for q in cutlass.range_constexpr(4):
                    res[q] = res[q] + i32_as_f32(a[q])
                    res[4 + q] = res[4 + q] + i32_as_f32(b[q])
        else:
            a = ld_shared_v4(buf + (i * self.rs + col) * 4)
            b = ld_shared_v4(buf + (i * self.rs + col + 4) * 4)
            for q in cutlass.range_constexpr(4):
                res[q] = i32_as_f32(a[q])
                res[4 + q] = i32_as_f32(b[q])
        if const_expr(self.cfg.kind == "nvfp4"):
            ga = ld_global_nc_v4(gs_base + col * 4)
            gb = ld_global_nc_v4(gs_base + col * 4 + 16)
            for q in cutlass.range_constexpr(4):
                res[q] = res[q] * i32_as_f32(ga[q])
                res[4 + q] = res[4 + q] * i32_as_f32(gb[q])

    def _store8(self, addr, vals):
        p = [pack2_16(vals[2 * q], vals[2 * q + 1], self.is_bf16) for q in range(4)]
        st_global_v4(addr, p[0], p[1], p[2], p[3])

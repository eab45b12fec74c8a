"""Every inline-PTX building block of the CuTe DSL W4A16 kernels (SM90 WGMMA, warp-MMA and decode), once.

Pure arithmetic helpers are emitted without side effects so LLVM/ptxas may schedule them freely;
memory, synchronization and asynchronous-copy helpers are side-effecting so they keep their program
order relative to barriers. Immediates (masks, shifts, selectors) are Python ints baked into the
instruction text; :func:`signed32` turns an unsigned 32-bit pattern into the value ``Int32`` takes.
"""

from __future__ import annotations

from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = [
    "signed32",
    # integer / packed 16-bit arithmetic
    "lop3_and_or",
    "lop3_or_and",
    "lop3_sel",
    "and_imm",
    "shr_u32",
    "prmt_imm",
    "prmt_pair",
    "packed_add",
    "packed_mul",
    "hfma2",
    "pack2_16",
    "half_to_f32",
    "i32_as_f32",
    # matrix instructions
    "mma_16816",
    "ldmatrix_x4",
    # shared memory
    "ld_shared_v4",
    "ld_shared_v2",
    "ld_shared_b32",
    "st_shared_v4",
    "st_shared_b32",
    "st_shared_f32",
    "st_shared_cvt16",
    # global memory
    "st_global_v4",
    "st_global_b32",
    "ld_global_cg_v4",
    "ld_global_nc_v4",
    "ld_stream_pred",
    "ld_act_pred",
    "red_add_v4_f32",
    "red_add_f32",
    "atom_add_gpu",
    # asynchronous copies, cache policy, prefetch
    "evict_first_policy",
    "cp_async_16",
    "cp_async_16_hint",
    "cp_async_commit",
    "cp_async_wait",
    "bulk_g2s",
    "prefetch_l2_bulk",
    # fences and warp-level
    "fence_proxy_async_smem",
    "fence_acq_rel_gpu",
    "ballot",
    "lanemask_lt",
]


def signed32(v: int) -> int:
    """An unsigned 32-bit pattern as the signed value ``Int32`` takes (``0x80008000`` -> ``-2147450880``)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def _i32(x, loc, ip):
    return Int32(x).ir_value(loc=loc, ip=ip)


def _i64(x, loc, ip):
    return Int64(x).ir_value(loc=loc, ip=ip)


def _f32(x, loc, ip):
    return Float32(x).ir_value(loc=loc, ip=ip)


def _struct(n: int, ty: str = "i32"):
    return ir.Type.parse("!llvm.struct<(" + ", ".join([ty] * n) + ")>")


def _unpack(r, n: int, loc, ip, ty=Int32):
    mlir_ty = T.i32() if ty is Int32 else T.f32()
    return tuple(ty(llvm.extractvalue(mlir_ty, r, [i], loc=loc, ip=ip)) for i in range(n))


# ------------------------------------------------------------------------------------------------------------
# integer / packed 16-bit arithmetic (no side effects)
# ------------------------------------------------------------------------------------------------------------
@dsl_user_op
def lop3_and_or(a, mask: int, c, *, loc=None, ip=None) -> Int32:
    """``(a & mask) | c`` in one LOP3 (``mask`` an immediate)."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(c, loc, ip)], f"lop3.b32 $0, $1, {mask & 0xFFFFFFFF:#x}, $2, 0xEA;",
        "=r,r,r", has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def lop3_or_and(a, b, mask: int, *, loc=None, ip=None) -> Int32:
    """``a | (b & mask)`` in one LOP3 (``mask`` an immediate)."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)], f"lop3.b32 $0, $1, $2, {mask & 0xFFFFFFFF:#x}, 0xF8;",
        "=r,r,r", has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def lop3_sel(a, b, mask: int, *, loc=None, ip=None) -> Int32:
    """``(a & mask) | (b & ~mask)`` in one LOP3 (bitwise select, ``mask`` an immediate)."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)], f"lop3.b32 $0, $1, $2, {mask & 0xFFFFFFFF:#x}, 0xE4;",
        "=r,r,r", has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def and_imm(a, mask: int, *, loc=None, ip=None) -> Int32:
    """``a & mask`` (``mask`` an immediate)."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip)], f"and.b32 $0, $1, {mask & 0xFFFFFFFF:#x};", "=r,r",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def shr_u32(a, s: int, *, loc=None, ip=None) -> Int32:
    """Logical shift right by an immediate."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip)], f"shr.u32 $0, $1, {s};", "=r,r", has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def prmt_imm(a, sel: int, *, loc=None, ip=None) -> Int32:
    """Byte permute of ``a`` with itself (``sel`` an immediate), e.g. 0x1010 / 0x3232 broadcast a half."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip)], f"prmt.b32 $0, $1, $1, {sel:#x};", "=r,r",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def prmt_pair(a, b, sel, *, loc=None, ip=None) -> Int32:
    """``prmt.b32 d, a, b, sel``: bytes of the pair ``(a, b)`` picked by a runtime selector (a table lookup)."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(sel, loc, ip)], "prmt.b32 $0, $1, $2, $3;",
        "=r,r,r,r", has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def packed_add(a, b, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """bf16x2 / f16x2 add, round to nearest."""
    op = "add.rn.bf16x2" if is_bf16 else "add.rn.f16x2"
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)], f"{op} $0, $1, $2;", "=r,r,r",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def packed_mul(a, b, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """bf16x2 / f16x2 multiply, round to nearest."""
    op = "mul.rn.bf16x2" if is_bf16 else "mul.rn.f16x2"
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)], f"{op} $0, $1, $2;", "=r,r,r",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def hfma2(a, b, c, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Packed ``a * b + c`` (bf16x2 / f16x2, round to nearest; sm_80+)."""
    op = "fma.rn.bf16x2" if is_bf16 else "fma.rn.f16x2"
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(c, loc, ip)], f"{op} $0, $1, $2, $3;", "=r,r,r,r",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def pack2_16(lo, hi, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Round two FP32 values to a packed bf16x2 / f16x2 word (``lo`` in the low half)."""
    op = "cvt.rn.bf16x2.f32" if is_bf16 else "cvt.rn.f16x2.f32"
    r = llvm.inline_asm(
        T.i32(), [_f32(hi, loc, ip), _f32(lo, loc, ip)], f"{op} $0, $1, $2;", "=r,f,f",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def half_to_f32(bits, hi: bool, is_bf16: bool, *, loc=None, ip=None) -> Float32:
    """The low (``hi=False``) or high 16 bits of ``bits`` (bf16 / f16) as an exact FP32 value."""
    if is_bf16:
        asm = "and.b32 $0, $1, 0xffff0000;" if hi else "shl.b32 $0, $1, 16;"
    else:
        asm = "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, " + ("hi" if hi else "lo") + "; }"
    r = llvm.inline_asm(T.f32(), [_i32(bits, loc, ip)], asm, "=f,r", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


@dsl_user_op
def i32_as_f32(v, *, loc=None, ip=None) -> Float32:
    """The 32 bits of ``v`` as an FP32 value."""
    r = llvm.inline_asm(T.f32(), [_i32(v, loc, ip)], "mov.b32 $0, $1;", "=f,r", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


# ------------------------------------------------------------------------------------------------------------
# matrix instructions
# ------------------------------------------------------------------------------------------------------------
@dsl_user_op
def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, is_bf16: bool, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32``; returns (d0, d1, d2, d3)."""
    ty = "bf16" if is_bf16 else "f16"
    r = llvm.inline_asm(
        _struct(4, "f32"),
        [_i32(v, loc, ip) for v in (a0, a1, a2, a3, b0, b1)] + [_f32(v, loc, ip) for v in (c0, c1, c2, c3)],
        f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, {{$8, $9}}, "
        "{$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", has_side_effects=False, loc=loc, ip=ip,
    )
    return _unpack(r, 4, loc, ip, Float32)


@dsl_user_op
def ldmatrix_x4(addr, *, loc=None, ip=None):
    """``ldmatrix.sync.aligned.m8n8.x4.shared.b16``: four 8x8 b16 matrices (lanes 8q..8q+7 address matrix q)."""
    r = llvm.inline_asm(
        _struct(4), [_i32(addr, loc, ip)], "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
        "=r,=r,=r,=r,r", has_side_effects=True, loc=loc, ip=ip,
    )
    return _unpack(r, 4, loc, ip)


# ------------------------------------------------------------------------------------------------------------
# shared memory (32-bit shared addresses)
# ------------------------------------------------------------------------------------------------------------
def _ld_shared(n: int, addr, loc, ip):
    if n == 1:
        r = llvm.inline_asm(
            T.i32(), [_i32(addr, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r",
            has_side_effects=True, loc=loc, ip=ip,
        )
        return (Int32(r),)
    regs = ", ".join(f"${i}" for i in range(n))
    cons = ",".join(["=r"] * n) + ",r"
    r = llvm.inline_asm(
        _struct(n), [_i32(addr, loc, ip)], f"ld.shared.v{n}.b32 {{{regs}}}, [${n}];", cons,
        has_side_effects=True, loc=loc, ip=ip,
    )
    return _unpack(r, n, loc, ip)


@dsl_user_op
def ld_shared_v4(addr, *, loc=None, ip=None):
    """Four 32-bit words from 16 aligned bytes of shared memory."""
    return _ld_shared(4, addr, loc, ip)


@dsl_user_op
def ld_shared_v2(addr, *, loc=None, ip=None):
    """Two 32-bit words from 8 aligned bytes of shared memory."""
    return _ld_shared(2, addr, loc, ip)


@dsl_user_op
def ld_shared_b32(addr, *, loc=None, ip=None):
    """One 32-bit word of shared memory."""
    return _ld_shared(1, addr, loc, ip)[0]


@dsl_user_op
def st_shared_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """Four 32-bit words to 16 aligned bytes of shared memory."""
    llvm.inline_asm(
        None, [_i32(addr, loc, ip)] + [_i32(v, loc, ip) for v in (a, b, c, d)],
        "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def st_shared_b32(addr, v, *, loc=None, ip=None) -> None:
    """One 32-bit word to shared memory."""
    llvm.inline_asm(
        None, [_i32(addr, loc, ip), _i32(v, loc, ip)], "st.shared.b32 [$0], $1;", "r,r",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def st_shared_f32(addr, v, *, loc=None, ip=None) -> None:
    """One FP32 value to shared memory."""
    llvm.inline_asm(
        None, [_i32(addr, loc, ip), _f32(v, loc, ip)], "st.shared.f32 [$0], $1;", "r,f",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def st_shared_cvt16(addr, v, is_bf16: bool, *, loc=None, ip=None) -> None:
    """Round an FP32 value to bf16/f16 (RN) and store it to shared memory."""
    cvt = "cvt.rn.bf16.f32" if is_bf16 else "cvt.rn.f16.f32"
    llvm.inline_asm(
        None, [_i32(addr, loc, ip), _f32(v, loc, ip)],
        f"{{ .reg .b16 h; {cvt} h, $1; st.shared.b16 [$0], h; }}", "r,f",
        has_side_effects=True, loc=loc, ip=ip,
    )


# ------------------------------------------------------------------------------------------------------------
# global memory (64-bit generic addresses)
# ------------------------------------------------------------------------------------------------------------
@dsl_user_op
def st_global_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """16-byte global store of four 32-bit words."""
    llvm.inline_asm(
        None, [_i64(addr, loc, ip)] + [_i32(v, loc, ip) for v in (a, b, c, d)],
        "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def st_global_b32(addr, v, *, loc=None, ip=None) -> None:
    """One 32-bit word to global memory."""
    llvm.inline_asm(
        None, [_i64(addr, loc, ip), _i32(v, loc, ip)], "st.global.b32 [$0], $1;", "l,r",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def ld_global_cg_v4(addr, *, loc=None, ip=None):
    """16-byte L2-coherent (``.cg``) global load of four 32-bit words (split-K partials of other CTAs)."""
    r = llvm.inline_asm(
        _struct(4), [_i64(addr, loc, ip)], "ld.global.cg.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
        has_side_effects=True, loc=loc, ip=ip,
    )
    return _unpack(r, 4, loc, ip)


@dsl_user_op
def ld_global_nc_v4(addr, *, loc=None, ip=None):
    """16-byte read-only (``.nc``) global load of four 32-bit words (NVFP4 global scales)."""
    r = llvm.inline_asm(
        _struct(4), [_i64(addr, loc, ip)], "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
        has_side_effects=True, loc=loc, ip=ip,
    )
    return _unpack(r, 4, loc, ip)


@dsl_user_op
def ld_stream_pred(addr, pred, policy, nwords: int, *, loc=None, ip=None):
    """``nwords`` (1, 2, 4) 32-bit words of streamed weight data, or zeros when ``pred`` is 0:
    ``ld.global.nc.L1::no_allocate.L2::cache_hint`` with ``policy``."""
    outs = ", ".join(f"${i}" for i in range(nwords))
    zero = " ".join(f"mov.b32 ${i}, 0;" for i in range(nwords))
    vec = f".v{nwords}" if nwords > 1 else ""
    dst = f"{{{outs}}}" if nwords > 1 else "$0"
    a, p, pol = nwords, nwords + 1, nwords + 2
    asm = (f"{{ .reg .pred p; setp.ne.b32 p, ${p}, 0; {zero} "
           f"@p ld.global.nc.L1::no_allocate.L2::cache_hint{vec}.b32 {dst}, [${a}], ${pol}; }}")
    cons = ",".join(["=&r"] * nwords) + ",l,r,l"
    args = [_i64(addr, loc, ip), _i32(pred, loc, ip), _i64(policy, loc, ip)]
    if nwords == 1:
        r = llvm.inline_asm(T.i32(), args, asm, cons, has_side_effects=True, loc=loc, ip=ip)
        return (Int32(r),)
    r = llvm.inline_asm(_struct(nwords), args, asm, cons, has_side_effects=True, loc=loc, ip=ip)
    return _unpack(r, nwords, loc, ip)


@dsl_user_op
def ld_act_pred(addr, pred, *, loc=None, ip=None) -> Int32:
    """One 32-bit word of activations (``ld.global.nc``), or 0 when ``pred`` is 0."""
    asm = "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 0; @p ld.global.nc.b32 $0, [$1]; }"
    r = llvm.inline_asm(
        T.i32(), [_i64(addr, loc, ip), _i32(pred, loc, ip)], asm, "=&r,l,r", has_side_effects=True, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def red_add_v4_f32(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """``red.global.add.v4.f32`` (sm_90+): four FP32 atomic adds to 16 aligned bytes."""
    llvm.inline_asm(
        None, [_i64(addr, loc, ip)] + [_f32(v, loc, ip) for v in (a, b, c, d)],
        "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f", has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def red_add_f32(addr, a, *, loc=None, ip=None) -> None:
    """``red.global.add.f32``: one FP32 atomic add (every arch)."""
    llvm.inline_asm(
        None, [_i64(addr, loc, ip), _f32(a, loc, ip)], "red.global.add.f32 [$0], $1;", "l,f",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def atom_add_gpu(addr, v, *, loc=None, ip=None) -> Int32:
    """``atom.add.u32`` at GPU scope; returns the old value."""
    r = llvm.inline_asm(
        T.i32(), [_i64(addr, loc, ip), _i32(v, loc, ip)], "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;",
        "=r,l,r", has_side_effects=True, loc=loc, ip=ip,
    )
    return Int32(r)


# ------------------------------------------------------------------------------------------------------------
# asynchronous copies, cache policy, prefetch
# ------------------------------------------------------------------------------------------------------------
@dsl_user_op
def evict_first_policy(*, loc=None, ip=None) -> Int64:
    """An L2 evict-first cache policy (``createpolicy.fractional``) for ``.L2::cache_hint`` accesses."""
    r = llvm.inline_asm(
        T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l",
        has_side_effects=True, loc=loc, ip=ip,
    )
    return Int64(r)


@dsl_user_op
def cp_async_16(dst_smem, src_gmem, *, loc=None, ip=None) -> None:
    """16-byte ``cp.async.cg`` global -> shared (``dst_smem`` a 32-bit shared address, ``src_gmem`` 64-bit)."""
    llvm.inline_asm(
        None, [_i32(dst_smem, loc, ip), _i64(src_gmem, loc, ip)], "cp.async.cg.shared.global [$0], [$1], 16;",
        "r,l", has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def cp_async_16_hint(dst_smem, src_gmem, policy, *, loc=None, ip=None) -> None:
    """:func:`cp_async_16` with an L2 cache policy (:func:`evict_first_policy`)."""
    llvm.inline_asm(
        None, [_i32(dst_smem, loc, ip), _i64(src_gmem, loc, ip), _i64(policy, loc, ip)],
        "cp.async.cg.shared.global.L2::cache_hint [$0], [$1], 16, $2;", "r,l,l",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None) -> None:
    """``cp.async.commit_group``."""
    llvm.inline_asm(None, [], "cp.async.commit_group;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def cp_async_wait(n: int, *, loc=None, ip=None) -> None:
    """``cp.async.wait_group n``: at most ``n`` of this thread's committed groups still pending."""
    llvm.inline_asm(None, [], f"cp.async.wait_group {n};", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def bulk_g2s(dst_smem, src_gmem, nbytes: int, mbar_smem, *, evict_first: bool = False, loc=None, ip=None) -> None:
    """1-D ``cp.async.bulk`` global -> shared completing ``nbytes`` of tx on the mbarrier."""
    if evict_first:
        asm = (
            "{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; "
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
            f"[$0], [$1], {nbytes}, [$2], pol; }}"
        )
    else:
        asm = f"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], {nbytes}, [$2];"
    llvm.inline_asm(
        None, [_i32(dst_smem, loc, ip), _i64(src_gmem, loc, ip), _i32(mbar_smem, loc, ip)], asm, "r,l,r",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def prefetch_l2_bulk(addr, nbytes, *, loc=None, ip=None) -> None:
    """``cp.async.bulk.prefetch.L2.global``: bring ``nbytes`` (a multiple of 16, 16-byte aligned) into L2."""
    llvm.inline_asm(
        None, [_i64(addr, loc, ip), _i32(nbytes, loc, ip)], "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r",
        has_side_effects=True, loc=loc, ip=ip,
    )


# ------------------------------------------------------------------------------------------------------------
# fences and warp-level
# ------------------------------------------------------------------------------------------------------------
@dsl_user_op
def fence_proxy_async_smem(*, loc=None, ip=None) -> None:
    """``fence.proxy.async.shared::cta``: order generic-proxy smem accesses with the async proxy."""
    llvm.inline_asm(None, [], "fence.proxy.async.shared::cta;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None) -> None:
    """``fence.acq_rel.gpu`` (split-K publish / counter handshake)."""
    llvm.inline_asm(None, [], "fence.acq_rel.gpu;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def ballot(pred, *, loc=None, ip=None) -> Int32:
    """``vote.sync.ballot.b32`` over the full warp of ``pred != 0``."""
    r = llvm.inline_asm(
        T.i32(), [_i32(pred, loc, ip)],
        "{ .reg .pred p; setp.ne.b32 p, $1, 0; vote.sync.ballot.b32 $0, p, 0xffffffff; }", "=r,r",
        has_side_effects=True, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def lanemask_lt(*, loc=None, ip=None) -> Int32:
    """``%lanemask_lt``: the bits of the lanes below this one."""
    r = llvm.inline_asm(T.i32(), [], "mov.u32 $0, %lanemask_lt;", "=r", has_side_effects=False, loc=loc, ip=ip)
    return Int32(r)

"""Small PTX building blocks for the SM90 W4A16 kernels (inline asm through the CuTe DSL).

Pure arithmetic helpers are emitted without side effects so LLVM/ptxas may schedule them freely;
memory and asynchronous-copy helpers are side-effecting so they keep their program order relative
to barriers.
"""

from __future__ import annotations

from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

__all__ = [
    "lop3_and_or",
    "packed_add",
    "packed_mul",
    "prmt",
    "cp_async_16",
    "bulk_g2s",
    "red_add_v4_f32",
    "red_add_f32",
    "st_global_v4",
    "ld_shared_v4",
    "ld_shared_v2",
    "ld_shared_b32",
    "fence_proxy_async_smem",
    "i32_as_f32",
    "st_shared_f32",
    "st_shared_cvt16",
    "pack2_16",
    "ld_global_cg_v4",
    "atom_add_gpu",
    "st_global_b32",
    "fence_acq_rel_gpu",
    "st_shared_v4",
    "st_shared_b32",
]


def _u32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def _i32(x, loc, ip):
    return Int32(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def lop3_and_or(a, mask: int, c, *, loc=None, ip=None) -> Int32:
    """``(a & mask) | c`` in one LOP3 (``mask`` an immediate)."""
    r = llvm.inline_asm(
        T.i32(),
        [_i32(a, loc, ip), _i32(c, loc, ip)],
        f"lop3.b32 $0, $1, {mask & 0xFFFFFFFF:#x}, $2, 0xEA;",
        "=r,r,r",
        has_side_effects=False,
        loc=loc,
        ip=ip,
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
def prmt(a, sel: int, *, loc=None, ip=None) -> Int32:
    """Byte permute of ``a`` with itself (``sel`` an immediate), e.g. 0x1010 / 0x3232 broadcast a half."""
    r = llvm.inline_asm(
        T.i32(), [_i32(a, loc, ip)], f"prmt.b32 $0, $1, $1, {sel:#x};", "=r,r",
        has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def cp_async_16(dst_smem, src_gmem, *, loc=None, ip=None) -> None:
    """16-byte ``cp.async.cg`` global -> shared (``dst_smem`` a 32-bit shared address, ``src_gmem`` 64-bit)."""
    llvm.inline_asm(
        None,
        [Int32(dst_smem).ir_value(loc=loc, ip=ip), Int64(src_gmem).ir_value(loc=loc, ip=ip)],
        "cp.async.cg.shared.global [$0], [$1], 16;",
        "r,l",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


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
        None,
        [
            Int32(dst_smem).ir_value(loc=loc, ip=ip),
            Int64(src_gmem).ir_value(loc=loc, ip=ip),
            Int32(mbar_smem).ir_value(loc=loc, ip=ip),
        ],
        asm,
        "r,l,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def red_add_v4_f32(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """``red.global.add.v4.f32`` (sm_90): four FP32 atomic adds to 16 aligned bytes."""
    llvm.inline_asm(
        None,
        [Int64(addr).ir_value(loc=loc, ip=ip)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c, d)],
        "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};",
        "l,f,f,f,f",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def red_add_f32(addr, a, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None,
        [Int64(addr).ir_value(loc=loc, ip=ip), Float32(a).ir_value(loc=loc, ip=ip)],
        "red.global.add.f32 [$0], $1;",
        "l,f",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def st_global_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """16-byte global store of four 32-bit words."""
    llvm.inline_asm(
        None,
        [Int64(addr).ir_value(loc=loc, ip=ip)] + [_i32(v, loc, ip) for v in (a, b, c, d)],
        "st.global.v4.b32 [$0], {$1, $2, $3, $4};",
        "l,r,r,r,r",
        has_side_effects=True,
        loc=loc,
        ip=ip,
    )


def _ld_shared(n: int, addr, loc, ip):
    if n == 1:
        r = llvm.inline_asm(
            T.i32(), [_i32(addr, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r",
            has_side_effects=True, loc=loc, ip=ip,
        )
        return (Int32(r),)
    regs = ", ".join(f"${i}" for i in range(n))
    cons = ",".join(["=r"] * n) + ",r"
    st = ir.Type.parse("!llvm.struct<(" + ", ".join(["i32"] * n) + ")>")
    r = llvm.inline_asm(
        st, [_i32(addr, loc, ip)], f"ld.shared.v{n}.b32 {{{regs}}}, [${n}];", cons,
        has_side_effects=True, loc=loc, ip=ip,
    )
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
def fence_proxy_async_smem(*, loc=None, ip=None) -> None:
    """``fence.proxy.async.shared::cta``: order generic-proxy smem accesses with the async proxy."""
    llvm.inline_asm(None, [], "fence.proxy.async.shared::cta;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def i32_as_f32(v, *, loc=None, ip=None) -> Float32:
    r = llvm.inline_asm(T.f32(), [_i32(v, loc, ip)], "mov.b32 $0, $1;", "=f,r", has_side_effects=False, loc=loc, ip=ip)
    return Float32(r)


@dsl_user_op
def st_shared_f32(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [_i32(addr, loc, ip), Float32(v).ir_value(loc=loc, ip=ip)], "st.shared.f32 [$0], $1;", "r,f",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def st_shared_cvt16(addr, v, is_bf16: bool, *, loc=None, ip=None) -> None:
    """Round an FP32 value to bf16/f16 (RN) and store it to shared memory."""
    cvt = "cvt.rn.bf16.f32" if is_bf16 else "cvt.rn.f16.f32"
    llvm.inline_asm(
        None, [_i32(addr, loc, ip), Float32(v).ir_value(loc=loc, ip=ip)],
        f"{{ .reg .b16 h; {cvt} h, $1; st.shared.b16 [$0], h; }}", "r,f",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def pack2_16(lo, hi, is_bf16: bool, *, loc=None, ip=None) -> Int32:
    """Round two FP32 values to a packed bf16x2 / f16x2 word (``lo`` in the low half)."""
    op = "cvt.rn.bf16x2.f32" if is_bf16 else "cvt.rn.f16x2.f32"
    r = llvm.inline_asm(
        T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
        f"{op} $0, $1, $2;", "=r,f,f", has_side_effects=False, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def ld_global_cg_v4(addr, *, loc=None, ip=None):
    """16-byte L2-coherent (``.cg``) global load of four 32-bit words (split-K partials of other CTAs)."""
    st = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
    r = llvm.inline_asm(
        st, [Int64(addr).ir_value(loc=loc, ip=ip)], "ld.global.cg.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
        has_side_effects=True, loc=loc, ip=ip,
    )
    return tuple(Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def atom_add_gpu(addr, v, *, loc=None, ip=None) -> Int32:
    """``atom.add.u32`` at GPU scope; returns the old value."""
    r = llvm.inline_asm(
        T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)],
        "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r", has_side_effects=True, loc=loc, ip=ip,
    )
    return Int32(r)


@dsl_user_op
def st_global_b32(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [Int64(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)], "st.global.b32 [$0], $1;", "l,r",
        has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def fence_acq_rel_gpu(*, loc=None, ip=None) -> None:
    llvm.inline_asm(None, [], "fence.acq_rel.gpu;", "", has_side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def st_shared_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [_i32(addr, loc, ip)] + [_i32(v, loc, ip) for v in (a, b, c, d)],
        "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r", has_side_effects=True, loc=loc, ip=ip,
    )


@dsl_user_op
def st_shared_b32(addr, v, *, loc=None, ip=None) -> None:
    llvm.inline_asm(
        None, [_i32(addr, loc, ip), _i32(v, loc, ip)], "st.shared.b32 [$0], $1;", "r,r",
        has_side_effects=True, loc=loc, ip=ip,
    )

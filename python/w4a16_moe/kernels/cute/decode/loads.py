"""The decode GEMV's unpredicated loads: :func:`ld_stream` and :func:`ld_act`, the forms of
:func:`..common.ptx.ld_stream_pred` and :func:`..common.ptx.ld_act_pred` for a load batch whose units are all in
range (no predicate, no zero fill), and :data:`INT4_SYM_BIAS_X16`, the bias of the FP16 in-place decode of the
nibbles at bits 4..7.

They live beside the decode family rather than in ``common/`` because only its FP32-scale kernels use them: the
other families' kernels (whose source hash covers ``common/``) stay what they are.
"""

from __future__ import annotations

from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..common.ptx import _i64, _struct, _unpack

__all__ = ["ld_stream", "ld_act", "INT4_SYM_BIAS_X16"]

#: fp16 ``-(magic + 128)`` in both halves: the bias of a nibble OR-ed onto the magic at bits 4..7 (``magic + 16 q``);
#: bf16's 7-bit mantissa cannot hold ``16 q``, so there is no bf16 entry
INT4_SYM_BIAS_X16 = {"fp16": 0xE480E480}


@dsl_user_op
def ld_stream(addr, policy, nwords: int, *, loc=None, ip=None):
    """``ld_stream_pred`` of an address known to be in range: ``nwords`` (1, 2 or 4) 32-bit words, L1 no-allocate
    with the L2 cache hint ``policy``."""
    outs = ", ".join(f"${i}" for i in range(nwords))
    vec = f".v{nwords}" if nwords > 1 else ""
    dst = f"{{{outs}}}" if nwords > 1 else "$0"
    asm = f"ld.global.nc.L1::no_allocate.L2::cache_hint{vec}.b32 {dst}, [${nwords}], ${nwords + 1};"
    cons = ",".join(["=r"] * nwords) + ",l,l"
    args = [_i64(addr, loc, ip), _i64(policy, loc, ip)]
    if nwords == 1:
        r = llvm.inline_asm(T.i32(), args, asm, cons, has_side_effects=True, loc=loc, ip=ip)
        return (Int32(r),)
    r = llvm.inline_asm(_struct(nwords), args, asm, cons, has_side_effects=True, loc=loc, ip=ip)
    return _unpack(r, nwords, loc, ip)


@dsl_user_op
def ld_act(addr, *, loc=None, ip=None) -> Int32:
    """``ld_act_pred`` of an address known to be in range: one 32-bit word of activations (``ld.global.nc``)."""
    r = llvm.inline_asm(T.i32(), [_i64(addr, loc, ip)], "ld.global.nc.b32 $0, [$1];", "=r,l",
                        has_side_effects=True, loc=loc, ip=ip)
    return Int32(r)

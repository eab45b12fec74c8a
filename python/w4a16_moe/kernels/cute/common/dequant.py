"""Weight-decode building blocks shared by the kernels that read the SM90 packed layout (CuTe DSL device code).

The SM90 WGMMA grouped GEMM and the route-major decode kernels read the same fragment-ready codes
(:mod:`w4a16_moe.kernels.cute.sm90.pack`) and decode them with the same instructions, so their weights are
bit-identical.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from . import ptx
from .codes import NEG_ZERO_X2

__all__ = ["e2m1_pair"]


@cute.jit
def e2m1_pair(word, i: cutlass.Constexpr, is_bf16: cutlass.Constexpr):
    """The E2M1 codes of nibbles ``i`` (lo) and ``i + 4`` (hi) of ``word`` as a raw 16-bit pair whose value is
    ``e2m1 * 2**-14`` (fp16) or ``e2m1 * 2**-126`` (bf16): the three magnitude bits land on the lowest exponent
    bits and the top mantissa bit (exact, subnormals included), the sign bit on bit 15. The pack folds
    ``2**14`` / ``2**126`` into the scales."""
    mag_shift = (9 if not is_bf16 else 6) - 4 * i  # nibble bit 0 -> bit 9 (fp16) / 6 (bf16)
    mag_mask = 0x0E000E00 if not is_bf16 else 0x01C001C0
    sgn_shift = 12 - 4 * i  # nibble bit 3 -> bit 15
    sgn = (word << sgn_shift) if sgn_shift > 0 else word
    sgn = sgn & Int32(ptx.signed32(NEG_ZERO_X2))
    mag = (word << mag_shift) if mag_shift > 0 else (word >> (-mag_shift)) if mag_shift < 0 else word
    return ptx.lop3_and_or(mag, mag_mask, sgn)

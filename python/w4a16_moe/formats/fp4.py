"""Bit-level helpers for the floating-point 4-bit formats (E2M1) and their scale types (E4M3, E8M0).

All functions work on any device and never synchronize with it.
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_VALUES",
    "e2m1_decode",
    "e2m1_encode",
    "e4m3_decode",
    "e4m3_encode",
    "e8m0_decode",
    "e8m0_encode_floor",
    "E4M3_MAX",
    "E2M1_MAX",
]

E2M1_MAX = 6.0
E4M3_MAX = 448.0
# Code c (0..15): bit 3 is the sign, bits 2..1 the exponent, bit 0 the mantissa.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E2M1 codes (any integer dtype holding 0..15)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long() & 0xF]


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round FP32 values to the nearest E2M1 code (ties to even mantissa), saturating at +-6.

    Returns uint8 codes 0..15. ``-0.0`` and values rounding to zero encode as code 0.
    """
    x = x.float()
    mag = x.abs()
    # Midpoints between neighbours 0, .5, 1, 1.5, 2, 3, 4, 6; '>' rounds a tie down, '>=' up, so that
    # each tie goes to the neighbour with an even mantissa (0, 1, 2, 4 and 6 have mantissa 0).
    idx = (
        (mag > 0.25).to(torch.uint8)
        + (mag >= 0.75)
        + (mag > 1.25)
        + (mag >= 1.75)
        + (mag > 2.5)
        + (mag >= 3.5)
        + (mag > 5.0)
    ).to(torch.uint8)
    sign = ((x < 0) & (idx > 0)).to(torch.uint8) << 3
    return idx | sign


def e4m3_decode(bits: torch.Tensor) -> torch.Tensor:
    """FP32 values of FP8 E4M3 (fn) scales given as ``torch.float8_e4m3fn`` or raw uint8 bits."""
    if bits.dtype == torch.uint8:
        bits = bits.view(torch.float8_e4m3fn)
    return bits.float()


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """Round FP32 values to FP8 E4M3 (nearest even), saturating at +-448."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e8m0_decode(bits: torch.Tensor) -> torch.Tensor:
    """FP32 values ``2**(bits - 127)`` of E8M0 scales stored as uint8 (255 is NaN)."""
    e = bits.to(torch.int32)
    out = torch.exp2((e - 127).float())
    return torch.where(e == 255, torch.full_like(out, float("nan")), out)


def e8m0_encode_floor(exponent: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 bits for integer exponents, clamped to the finite range [-127, 127]."""
    return (exponent.to(torch.int32).clamp(-127, 127) + 127).to(torch.uint8)

"""Quantize dense expert matrices into a scheme, and dequantize them exactly.

Everything here works on stacked expert matrices ``W[E, N, K]`` (``N`` output rows, ``K`` the
reduction dimension) and returns / consumes :class:`~w4a16_moe.formats.weights.QuantizedMatrix`.
"""

from __future__ import annotations

import torch

from .fp4 import (
    E2M1_MAX,
    E4M3_MAX,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    e8m0_decode,
    e8m0_encode_floor,
)
from .schemes import Scheme, get_scheme
from .weights import QuantizedMatrix, pack_nibbles, unpack_nibbles

__all__ = ["quantize_matrix", "dequantize_matrix"]

_FLOAT_SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _grouped(w: torch.Tensor, g: int) -> torch.Tensor:
    e, n, k = w.shape
    return w.reshape(e, n, k // g, g)


def quantize_matrix(
    w: torch.Tensor, scheme: "str | Scheme", *, name: str = "w", scale_dtype: "torch.dtype | None" = None
) -> QuantizedMatrix:
    """Quantize dense expert weights ``w[E, N, K]`` (BF16, FP16 or FP32) into ``scheme``.

    INT4 scales are stored in ``scale_dtype`` (default: the dtype of ``w`` when it is BF16/FP16,
    else BF16) and the codes are computed against the *stored* (rounded) scale, so dequantization
    reproduces exactly what the kernels see.

    Rules per scheme:
      * symmetric INT4: ``scale = absmax / 7`` per group (or row), ``code = clamp(round(w/scale), -8, 7) + 8``;
      * INT4 with zero point: ``scale = (max(w, 0) - min(w, 0)) / 15``, ``zero = clamp(round(-min/scale), 0, 15)``,
        ``code = clamp(round(w/scale) + zero, 0, 15)``;
      * NVFP4: ``global = absmax(expert matrix) / (6 * 448)`` (ModelOpt ``weight_scale_2``), per 16 values
        ``scale = e4m3(absmax / 6 / global)``, ``code = e2m1(w / (scale * global))``;
      * MXFP4: per 32 values ``scale = 2**(floor(log2(absmax)) - 2)`` (OCP MX), ``code = e2m1(w / scale)``.
    """
    sch = get_scheme(scheme)
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 3:
        raise ValueError(f"{name}: expected a 3-D tensor [E, N, K], got shape {tuple(w.shape)}")
    if w.dtype not in _FLOAT_SCALE_DTYPES:
        raise TypeError(f"{name}: expected bfloat16, float16 or float32, got {w.dtype}")
    e, n, k = w.shape
    mult = sch.min_k_multiple()
    if k % mult:
        raise ValueError(
            f"{name}: reduction size {k} is not a multiple of {mult} (scheme {sch.name})"
        )
    if not torch.isfinite(w).all():
        raise ValueError(f"{name}: contains NaN or Inf; cannot quantize")
    if scale_dtype is None:
        scale_dtype = w.dtype if w.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    if scale_dtype not in _FLOAT_SCALE_DTYPES:
        raise TypeError(f"scale_dtype: expected bfloat16, float16 or float32, got {scale_dtype}")
    wf = w.float().contiguous()  # a strided view quantizes like its contiguous copy
    g = sch.group_for(k)
    wg = _grouped(wf, g)

    if sch.kind == "int4":
        if sch.zero_point:
            hi = wg.amax(dim=-1).clamp(min=0)
            lo = wg.amin(dim=-1).clamp(max=0)
            scale = ((hi - lo) / 15.0).to(scale_dtype)
            sf = scale.float()
            sf_safe = torch.where(sf > 0, sf, torch.ones_like(sf))
            zero = torch.round(-lo / sf_safe).clamp(0, 15)
            q = torch.round(wg / sf_safe[..., None]) + zero[..., None]
            q = torch.where(sf[..., None] > 0, q, zero[..., None])
            codes = q.clamp(0, 15).to(torch.uint8).reshape(e, n, k)
            zeros = zero.to(torch.uint8).contiguous()
        else:
            absmax = wg.abs().amax(dim=-1)
            scale = (absmax / 7.0).to(scale_dtype)
            sf = scale.float()
            sf_safe = torch.where(sf > 0, sf, torch.ones_like(sf))
            q = torch.round(wg / sf_safe[..., None]).clamp(-8, 7)
            codes = (q + 8).to(torch.uint8).reshape(e, n, k)
            zeros = None
        return QuantizedMatrix(sch, pack_nibbles(codes), scale.contiguous(), zeros, None)

    if sch.kind == "nvfp4":
        amax = wf.abs().amax(dim=(1, 2))
        glob = torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
        blk = wg.abs().amax(dim=-1) / E2M1_MAX / glob[:, None, None]
        scale = e4m3_encode(blk)
        eff = e4m3_decode(scale) * glob[:, None, None]
        eff_safe = torch.where(eff > 0, eff, torch.ones_like(eff))
        codes = e2m1_encode(torch.where(eff[..., None] > 0, wg / eff_safe[..., None], torch.zeros_like(wg)))
        global_scale = glob[:, None].expand(e, n).contiguous().float()
        return QuantizedMatrix(sch, pack_nibbles(codes.reshape(e, n, k)), scale.contiguous(), None, global_scale)

    if sch.kind == "mxfp4":
        amax = wg.abs().amax(dim=-1)
        exp = torch.where(
            amax > 0, torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)))) - 2,
            torch.full_like(amax, -127.0),
        )
        bits = e8m0_encode_floor(exp)
        sc = e8m0_decode(bits)
        codes = e2m1_encode((wg / sc[..., None]).clamp(-E2M1_MAX, E2M1_MAX))
        return QuantizedMatrix(sch, pack_nibbles(codes.reshape(e, n, k)), bits.contiguous(), None, None)

    raise AssertionError(f"unhandled scheme kind {sch.kind}")  # pragma: no cover


def dequantize_matrix(qm: QuantizedMatrix) -> torch.Tensor:
    """Exact FP32 dequantization ``W[E, N, K]`` of a :class:`QuantizedMatrix` (the kernels' definition)."""
    sch = qm.scheme
    codes = unpack_nibbles(qm.codes)
    e, n, k = codes.shape
    g = sch.group_for(k)
    cg = codes.reshape(e, n, k // g, g)
    if sch.kind == "int4":
        zero = qm.zeros.float()[..., None] if sch.zero_point else 8.0
        w = (cg.float() - zero) * qm.scales.float()[..., None]
    elif sch.kind == "nvfp4":
        w = e2m1_decode(cg) * e4m3_decode(qm.scales)[..., None]
        w = w * qm.global_scale[:, :, None, None]
    elif sch.kind == "mxfp4":
        w = e2m1_decode(cg) * e8m0_decode(qm.scales)[..., None]
    else:  # pragma: no cover
        raise AssertionError(sch.kind)
    return w.reshape(e, n, k)

"""Converters between checkpoint layouts and :class:`~w4a16_moe.formats.weights.MoEWeights`.

All converters take the experts of one MoE layer stacked along a leading expert dimension ``E``
(``torch.stack`` the per-expert tensors of a checkpoint), with ``w13`` = gate rows then up rows
(``torch.cat([gate, up], dim=1)``) for gated activations. Every conversion is bit-exact both ways:
``MoEWeights.from_X(**w.to_X())`` reproduces ``w`` and ``to_X`` reproduces the checkpoint tensors.

compressed-tensors ``pack-quantized`` (GPTQ / AWQ exports of llm-compressor)
    ``weight_packed`` int32 ``[N, K/8]``: eight codes per word along K, the first in bits 0..3,
    each stored as ``q + 8``; ``weight_scale`` ``[N, K/g]`` (``[N, 1]`` for channel strategy);
    optional ``weight_zero_point`` int32 ``[ceil(N/8), K/g]``: zero points ``zp + 8`` packed eight per
    word along **N** (dim 0). Dequantization ``(q - zp) * scale``.
TensorRT-LLM per-channel W4A16 (``quant_algo: W4A16``)
    ``weight`` int8 ``[N/2, K]``: two signed (two's complement) INT4 values per byte along the output
    dim N, even row in the low nibble; ``weight_scale`` ``[N]`` per output channel (``absmax / 7``).
ModelOpt NVFP4
    ``weight`` uint8 ``[N, K/2]``: two E2M1 codes per byte along K, even index in the low nibble;
    ``weight_scale`` float8_e4m3fn ``[N, K/16]``; ``weight_scale_2`` FP32 per expert and matrix
    (``[E]``, or ``[E, 2]`` for a fused gate/up ``w13`` whose halves carry their own value).
"""

from __future__ import annotations

from typing import Optional

import torch

from .schemes import get_scheme
from .weights import MoEWeights, QuantizedMatrix

__all__ = [
    "from_compressed_tensors",
    "to_compressed_tensors",
    "from_trtllm_per_channel",
    "to_trtllm_per_channel",
    "from_modelopt_nvfp4",
    "to_modelopt_nvfp4",
]


def _gated(activation: str) -> bool:
    from ..activations import get_activation

    return get_activation(activation).gated


def _require(t: object, name: str, dtype: "torch.dtype | tuple", ndim: int) -> torch.Tensor:
    dts = dtype if isinstance(dtype, tuple) else (dtype,)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dts:
        raise TypeError(f"{name}: expected dtype {' or '.join(map(str, dts))}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


# ------------------------------------------------------------------------------------------------
# compressed-tensors pack-quantized
# ------------------------------------------------------------------------------------------------

def _ct_scheme(group_size: Optional[int], zero_point: bool) -> str:
    if group_size is None:
        if zero_point:
            raise ValueError("weight_zero_point: per-channel INT4 with zero points is not a supported scheme")
        return "int4_channel"
    if group_size not in (32, 64, 128):
        raise ValueError(f"group_size: must be 32, 64, 128 or None (channel), got {group_size}")
    return f"int4_g{group_size}" + ("_zp" if zero_point else "")


def _ct_unpack_zp(zp: torch.Tensor, n: int, name: str) -> torch.Tensor:
    """int32 ``[E, ceil(N/8), G]`` packed along N -> uint8 ``[E, N, G]``."""
    e, nw, g = zp.shape
    if nw != (n + 7) // 8:
        raise ValueError(f"{name}: expected {(n + 7) // 8} packed rows for N={n}, got shape {tuple(zp.shape)}")
    shifts = torch.arange(0, 32, 4, device=zp.device, dtype=torch.int32)
    nib = (zp[:, :, None, :] >> shifts[None, None, :, None]) & 0xF  # [E, N/8, 8, G]
    return nib.reshape(e, nw * 8, g)[:, :n].to(torch.uint8).contiguous()


def _ct_pack_zp(zeros: torch.Tensor) -> torch.Tensor:
    e, n, g = zeros.shape
    nw = (n + 7) // 8
    padded = torch.zeros(e, nw * 8, g, dtype=torch.int32, device=zeros.device)
    padded[:, :n] = zeros.to(torch.int32)
    shifts = torch.arange(0, 32, 4, device=zeros.device, dtype=torch.int32)
    return (padded.reshape(e, nw, 8, g) << shifts[None, None, :, None]).sum(dim=2, dtype=torch.int32)


def _ct_matrix(packed: torch.Tensor, scale: torch.Tensor, zp: Optional[torch.Tensor], scheme: str, name: str) -> QuantizedMatrix:
    _require(packed, f"{name}_weight_packed", torch.int32, 3)
    _require(scale, f"{name}_weight_scale", (torch.bfloat16, torch.float16, torch.float32), 3)
    codes = packed.contiguous().view(torch.uint8)
    zeros = None
    if zp is not None:
        _require(zp, f"{name}_weight_zero_point", torch.int32, 3)
        zeros = _ct_unpack_zp(zp, packed.shape[1], f"{name}_weight_zero_point")
    return QuantizedMatrix(get_scheme(scheme), codes, scale.contiguous(), zeros, None)


def from_compressed_tensors(
    w13_weight_packed: torch.Tensor,
    w13_weight_scale: torch.Tensor,
    w2_weight_packed: torch.Tensor,
    w2_weight_scale: torch.Tensor,
    *,
    group_size: Optional[int],
    w13_weight_zero_point: Optional[torch.Tensor] = None,
    w2_weight_zero_point: Optional[torch.Tensor] = None,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build :class:`MoEWeights` from compressed-tensors ``pack-quantized`` expert tensors.

    Args:
        w13_weight_packed: int32 ``[E, 2I|I, H/8]``; w13_weight_scale: ``[E, 2I|I, H/g]``.
        w2_weight_packed: int32 ``[E, H, I/8]``; w2_weight_scale: ``[E, H, I/g]``.
        group_size: 32, 64 or 128 (``strategy: group``), or ``None`` for ``strategy: channel``.
        w13_weight_zero_point / w2_weight_zero_point: int32 ``[E, ceil(N/8), K/g]`` for asymmetric
            (``symmetric: false``) checkpoints; give both or neither.
        activation: decides whether ``w13`` is gated (``2I`` rows) or not.
    """
    if (w13_weight_zero_point is None) != (w2_weight_zero_point is None):
        raise ValueError("w13_weight_zero_point / w2_weight_zero_point: give both or neither")
    scheme = _ct_scheme(group_size, w13_weight_zero_point is not None)
    w13 = _ct_matrix(w13_weight_packed, w13_weight_scale, w13_weight_zero_point, scheme, "w13")
    w2 = _ct_matrix(w2_weight_packed, w2_weight_scale, w2_weight_zero_point, scheme, "w2")
    return MoEWeights(get_scheme(scheme), w13, w2, _gated(activation))


def to_compressed_tensors(weights: MoEWeights) -> dict:
    """The compressed-tensors tensors (and ``group_size``) of INT4 :class:`MoEWeights`."""
    sch = weights.scheme
    if sch.kind != "int4":
        raise ValueError(f"weights: scheme {sch.name} has no compressed-tensors pack-quantized form")
    out: dict = {"group_size": sch.group_size}
    for name, m in (("w13", weights.w13), ("w2", weights.w2)):
        out[f"{name}_weight_packed"] = m.codes.contiguous().view(torch.int32)
        out[f"{name}_weight_scale"] = m.scales
        if sch.zero_point:
            out[f"{name}_weight_zero_point"] = _ct_pack_zp(m.zeros)
    return out


# ------------------------------------------------------------------------------------------------
# TensorRT-LLM per-channel W4A16
# ------------------------------------------------------------------------------------------------

def _trt_matrix(weight: torch.Tensor, scale: torch.Tensor, name: str) -> QuantizedMatrix:
    _require(weight, f"{name}_weight", (torch.int8, torch.uint8), 3)
    _require(scale, f"{name}_weight_scale", (torch.bfloat16, torch.float16, torch.float32), 2)
    e, n_half, k = weight.shape
    if tuple(scale.shape) != (e, 2 * n_half):
        raise ValueError(f"{name}_weight_scale: expected shape {(e, 2 * n_half)}, got {tuple(scale.shape)}")
    if k % 8:
        raise ValueError(f"{name}_weight: reduction size {k} is not a multiple of 8 (scheme int4_channel)")
    b = weight.contiguous().view(torch.uint8)
    lo, hi = b & 0xF, b >> 4  # two's-complement nibbles of rows 2j and 2j+1
    s = torch.stack((lo, hi), dim=2).reshape(e, 2 * n_half, k)
    codes = s ^ 8  # two's complement q -> offset-binary q + 8
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
    return QuantizedMatrix(get_scheme("int4_channel"), packed, scale.contiguous()[..., None], None, None)


def from_trtllm_per_channel(
    w13_weight: torch.Tensor,
    w13_weight_scale: torch.Tensor,
    w2_weight: torch.Tensor,
    w2_weight_scale: torch.Tensor,
    *,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build ``int4_channel`` :class:`MoEWeights` from TensorRT-LLM per-channel W4A16 expert tensors.

    Args:
        w13_weight: int8 ``[E, (2I|I)/2, H]``, two signed INT4 per byte along the output dim.
        w13_weight_scale: ``[E, 2I|I]``; w2_weight: int8 ``[E, H/2, I]``; w2_weight_scale: ``[E, H]``.
    """
    w13 = _trt_matrix(w13_weight, w13_weight_scale, "w13")
    w2 = _trt_matrix(w2_weight, w2_weight_scale, "w2")
    return MoEWeights(get_scheme("int4_channel"), w13, w2, _gated(activation))


def _trt_pack(m: QuantizedMatrix) -> tuple[torch.Tensor, torch.Tensor]:
    from .weights import unpack_nibbles

    codes = unpack_nibbles(m.codes)  # [E, N, K], q + 8
    s = codes ^ 8  # two's-complement nibble
    e, n, k = s.shape
    if n % 2:
        raise ValueError(f"weights: output size {n} is odd; TensorRT-LLM packs two rows per byte")
    packed = (s[:, 0::2, :] | (s[:, 1::2, :] << 4)).contiguous().view(torch.int8)
    return packed, m.scales[..., 0].contiguous()


def to_trtllm_per_channel(weights: MoEWeights) -> dict:
    """TensorRT-LLM per-channel tensors of ``int4_channel`` :class:`MoEWeights`."""
    if weights.scheme.name != "int4_channel":
        raise ValueError(f"weights: scheme {weights.scheme.name} is not int4_channel")
    w13, s13 = _trt_pack(weights.w13)
    w2, s2 = _trt_pack(weights.w2)
    return {"w13_weight": w13, "w13_weight_scale": s13, "w2_weight": w2, "w2_weight_scale": s2}


# ------------------------------------------------------------------------------------------------
# ModelOpt NVFP4
# ------------------------------------------------------------------------------------------------

def _mo_global(gs: torch.Tensor, e: int, n: int, gated: bool, name: str) -> torch.Tensor:
    _require(gs, name, torch.float32, gs.dim() if isinstance(gs, torch.Tensor) else 1)
    if gs.dim() == 2 and gs.shape[1] == 1:
        gs = gs[:, 0]
    if gs.dim() == 1 and gs.shape[0] == e:
        return gs[:, None].expand(e, n).contiguous()
    if gs.dim() == 2 and tuple(gs.shape) == (e, 2) and gated:
        half = n // 2
        return torch.cat((gs[:, :1].expand(e, half), gs[:, 1:].expand(e, half)), dim=1).contiguous()
    want = f"[{e}] or [{e}, 2]" if gated else f"[{e}]"
    raise ValueError(f"{name}: expected shape {want}, got {tuple(gs.shape)}")


def _mo_matrix(weight: torch.Tensor, scale: torch.Tensor, gs: torch.Tensor, gated: bool, name: str) -> QuantizedMatrix:
    _require(weight, f"{name}_weight", torch.uint8, 3)
    _require(scale, f"{name}_weight_scale", (torch.float8_e4m3fn, torch.uint8), 3)
    e, n, _ = weight.shape
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e4m3fn)
    glob = _mo_global(gs, e, n, gated, f"{name}_weight_scale_2")
    return QuantizedMatrix(get_scheme("nvfp4"), weight.contiguous(), scale.contiguous(), None, glob)


def from_modelopt_nvfp4(
    w13_weight: torch.Tensor,
    w13_weight_scale: torch.Tensor,
    w13_weight_scale_2: torch.Tensor,
    w2_weight: torch.Tensor,
    w2_weight_scale: torch.Tensor,
    w2_weight_scale_2: torch.Tensor,
    *,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build ``nvfp4`` :class:`MoEWeights` from ModelOpt NVFP4 expert tensors.

    Args:
        w13_weight: uint8 ``[E, 2I|I, H/2]``; w13_weight_scale: float8_e4m3fn ``[E, 2I|I, H/16]``;
        w13_weight_scale_2: FP32 ``[E]`` (or ``[E, 2]``: gate, up); likewise for ``w2`` with ``[E]``.
    """
    gated = _gated(activation)
    w13 = _mo_matrix(w13_weight, w13_weight_scale, w13_weight_scale_2, gated, "w13")
    w2 = _mo_matrix(w2_weight, w2_weight_scale, w2_weight_scale_2, False, "w2")
    return MoEWeights(get_scheme("nvfp4"), w13, w2, gated)


def to_modelopt_nvfp4(weights: MoEWeights) -> dict:
    """ModelOpt NVFP4 tensors of ``nvfp4`` :class:`MoEWeights` (``w13_weight_scale_2`` is ``[E, 2]`` when gated)."""
    if weights.scheme.name != "nvfp4":
        raise ValueError(f"weights: scheme {weights.scheme.name} is not nvfp4")
    g13 = weights.w13.global_scale
    if weights.gated:
        half = weights.w13.n // 2
        gs13 = torch.stack((g13[:, 0], g13[:, half]), dim=1)
    else:
        gs13 = g13[:, 0].contiguous()
    return {
        "w13_weight": weights.w13.codes,
        "w13_weight_scale": weights.w13.scales,
        "w13_weight_scale_2": gs13,
        "w2_weight": weights.w2.codes,
        "w2_weight_scale": weights.w2.scales,
        "w2_weight_scale_2": weights.w2.global_scale[:, 0].contiguous(),
    }

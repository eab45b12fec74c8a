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
    (``[E]``, or ``[E, 2]`` for a fused gate/up ``w13`` whose halves carry their own value):
    ``w = e2m1 * weight_scale * weight_scale_2`` with ``weight_scale_2 = amax / (6 * 448)``.
compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``
    ``weight_packed`` uint8 ``[N, K/2]`` (as ModelOpt); NVFP4: ``weight_scale`` float8_e4m3fn
    ``[N, K/16]`` and ``weight_global_scale`` FP32 stored **inverted**, ``6 * 448 / amax``
    (``w = e2m1 * weight_scale / weight_global_scale``); MXFP4: ``weight_scale`` uint8 E8M0 ``[N, K/32]``.
gpt-oss MXFP4
    ``*_blocks`` uint8 ``[N, K/32, 16]`` (E2M1 pairs, low nibble first), ``*_scales`` uint8 E8M0
    ``[N, K/32]``; the fused ``gate_up_proj`` interleaves rows (even rows gate, odd rows up), which
    :func:`w4a16_moe.load_experts` de-interleaves; :func:`from_mxfp4` takes gate rows then up rows.
GPTQ (AutoGPTQ / GPTQModel ``checkpoint_format: gptq``)
    ``qweight`` int32 ``[K/8, N]`` packed along K (row ``k`` in bits ``4 * (k % 8)`` of word row
    ``k // 8``); ``qzeros`` int32 ``[K/g, N/8]`` packed along N, storing ``zero - 1`` (``gptq``) or
    ``zero`` (``gptq_v2``); ``scales`` ``[K/g, N]``; ``g_idx`` int32 ``[K]`` (act order).
    ``w[n, k] = (q[k, n] - zero[g_idx[k], n]) * scales[g_idx[k], n]``.
AWQ (AutoAWQ ``version: gemm``)
    ``qweight`` int32 ``[K, N/8]`` packed along N in AWQ's order: nibble ``j`` of word ``c`` holds
    column ``8c + (0, 2, 4, 6, 1, 3, 5, 7)[j]``; ``qzeros`` int32 ``[K/g, N/8]`` in the same order;
    ``scales`` ``[K/g, N]``; ``w[n, k] = (q[k, n] - zero[k // g, n]) * scales[k // g, n]``.
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
    "from_compressed_tensors_fp4",
    "from_mxfp4",
    "from_gptq",
    "from_awq",
]

# A ModelOpt weight_scale_2 is amax / (6 * 448): above this, |w| would exceed ~2.7e5, which no trained
# layer has; a compressed-tensors weight_global_scale (6 * 448 / amax) is above it for any |w| < 2.7e3.
_NVFP4_GLOBAL_LIMIT = 1.0


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
    symmetric: Optional[bool] = None,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build :class:`MoEWeights` from compressed-tensors ``pack-quantized`` (INT4) expert tensors.

    Args:
        w13_weight_packed: int32 ``[E, 2I|I, H/8]``; w13_weight_scale: ``[E, 2I|I, H/g]``.
        w2_weight_packed: int32 ``[E, H, I/8]``; w2_weight_scale: ``[E, H, I/g]``.
        group_size: 32, 64 or 128 (``strategy: group``), or ``None`` for ``strategy: channel``.
        w13_weight_zero_point / w2_weight_zero_point: int32 ``[E, ceil(N/8), K/g]`` for asymmetric
            (``symmetric: false``) checkpoints; give both or neither.
        symmetric: the checkpoint's ``symmetric`` flag, when known: ``False`` requires the zero points,
            ``True`` refuses them.
        activation: decides whether ``w13`` is gated (``2I`` rows) or not.

    FP4 checkpoints (``nvfp4-pack-quantized``, ``mxfp4-pack-quantized``) go through
    :func:`from_compressed_tensors_fp4`.
    """
    if group_size in (16,) or (isinstance(w13_weight_packed, torch.Tensor) and w13_weight_packed.dtype == torch.uint8):
        raise ValueError(
            f"group_size: {group_size} with uint8 weight_packed is an FP4 checkpoint (nvfp4-pack-quantized / "
            "mxfp4-pack-quantized); from_compressed_tensors reads INT4 pack-quantized only: use "
            "MoEWeights.from_compressed_tensors_fp4 (or w4a16_moe.load_experts)"
        )
    if (w13_weight_zero_point is None) != (w2_weight_zero_point is None):
        raise ValueError("w13_weight_zero_point / w2_weight_zero_point: give both or neither")
    if symmetric is False and w13_weight_zero_point is None:
        raise ValueError(
            "w13_weight_zero_point: required for an asymmetric (symmetric=False) checkpoint; loading it without "
            "its zero points would read every weight as symmetric"
        )
    if symmetric is True and w13_weight_zero_point is not None:
        raise ValueError("w13_weight_zero_point: given, but symmetric=True (a symmetric checkpoint has none)")
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
    if gs.numel() and not bool((gs > 0).all() & (gs <= _NVFP4_GLOBAL_LIMIT).all()):
        raise ValueError(
            f"{name}: ModelOpt weight_scale_2 must be amax / (6 * 448), in (0, {_NVFP4_GLOBAL_LIMIT}]; got values up "
            f"to {gs.max().item():.4g}. This looks like a compressed-tensors weight_global_scale (stored inverted, "
            "6 * 448 / amax): use from_compressed_tensors_fp4, or pass 1 / weight_global_scale"
        )
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


# ------------------------------------------------------------------------------------------------
# compressed-tensors FP4 (nvfp4-pack-quantized, mxfp4-pack-quantized) and gpt-oss MXFP4
# ------------------------------------------------------------------------------------------------

def _fp4_codes(packed: torch.Tensor, name: str) -> torch.Tensor:
    """uint8 ``[E, N, K/2]`` (or gpt-oss blocks ``[E, N, K/32, 16]``) to canonical codes."""
    if isinstance(packed, torch.Tensor) and packed.dim() == 4:
        _require(packed, name, torch.uint8, 4)
        e, n, nb, b = packed.shape
        if b != 16:
            raise ValueError(f"{name}: MXFP4 blocks must be [E, N, K/32, 16], got shape {tuple(packed.shape)}")
        packed = packed.reshape(e, n, nb * b)
    _require(packed, name, torch.uint8, 3)
    return packed.contiguous()


def _ct_fp4_global(gs: torch.Tensor, e: int, n: int, gated: bool, name: str) -> torch.Tensor:
    _require(gs, name, torch.float32, gs.dim() if isinstance(gs, torch.Tensor) else 1)
    if gs.numel() and not bool((gs >= _NVFP4_GLOBAL_LIMIT).all() & torch.isfinite(gs).all()):
        raise ValueError(
            f"{name}: a compressed-tensors weight_global_scale is 6 * 448 / amax (stored inverted), at least "
            f"{_NVFP4_GLOBAL_LIMIT}; got values down to {gs.min().item():.4g}. This looks like a ModelOpt "
            "weight_scale_2 (amax / (6 * 448)): use from_modelopt_nvfp4"
        )
    return _mo_global(1.0 / gs, e, n, gated, name)


def from_compressed_tensors_fp4(
    w13_weight_packed: torch.Tensor,
    w13_weight_scale: torch.Tensor,
    w2_weight_packed: torch.Tensor,
    w2_weight_scale: torch.Tensor,
    *,
    w13_weight_global_scale: Optional[torch.Tensor] = None,
    w2_weight_global_scale: Optional[torch.Tensor] = None,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build ``nvfp4`` or ``mxfp4`` :class:`MoEWeights` from compressed-tensors FP4 expert tensors.

    Args:
        w13_weight_packed: uint8 ``[E, 2I|I, H/2]``; w2_weight_packed: uint8 ``[E, H, I/2]``.
        w13_weight_scale / w2_weight_scale: float8_e4m3fn ``[E, N, K/16]`` (``nvfp4-pack-quantized``) or
            uint8 E8M0 ``[E, N, K/32]`` (``mxfp4-pack-quantized``).
        w13_weight_global_scale / w2_weight_global_scale: NVFP4 only, FP32 ``[E]`` (``[E, 2]`` for
            gate, up) in compressed-tensors' inverted convention ``6 * 448 / amax``; they are stored
            as ModelOpt's ``1 / weight_global_scale``.
    """
    gated = _gated(activation)
    s13 = _require(w13_weight_scale, "w13_weight_scale", (torch.float8_e4m3fn, torch.uint8), 3)
    nv = s13.dtype == torch.float8_e4m3fn
    if nv and (w13_weight_global_scale is None or w2_weight_global_scale is None):
        missing = "w13_weight_global_scale" if w13_weight_global_scale is None else "w2_weight_global_scale"
        raise ValueError(f"{missing}: required for NVFP4 (float8_e4m3fn weight_scale)")
    if not nv and (w13_weight_global_scale is not None or w2_weight_global_scale is not None):
        raise ValueError("w13_weight_global_scale: MXFP4 (uint8 E8M0 weight_scale) has no global scale")
    mats = []
    for name, packed, scale, gs, g in (
        ("w13", w13_weight_packed, w13_weight_scale, w13_weight_global_scale, gated),
        ("w2", w2_weight_packed, w2_weight_scale, w2_weight_global_scale, False),
    ):
        codes = _fp4_codes(packed, f"{name}_weight_packed")
        e, n, _ = codes.shape
        if nv:
            _require(scale, f"{name}_weight_scale", torch.float8_e4m3fn, 3)
            glob = _ct_fp4_global(gs, e, n, g, f"{name}_weight_global_scale")
            mats.append(QuantizedMatrix(get_scheme("nvfp4"), codes, scale.contiguous(), None, glob))
        else:
            _require(scale, f"{name}_weight_scale", torch.uint8, 3)
            mats.append(QuantizedMatrix(get_scheme("mxfp4"), codes, scale.contiguous(), None, None))
    return MoEWeights(get_scheme("nvfp4" if nv else "mxfp4"), mats[0], mats[1], gated)


def from_mxfp4(
    w13_blocks: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_blocks: torch.Tensor,
    w2_scales: torch.Tensor,
    *,
    w13_bias: Optional[torch.Tensor] = None,
    w2_bias: Optional[torch.Tensor] = None,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build ``mxfp4`` :class:`MoEWeights` from OCP MXFP4 tensors (gpt-oss ``*_blocks`` / ``*_scales``).

    Args:
        w13_blocks: uint8 ``[E, 2I|I, H/32, 16]`` or ``[E, 2I|I, H/2]``: E2M1 pairs, low nibble first,
            gate rows then up rows (de-interleave gpt-oss' ``gate_up_proj`` first: even rows are gate).
        w13_scales: uint8 E8M0 ``[E, 2I|I, H/32]``; w2_blocks / w2_scales likewise ``[E, H, ...]``.
        w13_bias / w2_bias: optional FP32 or BF16 ``[E, 2I|I]`` / ``[E, H]``.
    """
    gated = _gated(activation)
    mats = []
    for name, blocks, scales in (("w13", w13_blocks, w13_scales), ("w2", w2_blocks, w2_scales)):
        codes = _fp4_codes(blocks, f"{name}_blocks")
        _require(scales, f"{name}_scales", torch.uint8, 3)
        mats.append(QuantizedMatrix(get_scheme("mxfp4"), codes, scales.contiguous(), None, None))
    return MoEWeights(get_scheme("mxfp4"), mats[0], mats[1], gated,
                      None if w13_bias is None else w13_bias.contiguous(),
                      None if w2_bias is None else w2_bias.contiguous())


# ------------------------------------------------------------------------------------------------
# GPTQ and AWQ
# ------------------------------------------------------------------------------------------------

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j of an AWQ word holds column 8c + AWQ_ORDER[j]


def _unpack_words(w: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 words to uint8 nibbles along ``dim`` (word ``i``, nibble ``j`` -> index ``8i + j``)."""
    dim = dim % w.dim()
    nib = (w.unsqueeze(dim + 1) >> _SHIFTS.to(w.device).view([8] + [1] * (w.dim() - dim - 1))) & 0xF
    shape = list(w.shape)
    shape[dim] *= 8
    return nib.reshape(shape).to(torch.uint8)


def _awq_unpack(w: torch.Tensor) -> torch.Tensor:
    """AWQ int32 ``[..., N/8]`` to uint8 ``[..., N]`` in column order."""
    nib = _unpack_words(w, -1).reshape(*w.shape, 8)
    inverse = torch.tensor([AWQ_ORDER.index(m) for m in range(8)], device=w.device)
    return nib[..., inverse].reshape(*w.shape[:-1], w.shape[-1] * 8)


def _kn_matrix(codes_kn: torch.Tensor, scales_gn: torch.Tensor, zeros_gn: Optional[torch.Tensor],
               group_size: Optional[int], name: str) -> QuantizedMatrix:
    """Codes ``[E, K, N]`` (0..15), scales / zeros ``[E, K/g, N]`` to the canonical ``[E, N, ...]`` layout."""
    e, k, n = codes_kn.shape
    g = k if group_size is None else group_size
    if k % g or tuple(scales_gn.shape) != (e, k // g, n):
        raise ValueError(f"{name}scales: expected shape {(e, k // g if k % g == 0 else '?', n)} for K={k}, "
                         f"group {g}, got {tuple(scales_gn.shape)}")
    scheme = _ct_scheme(group_size, zeros_gn is not None)
    codes = pack_nibbles_kn(codes_kn)
    zeros = None
    if zeros_gn is not None:
        if int(zeros_gn.max()) > 15:
            raise ValueError(f"{name}qzeros: zero point 16 (a stored 15 in GPTQ v1 'zero - 1' form) is outside 0..15")
        zeros = zeros_gn.transpose(1, 2).to(torch.uint8).contiguous()
    return QuantizedMatrix(get_scheme(scheme), codes, scales_gn.transpose(1, 2).contiguous(), zeros, None)


def pack_nibbles_kn(codes_kn: torch.Tensor) -> torch.Tensor:
    from .weights import pack_nibbles

    return pack_nibbles(codes_kn.transpose(1, 2))


def _act_order_perm(g_idx: torch.Tensor, k: int, group_size: Optional[int], name: str) -> Optional[torch.Tensor]:
    """The K permutation ``[E, K]`` making act-order groups contiguous (``None`` when already in order)."""
    _require(g_idx, name, (torch.int32, torch.int64), 2)
    if g_idx.shape[1] != k:
        raise ValueError(f"{name}: expected {k} entries per expert (K), got shape {tuple(g_idx.shape)}")
    g = k if group_size is None else group_size
    natural = (torch.arange(k, device=g_idx.device) // g)
    if bool((g_idx.long() == natural).all()):
        return None
    perm = torch.argsort(g_idx.long(), dim=1, stable=True)
    if not bool((torch.gather(g_idx.long(), 1, perm) == natural).all()):
        raise ValueError(f"{name}: every group must hold exactly group_size={g} channels")
    return perm


def _permute_rows(m: QuantizedMatrix, rows: torch.Tensor) -> QuantizedMatrix:
    """Row ``r`` of expert ``e`` becomes row ``rows[e, r]`` (rows ``[E, N]``)."""
    def take(t: torch.Tensor) -> torch.Tensor:
        idx = rows.to(t.device).view(*rows.shape, *([1] * (t.dim() - 2))).expand(*rows.shape, *t.shape[2:])
        return torch.gather(t, 1, idx).contiguous()

    return m.map(take)


def _gptq_matrix(qweight, qzeros, scales, group_size, sym, v1, name):
    _require(qweight, f"{name}qweight", torch.int32, 3)
    _require(scales, f"{name}scales", (torch.float16, torch.bfloat16, torch.float32), 3)
    codes_kn = _unpack_words(qweight, 1)
    zeros = None
    if qzeros is not None:
        _require(qzeros, f"{name}qzeros", torch.int32, 3)
        zeros = _unpack_words(qzeros, 2).to(torch.int32) + (1 if v1 else 0)
        if zeros.shape[2] != codes_kn.shape[2]:
            raise ValueError(f"{name}qzeros: expected {codes_kn.shape[2] // 8} packed columns, got {tuple(qzeros.shape)}")
        if sym:
            if not bool((zeros == 8).all()):
                raise ValueError(f"{name}qzeros: sym=True, but the zero points are not all 8")
            zeros = None
    elif not sym:
        raise ValueError(f"{name}qzeros: required for an asymmetric (sym=False) GPTQ checkpoint")
    return codes_kn, scales, zeros


def from_gptq(
    w13_qweight: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_qweight: torch.Tensor,
    w2_scales: torch.Tensor,
    *,
    group_size: Optional[int],
    w13_qzeros: Optional[torch.Tensor] = None,
    w2_qzeros: Optional[torch.Tensor] = None,
    w13_g_idx: Optional[torch.Tensor] = None,
    w2_g_idx: Optional[torch.Tensor] = None,
    sym: bool = True,
    checkpoint_format: str = "gptq",
    activation: str = "swiglu",
) -> MoEWeights:
    """Build INT4 :class:`MoEWeights` from GPTQ expert tensors (4 bits; see the module docstring).

    Args:
        w13_qweight: int32 ``[E, H/8, 2I|I]`` (gate columns then up columns); w13_scales ``[E, H/g, 2I|I]``.
        w2_qweight: int32 ``[E, I/8, H]``; w2_scales ``[E, I/g, H]``.
        group_size: 32, 64 or 128, or ``None`` (GPTQ ``group_size: -1``, one scale per column).
        w13_qzeros / w2_qzeros: int32 ``[E, K/g, N/8]``; optional when ``sym`` (then they must be 8).
        w13_g_idx / w2_g_idx: act-order (``desc_act``) group index ``[E, K]`` (the gate and up projections
            of an expert share one). Each is sorted (stable) into contiguous groups, ``perm = argsort(g_idx)``,
            and the codes' K columns are permuted by it (scales and zero points are then per sorted group).
            ``w2``'s permutation of the intermediate dimension is absorbed here, into ``w2``'s columns and
            ``w13``'s rows (exact, free at run time). ``w13``'s (over the hidden size) permutes the input
            ``x`` per expert: it is kept as :attr:`MoEWeights.w13_perm` (``perm``, int32 ``[E, H]``) and the
            torch ops gather ``x`` per route before the first GEMM (see :mod:`w4a16_moe.ops`);
            :meth:`MoEWeights.dequantize` returns ``w13`` back in checkpoint column order.
        sym: the config's ``sym``; checkpoint_format: ``gptq`` (zeros stored as ``zero - 1``) or ``gptq_v2``.
    """
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(f"checkpoint_format: expected 'gptq' or 'gptq_v2', got {checkpoint_format!r}")
    gated = _gated(activation)
    v1 = checkpoint_format == "gptq"
    c13, s13, z13 = _gptq_matrix(w13_qweight, w13_qzeros, w13_scales, group_size, sym, v1, "w13_")
    c2, s2, z2 = _gptq_matrix(w2_qweight, w2_qzeros, w2_scales, group_size, sym, v1, "w2_")
    if (z13 is None) != (z2 is None):
        raise ValueError("w13_qzeros / w2_qzeros: asymmetric zero points must be given for both matrices")
    perm13 = None if w13_g_idx is None else _act_order_perm(w13_g_idx, c13.shape[1], group_size, "w13_g_idx")
    if perm13 is not None:  # sort w13's K (H) columns into contiguous groups; x is gathered per expert instead
        c13 = torch.gather(c13, 1, perm13[:, :, None].expand_as(c13).to(c13.device))
    perm = None if w2_g_idx is None else _act_order_perm(w2_g_idx, c2.shape[1], group_size, "w2_g_idx")
    if perm is not None:
        c2 = torch.gather(c2, 1, perm[:, :, None].expand_as(c2).to(c2.device))
    w13 = _kn_matrix(c13, s13, z13, group_size, "w13_")
    w2 = _kn_matrix(c2, s2, z2, group_size, "w2_")
    if perm is not None:
        w13 = _permute_rows(w13, torch.cat((perm, perm + perm.shape[1]), dim=1) if gated else perm)
    w13_perm = None if perm13 is None else perm13.to(device=w13.device, dtype=torch.int32).contiguous()
    return MoEWeights(w13.scheme, w13, w2, gated, w13_perm=w13_perm)


def from_awq(
    w13_qweight: torch.Tensor,
    w13_qzeros: torch.Tensor,
    w13_scales: torch.Tensor,
    w2_qweight: torch.Tensor,
    w2_qzeros: torch.Tensor,
    w2_scales: torch.Tensor,
    *,
    group_size: int,
    activation: str = "swiglu",
) -> MoEWeights:
    """Build ``int4_g*_zp`` :class:`MoEWeights` from AWQ (GEMM) expert tensors (4 bits, zero points).

    Args:
        w13_qweight: int32 ``[E, H, (2I|I)/8]`` in AWQ's nibble order (gate columns then up columns);
        w13_qzeros: int32 ``[E, H/g, (2I|I)/8]``; w13_scales: ``[E, H/g, 2I|I]``; likewise ``w2`` with
        ``[E, I, H/8]``, ``[E, I/g, H/8]``, ``[E, I/g, H]``. group_size: 32, 64 or 128.
    """
    gated = _gated(activation)
    mats = []
    for name, qw, qz, sc in (("w13_", w13_qweight, w13_qzeros, w13_scales), ("w2_", w2_qweight, w2_qzeros, w2_scales)):
        _require(qw, f"{name}qweight", torch.int32, 3)
        if qz is None:
            raise ValueError(f"{name}qzeros: required (AWQ is asymmetric)")
        _require(qz, f"{name}qzeros", torch.int32, 3)
        _require(sc, f"{name}scales", (torch.float16, torch.bfloat16, torch.float32), 3)
        mats.append(_kn_matrix(_awq_unpack(qw), sc, _awq_unpack(qz), group_size, name))
    return MoEWeights(mats[0].scheme, mats[0], mats[1], gated)


# The converters are MoEWeights' ``from_*`` / ``to_*`` methods, attached as the functions themselves
# so that ``inspect.signature`` and ``help()`` show their real arguments and docstrings.
for _f in (from_compressed_tensors, from_compressed_tensors_fp4, from_trtllm_per_channel, from_modelopt_nvfp4,
           from_mxfp4, from_gptq, from_awq):
    setattr(MoEWeights, _f.__name__, staticmethod(_f))
for _f in (to_compressed_tensors, to_trtllm_per_channel, to_modelopt_nvfp4):
    setattr(MoEWeights, _f.__name__, _f)
del _f

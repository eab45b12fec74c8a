"""Any layer shape on the CuTe kernels: padded sizes, zero-padded weights, padded activation buffers.

The CuTe kernels take ``n`` / ``k`` as runtime sizes but need ``n`` a multiple of the row block and ``k`` a
multiple of the K tile (gated gate/up: ``n / 2`` a multiple of half the row block), and they address
activations and outputs with those sizes as row strides: the producer gathers whole K tiles of ``x`` / ``h``
rows at ``row * k`` without predication, and the epilogues store ``h`` at ``slot * n/2`` (gated) or
``slot * n``, ``y`` / the FP32 ``out`` at ``route * n`` / ``token * n``, the decode kernels ``out`` at
``token * n``. A layer with ``H`` and ``I`` multiples of 8 and of the scheme's group (what its weights need:
whole groups, whole int32 words of codes) therefore runs unchanged kernels on padded sizes ``Hp >= H`` and
``Ip >= I`` (:func:`padded_sizes`, once per plan): a TP shard such as gpt-oss's ``I = 1440`` (TP 2), Qwen3-30B-A3B's
``I = 96`` (TP 8) or an NVFP4 layer's ``I = 176`` runs on the same kernels as its aligned neighbours, at the cost
of the padded rows' and columns' bytes (at most one tile: ``Ip - I < 256``):

* weights (once, at pack time; the packed layout's cache key names the padded sizes,
  :func:`pad_suffix`): :func:`pad_matrix` pads ``N`` and ``K`` with *zero-valued* codes (INT4 symmetric 8,
  INT4 zero point 0 with zero point 0, E2M1 0 = +0.0) and zero scales (E8M0 has no zero: 1.0), so every
  padded weight dequantizes to exactly 0 whatever the scheme; a gated ``w13`` pads its gate and up halves
  separately (``[gate I | 0 | up I | 0]``, ``2 Ip`` rows), so the kernel's pairing of gate row ``j`` with
  up row ``j`` holds and a padded ``h`` column is ``act(0, 0) = 0`` (swiglu ``silu(0) * 0``, geglu
  ``gelu(0) * 0``, relu2 ``0``, silu ``0``);
* ``x [T, H]`` is copied into a zero-padded ``[T, Hp]`` buffer when ``Hp > H`` (:func:`pad_cols`, one
  launch: the CuTe routing family's ``pad`` kernel where the provider prepares routes with that family, so a
  prebuilt wheel compiles no Triton kernel for padded layers either; else :mod:`.pad_copy`);
  ``h [R, Ip]`` is internal (allocated padded; its padded columns are exact zeros by the above, and the
  down GEMM reads ``[0, Ip)``);
* the down GEMM writes ``Hp`` columns: ``y [R, Hp]`` is read by the deterministic finalize (CuTe or Triton)
  through its row stride (no copy), the fused path's FP32 buffer is ``[T, Hp]`` and its cast copies
  ``[:, :H]``; the decode kernels and the masked layout write a padded buffer that is copied into ``out``.

An aligned layer (``Hp == H`` and ``Ip == I``) has no padding, no copies and the same plan as before.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...formats.weights import QuantizedMatrix

__all__ = ["SHAPE_MULTIPLE", "padded_sizes", "pad_suffix", "pad_matrix", "pad_cols", "zero_code"]

#: H and I must be multiples of this (and of the scheme's group size) on the CuTe kernels: whole int32 words of
#: 4-bit codes, the weights' own rule (:meth:`..formats.schemes.Scheme.min_k_multiple`); the tiles come from padding
SHAPE_MULTIPLE = 8


def _up(a: int, m: int) -> int:
    return -(-a // m) * m


def padded_sizes(family, up, down, hidden: int, intermediate: int, gated: bool, scheme) -> tuple:
    """``(Hp, Ip)``: the smallest sizes >= ``(H, I)`` that the (gate_up, down) configs ``up`` / ``down`` of
    ``family`` run: ``Hp`` a multiple of the gate/up K tile and of the down row block, ``Ip`` of the down K
    tile and of the gate/up row block (half of it for gated activations: gate and up rows share a block),
    both of the scheme's group size."""
    g = scheme.group_size or 1
    rows_up, rows_down = family.rows_per_cta(up), family.rows_per_cta(down)
    hp = _up(hidden, math.lcm(up.k_tile, rows_down, g))
    ip = _up(intermediate, math.lcm(down.k_tile, rows_up // 2 if gated else rows_up, g))
    return hp, ip


def pad_suffix(n: int, k: int, n_pad: int, k_pad: int) -> str:
    """What a packed layout's cache key appends for padded sizes (``""`` when not padded)."""
    return "" if (n, k) == (n_pad, k_pad) else f":pad{n_pad}x{k_pad}"


def zero_code(scheme) -> int:
    """The 4-bit code that dequantizes to 0 with zero point 0 (INT4 symmetric: 8; zero point and E2M1: 0)."""
    return 8 if scheme.kind == "int4" and not scheme.zero_point else 0


def _pad_rows_cols(t: torch.Tensor, rows: list, n_pad: int, cols: int, fill) -> torch.Tensor:
    """``t [E, N, C]`` -> ``[E, n_pad, cols]`` filled with ``fill``, segment ``(src, dst, count)`` of rows
    copied to ``dst`` (columns ``[0, C)``)."""
    e, _, c = t.shape
    out = torch.full((e, n_pad, cols), fill, dtype=t.dtype, device=t.device)
    for src, dst, cnt in rows:
        out[:, dst : dst + cnt, :c] = t[:, src : src + cnt]
    return out


def pad_matrix(qm: QuantizedMatrix, n_pad: int, k_pad: int, halves: bool = False) -> QuantizedMatrix:
    """``qm [E, N, K]`` zero-padded to ``[E, n_pad, k_pad]`` (see the module docstring); ``halves``: a gated
    ``w13`` whose gate rows ``[0, N/2)`` go to ``[0, n_pad/2)`` and up rows to ``[n_pad/2, n_pad/2 + N/2)``.
    Returns ``qm`` itself when nothing is padded."""
    n, k = qm.n, qm.k
    if (n, k) == (n_pad, k_pad):
        return qm
    if n_pad < n or k_pad < k or k_pad % 2 or (halves and (n % 2 or n_pad % 2)):
        raise ValueError(f"pad_matrix: cannot pad [{n}, {k}] to [{n_pad}, {k_pad}] (halves={halves})")
    sch = qm.scheme
    if halves:
        rows = [(0, 0, n // 2), (n // 2, n_pad // 2, n // 2)]
    else:
        rows = [(0, 0, n)]
    if sch.group_size is None:
        groups = 1  # per channel: the row's scale covers the padded columns (their codes are zero-valued)
    else:
        if k_pad % sch.group_size:
            raise ValueError(f"pad_matrix: K {k_pad} is not a multiple of the group size {sch.group_size}")
        groups = k_pad // sch.group_size
    zc = zero_code(sch)
    codes = _pad_rows_cols(qm.codes, rows, n_pad, k_pad // 2, zc | (zc << 4))  # two zero-valued codes a byte
    scale_fill = 127 if sch.kind == "mxfp4" else 0  # E8M0 has no zero: 1.0 (the codes are +0.0)
    scales = _pad_rows_cols(qm.scales, rows, n_pad, groups, scale_fill)
    zeros = None if qm.zeros is None else _pad_rows_cols(qm.zeros, rows, n_pad, groups, 0)
    gs = None
    if qm.global_scale is not None:
        gs = _pad_rows_cols(qm.global_scale[:, :, None], rows, n_pad, 1, 1.0)[:, :, 0].contiguous()
    return QuantizedMatrix(sch, codes.contiguous(), scales.contiguous(),
                           None if zeros is None else zeros.contiguous(), gs)


def pad_cols(t: torch.Tensor, width: int, copy=None) -> torch.Tensor:
    """``t [..., C]`` (contiguous) as a zero-padded ``[..., width]`` copy; ``t`` itself when ``C == width``. On the
    GPU one launch of ``copy(t, width)``: the CuTe routing family's pad copy where the provider uses that family,
    else (and by default) the Triton one (:mod:`.pad_copy`)."""
    c = t.shape[-1]
    if c == width:
        return t
    if t.is_cuda:
        if copy is None:
            from .pad_copy import pad_copy as copy
        return copy(t.contiguous(), width)  # one launch
    return torch.nn.functional.pad(t, (0, width - c))


def padded_out(out: torch.Tensor, width: int) -> Optional[torch.Tensor]:
    """A ``[..., width]`` buffer standing in for ``out`` when ``width`` exceeds its last size (else None)."""
    if out.shape[-1] == width:
        return None
    return torch.empty(*out.shape[:-1], width, dtype=out.dtype, device=out.device)

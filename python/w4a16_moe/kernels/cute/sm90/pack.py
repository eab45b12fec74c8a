"""Load-time packing of 4-bit expert weights into the SM90 "fragment-ready" layout.

The Hopper grouped GEMM (:mod:`.grouped_gemm`) runs in a swap-AB formulation,
``D^T[N, M] = W[N, K] . X^T[K, M]``: weight rows are the WGMMA ``M`` dimension (64 per
warpgroup instruction), routed tokens the WGMMA ``N`` dimension. The weights are the
*register* operand A of ``wgmma.mma_async.sp?.m64nNk16.f32.{bf16,f16}`` (RS form), so each thread
of a consumer warpgroup must hold, for every k16 step, the four 32-bit A registers the PTX ISA
assigns to it. This module permutes a :class:`~w4a16_moe.formats.weights.QuantizedMatrix` once so
that those registers fall out of shared memory with one 16-byte load per thread per k64 and a
shift/mask per register, and so that the group scales a thread needs sit in the same contiguous
chunk as the codes (one 1-D ``cp.async.bulk`` per pipeline stage, no tensor map).

Hardware fragment (PTX ISA, "Register fragment for matrix A", wgmma .m64nNk16, 16-bit A)
----------------------------------------------------------------------------------------
Thread ``t`` (0..127) of the warpgroup, ``w = t // 32``, ``l = t % 32``, holds per k16 step four
registers ``R_i`` (``i = 0..3``), each a packed pair ``{lo, hi}`` of 16-bit values::

    row(t, i)    = 16*w + l//4 + 8*(i % 2)                 (weight row inside the 64-row block)
    col(t, i, h) = 2*(l % 4) + 8*(i // 2) + h,  h = 0 (lo half), 1 (hi half)   (k inside the step)

i.e. ``R_0 = (r, c..c+1)``, ``R_1 = (r+8, c..c+1)``, ``R_2 = (r, c+8..c+9)``, ``R_3 = (r+8, c+8..c+9)``.

Code word (one 32-bit word per thread per k16 step)
---------------------------------------------------
Word ``j`` of a thread holds the 8 codes of k16 step ``j``; nibble ``p`` (bits ``4p..4p+3``)::

    p = i + 4*h   ->  code of (row(t, i), col(t, i, h))

so ``(word >> 4*i) & 0x000F000F`` puts ``R_i``'s lo code in bits 0..3 and its hi code in bits 16..19.
OR-ing the exponent magic (bf16 ``0x4300`` = 128.0, fp16 ``0x6400`` = 1024.0) into both halves
gives the exact packed values ``magic + code``; one packed subtract of ``magic + 8`` (INT4
symmetric) or of ``magic + zero`` (INT4 with zero point, stored per group below) and one packed
multiply by the group scale yield ``R_i`` ready for WGMMA. In bytes (little endian) the word is
``[R0.lo|R1.lo<<4, R2.lo|R3.lo<<4, R0.hi|R1.hi<<4, R2.hi|R3.hi<<4]``. The same nibble placement
serves E2M1 (FP4) codes, decoded with shifts and masks instead (see FP4 below).

Packed tensor
-------------
``data``: uint8 ``[E, NB, KT, CHUNK]``, contiguous, ``NB = N / (64*X)`` row blocks, ``KT = K / BK``
K tiles (``BK`` = ``k_tile``, a multiple of 64). One chunk = everything one CTA needs for one
(expert, row block, K tile) pipeline stage, at a 16-byte multiple::

    chunk = codes  [X][BK/64][128 threads][4 words]              uint32  (X * BK/64 * 2048 bytes)
          + scales [X][32 quads][GPT groups][2 row halves]        scale dtype
          + biases [X][32 quads][GPT groups][2 row halves]        compute dtype (zero-point schemes only)

* ``codes[x][c][t][j]`` is the code word of thread ``t`` for k16 step ``j`` of k64 sub-tile ``c``
  of the m64 block ``x`` (rows ``64x..64x+63`` of the row block); a thread loads its 16 bytes with
  one ``ld.shared.v4.b32`` at byte ``((x*BK/64 + c)*128 + t)*16`` (conflict-free).
* ``GPT`` = groups per K tile = ``BK // g`` when ``g <= BK``, else 1 (the one group covering the
  tile; ``g > BK`` and per-channel scales are repeated in every tile that the group spans).
* Quad ``q = t // 4`` = ``8*w + l//4`` owns rows ``r = 16*(q//8) + q%8`` and ``r + 8``: element
  ``scales[x][q][gi][h]`` is the scale of row ``64x + r + 8h`` for group ``gi`` of the tile, so
  the 32-bit word ``(scale[r], scale[r+8])`` of group ``gi`` is one packed pair; ``R_0, R_2``
  multiply by its lo half, ``R_1, R_3`` by its hi half (bf16x2/f16x2 operand broadcast). A thread
  reads its ``GPT`` words with one 4/8/16-byte load.
* INT4 scales are stored in the compute dtype (the activations' bf16/fp16; converted here, exact
  when the canonical scales already have that dtype).
* FP4 (NVFP4 ``g = 16``, MXFP4 ``g = 32``) stores *effective* scales in the compute dtype:
  ``e4m3 * global_scale`` (NVFP4) or ``2**(e8m0 - 127)`` (MXFP4), times ``2**14`` (fp16) or
  ``2**126`` (bf16), rounded once to the compute dtype (relative error <= 2**-9 in bf16, the same
  rounding the INT4 path applies to every dequantized weight). The kernel decodes an E2M1 code
  into a raw 16-bit value ``e2m1 * 2**-14`` / ``e2m1 * 2**-126`` (magnitude bits on the lowest
  exponent bits, exact, subnormals included), so one packed multiply yields ``e2m1 * scale``.
  An effective scale of 4 or more (weights up to 24 in magnitude) would overflow the folded
  factor: :func:`pack_sm90` raises then, naming the matrix.
* Zero-point schemes append ``biases``: ``-(magic + zero)`` in the compute dtype (exact), the
  packed addend that turns ``magic + code`` into ``code - zero``.

Row order: rows are packed in the matrix's own order, except with ``interleave_gate_up=True``
(gated ``w13`` of ``2I`` rows): row block ``nb`` then holds gate rows ``[nb*32X, (nb+1)*32X)``
in its first ``X/2`` m64 blocks and the matching up rows ``I + [nb*32X, (nb+1)*32X)`` in its last
``X/2``, so one CTA computes both halves of a slice of ``h`` from one bulk copy per stage, and the
gate and up values of an output element sit in the same thread at the same fragment position.

:func:`unpack_sm90` inverts the layout from the hardware mapping above (independently of the
index tables :func:`pack_sm90` uses) and is what the round-trip tests check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ....formats.schemes import Scheme
from ....formats.weights import QuantizedMatrix, pack_nibbles, unpack_nibbles

__all__ = ["Sm90PackedMatrix", "pack_sm90", "unpack_sm90", "effective_scales", "fragment_row_col", "groups_per_tile",
           "FP4_SCALE_EXP"]

_MAGIC = {torch.bfloat16: 128.0, torch.float16: 1024.0}
#: log2 of the factor folded into FP4 scales (see the module docstring)
FP4_SCALE_EXP = {torch.bfloat16: 126, torch.float16: 14}


def fragment_row_col(t: torch.Tensor, i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in the m64 block, k in the k16 step) of half ``h`` of A register ``R_i`` of thread ``t``."""
    w, l = t // 32, t % 32
    row = 16 * w + l // 4 + 8 * (i % 2)
    col = 2 * (l % 4) + 8 * (i // 2) + h
    return row, col


def groups_per_tile(group: int, k_tile: int) -> int:
    """Scale groups a K tile holds (``GPT``)."""
    return k_tile // group if group <= k_tile else 1


@dataclass
class Sm90PackedMatrix:
    """A :class:`QuantizedMatrix` in the SM90 fragment-ready layout (see the module docstring)."""

    scheme: Scheme
    data: torch.Tensor  # uint8 [E, NB, KT, chunk_bytes]
    n: int
    k: int
    group: int
    m64_per_block: int  # X
    k_tile: int  # BK
    compute_dtype: torch.dtype
    interleave_gate_up: bool

    @property
    def num_experts(self) -> int:
        return self.data.shape[0]

    @property
    def block_rows(self) -> int:
        return 64 * self.m64_per_block

    @property
    def num_row_blocks(self) -> int:
        return self.data.shape[1]

    @property
    def num_k_tiles(self) -> int:
        return self.data.shape[2]

    @property
    def chunk_bytes(self) -> int:
        return self.data.shape[3]

    @property
    def gpt(self) -> int:
        return groups_per_tile(self.group, self.k_tile)

    @property
    def code_bytes(self) -> int:
        return self.m64_per_block * (self.k_tile // 64) * 2048

    @property
    def scale_bytes(self) -> int:
        return self.m64_per_block * 32 * self.gpt * 2 * 2

    @property
    def bias_bytes(self) -> int:
        return self.scale_bytes if self.scheme.zero_point else 0

    def nbytes(self) -> int:
        return self.data.numel()


def _row_order(n: int, x: int, interleave: bool) -> torch.Tensor:
    if not interleave:
        return torch.arange(n)
    half, per = n // 2, 32 * x
    nb = torch.arange(half // per)
    j = torch.arange(per)
    gate = nb[:, None] * per + j[None, :]
    return torch.cat([gate, gate + half], dim=1).reshape(-1)


def _check(qm: QuantizedMatrix, x: int, bk: int, compute_dtype: torch.dtype, interleave: bool) -> int:
    if bk % 64 or bk <= 0:
        raise ValueError(f"k_tile must be a positive multiple of 64, got {bk}")
    if x <= 0:
        raise ValueError(f"m64_per_block must be positive, got {x}")
    if compute_dtype not in _MAGIC:
        raise TypeError(f"compute_dtype must be bfloat16 or float16, got {compute_dtype}")
    n, k = qm.n, qm.k
    g = qm.group_size
    if k % bk:
        raise ValueError(f"K={k} is not a multiple of k_tile={bk}")
    if not (bk % g == 0 or g % bk == 0):
        raise ValueError(f"group {g} and k_tile {bk}: one must divide the other")
    if interleave:
        if x % 2:
            raise ValueError("interleave_gate_up needs an even m64_per_block")
        if n % 2 or (n // 2) % (32 * x):
            raise ValueError(f"interleave_gate_up: half of N={n} must be a multiple of {32 * x}")
    elif n % (64 * x):
        raise ValueError(f"N={n} is not a multiple of the row block {64 * x}")
    return g


# index tables of the code permutation: for (t, nibble p) the flat (row*16 + col) in an m64 x k16 block
def _code_index() -> torch.Tensor:
    t = torch.arange(128)[:, None]
    p = torch.arange(8)[None, :]
    row, col = fragment_row_col(t, p % 4, p // 4)
    return row * 16 + col  # [128, 8]


def _scale_records(s: torch.Tensor, x: int, bk: int, g: int, k: int) -> torch.Tensor:
    """[e, N, K/g] (already row-ordered) -> [e, NB, KT, X, 32, GPT, 2]."""
    e, n, ng = s.shape
    kt_n = k // bk
    gpt = groups_per_tile(g, bk)
    q = torch.arange(32)
    r = 16 * (q // 8) + q % 8
    rows = (64 * torch.arange(x))[:, None, None] + r[None, :, None] + 8 * torch.arange(2)[None, None, :]  # [X,32,2]
    if g <= bk:
        cols = torch.arange(kt_n)[:, None] * gpt + torch.arange(gpt)[None, :]  # [KT, GPT]
    else:
        cols = (torch.arange(kt_n) * bk // g)[:, None]  # [KT, 1]
    sb = s.reshape(e, n // (64 * x), 64 * x, ng)
    # out[e, nb, kt, X, 32, GPT, 2] = sb[e, nb, rows[X,32,2], cols[KT,GPT]]
    out = sb[:, :, rows[None, :, :, None, :], cols[:, None, None, :, None]]
    return out.contiguous()


def pack_sm90(
    qm: QuantizedMatrix,
    *,
    m64_per_block: int = 2,
    k_tile: int = 128,
    compute_dtype: torch.dtype = torch.bfloat16,
    interleave_gate_up: bool = False,
    experts_per_pass: int = 8,
) -> Sm90PackedMatrix:
    """Permute ``qm`` into the SM90 fragment-ready layout (torch only; runs on CPU or GPU).

    ``m64_per_block`` (X) m64 blocks form one row block (``64*X`` rows, one CTA's weight rows per
    stage); ``k_tile`` (BK) is the K extent of one pipeline stage. ``experts_per_pass`` bounds the
    temporary memory (codes are unpacked to one byte per code, per pass).
    """
    x, bk = m64_per_block, k_tile
    g = _check(qm, x, bk, compute_dtype, interleave_gate_up)
    sch = qm.scheme
    e_n, n, k = qm.num_experts, qm.n, qm.k
    nb_n, kt_n, c_n = n // (64 * x), k // bk, bk // 64
    order = _row_order(n, x, interleave_gate_up).to(qm.codes.device)
    idx = _code_index().to(qm.codes.device).reshape(-1)
    scales = effective_scales(qm, compute_dtype)
    chunks = []
    for e0 in range(0, e_n, experts_per_pass):
        e1 = min(e_n, e0 + experts_per_pass)
        ne = e1 - e0
        codes = unpack_nibbles(qm.codes[e0:e1])[:, order]  # [ne, N, K] uint8
        v = codes.reshape(ne, nb_n, x, 64, kt_n, c_n, 4, 16)
        v = v.permute(0, 1, 4, 2, 5, 6, 3, 7).reshape(ne, nb_n, kt_n, x, c_n, 4, 1024)
        nib = v[..., idx].reshape(ne, nb_n, kt_n, x, c_n, 4, 128, 8)
        nib = nib.permute(0, 1, 2, 3, 4, 6, 5, 7)  # [.., X, C, t, j, p]
        code_bytes = pack_nibbles(nib).reshape(ne, nb_n, kt_n, -1)  # nibble p=2b lo, 2b+1 hi of byte b
        parts = [code_bytes]
        rec = _scale_records(scales[e0:e1][:, order], x, bk, g, k)
        parts.append(rec.reshape(ne, nb_n, kt_n, -1).view(torch.uint8))
        if sch.zero_point:
            bias = -(qm.zeros[e0:e1][:, order].float() + _MAGIC[compute_dtype])
            brec = _scale_records(bias.to(compute_dtype), x, bk, g, k)
            parts.append(brec.reshape(ne, nb_n, kt_n, -1).view(torch.uint8))
        chunks.append(torch.cat(parts, dim=-1))
    data = torch.cat(chunks, dim=0).contiguous()
    assert data.shape[-1] % 16 == 0
    return Sm90PackedMatrix(sch, data, n, k, g, x, bk, compute_dtype, interleave_gate_up)


def effective_scales(qm: QuantizedMatrix, compute_dtype: torch.dtype, name: str = "weights") -> torch.Tensor:
    """The per-group scales the kernel multiplies by, in ``compute_dtype`` ``[E, N, K/g]``: INT4 scales
    converted; FP4 ``(e4m3 * global | 2**(e8m0-127)) * 2**FP4_SCALE_EXP`` (see the module docstring).
    Raises ValueError when a value does not fit the compute dtype."""
    from ....formats.fp4 import e4m3_decode, e8m0_decode

    kind = qm.scheme.kind
    if kind == "int4":
        out = qm.scales.to(compute_dtype)
        what = "scales"
    else:
        if kind == "nvfp4":
            eff = e4m3_decode(qm.scales).double() * qm.global_scale.double()[:, :, None]
        else:
            eff = e8m0_decode(qm.scales).double()
        if torch.isnan(eff).any():
            raise ValueError(f"{name}: {qm.scheme.name} scales hold NaN (E8M0 255 / E4M3 NaN)")
        out = (eff * 2.0 ** FP4_SCALE_EXP[compute_dtype]).to(compute_dtype)
        what = f"{qm.scheme.name} effective group scales (must be < 4 in magnitude for the CuTe kernels)"
    if not torch.isfinite(out.float()).all():
        raise ValueError(f"{name}: {what} overflow {compute_dtype}")
    return out


def unpack_sm90(p: Sm90PackedMatrix) -> QuantizedMatrix:
    """Invert :func:`pack_sm90` from the documented fragment mapping.

    Returns a :class:`QuantizedMatrix` in the original row order: codes exactly; INT4 scales in the
    compute dtype; FP4 scales as the FP32 effective scales (``e4m3 * global`` / ``2**(e8m0-127)``,
    rounded to the compute dtype, the ``2**FP4_SCALE_EXP`` factor removed) and no global scale.
    """
    x, bk, g = p.m64_per_block, p.k_tile, p.group
    e_n, nb_n, kt_n, chunk = p.data.shape
    n, k = p.n, p.k
    c_n, gpt = bk // 64, p.gpt
    dev = p.data.device
    cb, sb = p.code_bytes, p.scale_bytes
    raw = p.data
    # --- codes: walk every (x, c, t, j, i, h) of the documented mapping
    words = raw[..., :cb].reshape(e_n, nb_n, kt_n, x, c_n, 128, 4, 4).to(torch.int64)
    words = words[..., 0] | (words[..., 1] << 8) | (words[..., 2] << 16) | (words[..., 3] << 24)
    codes = torch.empty(e_n, nb_n, x, 64, kt_n, c_n, 4, 16, dtype=torch.uint8, device=dev)
    t = torch.arange(128, device=dev)
    for i in range(4):
        for h in range(2):
            nib = ((words >> (4 * (i + 4 * h))) & 0xF).to(torch.uint8)  # [e, nb, kt, X, C, t, j]
            row, col = fragment_row_col(t, torch.tensor(i, device=dev), torch.tensor(h, device=dev))
            # codes[e, nb, X, row[t], kt, C, j, col[t]] = nib[e, nb, kt, X, C, t, j]
            src = nib.permute(0, 1, 3, 5, 2, 4, 6)  # [e, nb, X, t, kt, C, j]
            codes[:, :, :, row, :, :, :, col] = src.permute(3, 0, 1, 2, 4, 5, 6)
    codes = codes.reshape(e_n, n, k)
    # --- scales (and biases): scales[x][q][gi][h] is row 64x + 16(q//8) + q%8 + 8h, group gi of the tile
    ng = k // g

    def records(lo: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        r = raw[..., lo : lo + nbytes].contiguous()
        if dtype.itemsize == 2:
            r = r.view(dtype)
        r = r.reshape(e_n, nb_n, kt_n, x, 32, gpt, 2)
        out = torch.empty(e_n, nb_n, x, 64, ng, dtype=r.dtype, device=dev)
        for q in range(32):
            for hh in range(2):
                row = 16 * (q // 8) + q % 8 + 8 * hh
                for kt in range(kt_n):
                    if g <= bk:
                        out[:, :, :, row, kt * gpt : (kt + 1) * gpt] = r[:, :, kt, :, q, :, hh]
                    else:
                        out[:, :, :, row, kt * bk // g] = r[:, :, kt, :, q, 0, hh]
        return out.reshape(e_n, n, ng)

    order = _row_order(n, x, p.interleave_gate_up).to(dev)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n, device=dev)
    zeros = None
    scales = records(cb, sb, p.compute_dtype)
    if p.scheme.kind == "int4":
        if p.scheme.zero_point:
            bias = records(cb + sb, sb, p.compute_dtype)
            zeros = (-bias.float() - _MAGIC[p.compute_dtype]).round().to(torch.uint8)[:, inv].contiguous()
    else:
        scales = (scales.double() * 2.0 ** -FP4_SCALE_EXP[p.compute_dtype]).float()
    return QuantizedMatrix(
        p.scheme, pack_nibbles(codes[:, inv]).contiguous(), scales[:, inv].contiguous(), zeros, None
    )

"""Load-time packing of 4-bit expert weights into the warp-MMA (``mma.sync``) fragment-ready layout.

The portable grouped GEMM (:mod:`.grouped_gemm`) runs swap-AB, ``D^T[N, M] = W[N, K] . X^T[K, M]``:
weight rows are the ``mma.sync.m16n8k16`` ``M`` dimension (operand A, 16 rows per instruction, held in
registers after an in-register dequantization), routed tokens the ``N`` dimension (operand B, 8 per
instruction, ``ldmatrix`` from shared memory).

Hardware fragment (PTX ISA, "Matrix Fragments for mma.m16n8k16", 16-bit A, row-major)
-----------------------------------------------------------------------------------------
Lane ``l`` (0..31) of a warp holds four 32-bit registers ``a_i`` (``i = 0..3``), each a packed pair
``{lo, hi}`` (``h = 0, 1``) of 16-bit values::

    row(l, i)    = l//4 + 8*(i % 2)                          (weight row inside the m16 block)
    col(l, i, h) = 2*(l % 4) + 8*(i // 2) + h                (k inside the k16 step)

(``a_0 = (r, c..c+1)``, ``a_1 = (r+8, c..c+1)``, ``a_2 = (r, c+8..c+9)``, ``a_3 = (r+8, c+8..c+9)``.)

Code word (one 32-bit word per lane per m16 block per k16 step)
---------------------------------------------------------------
Nibble ``p`` (bits ``4p..4p+3``) of the word holds the code of ``(row(l, i), col(l, i, h))`` with
``p = i + 4*h``, so ``(word >> 4*i) & 0x000F000F`` puts ``a_i``'s lo code in bits 0..3 and its hi code
in bits 16..19. INT4: OR-ing the exponent magic (bf16 ``0x4300`` = 128.0, fp16 ``0x6400`` = 1024.0)
into both halves gives the exact packed pair ``magic + code``; a packed FMA with 1.0 adds
``-(magic + 8)`` (symmetric) or the stored ``-(magic + zero)`` (zero point), a packed FMA with
``-0.0`` multiplies by the group scale: ``a_i`` is ready for ``mma.sync``. E2M1 (FP4) codes use the same
nibble placement (see the kernel for their decode).

Packed tensor
-------------
One flat uint8 tensor ``data``: ``E * NB * KT`` chunks of ``CHUNK`` bytes (``NB = N / RB`` row blocks of
``RB = 16 * MW * W`` rows, ``KT = K / BK`` K tiles), for NVFP4 followed by the FP32 per-row global
scales ``[E, N]`` (packed row order). Chunk ``((e * NB + nb) * KT + kt)`` is everything one CTA streams
for one (expert, row block, K tile) pipeline stage::

    chunk = codes  [W*MW m16 blocks][BK/64][32 lanes][4 words]       uint32   (RB * BK / 2 bytes)
          + scales [W*MW m16 blocks][8 quads][GPT groups][2 halves]  compute dtype (RB * GPT * 2 bytes)
          + biases [W*MW m16 blocks][8 quads][GPT groups][2 halves]  compute dtype (INT4 zero point only)

* m16 block ``mb = w * MW + m`` holds rows ``16*mb .. 16*mb + 15`` of the row block; warp ``w`` owns
  blocks ``w*MW .. w*MW + MW - 1``.
* ``codes[mb][c][l][j]`` is lane ``l``'s code word for k16 step ``j`` of k64 sub-tile ``c``; a lane
  loads its 16 bytes with one ``ld.shared.v4.b32`` at byte ``((mb * BK/64 + c) * 32 + l) * 16``.
* ``GPT`` = groups per K tile = ``BK // g`` if ``g <= BK`` else 1 (the single group covering the tile;
  per-channel scales and groups larger than the tile are repeated in every tile they span).
* Quad ``q = l // 4`` owns rows ``q`` and ``q + 8`` of its m16 block: ``scales[mb][q][gi][h]`` is the
  scale of row ``16*mb + q + 8h`` for group ``gi`` of the tile, so the 32-bit word of group ``gi`` is the
  packed pair ``(scale[r], scale[r + 8])``: ``a_0, a_2`` use its lo half, ``a_1, a_3`` its hi half
  (broadcast with ``prmt``). A lane reads its ``GPT`` words with 4/8/16-byte loads.
* Scales are stored in the compute dtype: INT4 scales converted (exact when the canonical scales have
  that dtype); NVFP4 E4M3 scales (exact in bf16 and fp16); MXFP4 E8M0 scales (exact in bf16; fp16 raises
  if a scale is outside its range).
* Zero-point schemes append ``biases``: ``-(magic + zero)`` in the compute dtype (exact), the packed
  addend that turns ``magic + code`` into ``code - zero``.

Row order: rows are packed in the matrix's own order, except with ``interleave_gate_up=True`` (gated
``w13`` of ``2I`` rows): row block ``nb`` then holds gate rows ``[nb*RB/2, (nb+1)*RB/2)`` in its first
``RB/2`` rows and the matching up rows ``I + [nb*RB/2, (nb+1)*RB/2)`` in its last ``RB/2``, so one CTA
computes both halves of a slice of ``h`` and the epilogue pairs staging columns ``j`` and ``RB/2 + j``.

:func:`unpack_warp` inverts the layout from the hardware mapping above, independently of the index
tables :func:`pack_warp` uses; :func:`emulate_fragments` reproduces the dequantized ``a_i`` registers of
the kernel's recipe bit by bit (what the CPU tests check against the exact weights).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ....formats.schemes import Scheme
from ....formats.weights import QuantizedMatrix, pack_nibbles, unpack_nibbles

__all__ = [
    "WarpPackedMatrix",
    "pack_warp",
    "unpack_warp",
    "fragment_row_col",
    "groups_per_tile",
    "emulate_fragments",
    "layout_for",
]

_MAGIC = {torch.bfloat16: 128.0, torch.float16: 1024.0}


def fragment_row_col(l: torch.Tensor, i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row in the m16 block, k in the k16 step) of half ``h`` of A register ``a_i`` of lane ``l``."""
    row = l // 4 + 8 * (i % 2)
    col = 2 * (l % 4) + 8 * (i // 2) + h
    return row, col


def groups_per_tile(group: int, k_tile: int) -> int:
    """Scale groups a K tile holds (``GPT``)."""
    return k_tile // group if group <= k_tile else 1


def layout_for(cfg) -> dict:
    """The :func:`pack_warp` keyword arguments matching a :class:`~.config.WarpGemmConfig`."""
    return dict(warps=cfg.warps, m16_per_warp=cfg.m16_per_warp, k_tile=cfg.k_tile)


@dataclass
class WarpPackedMatrix:
    """A :class:`QuantizedMatrix` in the warp-MMA fragment-ready layout (see the module docstring)."""

    scheme: Scheme
    data: torch.Tensor  # uint8 [E * NB * KT * chunk_bytes (+ 4 * E * N for NVFP4)]
    num_experts: int
    n: int
    k: int
    group: int
    warps: int  # W
    m16_per_warp: int  # MW
    k_tile: int  # BK
    compute_dtype: torch.dtype
    interleave_gate_up: bool

    @property
    def block_rows(self) -> int:
        return 16 * self.m16_per_warp * self.warps

    @property
    def num_row_blocks(self) -> int:
        return self.n // self.block_rows

    @property
    def num_k_tiles(self) -> int:
        return self.k // self.k_tile

    @property
    def gpt(self) -> int:
        return groups_per_tile(self.group, self.k_tile)

    @property
    def code_bytes(self) -> int:
        return self.block_rows * self.k_tile // 2

    @property
    def scale_bytes(self) -> int:
        return self.block_rows * self.gpt * 2

    @property
    def bias_bytes(self) -> int:
        return self.scale_bytes if self.scheme.zero_point else 0

    @property
    def chunk_bytes(self) -> int:
        return self.code_bytes + self.scale_bytes + self.bias_bytes

    @property
    def chunks_nbytes(self) -> int:
        return self.num_experts * self.num_row_blocks * self.num_k_tiles * self.chunk_bytes

    @property
    def chunks(self) -> torch.Tensor:
        """uint8 view ``[E, NB, KT, CHUNK]`` of the chunk region."""
        return self.data[: self.chunks_nbytes].view(
            self.num_experts, self.num_row_blocks, self.num_k_tiles, self.chunk_bytes)

    @property
    def global_scale(self) -> Optional[torch.Tensor]:
        """NVFP4: FP32 ``[E, N]`` per-row global scales in packed row order (a view of the tail of ``data``)."""
        if self.scheme.kind != "nvfp4":
            return None
        return self.data[self.chunks_nbytes:].view(torch.float32).view(self.num_experts, self.n)

    def nbytes(self) -> int:
        return self.data.numel()


def _row_order(n: int, rb: int, interleave: bool) -> torch.Tensor:
    if not interleave:
        return torch.arange(n)
    half, per = n // 2, rb // 2
    nb = torch.arange(half // per)
    j = torch.arange(per)
    gate = nb[:, None] * per + j[None, :]
    return torch.cat([gate, gate + half], dim=1).reshape(-1)


def _check(qm: QuantizedMatrix, w: int, mw: int, bk: int, compute_dtype: torch.dtype, interleave: bool) -> int:
    if bk not in (64, 128, 256, 512):
        raise ValueError(f"k_tile must be 64, 128, 256 or 512, got {bk}")
    if w <= 0 or mw <= 0:
        raise ValueError(f"warps and m16_per_warp must be positive, got {w}, {mw}")
    if compute_dtype not in _MAGIC:
        raise TypeError(f"compute_dtype must be bfloat16 or float16, got {compute_dtype}")
    n, k = qm.n, qm.k
    g = qm.group_size
    rb = 16 * mw * w
    if k % bk:
        raise ValueError(f"K={k} is not a multiple of k_tile={bk}")
    if not (bk % g == 0 or g % bk == 0):
        raise ValueError(f"group {g} and k_tile {bk}: one must divide the other")
    if interleave:
        if rb % 32:
            raise ValueError(f"interleave_gate_up needs a row block that is a multiple of 32, got {rb}")
        if n % 2 or (n // 2) % (rb // 2):
            raise ValueError(f"interleave_gate_up: half of N={n} must be a multiple of {rb // 2}")
    elif n % rb:
        raise ValueError(f"N={n} is not a multiple of the row block {rb}")
    return g


def _code_index() -> torch.Tensor:
    """For (lane l, nibble p): the flat ``row * 16 + col`` inside an m16 x k16 block."""
    l = torch.arange(32)[:, None]
    p = torch.arange(8)[None, :]
    row, col = fragment_row_col(l, p % 4, p // 4)
    return row * 16 + col  # [32, 8]


def _scale_records(s: torch.Tensor, rb: int, bk: int, g: int, k: int) -> torch.Tensor:
    """``[e, N, K/g]`` (already row-ordered) -> ``[e, NB, KT, RB/16, 8, GPT, 2]``."""
    e, n, ng = s.shape
    kt_n = k // bk
    gpt = groups_per_tile(g, bk)
    nmb = rb // 16
    rows = 16 * torch.arange(nmb)[:, None, None] + torch.arange(8)[None, :, None] + 8 * torch.arange(2)[None, None, :]
    if g <= bk:
        cols = torch.arange(kt_n)[:, None] * gpt + torch.arange(gpt)[None, :]  # [KT, GPT]
    else:
        cols = (torch.arange(kt_n) * bk // g)[:, None]  # [KT, 1]
    sb = s.reshape(e, n // rb, rb, ng)
    out = sb[:, :, rows[None, :, :, None, :], cols[:, None, None, :, None]]  # [e, NB, KT, nmb, 8, GPT, 2]
    return out.contiguous()


def _scales_in(qm: QuantizedMatrix, dtype: torch.dtype) -> torch.Tensor:
    """The scheme's group scales as exact values in the compute dtype (raises on loss)."""
    kind = qm.scheme.kind
    if kind == "int4":
        s = qm.scales.to(dtype)
        if not torch.isfinite(s.float()).all():
            raise ValueError(f"INT4 scales overflow {dtype}")
        return s
    if kind == "nvfp4":
        s32 = qm.scales.float()  # E4M3: every finite value is exact in bf16 and fp16
    else:  # mxfp4: E8M0 exponents
        e = qm.scales.to(torch.int32)
        if (e == 255).any():
            raise ValueError("MXFP4 scales hold the E8M0 NaN code 255")
        s32 = torch.exp2((e - 127).float())
    s = s32.to(dtype)
    if not torch.equal(s.float(), s32):
        lo, hi = s32.min().item(), s32.max().item()
        raise ValueError(
            f"{qm.scheme.name} scales in [{lo:g}, {hi:g}] are not exactly representable in {dtype} "
            f"(fp16 holds 2**-24 .. 2**15 exactly); use bfloat16 activations for these weights")
    return s


def pack_warp(
    qm: QuantizedMatrix,
    *,
    warps: int = 4,
    m16_per_warp: int = 2,
    k_tile: int = 128,
    compute_dtype: torch.dtype = torch.bfloat16,
    interleave_gate_up: bool = False,
    experts_per_pass: int = 8,
) -> WarpPackedMatrix:
    """Permute ``qm`` into the warp-MMA fragment-ready layout (torch only; runs on CPU or GPU).

    ``warps * m16_per_warp`` m16 blocks form one row block (``RB`` rows: one CTA's weight rows);
    ``k_tile`` (BK) is the K extent of one pipeline stage. ``experts_per_pass`` bounds the temporary memory.
    """
    w, mw, bk = warps, m16_per_warp, k_tile
    g = _check(qm, w, mw, bk, compute_dtype, interleave_gate_up)
    sch = qm.scheme
    e_n, n, k = qm.num_experts, qm.n, qm.k
    rb = 16 * mw * w
    nmb = rb // 16
    nb_n, kt_n, c_n = n // rb, k // bk, bk // 64
    dev = qm.codes.device
    order = _row_order(n, rb, interleave_gate_up).to(dev)
    idx = _code_index().to(dev).reshape(-1)
    scales = _scales_in(qm, compute_dtype)
    parts_all = []
    for e0 in range(0, e_n, experts_per_pass):
        e1 = min(e_n, e0 + experts_per_pass)
        ne = e1 - e0
        codes = unpack_nibbles(qm.codes[e0:e1])[:, order]  # [ne, N, K] uint8
        # [ne, NB, nmb, 16 rows, KT, C, 4 k16, 16 cols] -> [ne, NB, KT, nmb, C, 4, 256]
        v = codes.reshape(ne, nb_n, nmb, 16, kt_n, c_n, 4, 16)
        v = v.permute(0, 1, 4, 2, 5, 6, 3, 7).reshape(ne, nb_n, kt_n, nmb, c_n, 4, 256)
        nib = v[..., idx].reshape(ne, nb_n, kt_n, nmb, c_n, 4, 32, 8)
        nib = nib.permute(0, 1, 2, 3, 4, 6, 5, 7)  # [.., nmb, C, lane, j, p]
        parts = [pack_nibbles(nib).reshape(ne, nb_n, kt_n, -1)]  # nibble p=2b lo, 2b+1 hi of byte b
        rec = _scale_records(scales[e0:e1][:, order], rb, bk, g, k)
        parts.append(rec.reshape(ne, nb_n, kt_n, -1).view(torch.uint8))
        if sch.zero_point:
            bias = -(qm.zeros[e0:e1][:, order].float() + _MAGIC[compute_dtype])
            brec = _scale_records(bias.to(compute_dtype), rb, bk, g, k)
            parts.append(brec.reshape(ne, nb_n, kt_n, -1).view(torch.uint8))
        parts_all.append(torch.cat(parts, dim=-1).reshape(-1))
    if qm.scheme.kind == "nvfp4":
        parts_all.append(qm.global_scale[:, order].float().contiguous().reshape(-1).view(torch.uint8))
    data = torch.cat(parts_all).contiguous()
    p = WarpPackedMatrix(sch, data, e_n, n, k, g, w, mw, bk, compute_dtype, interleave_gate_up)
    assert p.chunk_bytes % 16 == 0 and data.numel() == p.chunks_nbytes + (4 * e_n * n if sch.kind == "nvfp4" else 0)
    return p


def _words(p: WarpPackedMatrix) -> torch.Tensor:
    """int64 code words ``[E, NB, KT, nmb, C, 32 lanes, 4]``."""
    nmb, c_n = p.block_rows // 16, p.k_tile // 64
    b = p.chunks[..., : p.code_bytes].reshape(*p.chunks.shape[:3], nmb, c_n, 32, 4, 4).to(torch.int64)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def _records(p: WarpPackedMatrix, lo: int, dtype: torch.dtype) -> torch.Tensor:
    """Scale/bias records -> ``[E, N(packed order), K/g]`` from the documented (mb, q, gi, h) mapping."""
    e_n, nb_n, kt_n = p.num_experts, p.num_row_blocks, p.num_k_tiles
    nmb, gpt, g, bk = p.block_rows // 16, p.gpt, p.group, p.k_tile
    r = p.chunks[..., lo: lo + p.scale_bytes].contiguous().view(dtype).reshape(e_n, nb_n, kt_n, nmb, 8, gpt, 2)
    ng = p.k // g
    out = torch.empty(e_n, nb_n, nmb, 16, ng, dtype=dtype, device=p.data.device)
    for q in range(8):
        for hh in range(2):
            row = q + 8 * hh
            for kt in range(kt_n):
                if g <= bk:
                    out[:, :, :, row, kt * gpt: (kt + 1) * gpt] = r[:, :, kt, :, q, :, hh]
                else:
                    out[:, :, :, row, kt * bk // g] = r[:, :, kt, :, q, 0, hh]
    return out.reshape(e_n, p.n, ng)


def unpack_warp(p: WarpPackedMatrix) -> QuantizedMatrix:
    """Invert :func:`pack_warp` from the documented fragment mapping.

    Returns a canonical :class:`QuantizedMatrix` (original row order). INT4 scales come back in the compute
    dtype; FP4 scales in their canonical dtypes (E4M3 / E8M0, recovered exactly from the compute dtype).
    """
    e_n, nb_n, kt_n = p.num_experts, p.num_row_blocks, p.num_k_tiles
    nmb, c_n = p.block_rows // 16, p.k_tile // 64
    dev = p.data.device
    words = _words(p)  # [e, NB, KT, nmb, C, lane, j]
    codes = torch.empty(e_n, nb_n, nmb, 16, kt_n, c_n, 4, 16, dtype=torch.uint8, device=dev)
    lanes = torch.arange(32, device=dev)
    for i in range(4):
        for h in range(2):
            nib = ((words >> (4 * (i + 4 * h))) & 0xF).to(torch.uint8)
            row, col = fragment_row_col(lanes, torch.tensor(i, device=dev), torch.tensor(h, device=dev))
            src = nib.permute(5, 0, 1, 3, 2, 4, 6)  # [lane, e, NB, nmb, KT, C, j]
            codes[:, :, :, row, :, :, :, col] = src
    codes = codes.reshape(e_n, p.n, p.k)
    order = _row_order(p.n, p.block_rows, p.interleave_gate_up).to(dev)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(p.n, device=dev)
    scales = _records(p, p.code_bytes, p.compute_dtype)[:, inv].contiguous()
    zeros = gs = None
    if p.scheme.zero_point:
        bias = _records(p, p.code_bytes + p.scale_bytes, p.compute_dtype)
        zeros = (-bias.float() - _MAGIC[p.compute_dtype]).round().to(torch.uint8)[:, inv].contiguous()
    if p.scheme.kind == "nvfp4":
        scales = scales.float().to(torch.float8_e4m3fn)
        gs = p.global_scale[:, inv].contiguous()
    elif p.scheme.kind == "mxfp4":
        scales = (torch.log2(scales.float()).round().to(torch.int32) + 127).to(torch.uint8)
    return QuantizedMatrix(p.scheme, pack_nibbles(codes[:, inv]).contiguous(), scales, zeros, gs)


# ----------------------------------------------------------------------------------------------------------
# bit-exact emulation of the kernel's register recipe (CPU tests)
# ----------------------------------------------------------------------------------------------------------
def _bits_to(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int64 tensor of 16-bit patterns -> values of ``dtype``."""
    v = v & 0xFFFF
    return (v - ((v & 0x8000) << 1)).to(torch.int16).view(dtype)


def _e2m1_half_bits(code: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """16-bit patterns of the exact E2M1 value of ``code`` (0..15) in ``dtype`` (what the kernel's lookup yields)."""
    from ....formats.fp4 import E2M1_VALUES

    table = torch.tensor(E2M1_VALUES, dtype=torch.float32).to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
    return table.to(code.device)[code]


def emulate_fragments(p: WarpPackedMatrix, e: int, nb: int, kt: int) -> torch.Tensor:
    """The dequantized A operands the kernel builds for chunk ``(e, nb, kt)``, as a ``[RB, BK]`` tensor of
    ``compute_dtype`` placed by the hardware fragment mapping (packed row order inside the row block).

    Emulates, per lane / m16 block / k16 step / register: the INT4 magic-OR, the packed FMA with 1.0 and the
    bias (rounding is exact), the packed FMA with the group scale and ``-0.0`` (one bf16/fp16 rounding), or
    for FP4 the exact E2M1 lookup followed by the same scale FMA. NVFP4's global scale is applied later (FP32
    epilogue) and is not part of the fragment.
    """
    dt = p.compute_dtype
    nmb, c_n, gpt, g, bk = p.block_rows // 16, p.k_tile // 64, p.gpt, p.group, p.k_tile
    chunk = p.chunks[e, nb, kt]
    words = _words(p)[e, nb, kt]  # [nmb, C, lane, j]
    sc = chunk[p.code_bytes: p.code_bytes + p.scale_bytes].contiguous().view(dt).reshape(nmb, 8, gpt, 2).float()
    if p.scheme.zero_point:
        bi = chunk[p.code_bytes + p.scale_bytes: p.chunk_bytes].contiguous().view(dt).reshape(nmb, 8, gpt, 2).float()
    out = torch.empty(p.block_rows, bk, dtype=dt)
    lanes = torch.arange(32)
    q = lanes // 4
    magic = _MAGIC[dt]
    for c in range(c_n):
        for j in range(4):
            kk = c * 64 + j * 16
            gi = kk // g if g <= bk else 0
            for i in range(4):
                for h in range(2):
                    code = (words[:, c, :, j] >> (4 * (i + 4 * h))) & 0xF  # [nmb, lane]
                    s = sc[:, q, gi, i % 2]  # [nmb, lane]
                    if p.scheme.kind == "int4":
                        t = code.float() + magic  # the magic-OR: exact
                        b = bi[:, q, gi, i % 2] if p.scheme.zero_point else torch.full_like(t, -(magic + 8))
                        t = (t + b).to(dt).float()  # fma(t, 1, b): exact (small integers)
                    else:
                        t = _bits_to(_e2m1_half_bits(code, dt), dt).float()
                    val = (t * s).to(dt)  # fma(t, s, -0.0): one rounding
                    row, col = fragment_row_col(lanes, torch.tensor(i), torch.tensor(h))
                    rows = 16 * torch.arange(nmb)[:, None] + row[None, :]
                    out[rows, kk + col[None, :].expand(nmb, 32)] = val
    return out

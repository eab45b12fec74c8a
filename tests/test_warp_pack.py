"""CPU tests of the warp-MMA family's packed layout, fragment recipes and index mappings (no GPU, no DSL).

* pack / unpack round trip for every scheme, compute dtype and layout (unpack walks the hardware mapping);
* the kernel's dequantization recipe emulated bit by bit reproduces the exact weights (rounded once);
* the FP4 ``prmt`` decode emulated instruction by instruction gives the exact E2M1 values;
* a pure-torch emulation of one CTA (cp.async destinations with the XOR swizzle, ldmatrix lane addresses,
  mma.sync m16n8k16 fragment semantics, epilogue staging, gate/up pairing) reproduces ``W @ X^T``;
* config names / spec names are unique and encode every field; the run-time modules import no ``cutlass``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import w4a16_moe as wm
from w4a16_moe.formats.quantize import dequantize_matrix
from w4a16_moe.formats.schemes import SCHEMES, get_scheme
from w4a16_moe.formats.weights import QuantizedMatrix
from w4a16_moe.kernels.cute.warp import family as fam
from w4a16_moe.kernels.cute.warp.config import WarpGemmConfig, e2m1_prmt_tables
from w4a16_moe.kernels.cute.warp.pack import (
    _row_order,
    emulate_fragments,
    fragment_row_col,
    pack_warp,
    unpack_warp,
)

ALL_SCHEMES = list(SCHEMES)
DTYPES = [torch.bfloat16, torch.float16]


def _qm(scheme: str, e=2, n=256, k=256, seed=0, dtype=torch.bfloat16) -> QuantizedMatrix:
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(e, n, k, generator=g) / k**0.5
    w2 = torch.randn(e, k, n // 2, generator=g) / k**0.5
    return wm.quantize_experts(w13.to(dtype), w2.to(dtype), scheme, activation="swiglu").w13


LAYOUTS = [  # (warps, m16_per_warp, k_tile, interleave)
    (4, 2, 128, False),
    (4, 2, 128, True),
    (4, 2, 64, True),
    (2, 1, 256, False),
    (8, 1, 128, True),
]


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"w{l[0]}m{l[1]}k{l[2]}{'i' if l[3] else ''}")
def test_round_trip(scheme, dtype, layout):
    w, mw, bk, inter = layout
    qm = _qm(scheme, seed=hash((scheme, layout)) % 1000)
    if qm.group_size > bk and qm.group_size % bk:
        pytest.skip("group and k_tile do not divide")
    p = pack_warp(qm, warps=w, m16_per_warp=mw, k_tile=bk, compute_dtype=dtype, interleave_gate_up=inter)
    rb = 16 * w * mw
    assert p.block_rows == rb and p.chunk_bytes % 16 == 0
    assert p.chunks.shape == (qm.num_experts, qm.n // rb, qm.k // bk, p.chunk_bytes)
    assert p.chunk_bytes == rb * bk // 2 + rb * p.gpt * 2 * (2 if qm.scheme.zero_point else 1)
    extra = 4 * qm.num_experts * qm.n if qm.scheme.kind == "nvfp4" else 0
    assert p.data.numel() == p.chunks_nbytes + extra
    back = unpack_warp(p)
    assert torch.equal(back.codes, qm.codes)
    if qm.scheme.kind == "int4":
        assert torch.equal(back.scales, qm.scales.to(dtype))
        if qm.scheme.zero_point:
            assert torch.equal(back.zeros, qm.zeros)
    else:
        assert torch.equal(back.scales.view(torch.uint8), qm.scales.view(torch.uint8))
        if qm.global_scale is not None:
            assert torch.equal(back.global_scale, qm.global_scale)
    if qm.scales.dtype == dtype or qm.scheme.kind != "int4":
        assert torch.equal(dequantize_matrix(back), dequantize_matrix(qm))


def test_random_codes_bit_exact():
    """Arbitrary bytes (not produced by the quantizer) survive the round trip, every layout."""
    g = torch.Generator().manual_seed(1)
    e, n, k = 2, 256, 512
    codes = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randn(e, n, k // 32, generator=g).to(torch.bfloat16)
    qm = QuantizedMatrix(get_scheme("int4_g32"), codes, scales)
    for w, mw, bk, inter in LAYOUTS:
        back = unpack_warp(pack_warp(qm, warps=w, m16_per_warp=mw, k_tile=bk, interleave_gate_up=inter))
        assert torch.equal(back.codes, codes) and torch.equal(back.scales, scales)


def test_fp16_range_errors():
    qm = _qm("mxfp4")
    bad = dataclasses.replace(qm, scales=torch.full_like(qm.scales, 127 + 20))  # 2**20: not in fp16
    with pytest.raises(ValueError, match="not exactly representable"):
        pack_warp(bad, compute_dtype=torch.float16)
    pack_warp(bad, compute_dtype=torch.bfloat16)  # fine in bf16


def test_layout_errors():
    qm = _qm("int4_g32", n=192)
    with pytest.raises(ValueError, match="row block"):
        pack_warp(qm, warps=4, m16_per_warp=2)
    with pytest.raises(ValueError, match="interleave"):
        pack_warp(qm, warps=4, m16_per_warp=2, interleave_gate_up=True)
    with pytest.raises(ValueError, match="k_tile"):
        pack_warp(_qm("int4_g32", k=192), k_tile=128)


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_fragment_recipe_reproduces_weights(scheme, dtype):
    """The kernel's register recipe (magic OR, FMA with the bias, FMA with the scale; or the E2M1 lookup)
    placed by the hardware fragment mapping gives the exact weights rounded once to the compute dtype."""
    qm = _qm(scheme, e=2, n=256, k=256, seed=3, dtype=dtype)
    w, mw, bk = 4, 2, 128
    p = pack_warp(qm, warps=w, m16_per_warp=mw, k_tile=bk, compute_dtype=dtype, interleave_gate_up=True)
    ref = dequantize_matrix(qm)  # [E, N, K] FP32, exact
    if qm.global_scale is not None:
        ref = ref / qm.global_scale[:, :, None]  # the kernel applies it to the FP32 accumulators
    order = _row_order(qm.n, p.block_rows, True)
    for e in range(qm.num_experts):
        for nb in range(p.num_row_blocks):
            for kt in range(p.num_k_tiles):
                got = emulate_fragments(p, e, nb, kt)
                rows = order[nb * p.block_rows:(nb + 1) * p.block_rows]
                exp = ref[e][rows][:, kt * bk:(kt + 1) * bk].to(dtype)
                assert torch.equal(got, exp), (scheme, e, nb, kt, (got.float() - exp.float()).abs().max())


# ------------------------------------------------------------------------------------------------------------
# FP4 decode: the kernel's instruction sequence, emulated
# ------------------------------------------------------------------------------------------------------------
def _prmt(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` default mode."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        byte = src[s & 7]
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0x00
        out |= byte << (8 * i)
    return out


def _shl(x: int, s: int) -> int:
    return (x << s) & 0xFFFFFFFF if s >= 0 else (x & 0xFFFFFFFF) >> (-s)


def _decode_fp4_register(word: int, i: int, is_bf16: bool) -> int:
    """Mirror of ``WarpW4A16GroupedGemm._dequant_fp4`` before the scale FMA."""
    (h0, h1), (l0, l1) = e2m1_prmt_tables(is_bf16)
    sg = _shl(word, 12 - 4 * i)
    if is_bf16:
        m = _shl(word, -4 * i) & 0x00070007
        sel = _prmt(m, m, 0x0020)
        hb = _prmt(h0, h1, sel)
        lb = _prmt(l0, l1, sel)
        v = _prmt(lb, hb, 0x6240)
    else:
        m = _shl(word, 4 - 4 * i) & 0x00700070
        sel = _prmt(m, m, 0x0020)
        v = _prmt(h0, h1, sel)
    return v | (sg & 0x80008000)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_fp4_prmt_decode_exact(dtype):
    from w4a16_moe.formats.fp4 import E2M1_VALUES

    is_bf16 = dtype == torch.bfloat16
    g = torch.Generator().manual_seed(5)
    words = torch.randint(0, 2**32, (4000,), generator=g, dtype=torch.int64).tolist()
    words += [int("".join(f"{c:x}" for c in [c0] * 8), 16) for c0 in range(16)]  # every code everywhere
    for word in words:
        for i in range(4):
            v = _decode_fp4_register(word, i, is_bf16)
            for h in range(2):
                code = (word >> (4 * (i + 4 * h))) & 0xF
                bits = (v >> (16 * h)) & 0xFFFF
                got = torch.tensor([bits - 65536 if bits >= 32768 else bits], dtype=torch.int16).view(dtype)
                exp = torch.tensor([E2M1_VALUES[code]], dtype=dtype)
                assert got.view(torch.int16).item() == exp.view(torch.int16).item(), (hex(word), i, h, code)


def test_int4_magic_constants():
    """bf16 0x4300 = 128, fp16 0x6400 = 1024; -(magic + 8) packed; 1.0 packed (the kernel's immediates)."""
    def half(bits, dt):
        return torch.tensor([bits - 65536 if bits >= 32768 else bits], dtype=torch.int16).view(dt).item()

    assert half(0x4300, torch.bfloat16) == 128.0 and half(0xC308, torch.bfloat16) == -136.0
    assert half(0x6400, torch.float16) == 1024.0 and half(0xE408, torch.float16) == -1032.0
    assert half(0x3F80, torch.bfloat16) == 1.0 and half(0x3C00, torch.float16) == 1.0
    for c in range(16):  # magic | code is exactly magic + code
        assert half(0x4300 | c, torch.bfloat16) == 128.0 + c
        assert half(0x6400 | c, torch.float16) == 1024.0 + c


# ------------------------------------------------------------------------------------------------------------
# one CTA, emulated with the kernel's index formulas
# ------------------------------------------------------------------------------------------------------------
def _mma_16816(a: list, b: list, c: torch.Tensor) -> torch.Tensor:
    """mma.sync.m16n8k16 from per-lane fragments (PTX ISA layout): a[l] = 8 values (a0.lo, a0.hi, a1.lo, ..),
    b[l] = 4 values (b0.lo, b0.hi, b1.lo, b1.hi), c [32, 4]; returns d [32, 4]."""
    A = torch.zeros(16, 16, dtype=torch.float64)
    B = torch.zeros(16, 8, dtype=torch.float64)
    for l in range(32):
        for i in range(4):
            for h in range(2):
                row = l // 4 + 8 * (i % 2)
                col = 2 * (l % 4) + 8 * (i // 2) + h
                A[row, col] = a[l][2 * i + h]
        for r in range(2):
            for h in range(2):
                B[2 * (l % 4) + 8 * r + h, l // 4] = b[l][2 * r + h]
    D = A @ B
    d = c.clone()
    for l in range(32):
        for v in range(4):
            d[l, v] += D[l // 4 + 8 * (v // 2), 2 * (l % 4) + (v % 2)]
    return d


def _emulate_cta(p, x_rows: torch.Tensor, e: int, nb: int, cfg: WarpGemmConfig) -> torch.Tensor:
    """FP64 staging tile ``[TN][RB]`` of one CTA over all K tiles, using the kernel's formulas: activation
    cp.async destinations (``r * 2BK + ((c ^ (r % 8)) * 16)``), ldmatrix.x4 lane addresses, fragment decode
    (emulate_fragments), mma.sync semantics and the staging store."""
    W, MW, TN, BK = cfg.warps, cfg.m16_per_warp, cfg.tokens_per_tile, cfg.k_tile
    T, CPR = 32 * W, BK // 8
    rb = 16 * MW * W
    acc = torch.zeros(W, MW, TN // 8, 32, 4, dtype=torch.float64)
    for kt in range(p.num_k_tiles):
        # smem activation tile as bytes (16-byte chunks of 8 values)
        smem = {}
        for t in range(T):
            cc, r0 = t % CPR, t // CPR
            for j in range((TN * CPR + T - 1) // T):
                r = r0 + j * (T // CPR)
                if t + j * T < TN * CPR:
                    smem[r * 2 * BK + ((cc ^ (r % 8)) * 16)] = x_rows[r, kt * BK + cc * 8: kt * BK + cc * 8 + 8]
        a_tile = emulate_fragments(p, e, nb, kt).double()  # [RB, BK] by the A fragment mapping
        for w in range(W):
            for kb2 in range(BK // 32):
                bfr = []
                for nb8 in range(TN // 8):
                    regs = [[None] * 4 for _ in range(32)]
                    # ldmatrix.x4: lanes 8q..8q+7 give the row addresses of matrix q; lane l receives, of
                    # each matrix q, row l // 4, elements 2 (l % 4), +1
                    addrs = [nb8 * 8 * 2 * BK + (l % 8) * 2 * BK + (((4 * kb2 + l // 8) ^ (l % 8)) * 16) for l in range(32)]
                    for q in range(4):
                        for l in range(32):
                            row = smem[addrs[8 * q + l // 4]]
                            regs[l][q] = (row[2 * (l % 4)].item(), row[2 * (l % 4) + 1].item())
                    bfr.append(regs)
                for kk in range(2):
                    kb = 2 * kb2 + kk
                    for m in range(MW):
                        mb = w * MW + m
                        a = []
                        for l in range(32):
                            vals = []
                            for i in range(4):
                                for h in range(2):
                                    row, col = fragment_row_col(torch.tensor(l), torch.tensor(i), torch.tensor(h))
                                    vals.append(a_tile[16 * mb + int(row), 16 * kb + int(col)].item())
                            a.append(vals)
                        for nb8 in range(TN // 8):
                            b = [list(bfr[nb8][l][2 * kk]) + list(bfr[nb8][l][2 * kk + 1]) for l in range(32)]
                            acc[w, m, nb8] = _mma_16816(a, b, acc[w, m, nb8])
    stage = torch.full((TN, rb), float("nan"), dtype=torch.float64)
    for w in range(W):
        for l in range(32):
            for m in range(MW):
                for rh in range(2):
                    col = (w * MW + m) * 16 + l // 4 + 8 * rh
                    for nb8 in range(TN // 8):
                        for v in range(2):
                            stage[8 * nb8 + 2 * (l % 4) + v, col] = acc[w, m, nb8, l, 2 * rh + v]
    return stage


@pytest.mark.parametrize("cfg", [
    WarpGemmConfig(warps=2, m16_per_warp=1, tokens_per_tile=8, k_tile=64),
    WarpGemmConfig(warps=2, m16_per_warp=2, tokens_per_tile=16, k_tile=128),
    WarpGemmConfig(warps=1, m16_per_warp=2, tokens_per_tile=8, k_tile=256),
], ids=lambda c: c.name())
def test_cta_emulation_reproduces_gemm(cfg):
    """Staging tile of one CTA == W_rows @ X^T, and the gate/up pairing of the epilogue matches the interleave."""
    torch.manual_seed(0)
    rb = cfg.rows_per_cta
    n, k = 2 * rb, 2 * cfg.k_tile
    qm = _qm("int4_g32", e=1, n=n, k=k, seed=7)
    p = pack_warp(qm, warps=cfg.warps, m16_per_warp=cfg.m16_per_warp, k_tile=cfg.k_tile, interleave_gate_up=True)
    x = torch.randn(cfg.tokens_per_tile, k).to(torch.bfloat16)
    w = dequantize_matrix(qm)[0].to(torch.bfloat16).double()  # the dequantized operand, rounded like the kernel
    order = _row_order(n, rb, True)
    for nb in range(n // rb):
        stage = _emulate_cta(p, x.double(), 0, nb, cfg)
        ref = x.double() @ w[order[nb * rb:(nb + 1) * rb]].T  # [TN, RB]
        assert torch.allclose(stage, ref, rtol=1e-9, atol=1e-9), (stage - ref).abs().max()
        # epilogue pairing: staging columns j (gate) and RB/2 + j (up) are rows nb*RB/2 + j and I + nb*RB/2 + j
        half = rb // 2
        gate = x.double() @ w[nb * half: (nb + 1) * half].T
        up = x.double() @ w[n // 2 + nb * half: n // 2 + (nb + 1) * half].T
        assert torch.allclose(stage[:, :half], gate) and torch.allclose(stage[:, half:], up)


# ------------------------------------------------------------------------------------------------------------
# configs, specs, variants
# ------------------------------------------------------------------------------------------------------------
def test_config_names_unique_and_complete():
    specs = fam.variants()
    cfgs = [fam.config_from_spec(s) for s in specs]
    names = [c.name() for c in cfgs]
    assert len(set(names)) == len(names) == len(specs)
    assert len({s.name for s in specs}) == len(specs)
    # every codegen field changes the name
    base = WarpGemmConfig()
    changes = dict(mode="down", dtype="fp16", kind="nvfp4", group=64, zero_point=True, warps=8, m16_per_warp=1,
                   tokens_per_tile=16, k_tile=64, stages=3, activation="geglu", epilogue="h", evict_first=False,
                   min_ctas_per_sm=2, bias=True, row_blocks=1, acc_scales=False, tile_loop=True, pdl=True,
                   occupancy=True)
    assert set(changes) == {f.name for f in dataclasses.fields(WarpGemmConfig)}
    for key, val in changes.items():
        other = dataclasses.replace(base, **{key: val})
        if key == "epilogue":  # "auto" of gate_up is "h": same kernel, but a different spec
            assert fam.spec_for(other) != fam.spec_for(base)
            continue
        assert other.name() != base.name(), key
    for s in specs[:50]:
        assert fam.spec_for(fam.config_from_spec(s)) == s


def test_variant_sets():
    smoke = fam.aot_variants("smoke")
    # (2 INT4 schemes x (buckets + the cost model's TN 24 tile) + int4_g32's K-tile-64 twins) x (gate_up, down y,
    # down atomic) x (launched plain, with PDL, or looping over its tiles)
    assert len(smoke) == (2 * (len(fam.TILES) + len(fam.MODEL_TILES)) + len(fam.K64_TILES)) * 3 * 3
    assert sum(fam.config_from_spec(s).pdl for s in smoke) == len(smoke) // 3
    assert not any(fam.config_from_spec(s).pdl and fam.config_from_spec(s).tile_loop for s in smoke)
    full = fam.aot_variants("full")
    assert set(smoke) <= set(full)
    kinds = {fam.config_from_spec(s).kind for s in full}
    assert kinds == {"int4", "nvfp4", "mxfp4"}
    assert {fam.config_from_spec(s).kind for s in full if fam.config_from_spec(s).tokens_per_tile == 24} == {"int4"}
    # the K-tile-64 twins of TN 8 / 16: INT4 of groups <= 64 and per channel (group 0), never FP4 or groups of 128
    k64 = [fam.config_from_spec(s) for s in full
           if fam.config_from_spec(s).k_tile == 64 and fam.config_from_spec(s).tokens_per_tile in (8, 16)]
    assert {(c.kind, c.group) for c in k64} == {("int4", 0), ("int4", 32), ("int4", 64)}
    with pytest.raises(ValueError):
        fam.aot_variants("nope")


def test_tile_selection_and_splits():
    assert fam.select_tiles(8, 384)["tokens_per_tile"] == 8
    assert fam.select_tiles(64 * 8, 384)["tokens_per_tile"] == 8
    assert fam.select_tiles(32 * 8 * 16, 16)["tokens_per_tile"] == 64
    up, down = fam.gemm_configs(get_scheme("int4_g32"), "bf16", "swiglu", True, "fused", fam.select_tiles(8, 384))
    assert up.gated and down.epi == "atomic_f32" and up.tokens_per_tile == down.tokens_per_tile
    # W1 decode (E=384, H=7168, I=256, top-8, 1 token): small experts (1.8 MB of gate/up weights) never split;
    # Llama-4 Scout's down GEMM (N = 5120, K = 8192: 21 MB per expert) at 8 routes on 16 experts does
    assert fam.num_splits(512, 7168, up, 8, 384) == 1
    assert fam.num_splits(7168, 256, down, 8, 384) == 1
    assert fam.num_splits(5120, 8192, down, 8, 16) > 1
    for r in (1, 8, 64, 5000):
        for tn in (8, 64):
            assert fam.max_tiles(r, 16, tn) >= -(-r // tn)


def test_every_bucket_fits_99kb_smem():
    """sm_86 / sm_89 / sm_120 allow 99 KB per CTA: every variant must fit (same variants on every arch)."""
    for spec in fam.variants():
        c = fam.config_from_spec(spec)
        g = c.group
        gpt = c.k_tile // g if (g and g <= c.k_tile) else 1
        chunk = c.rows_per_cta * c.k_tile // 2 + c.rows_per_cta * gpt * 2 * (2 if c.zero_point else 1)
        stage = -(-chunk // 128) * 128 + c.tokens_per_tile * c.k_tile * 2
        epi = c.tokens_per_tile * (c.rows_per_cta + 4) * 4
        sz = c.stage_sizes
        assert (sz["chunk"], sz["w_stage"] + sz["b_stage"], sz["epi"]) == (chunk, stage, epi), c.name()
        if c.streams:  # a streaming kernel stages a finished row block in one ring stage (padded for it)
            assert epi <= sz["stage"] <= max(stage, epi) and 8 * epi <= 9 * stage, c.name()
        else:
            assert sz["stage"] == stage
        smem = max(c.stages * sz["stage"], epi) + 16
        assert smem <= 99 * 1024, (c.name(), smem)


def test_scales_in_acc_rule():
    """Which INT4 kernels apply the scales to FP32 partial sums (groups >= 128 up to TN 32, group 64 up to TN 16)."""
    def cfg(**kw):
        return WarpGemmConfig(**{**dict(kind="int4", group=128, tokens_per_tile=16, k_tile=128), **kw})

    assert all(cfg(tokens_per_tile=tn).scales_in_acc for tn in (8, 16, 24, 32))
    assert not cfg(tokens_per_tile=40).scales_in_acc
    assert cfg(group=0).scales_in_acc and cfg(group=256).scales_in_acc  # per channel / groups past the K tile
    assert cfg(group=64, tokens_per_tile=16).scales_in_acc and not cfg(group=64, tokens_per_tile=24).scales_in_acc
    assert not any(cfg(group=32, tokens_per_tile=tn).scales_in_acc for tn in (8, 16))
    assert not cfg(tokens_per_tile=64, k_tile=64).scales_in_acc  # the TN 64 bucket
    assert not cfg(kind="nvfp4", group=16).scales_in_acc and not cfg(kind="mxfp4", group=32).scales_in_acc
    assert not cfg(acc_scales=False).scales_in_acc
    assert cfg(zero_point=True).scales_in_acc


def test_row_block_streaming_rule():
    """Which launches stream several row blocks per CTA (the host mirror of the kernel's run-time rule)."""
    from w4a16_moe.kernels.cute.warp.config import STREAM_CTAS, STREAM_MAX_K_TILES, stream_row_blocks

    sch = get_scheme("int4_g128")
    tiles = {t["tokens_per_tile"]: t for t in fam.model_tiles(sch)}
    for tn in (8, 16, 24, 32):  # the buckets up to TN 32 and the TN 24 model tile stream; TN 64 (BK 64) does not
        up, down = fam.gemm_configs(sch, "bf16", "swiglu", True, "deterministic", tiles[tn])
        assert down.streams and down.row_blocks == 8, down.name()
        # gate/up (K = the hidden size) is built without the streaming loop, even where K is short
        assert fam.UP_ROW_BLOCKS == 1 and up.row_blocks == 1 and not up.streams, up.name()
        assert stream_row_blocks(up, 2 * 256, 512, 10**4, 1) == 1
        # Kimi-K2 TP8 down GEMM (N = H = 7168, K = I = 256) at 512 tokens: 56 row blocks x max_tiles
        mt = fam.max_tiles(512 * 8, 384, tn)
        assert stream_row_blocks(down, 7168, 256, mt, 1) == min(8, 56 * mt // STREAM_CTAS) > 1
        assert stream_row_blocks(down, 7168, 256, mt, 2) == 1  # split-K: one row block per CTA
        assert stream_row_blocks(down, 7168, 128 * (STREAM_MAX_K_TILES + 1), mt, 1) == 1  # long K
        assert stream_row_blocks(down, 7168, 256, 1, 1) == 1  # a small grid keeps its CTAs
        off = dataclasses.replace(down, row_blocks=1)
        assert not off.streams and stream_row_blocks(off, 7168, 256, mt, 1) == 1
    _, down64 = fam.gemm_configs(sch, "bf16", "swiglu", True, "deterministic", tiles[64])
    assert not down64.streams and stream_row_blocks(down64, 7168, 256, 10**4, 1) == 1


SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["cutlass"] = None          # any `import cutlass` now raises ImportError
    sys.modules["cuda.bindings"] = None
    import torch, w4a16_moe as wm
    from w4a16_moe.kernels.cute.warp import family as fam
    from w4a16_moe.kernels.cute.warp.pack import pack_warp, layout_for
    from w4a16_moe.loader.spec import get_family
    g = torch.Generator().manual_seed(0)
    w = wm.quantize_experts(torch.randn(4, 512, 256, generator=g).bfloat16(),
                            torch.randn(4, 256, 256, generator=g).bfloat16(), "int4_g32")
    up, down = fam.gemm_configs(w.scheme, "bf16", "swiglu", True, "deterministic", fam.select_tiles(6, 4))
    assert fam.config_from_spec(fam.spec_for(up)) == up
    p = pack_warp(w.w13, interleave_gate_up=True, **layout_for(up))
    assert get_family(fam.FAMILY).source_files()
    print("ok", fam.spec_for(down).name, p.data.numel())
""")


def test_runtime_path_imports_no_cutlass(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "python"),
                                          env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok warp_w4a16_gemm__")

"""Round trips of the SM90 fragment-ready weight packing (CPU only, fast)."""

from __future__ import annotations

import pytest
import torch

from w4a16_moe.formats.quantize import dequantize_matrix, quantize_matrix
from w4a16_moe.formats.weights import QuantizedMatrix, pack_nibbles, unpack_nibbles
from w4a16_moe.kernels.cute.sm90.pack import (
    FP4_SCALE_EXP, effective_scales, fragment_row_col, pack_sm90, unpack_sm90,
)


def _random_int4(e, n, k, scheme, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g).to(dtype)
    return quantize_matrix(w, scheme)


CASES = [
    # (E, N, K, scheme, X, BK, interleave)
    (2, 128, 128, "int4_g32", 2, 128, False),
    (3, 256, 256, "int4_g64", 2, 128, True),
    (1, 64, 384, "int4_g128", 1, 128, False),
    (2, 128, 256, "int4_g128", 1, 64, False),  # g > BK: scale repeated per tile
    (2, 256, 128, "int4_g32", 4, 64, True),
    (1, 128, 512, "int4_channel", 2, 128, False),
    (2, 128, 256, "int4_g32_zp", 2, 128, True),
    (1, 192, 256, "int4_g64_zp", 3, 64, False),
    (2, 128, 256, "nvfp4", 2, 128, False),
    (1, 256, 128, "mxfp4", 2, 64, True),
]


@pytest.mark.parametrize("e,n,k,scheme,x,bk,inter", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_trip(e, n, k, scheme, x, bk, inter, dtype):
    qm = _random_int4(e, n, k, scheme, dtype=dtype)
    p = pack_sm90(qm, m64_per_block=x, k_tile=bk, compute_dtype=dtype, interleave_gate_up=inter, experts_per_pass=2)
    assert p.data.dtype == torch.uint8 and p.data.is_contiguous()
    assert p.data.shape == (e, n // (64 * x), k // bk, p.chunk_bytes)
    assert p.chunk_bytes == p.code_bytes + p.scale_bytes + p.bias_bytes
    assert p.chunk_bytes % 16 == 0
    back = unpack_sm90(p)
    assert torch.equal(back.codes, qm.codes)
    if qm.scheme.kind == "int4":
        assert torch.equal(back.scales, qm.scales.to(dtype))
        if qm.scheme.zero_point:
            assert torch.equal(back.zeros, qm.zeros)
        assert torch.equal(dequantize_matrix(back), dequantize_matrix(qm))
    else:
        # FP4: effective scales (global folded in), rounded once to the compute dtype
        eff = effective_scales(qm, dtype).double() * 2.0 ** -FP4_SCALE_EXP[dtype]
        assert torch.equal(back.scales, eff.float())
        exact = dequantize_matrix(qm).double()
        approx = unpack_nibbles(back.codes)
        from w4a16_moe.formats.fp4 import e2m1_decode

        g = qm.scheme.group_size
        deq = e2m1_decode(approx).double() * back.scales.double().repeat_interleave(g, dim=-1)
        rel = (deq - exact).abs().max() / exact.abs().max()
        assert rel < 2.0 ** -8, rel


def test_random_codes_bit_exact():
    """Arbitrary bytes (not produced by the quantizer) survive the round trip."""
    g = torch.Generator().manual_seed(1)
    from w4a16_moe.formats.schemes import get_scheme

    e, n, k = 2, 256, 256
    codes = torch.randint(0, 256, (e, n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randn(e, n, k // 32, generator=g).to(torch.bfloat16)
    qm = QuantizedMatrix(get_scheme("int4_g32"), codes, scales)
    for x, bk, inter in [(2, 128, False), (2, 64, True), (4, 256, True)]:
        back = unpack_sm90(pack_sm90(qm, m64_per_block=x, k_tile=bk, interleave_gate_up=inter))
        assert torch.equal(back.codes, codes) and torch.equal(back.scales, scales)


def test_decode_recipe_matches_fragment():
    """The kernel's register recipe, emulated bit by bit, reproduces the WGMMA A fragment."""
    e, n, k = 1, 128, 128
    qm = _random_int4(e, n, k, "int4_g32", seed=3)
    x, bk = 2, 128
    p = pack_sm90(qm, m64_per_block=x, k_tile=bk)
    w = dequantize_matrix(qm)[0]  # [N, K] fp32 (exact)
    chunk = p.data[0, 0, 0]
    words = chunk[: p.code_bytes].view(torch.int32).reshape(x, bk // 64, 128, 4)
    sc = chunk[p.code_bytes : p.code_bytes + p.scale_bytes].view(torch.bfloat16).reshape(x, 32, p.gpt, 2)
    magic = torch.tensor([0x4300], dtype=torch.int32)
    for xi in range(x):
        for c in range(bk // 64):
            for t in range(0, 128, 7):
                q = t // 4
                for j in range(4):
                    word = int(words[xi, c, t, j]) & 0xFFFFFFFF
                    for i in range(4):
                        reg = ((word >> (4 * i)) & 0x000F000F) | 0x43004300
                        for h in range(2):
                            half = (reg >> (16 * h)) & 0xFFFF
                            val = torch.tensor([half], dtype=torch.int16).view(torch.bfloat16).float() - 136.0
                            kk = c * 64 + j * 16
                            gi = kk // 32
                            s = sc[xi, q, gi, i % 2].float()
                            row, col = fragment_row_col(torch.tensor(t), torch.tensor(i), torch.tensor(h))
                            ref = w[64 * xi + int(row), kk + int(col)]
                            got = (val * s).to(torch.bfloat16).float()
                            assert got.item() == ref.to(torch.bfloat16).float().item(), (xi, c, t, j, i, h)
    del magic


def test_nibble_helpers_consistent():
    c = torch.randint(0, 16, (3, 5, 16), dtype=torch.uint8)
    assert torch.equal(unpack_nibbles(pack_nibbles(c)), c)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp4_decode_recipe_matches_fragment(scheme, dtype):
    """The kernel's E2M1 recipe (``_e2m1_pair``: shifts, masks, one packed multiply by the folded
    scale), emulated bit by bit, reproduces every weight of the fragment, rounded once."""
    e, n, k = 1, 128, 128
    qm = _random_int4(e, n, k, scheme, dtype=dtype, seed=5)
    x, bk = 2, 64
    p = pack_sm90(qm, m64_per_block=x, k_tile=bk, compute_dtype=dtype)
    w = dequantize_matrix(qm)[0].double()
    bf = dtype == torch.bfloat16
    mag_base, mag_mask = (6, 0x01C001C0) if bf else (9, 0x0E000E00)
    chunk = p.data[0, 0, 0]
    words = chunk[: p.code_bytes].view(torch.int32).reshape(x, bk // 64, 128, 4)
    sc = chunk[p.code_bytes : p.code_bytes + p.scale_bytes].view(dtype).reshape(x, 32, p.gpt, 2)

    def shift(v, s):
        return (v << s) & 0xFFFFFFFF if s >= 0 else v >> -s

    for xi in range(x):
        for t in range(0, 128, 5):
            q = t // 4
            for j in range(4):
                word = int(words[xi, 0, t, j]) & 0xFFFFFFFF
                for i in range(4):
                    reg = (shift(word, mag_base - 4 * i) & mag_mask) | (shift(word, 12 - 4 * i) & 0x80008000)
                    for h in range(2):
                        half = torch.tensor([(reg >> (16 * h)) & 0xFFFF], dtype=torch.int32).to(torch.int16)
                        raw = half.view(dtype).double()
                        kk = j * 16
                        s = sc[xi, q, kk // qm.scheme.group_size, i % 2].double()
                        got = (raw * s).to(dtype).double()  # one rounding, as mul.rn
                        row, col = fragment_row_col(torch.tensor(t), torch.tensor(i), torch.tensor(h))
                        ref = w[64 * xi + int(row), kk + int(col)]
                        tol = 2.0 ** -7 * abs(float(ref)) + 1e-30
                        assert abs(float(got) - float(ref)) <= tol, (xi, t, j, i, h, float(got), float(ref))


def test_fp4_scale_overflow_is_refused():
    from w4a16_moe.formats.schemes import get_scheme

    codes = torch.zeros(1, 64, 32, dtype=torch.uint8)
    scales = torch.full((1, 64, 2), 127 + 3, dtype=torch.uint8)  # 2**3 = 8 >= 4
    qm = QuantizedMatrix(get_scheme("mxfp4"), codes, scales)
    with pytest.raises(ValueError, match="effective group scales"):
        pack_sm90(qm, m64_per_block=1, k_tile=64, compute_dtype=torch.bfloat16)

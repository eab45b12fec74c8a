"""Weight formats: packing, quantization error bounds, exact dequantization, converter round trips."""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.formats import (
    SCHEMES,
    dequantize_matrix,
    from_compressed_tensors,
    from_modelopt_nvfp4,
    from_trtllm_per_channel,
    pack_nibbles,
    quantize_matrix,
    to_compressed_tensors,
    to_modelopt_nvfp4,
    to_trtllm_per_channel,
    unpack_nibbles,
)
from w4a16_moe.formats.fp4 import E2M1_VALUES, e2m1_decode, e2m1_encode, e8m0_decode, e8m0_encode_floor

from conftest import k_for

ALL = list(SCHEMES)
INT4 = [s for s in ALL if s.startswith("int4")]


def test_pack_unpack_round_trip():
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.shape == (3, 5, 32)
    assert torch.equal(packed[..., 0] & 0xF, codes[..., 0]) and torch.equal(packed[..., 0] >> 4, codes[..., 1])
    assert torch.equal(unpack_nibbles(packed), codes)


def test_packed_bytes_are_compressed_tensors_words():
    codes = torch.randint(0, 16, (2, 3, 16), dtype=torch.uint8)
    words = pack_nibbles(codes).view(torch.int32)
    for i in range(8):
        assert torch.equal(((words >> (4 * i)) & 0xF)[..., 0].to(torch.uint8), codes[..., i])


def test_e2m1_table_and_ties_to_even():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = e2m1_decode(codes)
    assert vals.tolist() == list(E2M1_VALUES)
    # every representable value encodes to itself (-0 -> +0 code 0)
    assert torch.equal(e2m1_decode(e2m1_encode(vals)), vals.abs() * torch.sign(vals) + 0.0)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, 100.0])
    assert e2m1_decode(e2m1_encode(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, 6.0, 6.0]


def test_e8m0():
    bits = e8m0_encode_floor(torch.tensor([-200, -127, 0, 3, 200]))
    assert bits.tolist() == [0, 0, 127, 130, 254]
    assert e8m0_decode(bits).tolist() == [2.0**-127, 2.0**-127, 1.0, 8.0, 2.0**127]
    assert torch.isnan(e8m0_decode(torch.tensor([255], dtype=torch.uint8))).all()


@pytest.mark.parametrize("scheme", ALL)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantization_error_bound(scheme, dtype):
    sch = wm.get_scheme(scheme)
    k = k_for(scheme, 256)
    torch.manual_seed(1)
    w = (torch.randn(3, 48, k) * 0.02).to(dtype)
    qm = quantize_matrix(w, scheme)
    deq = dequantize_matrix(qm)
    err = (deq - w.float()).abs()
    g = sch.group_for(k)
    if sch.kind == "int4":
        s = qm.scales.float().repeat_interleave(g, dim=-1)
        bound = (1.0 if sch.zero_point else 0.5) * s * (1 + 2**-6) + 1e-12
        assert (err <= bound).all(), (err - bound).max()
    else:
        # One E2M1 unit is at most blk/4 (MXFP4: scale = 2^floor(log2 blk) / 4; NVFP4: blk/6 before E4M3
        # rounding); rounding costs at most one unit (step 2 between 4 and 6) and MXFP4 clipping of
        # values in (6, 8) units at most (4m - 6)/(4m) * blk < blk/4.
        blk = w.float().abs().reshape(3, 48, k // g, g).amax(-1).repeat_interleave(g, -1)
        assert (err <= 0.5 * blk / 2 + 1e-12).all(), (err / blk).max()
    assert (err.norm() / w.float().norm()) < 0.15


@pytest.mark.parametrize("scheme", ALL)
def test_dequantize_matches_definition(scheme):
    """Dequantization follows the table in formats.schemes exactly (element-wise, on random codes)."""
    torch.manual_seed(2)
    k = k_for(scheme, 128)
    qm = quantize_matrix(torch.randn(2, 8, k, dtype=torch.bfloat16), scheme)
    codes = unpack_nibbles(qm.codes).long()
    n_idx, k_idx = 5, 77
    g = qm.group_size
    c = codes[1, n_idx, k_idx].item()
    s = qm.scales[1, n_idx, k_idx // g]
    sch = qm.scheme
    if sch.kind == "int4":
        z = qm.zeros[1, n_idx, k_idx // g].item() if sch.zero_point else 8
        want = (c - z) * s.float().item()
    elif sch.kind == "nvfp4":
        want = E2M1_VALUES[c] * s.float().item() * qm.global_scale[1, n_idx].item()
    else:
        want = E2M1_VALUES[c] * 2.0 ** (int(s.item()) - 127)
    assert dequantize_matrix(qm)[1, n_idx, k_idx].item() == pytest.approx(want, rel=1e-6, abs=0)


@pytest.mark.parametrize("scheme", INT4)
@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
def test_compressed_tensors_round_trip(scheme, activation):
    w = _weights(scheme, activation)
    ckpt = to_compressed_tensors(w)
    assert ckpt["w13_weight_packed"].dtype == torch.int32
    assert ckpt["w13_weight_packed"].shape == (w.num_experts, w.w13.n, w.hidden_size // 8)
    back = from_compressed_tensors(**ckpt, activation=activation)
    _assert_same(w, back)
    again = to_compressed_tensors(back)
    for key, t in ckpt.items():
        assert (t == again[key]) if not isinstance(t, torch.Tensor) else torch.equal(t, again[key]), key


def test_compressed_tensors_zero_point_layout():
    """Zero points pack eight per int32 word along N (dim 0), each stored as zp + 8 (compressed-tensors)."""
    w = _weights("int4_g32_zp", "swiglu")
    zp = to_compressed_tensors(w)["w13_weight_zero_point"]
    n = w.w13.n
    assert zp.shape == (w.num_experts, (n + 7) // 8, w.hidden_size // 32)
    assert ((zp[0, 1, 3] >> 8) & 0xF).item() == w.w13.zeros[0, 10, 3].item()


def test_compressed_tensors_signed_words_dequantize():
    torch.manual_seed(3)
    e, n, k = 2, 64, 64
    q = torch.randint(-8, 8, (e, n, k))
    scale = (torch.rand(e, n, k // 32) + 0.5).to(torch.bfloat16)
    u = (q + 8).to(torch.int64)
    packed = torch.zeros(e, n, k // 8, dtype=torch.int64)
    for i in range(8):
        packed |= u[..., i::8] << (4 * i)
    packed = ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)  # two's-complement int32 words
    w2_packed = torch.zeros(e, k, n // 8, dtype=torch.int32)
    w2_scale = torch.ones(e, k, n // 32, dtype=torch.bfloat16)
    mw = from_compressed_tensors(packed, scale, w2_packed, w2_scale, group_size=32, activation="relu2")
    want = q.float() * scale.float().repeat_interleave(32, -1)
    assert torch.equal(mw.dequantize()[0], want)


@pytest.mark.parametrize("activation", ["swiglu", "silu"])
def test_trtllm_per_channel_round_trip(activation):
    w = _weights("int4_channel", activation)
    ckpt = to_trtllm_per_channel(w)
    assert ckpt["w13_weight"].dtype == torch.int8
    assert ckpt["w13_weight"].shape == (w.num_experts, w.w13.n // 2, w.hidden_size)
    assert ckpt["w13_weight_scale"].shape == (w.num_experts, w.w13.n)
    back = from_trtllm_per_channel(**ckpt, activation=activation)
    _assert_same(w, back)
    again = to_trtllm_per_channel(back)
    for key in ckpt:
        assert torch.equal(ckpt[key], again[key]), key


def test_trtllm_nibble_order_and_sign():
    """Even output row in the low nibble, two's-complement signed values."""
    e, n, k = 1, 64, 64
    q = torch.randint(-8, 8, (e, n, k))
    scale = torch.rand(e, n, dtype=torch.float16) + 0.5
    nib = q & 0xF
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    w2 = torch.zeros(e, k // 2, n, dtype=torch.int8)
    mw = from_trtllm_per_channel(packed, scale, w2, torch.ones(e, k, dtype=torch.float16), activation="relu2")
    assert torch.equal(mw.dequantize()[0], q.float() * scale.float()[..., None])


@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
def test_modelopt_nvfp4_round_trip(activation):
    w = _weights("nvfp4", activation)
    ckpt = to_modelopt_nvfp4(w)
    assert ckpt["w13_weight"].dtype == torch.uint8 and ckpt["w13_weight_scale"].dtype == torch.float8_e4m3fn
    back = from_modelopt_nvfp4(**ckpt, activation=activation)
    _assert_same(w, back)
    again = to_modelopt_nvfp4(back)
    for key in ckpt:
        assert torch.equal(ckpt[key].view(torch.uint8) if ckpt[key].dtype == torch.float8_e4m3fn else ckpt[key],
                           again[key].view(torch.uint8) if again[key].dtype == torch.float8_e4m3fn else again[key]), key


def test_modelopt_separate_gate_up_global_scales():
    w = _weights("nvfp4", "swiglu")
    ckpt = to_modelopt_nvfp4(w)
    ckpt["w13_weight_scale_2"] = torch.stack((ckpt["w13_weight_scale_2"][:, 0], 2 * ckpt["w13_weight_scale_2"][:, 1]), 1)
    mw = from_modelopt_nvfp4(**ckpt)
    d_old, d_new = w.dequantize()[0], mw.dequantize()[0]
    i = w.intermediate_size
    assert torch.equal(d_new[:, :i], d_old[:, :i]) and torch.equal(d_new[:, i:], 2 * d_old[:, i:])


def test_weights_validation_messages():
    w = _weights("int4_g32", "swiglu")
    with pytest.raises(ValueError, match="w13: expected 64 rows for a non-gated"):
        wm.MoEWeights(w.scheme, w.w13, w.w2, gated=False)
    with pytest.raises(ValueError, match="not a multiple of 32"):
        wm.quantize_experts(torch.randn(2, 64, 48), torch.randn(2, 48, 32), "int4_g32")
    with pytest.raises(ValueError, match="unknown scheme 'int3'"):
        wm.quantize_experts(torch.randn(2, 64, 64), torch.randn(2, 64, 32), "int3")
    with pytest.raises(ValueError, match="needs 2I=64 rows"):
        wm.quantize_experts(torch.randn(2, 32, 64), torch.randn(2, 64, 32), "int4_g32")
    with pytest.raises(ValueError, match="NaN or Inf"):
        wm.quantize_experts(torch.full((2, 64, 64), float("nan")), torch.randn(2, 64, 32), "int4_g32")


def _weights(scheme, activation, e=3, h=128, i=64):
    torch.manual_seed(4)
    h = max(h, k_for(scheme)); i = max(i, k_for(scheme))
    n13 = 2 * i if wm.get_activation(activation).gated else i
    return wm.quantize_experts(torch.randn(e, n13, h, dtype=torch.bfloat16) * 0.05,
                               torch.randn(e, h, i, dtype=torch.bfloat16) * 0.05, scheme, activation=activation)


def _assert_same(a, b):
    assert a.scheme == b.scheme and a.gated == b.gated
    for ma, mb in ((a.w13, b.w13), (a.w2, b.w2)):
        for key, t in ma.tensors().items():
            u = mb.tensors()[key]
            if t is None:
                assert u is None, key
            else:
                assert t.dtype == u.dtype and torch.equal(t.view(torch.uint8), u.view(torch.uint8)), key


def test_packed_nbytes_counts_each_cached_layout_once():
    """``MoEWeights.packed_nbytes``: every cached provider layout (a packed dataclass, a tuple, the bias tables
    cached on the bias tensors), its distinct storages once, the canonical tensors it shares not at all."""
    from w4a16_moe.kernels.cute.sm90.pack import pack_sm90

    w = _weights("int4_g32", "swiglu", e=2, h=128, i=64)
    assert w.packed_nbytes() == {}
    p = w.packed_for("sm90:w13", lambda ww: pack_sm90(ww.w13, m64_per_block=2, k_tile=64,
                                                      compute_dtype=torch.bfloat16, interleave_gate_up=True))
    extra = torch.zeros(10, dtype=torch.float32)
    w.packed_for("mixed", lambda ww: (extra, {"again": extra[2:], "shared": ww.w2.scales}, [ww.w13.codes]))
    got = w.packed_nbytes()
    assert got == {"sm90:w13": p.data.untyped_storage().nbytes(), "mixed": 40}
    assert got["sm90:w13"] >= w.w13.codes.numel()  # a full copy of the 4-bit codes at least
    # the weights re-wrapped (as the torch ops do per call) see the same layouts
    again = wm.MoEWeights.trusted(w.scheme, w.w13, w.w2, w.gated)
    assert again.packed_nbytes() == got
    # bias tables live on the bias tensors
    b = torch.zeros(2, 128, dtype=torch.float32)
    wb = wm.MoEWeights(w.scheme, w.w13, w.w2, w.gated, w2_bias=b)
    from w4a16_moe.formats.weights import layout_cache

    layout_cache(b)["cute-bias:128"] = torch.zeros(2, 128, dtype=torch.float32)
    assert wb.packed_nbytes()["w2_bias:cute-bias:128"] == 2 * 128 * 4


def test_warmup_logs_the_packed_bytes(caplog):
    w = _weights("int4_g32", "swiglu", e=2, h=128, i=64)
    with caplog.at_level("INFO", logger="w4a16_moe"):
        assert wm.warmup(w, max_tokens=2, top_k=2, backend="reference")
    msg = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warmup:")]
    canonical = w.nbytes_per_expert() * w.num_experts / 1e6
    assert msg == [f"warmup: 0 packed layouts of {w} hold 0.0 MB beside its {canonical:.1f} MB of canonical tensors"]

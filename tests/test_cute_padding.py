"""CPU tests of any-shape support on the CuTe kernels (:mod:`w4a16_moe.kernels.cute.padding`).

* :func:`pad_matrix` for every scheme: the padded matrix dequantizes to the canonical weights with exact
  zeros around them (gated ``w13``: gate and up halves padded separately);
* the SM90 and warp packs of a padded matrix unpack to it (codes exactly, scales as each pack stores them),
  so the kernels see exactly-zero padded weights;
* plans: padded sizes per family and tile bucket, no padding (and the recorded plans) for aligned layers,
  the refusal reasons that name the rule.
"""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.formats.fp4 import e2m1_decode
from w4a16_moe.formats.quantize import dequantize_matrix
from w4a16_moe.formats.schemes import SCHEMES, get_scheme
from w4a16_moe.formats.weights import unpack_nibbles
from w4a16_moe.kernels.cute import provider, registry
from w4a16_moe.kernels.cute.padding import pad_cols, pad_matrix, padded_sizes, zero_code
from w4a16_moe.kernels.cute.sm90.pack import FP4_SCALE_EXP, effective_scales, pack_sm90, unpack_sm90
from w4a16_moe.kernels.cute.warp.pack import pack_warp, unpack_warp
from w4a16_moe.validate import MaskedCall, MoECall

ALL_SCHEMES = list(SCHEMES)
H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
A100 = DeviceInfo("cuda", "NVIDIA A100", (8, 0), 108)


def _layer(scheme, e, h, i, activation="swiglu", dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    gated = get_activation(activation).gated
    w13 = torch.randn(e, 2 * i if gated else i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    return wm.quantize_experts(w13.to(dtype), w2.to(dtype), scheme, activation=activation)


def _hi(scheme) -> tuple:
    """(H, I) of a small unaligned layer the scheme's group divides."""
    return (384, 640) if get_scheme(scheme).group_size == 128 else (192, 320)


def _zero_padded(w: torch.Tensor, n_pad: int, k_pad: int, halves: bool) -> torch.Tensor:
    e, n, k = w.shape
    out = torch.zeros(e, n_pad, k_pad, dtype=w.dtype)
    if halves:
        out[:, : n // 2, :k] = w[:, : n // 2]
        out[:, n_pad // 2 : n_pad // 2 + n // 2, :k] = w[:, n // 2 :]
    else:
        out[:, :n, :k] = w
    return out


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
@pytest.mark.parametrize("halves", [False, True], ids=["plain", "gated"])
def test_pad_matrix_dequantizes_to_zero_padded_weights(scheme, halves):
    w = _layer(scheme, 2, *_hi(scheme))
    for qm, hv in ((w.w13, halves), (w.w2, False)):
        n_pad, k_pad = qm.n + 128, qm.k + 64 * (2 if get_scheme(scheme).group_size == 128 else 1)
        p = pad_matrix(qm, n_pad, k_pad, halves=hv)
        p.validate("padded")
        assert (p.n, p.k) == (n_pad, k_pad)
        assert torch.equal(dequantize_matrix(p), _zero_padded(dequantize_matrix(qm), n_pad, k_pad, hv))
        # the padded codes are the scheme's zero-valued code
        codes = unpack_nibbles(p.codes)
        assert (codes[:, :, qm.k:] == zero_code(qm.scheme)).all()
    assert pad_matrix(w.w2, w.w2.n, w.w2.k) is w.w2


def test_pad_matrix_errors():
    w = _layer("int4_g128", 1, 256, 256)
    with pytest.raises(ValueError, match="not a multiple of the group size 128"):
        pad_matrix(w.w2, 256, 320)
    with pytest.raises(ValueError, match="cannot pad"):
        pad_matrix(w.w2, 128, 256)


def _sm90_weights(back, scheme) -> torch.Tensor:
    """FP32 weights the SM90 kernels compute from an unpacked SM90 layout."""
    if scheme.kind == "int4":
        return dequantize_matrix(back)
    codes = unpack_nibbles(back.codes).float()
    e, n, k = codes.shape
    g = scheme.group_size
    return (e2m1_decode(codes.to(torch.uint8).reshape(e, n, k // g, g)) * back.scales[..., None]).reshape(e, n, k)


# (X, BK, interleave) of the SM90 layouts the provider's buckets and the decode kernels read
SM90_LAYOUTS = [(2, 64, True), (2, 128, True), (4, 64, True), (4, 128, True), (2, 128, False), (4, 64, False)]


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_sm90_pack_of_padded_matrix(scheme, dtype):
    sch = get_scheme(scheme)
    h, i = _hi(scheme)
    w = _layer(scheme, 2, h, i, dtype=dtype, seed=3)  # neither aligned
    for x, bk, inter in SM90_LAYOUTS:
        qm = w.w13 if inter else w.w2
        rows = 64 * x
        if inter:
            ip = -(-i // (rows // 2)) * (rows // 2)
            n_pad = 2 * ip
        else:
            n_pad = -(-qm.n // rows) * rows
        k_pad = -(-qm.k // max(bk, sch.group_size or 1)) * max(bk, sch.group_size or 1)
        pad = pad_matrix(qm, n_pad, k_pad, halves=inter)
        p = pack_sm90(pad, m64_per_block=x, k_tile=bk, compute_dtype=dtype, interleave_gate_up=inter,
                      experts_per_pass=1)
        assert (p.n, p.k) == (n_pad, k_pad)
        back = unpack_sm90(p)
        assert torch.equal(back.codes, pad.codes), (x, bk, inter)
        got = _sm90_weights(back, sch)
        want = _zero_padded(dequantize_matrix(qm), n_pad, k_pad, inter)
        assert torch.equal(got == 0, want == 0) or sch.kind != "int4"
        if sch.kind == "int4" and qm.scales.dtype == dtype:
            assert torch.equal(got, want)
        else:
            eff = effective_scales(pad, dtype) if sch.kind != "int4" else None
            assert torch.allclose(got, want, rtol=2**-7, atol=0), (x, bk, inter)
            if eff is not None:
                assert torch.equal(back.scales, (eff.double() * 2.0 ** -FP4_SCALE_EXP[dtype]).float())
        # the padding is exact zeros, whatever the scheme
        pad_mask = _zero_padded(torch.ones_like(want[:, : qm.n, : qm.k]), n_pad, k_pad, inter) == 0
        assert (got[pad_mask] == 0).all()


WARP_LAYOUTS = [(4, 2, 128, True), (4, 2, 64, True), (4, 2, 128, False), (4, 2, 64, False)]


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_warp_pack_of_padded_matrix(scheme, dtype):
    sch = get_scheme(scheme)
    h, i = _hi(scheme)
    w = _layer(scheme, 2, h, i, dtype=dtype, seed=4)
    for wp, mw, bk, inter in WARP_LAYOUTS:
        qm = w.w13 if inter else w.w2
        rb = 16 * wp * mw
        if inter:
            n_pad = 2 * (-(-i // (rb // 2)) * (rb // 2))
        else:
            n_pad = -(-qm.n // rb) * rb
        m = max(bk, sch.group_size or 1)
        k_pad = -(-qm.k // m) * m
        pad = pad_matrix(qm, n_pad, k_pad, halves=inter)
        p = pack_warp(pad, warps=wp, m16_per_warp=mw, k_tile=bk, compute_dtype=dtype, interleave_gate_up=inter)
        back = unpack_warp(p)
        assert torch.equal(back.codes, pad.codes)
        want = _zero_padded(dequantize_matrix(qm), n_pad, k_pad, inter)
        got = dequantize_matrix(back)
        if qm.scales.dtype == dtype or sch.kind != "int4":
            assert torch.equal(got, want), (wp, mw, bk, inter)
        pad_mask = _zero_padded(torch.ones_like(want[:, : qm.n, : qm.k]), n_pad, k_pad, inter) == 0
        assert (got[pad_mask] == 0).all()


def test_pad_cols():
    x = torch.randn(3, 192)
    assert pad_cols(x, 192) is x
    y = pad_cols(x, 256)
    assert y.shape == (3, 256) and torch.equal(y[:, :192], x) and (y[:, 192:] == 0).all()


# ----------------------------------------------------------------------------------------------------------
# plans
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def _kernels_anywhere(monkeypatch):
    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    for v in ("W4A16_MOE_CUTE_DECODE", "W4A16_MOE_BATCH_INVARIANT", "W4A16_MOE_CUTE_FAMILY"):
        monkeypatch.delenv(v, raising=False)
    provider.clear_plans()
    yield
    provider.clear_plans()


def _call(tokens, h, i, scheme="int4_g32", activation="swiglu", finalize="deterministic", e=32, k=4,
          dtype=torch.bfloat16):
    return MoECall(tokens, k, h, i, e, dtype, torch.device("cuda"), get_activation(activation), finalize, 0, scheme)


def _check_padded(p, call):
    fam = registry.get(p.family)
    up, down = p.configs
    hp, ip = p.pad or (call.hidden, call.intermediate)
    gated = call.activation.gated
    n13 = 2 * ip if gated else ip
    rows_up, rows_down = fam.rows_per_cta(up), fam.rows_per_cta(down)
    assert hp >= call.hidden and ip >= call.intermediate
    assert hp % up.k_tile == 0 and hp % rows_down == 0
    assert ip % down.k_tile == 0 and (ip % (rows_up // 2) == 0 if gated else n13 % rows_up == 0)
    g = get_scheme(call.scheme).group_size or 1
    assert hp % g == 0 and ip % g == 0
    # at most one tile of padding (what bounds the extra cost against the next aligned size)
    assert hp - call.hidden < max(up.k_tile, rows_down, g) and ip - call.intermediate < 256
    return hp, ip


SHAPES = [(2880, 2880), (2688, 1856), (192, 320), (128, 64), (3008, 1984), (1024, 384)]


@pytest.mark.parametrize("h,i", SHAPES)
@pytest.mark.parametrize("tokens", [1, 4, 24, 200, 2048])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_plans_pad_to_the_kernels_tiles(_kernels_anywhere, h, i, tokens, finalize):
    for scheme in ("int4_g32", "int4_channel", "nvfp4"):
        for act in ("swiglu", "relu2"):
            call = _call(tokens, h, i, scheme, act, finalize)
            p = provider.plan(call, H200)
            hp, ip = _check_padded(p, call)
            assert bool(p.pad) == ((hp, ip) != (h, i))
            if p.pad:
                assert "padded to H" in p.describe()


def test_plan_families_pad(_kernels_anywhere, monkeypatch):
    call = _call(2, 2880, 2880)
    assert provider.plan(call, H200).decode  # small calls: the decode kernels
    assert provider.plan(call, H200).pad == (3072, 2880)  # down rows 256 (x4); gate/up 64 rows per half, BK 64
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    provider.clear_plans()
    p = provider.plan(call, H200)
    assert p.family == "sm90" and not p.decode
    _check_padded(p, call)
    monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", "warp")
    provider.clear_plans()
    p = provider.plan(call, H200)
    assert p.family == "warp" and p.pad == (2944, 2944)  # 128-row blocks, BK 128
    assert provider.plan(_call(2, 2880, 2880), A100).family == "warp"
    masked = MaskedCall(8, 64, 2688, 1856, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                        "int4_g64")
    monkeypatch.delenv("W4A16_MOE_CUTE_FAMILY")
    provider.clear_plans()
    _check_padded(provider.plan(masked, H200), masked)


def test_aligned_layers_are_not_padded(_kernels_anywhere):
    for h, i in ((2048, 768), (4096, 1536), (7168, 2048), (1024, 256)):
        for tokens in (1, 8, 64, 512, 4096):
            for fin in ("deterministic", "fused"):
                assert provider.plan(_call(tokens, h, i, finalize=fin), H200).pad == ()


def test_padded_sizes_helper():
    from w4a16_moe.kernels.cute.sm90 import family as sm90

    up, down = sm90.gemm_configs(get_scheme("int4_g128"), "bf16", "swiglu", True, "deterministic",
                                 sm90.TILES[-1][1])  # X 4, BK 64
    assert padded_sizes(sm90.DESCRIPTOR, up, down, 2688, 1856, True, get_scheme("int4_g128")) == (2816, 1920)
    assert padded_sizes(sm90.DESCRIPTOR, up, down, 2816, 1920, True, get_scheme("int4_g128")) == (2816, 1920)


@pytest.mark.parametrize("h,i,scheme,match", [
    (2880, 2880, "int4_g128", "hidden size H = 2880 is not a multiple of the group size 128"),
    (2048, 1856, "int4_g128", "intermediate size I = 1856 is not a multiple of the group size 128"),
    (96, 256, "int4_g32", "hidden size H = 96 is not a multiple of 64"),
    (256, 160, "int4_g32", "intermediate size I = 160 is not a multiple of 64"),
])
def test_refusals_name_the_rule(_kernels_anywhere, h, i, scheme, match):
    why = provider.unavailable_reason(_call(8, h, i, scheme), H200)
    assert why is not None and match in why and "provider cute" in why

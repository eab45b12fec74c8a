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
    w = _layer(scheme, 1, h, i, dtype=dtype, seed=3)  # neither aligned
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
    w = _layer(scheme, 1, h, i, dtype=dtype, seed=4)
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


SHAPES = [(2880, 2880), (2688, 1856), (192, 320), (128, 64), (3008, 1984), (1024, 384),
          # multiples of 32, not of 64: gpt-oss at TP 2, Qwen3-30B-A3B and Phi-3.5-MoE at TP 8, a small odd layer
          (2880, 1440), (2048, 96), (4096, 800), (1056, 160)]


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
    assert p.family == "warp" and not p.decode  # the rule's smallest bucket: the warp-MMA tiles
    _check_padded(p, call)
    monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", "sm90")
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
    (1040, 256, "int4_g32", "hidden size H = 1040 is not a multiple of the group size 32"),
    (100, 256, "int4_channel", "hidden size H = 100 is not a multiple of 8"),
    (256, 164, "int4_channel", "intermediate size I = 164 is not a multiple of 8"),
])
def test_refusals_name_the_rule(_kernels_anywhere, h, i, scheme, match):
    why = provider.unavailable_reason(_call(8, h, i, scheme), H200)
    assert why is not None and match in why and "provider cute" in why


@pytest.mark.parametrize("h,i,scheme", [(96, 256, "int4_g32"), (256, 160, "int4_g32"), (1040, 176, "nvfp4"),
                                        (1000, 200, "int4_channel"), (2880, 1440, "mxfp4")])
def test_every_size_the_weights_allow_runs(_kernels_anywhere, h, i, scheme):
    """The CuTe rule is the weights' own (multiples of 8 and of the group): every such layer gets a padded plan."""
    for tokens in (1, 24, 2048):
        call = _call(tokens, h, i, scheme)
        assert provider.unavailable_reason(call, H200) is None
        p = provider.plan(call, H200)
        hp, ip = _check_padded(p, call)
        assert p.pad == (hp, ip) != (h, i)


# ----------------------------------------------------------------------------------------------------------
# the provider's buffers and launch sizes on padded plans, with the kernels emulated in torch
# ----------------------------------------------------------------------------------------------------------
def _unpacked_weights(packed) -> torch.Tensor:
    """FP32 ``[E, n, k]`` weights (padded, canonical row order) a packed layout holds."""
    from w4a16_moe.kernels.cute.sm90.pack import Sm90PackedMatrix

    if isinstance(packed, Sm90PackedMatrix):
        return _sm90_weights(unpack_sm90(packed), packed.scheme)
    return dequantize_matrix(unpack_warp(packed))


class _Emulator:
    """Stands in for ``provider._run_kernel``: checks that every launch's buffers have the row strides its
    ``n`` / ``k`` scalars imply (what the kernels address them with) and computes what the kernel writes."""

    def __init__(self, weights, activation):
        from w4a16_moe.formats.weights import layout_cache

        self.layouts = layout_cache(weights.w13.codes)
        self.act = get_activation(activation)
        self.launches = []

    def _packed(self, data):
        return next(p for p in self.layouts.values() if p.data is data)

    def __call__(self, family, arch, cfg, tensors, scalars):
        from w4a16_moe.activations import apply_activation

        packed = self._packed(tensors[0])
        wts = _unpacked_weights(packed)
        src, dst = tensors[1], tensors[2]
        e_n, n, k = scalars[:3]
        assert (packed.n, packed.k) == (n, k), (packed.n, packed.k, n, k)
        assert src.is_contiguous() and src.shape[-1] == k, (tuple(src.shape), k)  # act row stride = k
        gated = cfg.mode == "gate_up" and self.act.gated
        assert dst.is_contiguous() and dst.shape[-1] == (n // 2 if gated else n), (tuple(dst.shape), n)
        self.launches.append((family.name, cfg.mode, n, k))
        s2 = src.reshape(-1, k).float()
        d2 = dst.view(-1, dst.shape[-1])

        def mlp(ex, rows):
            v = rows @ wts[ex].T
            return apply_activation(v, self.act) if cfg.mode == "gate_up" else v

        if family.name == "decode":
            ids, tw = tensors[3], tensors[6]
            r, top_k, off = scalars[3], scalars[4], scalars[5]
            flat = ids.reshape(-1).long() - off
            if cfg.mode == "gate_up":
                for route in range(r):
                    if 0 <= flat[route] < e_n:
                        d2[route] = mlp(flat[route], s2[route // top_k][None])[0].to(d2.dtype)
            else:
                acc = torch.zeros(d2.shape, dtype=torch.float32)
                for route in range(r):
                    if 0 <= flat[route] < e_n:
                        acc[route // top_k] += tw.reshape(-1)[route] * mlp(flat[route], s2[route][None])[0]
                d2.copy_(acc)
            return
        sorted_routes, route_start, tw = tensors[3], tensors[4], tensors[6]
        top_k = scalars[4]
        for ex in range(e_n):
            for slot in range(int(route_start[ex]), int(route_start[ex + 1])):
                route = int(sorted_routes[slot])
                if cfg.mode == "gate_up":
                    d2[slot] = mlp(ex, s2[route // top_k][None])[0].to(d2.dtype)
                elif cfg.epilogue == "y":
                    d2[route] = mlp(ex, s2[slot][None])[0].to(d2.dtype)
                else:
                    d2[route // top_k] += float(tw.reshape(-1)[route]) * mlp(ex, s2[slot][None])[0]


def _torch_routes(ids, num_experts, expert_offset, block_m, zeroed=0):
    from w4a16_moe.kernels.routing.prepare import RoutePlan

    flat = ids.reshape(-1).long() - expert_offset
    ok = (flat >= 0) & (flat < num_experts)
    order = torch.argsort(torch.where(ok, flat, num_experts), stable=True)[: int(ok.sum())]
    counts = torch.bincount(flat[ok], minlength=num_experts)
    start = torch.zeros(num_experts + 1, dtype=torch.int32)
    start[1:] = counts.cumsum(0)
    blocks = torch.zeros(num_experts + 1, dtype=torch.int32)
    blocks[1:] = (-(-counts // block_m)).cumsum(0)
    return RoutePlan(order.to(torch.int32), start, blocks, start, int(blocks[-1]), block_m,
                     torch.zeros(max(zeroed, 1), dtype=torch.int32))


def _torch_finalize(ybuf, topk_weights, out, *, topk_ids, num_experts, expert_offset):
    t, h = out.shape
    y = ybuf[:, :h].float().view(t, -1, h)  # the finalize reads H columns through the row stride
    valid = (topk_ids >= expert_offset) & (topk_ids < expert_offset + num_experts)
    out.copy_(torch.where(valid[..., None], topk_weights[..., None] * y, 0.0).sum(1))


@pytest.mark.parametrize("path", ["decode", "sm90", "warp"])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("scheme,activation", [("int4_g32", "swiglu"), ("nvfp4", "relu2"),
                                               ("int4_g64_zp", "swiglu")])
def test_padded_execution_emulated(_kernels_anywhere, monkeypatch, path, finalize, scheme, activation):
    from w4a16_moe.kernels.routing import finalize as fin_mod, prepare as prep_mod

    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "1" if path == "decode" else "0")
    if path in ("warp", "sm90"):  # the family under test (auto would pick warp for this small call)
        monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", path)
    provider.clear_plans()
    h, i, e, t, k = 192, 320, 4, 5, 2
    w = _layer(scheme, e, h, i, activation=activation, seed=7)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e + 2, generator=g)[:k] for _ in range(t)]).to(torch.int32) - 1  # some invalid
    tw = torch.softmax(torch.randn(t, k, generator=g), 1)
    call = MoECall(t, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation(activation), finalize, 0,
                   scheme)
    p = provider.plan(call, H200)
    assert p.pad and p.decode == (path == "decode") and p.family == ("decode" if path == "decode" else path)
    emu = _Emulator(w, activation)
    monkeypatch.setattr(provider, "_run_kernel", emu)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(prep_mod, "prepare_routes", _torch_routes)
    monkeypatch.setattr(fin_mod, "launch_finalize", _torch_finalize)
    out = torch.full((t, h), float("nan"), dtype=torch.bfloat16)
    provider.cute_fused_moe(x, w, tw, ids, call=call, out=out, plan=p)
    hp, ip = p.pad
    n13 = 2 * ip if get_activation(activation).gated else ip
    assert [(n, kk) for _, _, n, kk in emu.launches] == [(n13, hp), (hp, ip)]
    ref = wm.reference_moe(x, w, tw, ids, activation=activation)
    assert not torch.isnan(out).any()
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 0.02, err


def test_finalize_stride_and_pad_copy_in_the_interpreter():
    """The Triton finalize in the interpreter: a ``[T*k, Hp]`` y gives what its ``[:, :H]`` copy gives; the
    one-launch padded copy of x."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from w4a16_moe.kernels.routing.finalize import launch_finalize
        y = torch.randn(6, 128, dtype=torch.float16)
        tw = torch.softmax(torch.randn(3, 2), 1)
        ids = torch.tensor([[0, 1], [2, -1], [1, 3]], dtype=torch.int32)
        a, b = torch.empty(3, 96, dtype=torch.float16), torch.empty(3, 96, dtype=torch.float16)
        launch_finalize(y, tw, a, topk_ids=ids, num_experts=4)
        launch_finalize(y[:, :96].contiguous(), tw, b, topk_ids=ids, num_experts=4)
        assert torch.equal(a, b)
        from w4a16_moe.kernels.cute.pad_copy import pad_copy
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(3, 5, 192).to(dt)
            z = pad_copy(x, 256)
            assert z.shape == (3, 5, 256) and torch.equal(z[..., :192], x) and (z[..., 192:] == 0).all()
            x = torch.randn(2, 2880).to(dt)
            z = pad_copy(x, 3072)
            assert torch.equal(z[:, :2880], x) and (z[:, 2880:] == 0).all()
    """)
    import os

    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def _torch_masked_routes(masked_m, cap, block_m, out, zeroed=0):
    from w4a16_moe.kernels.routing.prepare import RoutePlan

    e = masked_m.numel()
    m = masked_m.long().clamp(0, cap)
    rows = torch.cat([ex * cap + torch.arange(int(m[ex])) for ex in range(e)]).to(torch.int32)
    start = torch.zeros(e + 1, dtype=torch.int32)
    start[1:] = m.cumsum(0)
    blocks = torch.zeros(e + 1, dtype=torch.int32)
    blocks[1:] = (-(-m // block_m)).cumsum(0)
    for ex in range(e):
        out[ex, int(m[ex]):] = 0
    return RoutePlan(rows, start, blocks, start, int(blocks[-1]), block_m,
                     torch.zeros(max(zeroed, 1), dtype=torch.int32))


def test_padded_masked_and_expert_routes_emulated(_kernels_anywhere, monkeypatch):
    from w4a16_moe.kernels.routing import prepare as prep_mod
    from w4a16_moe.validate import MaskedCall

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(prep_mod, "prepare_masked_routes", _torch_masked_routes)
    monkeypatch.setattr(prep_mod, "prepare_routes", _torch_routes)
    h, i, e, cap = 192, 320, 3, 4
    w = _layer("int4_g32", e, h, i, seed=9)
    g = torch.Generator().manual_seed(10)
    x = torch.randn(e, cap, h, generator=g).to(torch.bfloat16)
    m = torch.tensor([4, 0, 2], dtype=torch.int32)
    call = MaskedCall(e, cap, h, i, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"), "int4_g32")
    p = provider.plan(call, H200)
    assert p.pad
    emu = _Emulator(w, "swiglu")
    monkeypatch.setattr(provider, "_run_kernel", emu)
    out = torch.full_like(x, float("nan"))
    provider.cute_fused_moe_masked(x, w, m, call=call, out=out, plan=p)
    ref = wm.reference_moe_masked(x, w, m)
    assert not torch.isnan(out).any() and (out[1] == 0).all() and (out[2, 2:] == 0).all()
    assert ((out.float() - ref.float()).norm() / ref.float().norm()).item() < 0.02
    # expert-parallel halves: y [T, k, H] of every valid route
    t, k = 4, 2
    xt = torch.randn(t, h, generator=g).to(torch.bfloat16)
    ids = torch.tensor([[0, 2], [1, -1], [2, 0], [1, 2]], dtype=torch.int32)
    rcall = MoECall(t, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"), "deterministic",
                    0, "int4_g32", True)
    rp = provider.plan(rcall, H200)
    assert rp.pad and not rp.decode
    y, valid = provider.cute_expert_routes(xt, w, ids, call=rcall, plan=rp)
    assert y.shape == (t, k, h) and y.is_contiguous()
    ones = torch.ones(t, k)
    for tt in range(t):
        for j in range(k):
            if valid[tt, j]:
                one = torch.zeros(1, k, dtype=torch.int32) - 1
                one[0, 0] = ids[tt, j]
                want = wm.reference_moe(xt[tt : tt + 1], w, ones[:1], one)[0]
                assert ((y[tt, j].float() - want.float()).norm() / want.float().norm()) < 0.02

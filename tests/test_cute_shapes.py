"""Any layer shape on the CuTe kernels (padded plans, :mod:`w4a16_moe.kernels.cute.padding`), on the GPU.

A fuzz over random ``(H, I)`` multiples of 64 in ``[128, 3072]`` (plus gpt-oss 2880/2880 and the
Nemotron-style 2688/1856) through the three CuTe families: the route-major decode kernels
(``W4A16_MOE_CUTE_DECODE=1``), the SM90 WGMMA grouped GEMMs (``W4A16_MOE_CUTE_DECODE=0``) and the portable
warp family (``W4A16_MOE_CUTE_FAMILY=warp``), both finalize modes, BF16 and FP16, several schemes; every
output poisoned with NaN first, NRMSE < 0.02 against ``reference_moe``. Then sizes that are multiples of 8 or
16 but not of 64 (tensor-parallel shards: gpt-oss's ``I = 1440`` at TP 2 with its biases and ``swiglu_oai``,
Qwen3-30B-A3B's ``I = 96`` at TP 8, Phi-3.5-MoE's ``I = 800`` at TP 8, NVFP4 and per-channel layers with odd
``H``) on every path. Also the masked layout and the expert-parallel halves on padded layers.

Kernels it needs (all in the ``full`` AOT subset, no tuner-only candidate is forced): the rule's tile
buckets of the SM90 family for 2..8 and 40 routes per expert (TN 8 / 16 and TN 64; the masked case TN 16) and
of the warp family (TN 8, 64), the default decode knob set, for the schemes and dtypes the cases list, SwiGLU
(and relu2 in a few cases).
"""

from __future__ import annotations

import random

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.providers import select_provider
from w4a16_moe.routes import combine_routes, expert_routes
from w4a16_moe.validate import check_moe_call

from conftest import HAS_CUDA, nrmse, random_routing, random_weights, run_cute_moe, with_biases

SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")]

TOL = 0.02
PATHS = ("decode", "sm90", "warp")


def _cases():
    rng = random.Random(18)
    shapes = [(2880, 2880), (2688, 1856)]
    while len(shapes) < 30:
        s = (64 * rng.randint(2, 48), 64 * rng.randint(2, 48))
        if s not in shapes:
            shapes.append(s)
    out = []
    for n, (h, i) in enumerate(shapes):
        schemes = ["int4_g32", "int4_g64_zp", "nvfp4", "mxfp4", "int4_channel"]
        if h % 128 == 0 and i % 128 == 0:
            schemes.append("int4_g128")
        scheme = schemes[n % len(schemes)]
        dtype = (torch.bfloat16, torch.float16)[n % 2]
        finalize = ("deterministic", "fused")[(n // 2) % 2]
        activation = "relu2" if n % 7 == 3 else "swiglu"
        paths = PATHS if n < 2 else (PATHS[n % 3],)  # the two named shapes on every path
        for path in paths:
            out.append(pytest.param(h, i, scheme, dtype, finalize, activation, path,
                                    id=f"{h}x{i}-{scheme}-{str(dtype)[6:]}-{finalize[:3]}-{activation}-{path}"))
    return out


def _set_path(monkeypatch, path):
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "1" if path == "decode" else "0")
    if path in ("warp", "sm90"):  # the family under test (auto picks warp-MMA tiles for the smallest calls)
        monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", path)
    else:
        monkeypatch.delenv("W4A16_MOE_CUTE_FAMILY", raising=False)


@pytest.mark.parametrize("h,i,scheme,dtype,finalize,activation,path", _cases())
def test_any_shape(monkeypatch, h, i, scheme, dtype, finalize, activation, path):
    _set_path(monkeypatch, path)
    e = 8
    w = random_weights(scheme, e, h, i, activation=activation, dtype=dtype, device="cuda", seed=h + i)
    for t, k in ((2, 4),) if path == "decode" else ((3, 4), (80, 4)):  # 80 x 4 over 8 experts: TN 64 buckets

        def on_path(x, tw, ids):
            call = check_moe_call(x, w, tw, ids, activation=activation, finalize=finalize)
            d = select_provider(call, "cute")
            assert d.provider == "cute" and d.plan.decode == (path == "decode"), d.plan.describe()
            assert d.plan.family == ("decode" if path == "decode" else path)
            if (h, i) == (2880, 2880):
                assert d.plan.pad, d.plan.describe()  # 2880 is not a multiple of 128: every path pads H

        run_cute_moe(w, t, k, dtype=dtype, activation=activation, finalize=finalize, tol=TOL, check_path=on_path,
                     seed=t)


#: (H, I, scheme, activation, biases): sizes that are multiples of the scheme's group (and of 8), not of 64
SHARDS = [
    (2880, 1440, "mxfp4", "swiglu_oai", True),  # gpt-oss-120b / -20b at TP 2
    (2048, 96, "int4_g32", "swiglu", False),  # Qwen3-30B-A3B at TP 8
    (4096, 800, "int4_g32_zp", "swiglu", False),  # Phi-3.5-MoE at TP 8
    (1040, 176, "nvfp4", "swiglu", False),  # H and I multiples of 16 only
    (1000, 200, "int4_channel", "relu2", False),  # multiples of 8 only, non-gated
]


def _shard_cases():
    # the decode kernels implement no biases (a call with biases never takes them: test_cute_gpt_oss.py)
    return [pytest.param(*s, dtype, path, id=f"{s[0]}x{s[1]}-{s[2]}-{str(dtype)[6:]}-{path}")
            for s in SHARDS for dtype in (torch.bfloat16, torch.float16) for path in PATHS
            if not (s[4] and path == "decode")]


@pytest.mark.parametrize("h,i,scheme,activation,bias,dtype,path", _shard_cases())
def test_shards_not_multiples_of_64(monkeypatch, h, i, scheme, activation, bias, dtype, path):
    _set_path(monkeypatch, path)
    w = random_weights(scheme, 8, h, i, activation=activation, dtype=dtype, device="cuda", seed=h + i)
    if bias:
        w = with_biases(w)
    for t, k, fin in ((2, 4, "deterministic"),) if path == "decode" else ((3, 4, "fused"), (80, 4, "deterministic")):

        def on_path(x, tw, ids):
            call = check_moe_call(x, w, tw, ids, activation=activation, finalize=fin)
            d = select_provider(call, "auto")
            assert d.provider == "cute" and d.plan.decode == (path == "decode"), d.plan.describe()
            assert d.plan.family == ("decode" if path == "decode" else path)
            hp, ip = d.plan.pad
            assert hp >= h and ip > i and ip - i < 256 and hp - h < 256, d.plan.describe()

        run_cute_moe(w, t, k, dtype=dtype, activation=activation, finalize=fin, tol=TOL, check_path=on_path, seed=t)


#: (H, I, scheme, tokens): gated layers of ``I % 128 == 64``, where the cost model's warp TN 8 / 16 tiles take K tile 64
#: and run the layer unpadded (warp.family.K64_TILES; 64 experts, top-8)
K64_LAYERS = [(2048, 192, "int4_g32", 4), (2048, 192, "int4_g32", 16), (2048, 192, "int4_g32", 64),
              (2048, 320, "int4_g64_zp", 16)]


@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("h,i,scheme,t", K64_LAYERS)
def test_warp_k64_twins_run_unpadded(monkeypatch, h, i, scheme, t, finalize):
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    monkeypatch.delenv("W4A16_MOE_CUTE_FAMILY", raising=False)
    w = random_weights(scheme, 64, h, i, device="cuda", seed=h + i)

    def on_path(x, tw, ids):
        d = select_provider(check_moe_call(x, w, tw, ids, finalize=finalize), "cute")
        p = d.plan
        assert p.family == "warp" and not p.pad and [c.k_tile for c in p.configs] == [64, 64], p.describe()
        assert p.configs[0].tokens_per_tile in (8, 16), p.describe()

    run_cute_moe(w, t, 8, finalize=finalize, tol=TOL, check_path=on_path, seed=t)
    # the one warp layout of each matrix it packed, each at least the 4-bit codes (MoEWeights.packed_nbytes)
    held = {k: v for k, v in w.packed_nbytes().items() if k.startswith("cute-warp:")}
    assert sorted(k.split(":")[1] for k in held) == ["w13", "w2"] and all(":k64:" in k for k in held), held
    assert held[next(k for k in held if ":w13:" in k)] >= w.w13.codes.numel(), held
    assert held[next(k for k in held if ":w2:" in k)] >= w.w2.codes.numel(), held


@pytest.mark.parametrize("path", PATHS)
def test_padded_layers_launch_no_triton_kernel(monkeypatch, path):
    """With the CuTe routing family (what a prebuilt wheel has), a padded plan's activation copy and its
    deterministic finalize are CuTe kernels too: the Triton ones, patched to fail, are never called."""
    import w4a16_moe.kernels.cute.pad_copy as triton_pad
    import w4a16_moe.kernels.routing.finalize as triton_finalize

    def fail(*args, **kwargs):
        raise AssertionError("a Triton kernel was launched")

    monkeypatch.setenv("W4A16_MOE_ROUTING", "cute")
    monkeypatch.setattr(triton_pad, "pad_copy", fail)
    monkeypatch.setattr(triton_finalize, "launch_finalize", fail)
    _set_path(monkeypatch, path)
    w = random_weights("mxfp4", 8, 2880, 1440, dtype=torch.bfloat16, device="cuda", seed=3)
    for t in ((2,) if path == "decode" else (3, 80)):

        def padded(x, tw, ids):
            d = select_provider(check_moe_call(x, w, tw, ids), "cute")
            assert d.plan.pad and d.plan.pad[0] > 2880 and d.plan.family == path, d.plan.describe()

        run_cute_moe(w, t, 4, tol=TOL, check_path=padded, seed=t)
    if path == "sm90":  # the masked layout's plans (SM90 tiles)
        x = torch.randn(8, 16, 2880, device="cuda").to(torch.bfloat16)
        m = torch.tensor([0, 1, 16, 7, 9, 3, 2, 8], dtype=torch.int32, device="cuda")
        out = wm.fused_moe_masked(x, w, m, backend="cute")
        live = torch.arange(16, device="cuda")[None, :] < m[:, None]
        assert nrmse(out[live], wm.reference_moe_masked(x, w, m)[live]) < TOL


@pytest.mark.parametrize("h,i", [(2880, 2880), (2688, 1856), (2048, 96)])
def test_masked_and_expert_routes_padded(monkeypatch, h, i):
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    w = random_weights("int4_g64" if i % 64 == 0 else "int4_g32", 8, h, i, dtype=torch.bfloat16, device="cuda", seed=5)
    cap, masked = 16, [0, 1, 16, 7, 9, 99, -3, 8]
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(8, cap, h, generator=g).to(torch.bfloat16).cuda()
    m = torch.tensor(masked, dtype=torch.int32, device="cuda")
    out = wm.fused_moe_masked(x, w, m, backend="cute")
    ref = wm.reference_moe_masked(x, w, m)
    live = torch.zeros(8, cap, dtype=torch.bool)
    for ex, v in enumerate(masked):
        live[ex, : max(0, min(v, cap))] = True
    live = live.cuda()
    assert torch.isfinite(out).all() and torch.equal(out[~live], torch.zeros_like(out[~live]))
    assert nrmse(out[live], ref[live]) < TOL
    # expert-parallel halves: routes, then the combine, equal the fused call bit for bit
    xt = torch.randn(5, h, generator=g).to(torch.bfloat16).cuda()
    tw, ids = random_routing(5, 4, 8, device="cuda")
    y, valid = expert_routes(xt, w, ids, activation="swiglu", backend="cute")
    assert y.shape == (5, 4, h)
    comb = combine_routes(y, tw, valid, torch.bfloat16)
    full = wm.fused_moe(xt, w, tw, ids, backend="cute")
    assert torch.equal(comb, full)

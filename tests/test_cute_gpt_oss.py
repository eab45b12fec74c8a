"""gpt-oss experts on the CuTe provider: per-expert biases and the clamped ``swiglu_oai`` activation.

CPU: plans of gpt-oss-shaped calls (E=128, H=I=2880, top-4, MXFP4, biases, swiglu_oai) go to the decode
kernels where the decode rule sends them (1-2 tokens) and to the rule's grouped family beyond (never Triton);
the per-family feature reasons; the new config fields in
spec names and their round trip; the AOT ``full`` subset holds what those plans select; the bias tables the
kernels read (padded, un-interleaved) and the fused finalize's bias accumulator; one sm_90a compile of a
bias + swiglu_oai gate/up kernel and a bias down kernel (and one warp-MMA one).

GPU (marker ``gpu``, SM90): every case poisons the output with NaN, checks it against the FP32 reference
(NRMSE < 0.02, the other CuTe tests' tolerance) and asserts the plan (the decode kernels where the rule sends
the call, else the CuTe grouped family); the decode kernels' biases are also forced over the scheme, bias,
activation and grid matrix.
"""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.activations import get_activation, swiglu_oai
from w4a16_moe.device import DeviceInfo
from w4a16_moe.formats.schemes import get_scheme
from w4a16_moe.kernels.cute import overrides, provider, registry
from w4a16_moe.kernels.cute.decode import family as dec
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.warp import family as warp_fam
from w4a16_moe.providers import select_provider
from w4a16_moe.validate import MaskedCall, MoECall, check_masked_call, check_moe_call

from conftest import HAS_CUDA, nrmse, random_routing, random_weights, run_cute_moe, with_biases

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
OAI = "swiglu_oai"
OAI_CUSTOM = swiglu_oai(alpha=1.5, limit=2.0).name
TOL = 0.02


# ----------------------------------------------------------------------------------------------------------
# CPU: plans, reasons, specs, AOT
# ----------------------------------------------------------------------------------------------------------
def _oss_call(tokens, finalize="deterministic", activation=OAI, bias=True, e=128, routes_only=False):
    return MoECall(tokens, 4, 2880, 2880, e, torch.bfloat16, torch.device("cuda"), get_activation(activation),
                   finalize, 0, "mxfp4", routes_only, bias)


def _rule_family(tokens, top_k, experts, scheme="mxfp4"):
    return fam.rule_choice(tokens * top_k, experts, scheme=scheme)[0]


def _decodes(tokens, top_k, experts, num_global=None, scheme="mxfp4"):
    """Whether the untuned decode rule sends the call to the decode kernels."""
    return dec.use_decode(tokens, top_k, None, experts, num_global, scheme)


@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("activation", [OAI, OAI_CUSTOM])
def test_gpt_oss_plans_go_to_the_decode_rule_then_the_grouped_families(_kernels_anywhere, finalize, activation):
    # MXFP4: re-read 1.0 and 1.016 (1, 2 tokens) within MAX_REREAD_FP4, 1.03 beyond; INT4 up to 1.08 (6 tokens)
    assert [t for t in (1, 2, 3, 4, 6, 8) if _decodes(t, 4, 128)] == [1, 2]
    assert [t for t in (1, 2, 3, 4, 6, 8) if _decodes(t, 4, 128, scheme="int4_g32")] == [1, 2, 3, 4, 6]
    # MXFP4 keeps the SM90 tiles in the warp-MMA buckets; INT4 takes the warp-MMA tiles there
    assert {_rule_family(t, 4, 128) for t in (8, 64, 256)} == {"sm90"}
    assert {_rule_family(t, 4, 128, "int4_g32") for t in (8, 64, 256)} == {"warp"}
    for tokens in (1, 2, 8, 64, 512, 4096):
        call = _oss_call(tokens, finalize, activation)
        assert provider.unavailable_reason(call, H200) is None
        p = provider.plan(call, H200)
        if _decodes(tokens, 4, 128):
            # the decode kernels, both with their biases (both finalize modes: the down kernel adds the
            # token's weighted w2 biases itself)
            assert p.family == "decode" and p.decode, (tokens, p.describe())
            up, down = p.configs
            assert up.bias and down.bias and up.fp4 and up.activation == get_activation(activation).name
            assert p.pad and p.pad[0] >= 2880 and "_bias" in down.name()
            continue
        # the rule's grouped family (warp-MMA tiles for the smallest buckets, else SM90)
        assert p.provider == "cute" and p.family == _rule_family(tokens, 4, 128) and not p.decode, \
            (tokens, p.describe())
        up, down = p.configs
        fp4 = up.fp4 if p.family == "sm90" else up.kind == "mxfp4"
        assert up.activation == get_activation(activation).name and up.bias and fp4 and up.group == 32
        assert down.bias == (finalize == "deterministic")  # fused: the accumulator starts from the biases
        assert down.epi == ("y" if finalize == "deterministic" else "atomic_f32")
        assert p.pad and p.pad[0] >= 2880 and p.pad[1] >= 2880
        assert "_bias" in up.name() and up.name() in p.describe()
    # the same layer without the gpt-oss features keeps its decode kernels for small calls
    assert provider.plan(_oss_call(1, finalize, "swiglu", bias=False), H200).decode
    # the expert-parallel first half and the masked layout
    ro = provider.plan(_oss_call(64, "deterministic", activation, routes_only=True), H200)
    assert ro.family == _rule_family(64, 4, 128) and ro.configs[0].bias and ro.configs[1].bias
    masked = MaskedCall(128, 64, 2880, 2880, torch.bfloat16, torch.device("cuda"), get_activation(activation),
                        "mxfp4", True)
    mp = provider.plan(masked, H200)
    assert mp.family == "sm90" and mp.configs[0].bias and mp.configs[1].bias and mp.configs[1].epi == "y"


def test_gpt_oss_plans_on_other_archs_take_the_warp_family(_kernels_anywhere):
    for info in (DeviceInfo("cuda", "NVIDIA A100", (8, 0), 108), DeviceInfo("cuda", "NVIDIA B200", (10, 0), 148)):
        for fin in ("deterministic", "fused"):
            p = provider.plan(_oss_call(8, fin), info)
            assert p.family == "warp" and p.configs[0].bias and p.configs[1].bias == (fin == "deterministic")


def test_tuned_warp_rows_fall_back_to_the_rule_when_warp_lacks_a_feature(_kernels_anywhere, monkeypatch):
    call = _oss_call(64)
    warp = registry.get("warp")
    monkeypatch.setattr(fam.DESCRIPTOR, "choose", lambda *a, **kw: ("warp", dict(warp_fam.TILES[0][1]), None))
    assert provider.plan(call, H200).family == "warp"  # warp runs biases and swiglu_oai
    provider.clear_plans()
    monkeypatch.setattr(type(warp), "can_implement", lambda self, c: "no biases here")
    p = provider.plan(call, H200)
    assert p.family == "sm90" and dict(p.tiles) == fam.select_tiles(64 * 4, 128)


def test_feature_reasons_per_family():
    call = _oss_call(4)
    plain = _oss_call(4, activation="swiglu", bias=False)
    assert registry.feature_reason(plain) is None
    assert registry.feature_reason(call) == "biases (w13_bias/w2_bias) are not supported by this CuTe family's kernels"
    assert (registry.feature_reason(call, bias=True)
            == "activation swiglu_oai is not supported by this CuTe family's kernels")
    assert registry.feature_reason(call, bias=True, swiglu_oai=True) is None
    for name in ("sm90", "warp", "decode"):
        assert registry.get(name).can_implement(call) is None
        assert registry.get(name).can_implement(_oss_call(4, activation=OAI_CUSTOM)) is None
        assert registry.get(name).can_implement(plain) is None
    # the shape rules still apply (and still name the rule)
    odd = MoECall(4, 4, 2880, 2880 + 16, 8, torch.bfloat16, torch.device("cuda"), get_activation(OAI),
                  "deterministic", 0, "mxfp4", False, True)
    assert "not a multiple of the group size 32" in registry.get("sm90").can_implement(odd)


def _configs(family_mod, activation, finalize, bias, scheme="mxfp4"):
    tiles = family_mod.TILES[2][1]
    gated = get_activation(activation).gated
    return family_mod.gemm_configs(get_scheme(scheme), "bf16", get_activation(activation).name, gated, finalize,
                                   tiles, bias)


@pytest.mark.parametrize("family_mod", [fam, warp_fam], ids=["sm90", "warp"])
def test_spec_fields_round_trip(family_mod):
    seen = set()
    for act in ("swiglu", OAI, OAI_CUSTOM, "swiglu_oai(alpha=1.702,limit=10.0)"):
        for fin in ("deterministic", "fused"):
            for bias in (False, True):
                for cfg in _configs(family_mod, act, fin, bias):
                    spec = family_mod.spec_for(cfg)
                    assert family_mod.config_from_spec(spec) == cfg
                    assert type(spec).from_json(spec.to_json()) == spec
                    assert spec.name.isidentifier() and cfg.name().isidentifier(), (spec.name, cfg.name())
                    seen.add(spec.name)
    # every activation parameter and the bias flag change the gate/up spec; the down spec only sees bias + epilogue
    ups = {family_mod.spec_for(_configs(family_mod, a, "deterministic", b)[0]).name
           for a in ("swiglu", OAI, OAI_CUSTOM, "swiglu_oai(alpha=1.702,limit=10.0)") for b in (False, True)}
    assert len(ups) == 8
    downs = {family_mod.spec_for(_configs(family_mod, a, f, b)[1]).name
             for a in ("swiglu", OAI_CUSTOM) for f in ("deterministic", "fused") for b in (False, True)}
    assert len(downs) == 3  # y, y + bias, atomic_f32 (no bias: the accumulator starts from the biases)
    up, down = _configs(family_mod, OAI_CUSTOM, "deterministic", True)
    # (the warp gate/up kernels are built with one row block per CTA: name suffix _r1; TN 32 for the tiles' occupied
    # token blocks too: _occ)
    assert up.name().endswith(("_swiglu_oai_a1p5_l2p0_bias_ser", "_swiglu_oai_a1p5_l2p0_bias_r1_occ"))
    assert up.gated and "_y_bias" in down.name()
    plain_up, plain_down = _configs(family_mod, "swiglu", "deterministic", False)
    assert "bias" not in plain_up.name() + plain_down.name()  # existing kernels keep their config names


def test_config_checks_name_the_rule():
    from w4a16_moe.kernels.cute.common.codes import check_activation, check_bias

    check_activation("gate_up", OAI_CUSTOM)
    with pytest.raises(ValueError, match="canonical swiglu_oai"):
        check_activation("gate_up", "swiglu_oai(limit=2.0)")  # not the canonical form
    with pytest.raises(ValueError, match="activation"):
        check_activation("gate_up", "gelu_oai")
    with pytest.raises(ValueError, match="atomic_f32 epilogue takes no bias"):
        check_bias("down", "atomic_f32", True)
    check_bias("down", "y", True)


def test_full_subset_holds_what_gpt_oss_plans_select(_kernels_anywhere):
    import os
    import sys

    from w4a16_moe.aot import subset_specs

    full = {s.name for s in subset_specs("full", "sm_90a")}
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    from device_specs import device_specs

    dev = {s.name for s in device_specs()}
    assert full <= dev
    for fin in ("deterministic", "fused"):
        for tokens in (1, 8, 64, 512, 4096):
            for call in (_oss_call(tokens, fin), _oss_call(tokens, fin, "swiglu"), _oss_call(tokens, fin, bias=False),
                         _oss_call(tokens, fin, e=16)):
                p = provider.plan(call, H200)
                assert set(p.specs) <= full, (call, p.specs)
            p = provider.plan(_oss_call(tokens, fin, OAI_CUSTOM, e=8), H200)
            assert set(p.specs) <= dev or tokens > 16, p.specs  # the GPU tests' custom pair (up to 16 tokens)
    for info in (DeviceInfo("cuda", "NVIDIA A100", (8, 0), 108),):
        warp_full = {s.name for s in subset_specs("full", "sm_80")}
        for tokens in (1, 64, 512):
            assert set(provider.plan(_oss_call(tokens), info).specs) <= warp_full


def test_device_specs_hold_what_the_gpu_tests_select(_kernels_anywhere, monkeypatch):
    """The GPU machine runs with JIT off: every kernel the GPU tests below (and the Triton suite's biased
    ``backend="auto"`` test) select must be in ``scripts/device_specs.py``'s set."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    from device_specs import device_specs

    dev = {s.name for s in device_specs()}
    bf, f16 = torch.bfloat16, torch.float16

    def call(t, act, fin, *, scheme="mxfp4", dtype=bf, bias=True, e=8, h=512, i=256):
        return MoECall(t, 4, h, i, e, dtype, torch.device("cuda"), get_activation(act), fin, 0, scheme, False, bias)

    calls = []
    for fin in ("deterministic", "fused"):
        for scheme in ("mxfp4", "int4_g32", "int4_g128_zp"):
            for dtype in (bf, f16):
                for act in ("swiglu", OAI, OAI_CUSTOM):
                    calls.append(call(33, act, fin, scheme=scheme, dtype=dtype))  # the matrix (and EP: same plan)
        calls += [call(33, a, fin, scheme="int4_g128", bias=True) for a in ("relu2", "silu")]
        calls += [call(33, a, fin, bias=False) for a in (OAI, OAI_CUSTOM, "swiglu")]
        calls += [call(t, OAI, fin, e=16, h=2880, i=2880) for t in (1, 8, 64, 512)]
        calls += [call(t, OAI, fin) for t in range(1, 65)]  # warmup + CUDA graph
        calls += [call(t, OAI_CUSTOM, fin) for t in range(1, 17)]  # the Triton suite's auto test
    for c in calls:
        p = provider.plan(c, H200)
        want = ("decode" if _decodes(c.tokens, c.top_k, c.experts, scheme=c.scheme)
                else _rule_family(c.tokens, c.top_k, c.experts, c.scheme))
        assert p.family == want and set(p.specs) <= dev, (c, p.specs)
    for scheme, dtype in DECODE_MATRIX:  # the forced decode kernels of test_gpu_decode_kernels_with_biases
        for act in ("swiglu", OAI, OAI_CUSTOM):
            for knobs in DECODE_KNOBS:
                with overrides.forced_decode(dec.parse_knobs(knobs)):
                    for fin in ("deterministic", "fused"):
                        p = provider.plan(call(3, act, fin, scheme=scheme, dtype=dtype), H200)
                        assert p.decode and set(p.specs) <= dev, (scheme, act, knobs, p.specs)
    for cand, splits in ((0, 3), (fam.CANDIDATES.index(fam.TILES[-1][1]), 2)):  # split-K
        with fam.forced(cand, splits):
            for fin in ("deterministic", "fused"):
                assert set(provider.plan(call(37, OAI, fin, h=1024, i=512), H200).specs) <= dev
    for dtype in (bf, f16):  # masked, capacity 24
        m = MaskedCall(8, 24, 512, 256, dtype, torch.device("cuda"), get_activation(OAI), "mxfp4", True)
        assert set(provider.plan(m, H200).specs) <= dev
    monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", "warp")
    for fin in ("deterministic", "fused"):
        p = provider.plan(call(33, OAI, fin), H200)
        assert p.family == "warp" and set(p.specs) <= dev


# ----------------------------------------------------------------------------------------------------------
# CPU: the bias tables the kernels read, and the fused finalize's accumulator
# ----------------------------------------------------------------------------------------------------------
def _cpu_oss_weights(e=4, h=128, i=192, w13=True, w2=True, dtype=torch.float32):
    return with_biases(random_weights("mxfp4", e, h, i, dtype=torch.bfloat16), w13=w13, w2=w2, dtype=dtype)


def test_bias_tables_are_padded_un_interleaved_fp32_and_cached():
    w = _cpu_oss_weights(dtype=torch.bfloat16)
    e, i = w.num_experts, w.intermediate_size
    pad = (256, 256)
    b13 = provider._bias(w, "w13", pad)
    assert b13.dtype == torch.float32 and b13.shape == (e, 512)
    assert torch.equal(b13[:, :i], w.w13_bias[:, :i].float())
    assert torch.equal(b13[:, 256 : 256 + i], w.w13_bias[:, i:].float())
    assert not b13[:, i:256].any() and not b13[:, 256 + i :].any()  # padded rows: bias 0
    b2 = provider._bias(w, "w2", pad)
    assert b2.shape == (e, 256) and torch.equal(b2[:, :128], w.w2_bias.float()) and not b2[:, 128:].any()
    assert provider._bias(w, "w13", pad) is b13  # converted once
    rewrapped = wm.MoEWeights(w.scheme, w.w13, w.w2, w.gated, w.w13_bias, w.w2_bias)
    assert provider._bias(rewrapped, "w13", pad) is b13  # cached on the bias tensor itself
    assert torch.equal(provider._bias(w, "w13"), w.w13_bias.float())  # unpadded
    only13 = _cpu_oss_weights(w2=False)
    z = provider._bias(only13, "w2", pad)
    assert z.shape == (e, 256) and not z.any()  # a missing bias reads zeros


def test_fused_accumulator_starts_from_the_weighted_local_biases():
    w = _cpu_oss_weights()
    e = w.num_experts
    tw, ids = random_routing(9, 3, 3 * e, seed=3)
    ids[0, 1] = -1
    offset = e
    acc = provider._fused_acc(w, tw, ids, offset, 256, (256, 256))
    want = torch.zeros(9, 256)
    for t in range(9):
        for j in range(3):
            loc = int(ids[t, j]) - offset
            if 0 <= loc < e:
                want[t, :128] += tw[t, j] * w.w2_bias[loc]
    torch.testing.assert_close(acc, want)
    assert not provider._fused_acc(_cpu_oss_weights(w2=False), tw, ids, offset, 256, ()).any()
    assert provider._biases_of(w, _configs(fam, OAI, "fused", True)) == ["w13", "w2"]
    assert provider._biases_of(_cpu_oss_weights(w2=False), _configs(fam, OAI, "fused", True)) == ["w13"]


# ----------------------------------------------------------------------------------------------------------
# CPU: the kernels compile (sm_90a; one portable warp-MMA kernel)
# ----------------------------------------------------------------------------------------------------------
def test_bias_swiglu_oai_kernels_compile_for_sm90(tmp_path):
    """The bias kernels read the FP32 bias rows with 16-byte read-only loads (``LDG.E.128.CONSTANT``: the plain
    MXFP4 kernels have none), the clamped activation has its min / max (``FMNMX``); no local memory."""
    pytest.importorskip("cutlass")
    import re

    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm
    from w4a16_moe.kernels.cute.warp.grouped_gemm import WarpW4A16GroupedGemm
    from w4a16_moe.loader import sass, toolchain

    up, down = _configs(fam, OAI_CUSTOM, "deterministic", True)
    assert up.bias and down.bias and up.epi == "h" and down.epi == "y"
    toolchain.preload_dsl_runtime()
    for name, cfg in (("up", up), ("down", down)):
        Sm90W4A16GroupedGemm(cfg).compile("sm_90a").export_to_c(str(tmp_path), name, function_prefix=name)
        (cubin,) = sass.extract_cubins((tmp_path / f"{name}.o").read_bytes())
        text = sass.disassemble(cubin.data)
        ops = sass.opcode_counts(text)
        assert re.search(r"\bLDG\.E\.128\.CONSTANT\b", text), name
        assert bool(ops["FMNMX"]) == (name == "up") and not ops["LDL"] and not ops["STL"], name
    wup, _ = _configs(warp_fam, OAI, "deterministic", True)
    WarpW4A16GroupedGemm(wup, "sm_90a").compile("sm_90a")
    bad = fam.kernel_config(mode="down", epilogue="atomic_f32", bias=True)
    with pytest.raises(ValueError, match="atomic_f32 epilogue takes no bias"):
        Sm90W4A16GroupedGemm(bad)


# ----------------------------------------------------------------------------------------------------------
# GPU (SM90)
# ----------------------------------------------------------------------------------------------------------
SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
BIASES = {"w13": (True, False), "w2": (False, True), "both": (True, True)}
OAI_X_SCALE = 6.0  # pre-activations of std ~6: the limit 7 (and 2) clamps gate and up on a good share
OAI_B_SCALE = 3.0  # biases of the same order, so that they matter next to the larger outputs


def _biased(w, which, dtype, scale):
    b13, b2 = BIASES[which]
    return with_biases(w, w13=b13, w2=b2, dtype=dtype, scale=scale)


def _scales(activation) -> tuple:
    """(x scale, bias scale): swiglu_oai where its clamps bite, the others at unit scale."""
    return (OAI_X_SCALE, OAI_B_SCALE) if get_activation(activation).kind == "swiglu_oai" else (1.0, 0.5)


def _oss_weights(scheme, e, h, i, *, which="both", activation=OAI, dtype=torch.bfloat16, bias_dtype=None,
                 bias_scale=None, seed=0):
    w = random_weights(scheme, e, h, i, activation=activation, dtype=dtype, device="cuda", seed=seed)
    bdt = bias_dtype or (torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
    return _biased(w, which, bdt, bias_scale or _scales(activation)[1]) if which else w


def _run(w, t, k, *, activation=OAI, finalize="deterministic", dtype=torch.bfloat16, offset=0, num_global=None,
         ids=None, family=None, seed=1):
    """One ``fused_moe(backend="cute")`` call on fresh inputs into a NaN-poisoned output, checked against the
    reference; asserts the plan is ``family`` (default: the decode kernels where the decode rule or an override
    sends the call, else the rule's grouped family; no Triton fallback) with the bias kernels, and that the
    biases matter (the reference without them is far off)."""

    def on_path(x, tw, ids):
        call = check_moe_call(x, w, tw, ids, activation=activation, finalize=finalize, expert_offset=offset)
        d = select_provider(call, "cute")
        forced = overrides.current().decode_knobs is not None
        want = family or ("decode" if forced or _decodes(t, k, w.num_experts, num_global, w.scheme.name)
                          else _rule_family(t, k, w.num_experts, w.scheme.name))
        assert d.provider == "cute" and d.plan.family == want and d.plan.decode == (want == "decode"), \
            d.plan.describe()
        up, down = d.plan.configs
        assert up.bias == w.has_bias and up.activation == get_activation(activation).name
        if want == "decode":
            assert down.bias == w.has_bias

    x, tw, ids, out = run_cute_moe(w, t, k, dtype=dtype, activation=activation, finalize=finalize, offset=offset,
                                   num_global=num_global, seed=seed, ids=ids, tol=TOL, check_path=on_path,
                                   x_scale=_scales(activation)[0])
    if w.has_bias:
        ref = wm.reference_moe(x, w, tw, ids, activation=activation, expert_offset=offset)
        plain = wm.MoEWeights(w.scheme, w.w13, w.w2, w.gated)
        assert nrmse(wm.reference_moe(x, plain, tw, ids, activation=activation, expert_offset=offset), ref) > 0.1
    return x, tw, ids, out


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("activation", ["swiglu", OAI, OAI_CUSTOM])
@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("scheme", ["mxfp4", "int4_g32", "int4_g128_zp"])
def test_gpu_bias_and_activation_matrix(scheme, dtype, finalize, bias, activation):
    """33 tokens x top-4 over 8 experts (one tile bucket): scheme x dtype x finalize x bias x activation."""
    w = _oss_weights(scheme, 8, 512, 256, which=bias, activation=activation, dtype=dtype, seed=1)
    x, tw, ids, out = _run(w, 33, 4, activation=activation, finalize=finalize, dtype=dtype)
    if finalize == "deterministic":
        assert torch.equal(wm.fused_moe(x, w, tw, ids, activation=activation, backend="cute"), out)



@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("activation", ["relu2", "silu"])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_bias_non_gated(activation, finalize):
    """Non-gated gate/up kernels add the ``[E, I]`` w13 bias before the activation."""
    w = _oss_weights("int4_g128", 8, 512, 256, activation=activation, bias_scale=2.0, seed=12)
    _run(w, 33, 4, activation=activation, finalize=finalize, seed=12)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("activation", [OAI, OAI_CUSTOM])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_swiglu_oai_without_biases(activation, finalize):
    w = _oss_weights("mxfp4", 8, 512, 256, which=None, seed=2)
    x, tw, ids, out = _run(w, 33, 4, activation=activation, finalize=finalize, seed=2)
    plain = wm.fused_moe(x, w, tw, ids, activation="swiglu", finalize=finalize, backend="cute")
    assert nrmse(plain, out) > 0.1  # the clamped activation really runs


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_expert_parallel_offset_and_invalid_routes(finalize):
    w = _oss_weights("mxfp4", 8, 512, 256, seed=3)
    t, k = 33, 4
    tw, ids = random_routing(t, k, 24, seed=3, device="cuda")  # 8 local experts (8..15) of 24
    ids[::3, 1] = -1
    ids[::5, 0] = 1000
    _run(w, t, k, finalize=finalize, offset=8, ids=ids, seed=3)
    none_local = torch.randint(16, 24, (t, k), dtype=torch.int32, device="cuda")
    x = torch.randn(t, 512, device="cuda").to(torch.bfloat16)
    out = torch.full_like(x, float("nan"))
    wm.fused_moe(x, w, tw, none_local, activation=OAI, finalize=finalize, expert_offset=8, backend="cute", out=out)
    assert torch.equal(out, torch.zeros_like(out))  # no local route: no bias either


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
def test_gpu_expert_routes_with_biases():
    from w4a16_moe.reference import reference_routes
    from w4a16_moe.routes import expert_routes

    w = _oss_weights("mxfp4", 8, 512, 256, seed=4)
    g = torch.Generator(device="cpu").manual_seed(4)
    x = (torch.randn(40, 512, generator=g) * OAI_X_SCALE).to(torch.bfloat16).cuda()
    _, ids = random_routing(40, 4, 8, seed=4, device="cuda")
    ids[::4, 2] = -1
    y, valid = expert_routes(x, w, ids, activation=OAI, backend="cute")
    ref_y, ref_valid = reference_routes(x, w, ids, activation=OAI)
    assert torch.equal(valid, ref_valid)
    assert nrmse(torch.where(valid[..., None], y.float(), 0.0), ref_y) < TOL


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("candidate,splits", [(0, 3), (fam.CANDIDATES.index(fam.TILES[-1][1]), 2)])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_split_k_adds_the_bias_once(candidate, splits, finalize):
    w = _oss_weights("mxfp4", 8, 1024, 512, seed=5)
    with fam.forced(candidate, splits):
        p = select_provider(check_moe_call(torch.zeros(37, 1024, dtype=torch.bfloat16, device="cuda"), w,
                                           torch.ones(37, 4, device="cuda"),
                                           torch.zeros(37, 4, dtype=torch.int32, device="cuda"), activation=OAI,
                                           finalize=finalize), "cute").plan
        assert max(p.splits) > 1, p.describe()
        _run(w, 37, 4, finalize=finalize, seed=5)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_masked_layout_with_biases(bias, dtype):
    w = _oss_weights("mxfp4", 8, 512, 256, which=bias, dtype=dtype, seed=6)
    cap, masked = 24, [0, 1, 24, 7, 9, 99, -3, 8]
    g = torch.Generator(device="cpu").manual_seed(6)
    x = (torch.randn(8, cap, 512, generator=g) * OAI_X_SCALE).to(dtype).cuda()
    m = torch.tensor(masked, dtype=torch.int32, device="cuda")
    d = select_provider(check_masked_call(x, w, m, activation=OAI), "cute")
    assert d.provider == "cute" and d.plan.family == "sm90" and d.plan.configs[1].bias
    out = wm.fused_moe_masked(x, w, m, activation=OAI, backend="cute")  # (the API allocates the output)
    ref = wm.reference_moe_masked(x, w, m, activation=OAI)
    live = torch.zeros(8, cap, dtype=torch.bool)
    for e, v in enumerate(masked):
        live[e, : max(0, min(v, cap))] = True
    live = live.cuda()
    assert torch.isfinite(out).all()
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))  # rows past masked_m: zeros, no bias
    assert nrmse(out[live], ref[live]) < TOL


#: (scheme, dtype) pairs and knob sets (default grid, K split over 3 CTAs, persistent grids) of the forced
#: decode-kernel bias tests
DECODE_MATRIX = (("mxfp4", torch.bfloat16), ("int4_g32", torch.float16), ("int4_g128_zp", torch.bfloat16))
DECODE_KNOBS = ("w4u8/w4u4", "w4u8s3/w4u4s3", "w4u8c5/w4u4c3")


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("knobs", DECODE_KNOBS)
@pytest.mark.parametrize("activation", ["swiglu", OAI, OAI_CUSTOM])
@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("scheme,dtype", DECODE_MATRIX, ids=[f"{s}-{str(d)[6:]}" for s, d in DECODE_MATRIX])
def test_gpu_decode_kernels_with_biases(scheme, dtype, finalize, bias, activation, knobs):
    """The decode kernels forced (3 tokens x top-4 over 8 local experts of 12, invalid routes): gate/up adds
    the w13 bias before the activation, down the token's weighted w2 biases (once, also with a K split)."""
    w = _oss_weights(scheme, 8, 512, 256, which=bias, activation=activation, dtype=dtype, seed=13)
    tw, ids = random_routing(3, 4, 12, seed=13, device="cuda")
    ids[1, 2] = -1
    with overrides.forced_decode(dec.parse_knobs(knobs)):
        x, tw, ids, out = _run(w, 3, 4, activation=activation, finalize=finalize, dtype=dtype, offset=2, ids=ids,
                               seed=13)
        assert torch.equal(wm.fused_moe(x, w, tw, ids, activation=activation, finalize=finalize,
                                        expert_offset=2, backend="cute"), out)  # fixed order: bit-identical


@pytest.fixture(scope="module")
def _gpt_oss_layer():
    """A gpt-oss-shaped layer (H = I = 2880, MXFP4, BF16 biases) with 16 experts instead of 128."""
    if not SM90:
        pytest.skip("needs an SM90 GPU")
    e, h, i = 16, 2880, 2880
    g = torch.Generator(device="cuda").manual_seed(11)
    w13 = (torch.randn(e, 2 * i, h, generator=g, device="cuda") / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g, device="cuda") / i**0.5).to(torch.bfloat16)
    w = wm.quantize_experts(w13, w2, "mxfp4", activation=OAI)
    del w13, w2
    return with_biases(w, dtype=torch.bfloat16, scale=OAI_B_SCALE, seed=11)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("tokens", [1, 8, 64, 512])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_gpt_oss_layer_shape(_gpt_oss_layer, tokens, finalize):
    """The padded decode kernels at 1 token, the padded grouped GEMMs beyond (warp-MMA tiles at 8 tokens,
    SM90 beyond)."""
    _run(_gpt_oss_layer, tokens, 4, finalize=finalize, seed=tokens)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_warp_family_on_the_h200(monkeypatch, finalize):
    monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", "warp")
    w = _oss_weights("mxfp4", 8, 512, 256, seed=7)
    _run(w, 33, 4, finalize=finalize, family="warp", seed=7)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_gpu_cuda_graph_with_biases(finalize):
    w = _oss_weights("mxfp4", 8, 512, 256, seed=8)
    t, k = 40, 4
    wm.warmup(w, dtype=torch.bfloat16, activation=OAI, top_k=k, max_tokens=64, finalize=finalize, backend="cute")
    x = torch.zeros(t, 512, dtype=torch.bfloat16, device="cuda")
    tw, ids = random_routing(t, k, 8, device="cuda")
    out = torch.full_like(x, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wm.fused_moe(x, w, tw, ids, activation=OAI, finalize=finalize, backend="cute", out=out)
    for seed in (10, 11):
        x.copy_((torch.randn(t, 512, device="cuda") * OAI_X_SCALE).to(torch.bfloat16))
        tw2, ids2 = random_routing(t, k, 8, seed=seed, device="cuda")
        ids2[::3, 0] = -1
        tw.copy_(tw2)
        ids.copy_(ids2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert nrmse(out, wm.reference_moe(x, w, tw, ids, activation=OAI)) < TOL
        if finalize == "deterministic":
            assert torch.equal(out, wm.fused_moe(x, w, tw, ids, activation=OAI, backend="cute"))


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
def test_gpu_unconverted_biases_inside_capture_raise():
    w = _oss_weights("mxfp4", 8, 512, 256, seed=9)
    t, k = 8, 4
    x = torch.randn(t, 512, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(t, k, 8, device="cuda")
    wm.fused_moe(x, w, tw, ids, activation=OAI, backend="cute")  # kernels loaded, weights packed
    fresh = with_biases(wm.MoEWeights(w.scheme, w.w13, w.w2, w.gated), dtype=torch.bfloat16, seed=99)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"w13_bias.*warmup"):
        with torch.cuda.graph(graph):
            wm.fused_moe(x, fresh, tw, ids, activation=OAI, backend="cute")
    y = wm.fused_moe(x, fresh, tw, ids, activation=OAI, backend="cute")  # still works afterwards
    assert nrmse(y, wm.reference_moe(x, fresh, tw, ids, activation=OAI)) < TOL

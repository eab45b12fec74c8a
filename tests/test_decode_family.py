"""The route-major decode kernels' family module on the CPU: configs, names, when calls use them, and that
every scheme compiles for sm_90a (when the CuTe DSL is installed)."""

from __future__ import annotations

import importlib.util

import pytest

from w4a16_moe.formats.schemes import SCHEMES, get_scheme
from w4a16_moe.kernels.cute.decode import family as dec
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.loader.spec import family_source_hash

HAS_DSL = importlib.util.find_spec("cutlass") is not None


def test_configs_share_the_sm90_layout_of_the_decode_tile():
    up, down = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu")
    tile = fam.CANDIDATES[9]
    assert (up.m64_per_block, up.k_tile) == (tile["m64_per_block"], tile["k_tile"])
    assert (down.m64_per_block, down.k_tile) == (tile["down_m64_per_block"], tile["down_k_tile"])
    assert up.mode == "gate_up" and down.mode == "down" and up.gated and not down.gated


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_scheme_fields(scheme):
    sch = get_scheme(scheme)
    up, _ = dec.configs(sch, "fp16", "relu2")
    assert up.fp4 == sch.is_fp4 and up.zero_point == sch.zero_point
    assert up.group == (0 if sch.group_size is None else sch.group_size)
    assert not up.gated


def test_spec_names_encode_every_knob():
    a, _ = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu")
    b, _ = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu", (("gate_up", (("unroll", 8), ("warps", 16))),))
    assert (b.warps, b.unroll) == (16, 8)
    assert dec.spec_for(a).name != dec.spec_for(b).name
    assert dec.config_from_spec(dec.spec_for(b)) == b
    assert len(family_source_hash(dec.FAMILY)) > 0
    c, _ = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu", dec.knob_items("w4u8c396/w4u4"))
    assert c.ctas == 396 and c.name().endswith("_c396") and dec.spec_for(c).name != dec.spec_for(a).name


def test_parse_knobs():
    assert dec.parse_knobs("w8u4/w4u2") == {"gate_up": {"warps": 8, "unroll": 4}, "down": {"warps": 4, "unroll": 2}}
    assert dec.parse_knobs("w16u2") == {"gate_up": {"warps": 16, "unroll": 2}}
    assert dec.parse_knobs("w8u8/w8u4p0")["down"] == {"warps": 8, "unroll": 4, "pdl": False}
    assert dec.parse_knobs("w4u8c396/w4u4c528p0") == {"gate_up": {"warps": 4, "unroll": 8, "ctas": 396},
                                                       "down": {"warps": 4, "unroll": 4, "ctas": 528, "pdl": False}}
    with pytest.raises(ValueError, match="wNuM"):
        dec.parse_knobs("w8u8p0/w8u4")
    with pytest.raises(ValueError, match="wNuM"):
        dec.parse_knobs("8x4")


def test_parse_knobs_prefetch_and_fp32_scale():
    assert dec.parse_knobs("w16u4c132fx/w16u2x") == {
        "gate_up": {"warps": 16, "unroll": 4, "ctas": 132, "l2_prefetch": True, "fp32_scale": True},
        "down": {"warps": 16, "unroll": 2, "fp32_scale": True}}
    assert dec.parse_knobs("w8u8fs2/w8u4xs1p0") == {
        "gate_up": {"warps": 8, "unroll": 8, "l2_prefetch": True, "splits": 2},
        "down": {"warps": 8, "unroll": 4, "fp32_scale": True, "splits": 1, "pdl": False}}
    for bad in ("w8u8/w8u4f", "w8u8xf/w8u4", "w8u8s2f/w8u4"):  # f: gate_up only; the order c, f, x, s, p0
        with pytest.raises(ValueError, match="wNuM"):
            dec.parse_knobs(bad)
    for text in ("w16u4c132fx/w16u2x", "w8u8fs2/w8u4xs1p0", "w4u8f/w8u4", "w8u8/w8u4"):
        assert dec.knob_text(dec.knob_items(text)) == text  # the text round-trips
    up, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu", dec.knob_items("w16u4c132fx/w16u2x"))
    assert up.l2_prefetch and up.fp32_scale and down.fp32_scale and not down.l2_prefetch
    assert up.name().endswith("_c132_l2pf_s32") and down.name().endswith("_pdl_s32")
    assert all(dec.config_from_spec(dec.spec_for(c)) == c for c in (up, down))
    # FP4 codes have no FP32-scale variant: the knob leaves their configs as they are
    fp4 = dec.configs(get_scheme("nvfp4"), "bf16", "swiglu", dec.knob_items("w16u4c132fx/w16u2x"))
    assert fp4 == dec.configs(get_scheme("nvfp4"), "bf16", "swiglu", dec.knob_items("w16u4c132f/w16u2"))
    assert not any(c.fp32_scale for c in fp4)


def test_num_parts():
    up, down = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu")
    assert dec.num_parts(up, 7168) == up.warps  # 112 k64 units: one part per warp
    assert dec.num_parts(down, 64) == 1
    assert dec.num_parts(down, 256) == -(-4 // down.unroll)  # about one load batch per part
    assert dec.num_parts(down, 2048) == min(down.warps, -(-32 // down.unroll))
    # a K split sizes the parts for every warp of the split CTAs (still about one load batch each)
    assert dec.num_parts(up, 7168, 2) == 14 and dec.num_parts(up, 7168, 1) == up.warps
    assert dec.num_parts(down, 14336, 4) == 32 and dec.num_parts(down, 256, 2) == 1


def test_parse_knobs_split_suffix():
    assert dec.parse_knobs("w8u8s2/w8u4s4p0") == {"gate_up": {"warps": 8, "unroll": 8, "splits": 2},
                                                   "down": {"warps": 8, "unroll": 4, "splits": 4, "pdl": False}}
    assert dec.parse_knobs("w4u8c5s3/w4u4c3") == {"gate_up": {"warps": 4, "unroll": 8, "ctas": 5, "splits": 3},
                                                   "down": {"warps": 4, "unroll": 4, "ctas": 3}}
    for bad in ("w8u8s2c5", "w8u8p0s2/w8u4", "w8u8/w8u4p0s2"):
        with pytest.raises(ValueError, match="wNuM"):
            dec.parse_knobs(bad)
    for bad in ("w8u8s0", "w8u8/w8u4s70000"):
        with pytest.raises(ValueError, match="split"):
            dec.parse_knobs(bad)
    # the split is a launch parameter: the same configs and specs as without it
    plain = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu", dec.knob_items("w8u8/w8u4"))
    split = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu", dec.knob_items("w8u8s2/w8u4s4"))
    assert plain == split and [dec.spec_for(c) for c in plain] == [dec.spec_for(c) for c in split]
    assert all(dec.config_from_spec(dec.spec_for(c)) == c for c in split)
    persistent = dec.configs(get_scheme("nvfp4"), "fp16", "relu2", dec.knob_items("w4u8c5s3/w4u4c3s2p0"))
    assert persistent == dec.configs(get_scheme("nvfp4"), "fp16", "relu2", dec.knob_items("w4u8c5/w4u4c3p0"))
    assert all(dec.config_from_spec(dec.spec_for(c)) == c for c in persistent)
    assert dec.forced_splits(dec.knob_items("w8u8s2/w8u4s4")) == (2, 4)
    assert dec.forced_splits(dec.knob_items("w8u8/w8u4s4")) == (None, 4)
    assert dec.forced_splits(()) == (None, None)
    assert dec.variants(knobs=[dec.knob_items("w4u8s2/w4u4s3")]) == dec.variants(knobs=[dec.knob_items("w4u8/w4u4")])


#: (E, H, I, top-k) -> {tokens: (gate_up split, down split)} the rule picks on 132 SMs with the default knobs
SPLIT_EXAMPLES = {
    (8, 4096, 14336, 2): {1: (1, 4), 2: (1, 2), 4: (1, 1)},  # down: 64 / 128 / 256 tiles
    # Kimi-K2 TP8: 128 / 112 tiles at one token; down's 8 routes of one 4-unit part keep S = 1 (8 items, one
    # per warp: S = 2 only adds idle warps; H200: 4.9 us instead of 6.9, docs/perf/2026-12-02-decode-defaults)
    (384, 7168, 256, 8): {1: (2, 1), 2: (1, 1), 4: (1, 1)},
    (128, 2048, 768, 8): {1: (1, 4), 2: (1, 4), 4: (1, 2)},  # Qwen3-30B-A3B: gate_up 384 tiles, down 32 at T=1
    (256, 7168, 2048, 8): {1: (1, 2)},  # DeepSeek-V3: down 112 tiles
}


@pytest.mark.parametrize("layer", list(SPLIT_EXAMPLES))
def test_split_rule_examples(layer):
    e, h, i, k = layer
    up, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu")
    for t, want in SPLIT_EXAMPLES[layer].items():
        got = (dec.num_splits(up, 2 * i, h, t, k, 132), dec.num_splits(down, h, i, t, k, 132))
        assert got == want, (layer, t, got)
        for cfg, n, s in ((up, 2 * i, got[0]), (down, h, got[1])):
            rows = t * k if cfg.mode == "gate_up" else t
            assert s == 1 or dec.tile_ctas(cfg, n, rows) * s <= dec.SPLIT_WAVES * 132


def test_split_rule_bounds():
    up, down = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu")
    # never below MIN_UNITS_PER_WARP k64 units per warp: one route of K = 256 (4 units) is not split
    assert dec.num_splits(down, 7168, 256, 1, 1, 132) == 1
    # the expert-parallel hint: one token of DeepSeek-V3 EP8 (32 of 256 experts, top-8) has one expected local
    # route, so gate/up (H=7168, 2I=4096) counts 128 working tiles instead of 1024: S=2
    assert dec.num_splits(up, 4096, 7168, 1, 8, 132) == 1
    assert dec.num_splits(up, 4096, 7168, 1, 8, 132, 32, 256) == 2
    assert dec.num_splits(up, 4096, 7168, 1, 8, 132, 32, 32) == 1  # no hint beyond the local experts
    # down with the hint: one expected local route of a token (16 of 128 experts, top-8; I = 1536: 24 units)
    # is not split, where eight local routes would be (4: 256 CTAs)
    assert dec.num_splits(down, 4096, 1536, 1, 8, 132) == 4
    assert dec.num_splits(down, 4096, 1536, 1, 8, 132, 16, 128) == 1
    # a small GPU gets smaller splits; a GPU with many SMs at most MAX_SPLITS
    assert dec.num_splits(down, 4096, 14336, 1, 2, 16) == 1
    assert dec.num_splits(down, 4096, 14336, 1, 2, 10**6) == dec.MAX_SPLITS
    assert dec.num_splits(up, 28672, 4096, 1, 2, 132) == 1
    assert dec.scratch_sizes(down, 4096, 1, 2, 1) == (0, 0)
    assert dec.scratch_sizes(down, 4096, 1, 2, 4) == (64 * 4 * 64, 64)  # 64 tiles, 4 splits, 16 X partials
    assert dec.scratch_sizes(up, 512, 1, 8, 2) == (128 * 2 * 32, 128)


def test_decode_plans_carry_the_split(monkeypatch):
    import torch

    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import overrides, provider
    from w4a16_moe.validate import MoECall

    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "1")
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)
    provider.clear_plans()
    h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
    for (e, h, i, k), rows in SPLIT_EXAMPLES.items():
        for t, want in rows.items():
          for scheme in ("nvfp4", "int4_g128"):  # FP4: the 16-bit-scale sets; INT4 g128: FP32_SCALE_KNOB_SETS
            call = MoECall(t, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                           "deterministic", 0, scheme)
            p = provider.plan(call, h200)
            up, down = p.configs
            kn = dict(p.tiles)["knobs"]
            regime = dec.default_knobs(t, k, h, 2 * i, 132)
            assert kn == dec.knob_items(dec.default_knobs(t, k, h, 2 * i, 132, fp32_scales=scheme == "int4_g128"))
            if regime:  # a small grid, a short gate/up K or a large grid: a 16- or 4-warp set, its own split
                assert up.warps != 8
            if kn != ():  # (SPLIT_EXAMPLES: the splits of the 8-warp 16-bit-scale set, KNOBS)
                want = (dec.num_splits(up, 2 * i, h, t, k, 132), dec.num_splits(down, h, i, t, k, 132))
            assert p.decode and p.splits == want, ((e, h, i, k), t, p.describe())
            assert p.counters == (dec.scratch_sizes(up, 2 * i, t, k, want[0])[1]
                                  + dec.scratch_sizes(down, h, t, k, want[1])[1])
            assert f"K split {want[0]}/{want[1]}" in p.describe()
    call = MoECall(1, 8, 7168, 256, 384, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                   "fused", 0, "int4_g32")
    with overrides.forced_decode(dec.parse_knobs("w8u8s1/w8u4s8")):
        p = provider.plan(call, h200)
        assert p.splits == (1, 8) and p.counters == 112
    with overrides.forced_decode(dec.parse_knobs("w8u8/w8u4")):
        assert provider.plan(call, h200).splits == (2, 1)
    provider.clear_plans()


def test_use_decode_rule(monkeypatch):
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "auto")
    lim = dec.DECODE_MAX_ROUTES
    assert dec.use_decode(1, 8) and dec.use_decode(lim // 8, 8) and not dec.use_decode(lim // 8 + 1, 8)
    assert dec.use_decode(4, 8, max_routes=32) and not dec.use_decode(5, 8, max_routes=32)
    assert not dec.use_decode(1, 8, max_routes=0)
    assert not dec.use_decode(0, 8)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "1")
    assert dec.use_decode(1000, 8) and not dec.use_decode(10000, 8)  # one launch's grid: T * k <= 65535
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    assert not dec.use_decode(1, 8)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "auto")
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "1")
    assert not dec.use_decode(1, 8)
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "0")
    # the tuned bound is the only test where there is one (no re-read test, no bytes bound)
    assert dec.use_decode(8, 8, max_routes=64, num_experts=8)
    assert dec.use_decode(4, 1, max_routes=4, num_experts=16, expert_bytes=10**9)
    # the bytes bound: expected local routes x one expert's 4-bit weights; E=16, H=5120, I=8192, top-1 (63 MB
    # an expert): two tokens stream 126 MB, three 189 MB (re-read 1.07 there: only the bytes bound refuses)
    eb = 3 * 8192 * 5120 // 2
    assert dec.streamed_bytes(3, 1, eb, 16) == 3 * eb
    assert dec.use_decode(2, 1, None, 16, expert_bytes=eb) and not dec.use_decode(3, 1, None, 16, expert_bytes=eb)
    assert dec.use_decode(3, 1, None, 16) and dec.reread_factor(3, 1, 16) <= dec.MAX_REREAD
    # with the expert-parallel hint the bound counts the expected local routes (32 of 256 experts local,
    # top-8: one local route per token): 7168 x 2048 experts (22 MB) at 8 tokens, 176 MB
    eb = 3 * 2048 * 7168 // 2
    assert dec.streamed_bytes(8, 8, eb, 32, 256) == 8 * eb <= dec.DECODE_MAX_WEIGHT_BYTES
    assert dec.streamed_bytes(16, 8, eb, 32, 256) > dec.DECODE_MAX_WEIGHT_BYTES
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "yes")
    with pytest.raises(ValueError, match="W4A16_MOE_CUTE_DECODE"):
        dec.mode()


def test_variants():
    full = dec.aot_variants("full")
    plain = [get_scheme(n) for n in SCHEMES if not dec.takes_fp32_scales(get_scheme(n))]
    fp32 = [get_scheme(n) for n in SCHEMES if dec.takes_fp32_scales(get_scheme(n))]
    defaults = dec.variants(schemes=plain, knobs=[()]) + dec.variants(
        schemes=fp32, knobs=[dec.knob_items(dec.FP32_SCALE_KNOB_SETS[""])])  # each kind's plain set
    assert len(defaults) == len(SCHEMES) * 2 * 5  # 4 gate_up activations + 1 down per scheme and dtype
    assert set(s.name for s in defaults) <= set(s.name for s in full)
    assert {s.family for s in full} == {dec.FAMILY}
    # every knob set of the tuned table is in the full set, for its scheme and dtype (and only for it)
    for sch in SCHEMES:
        for dt in ("bf16", "fp16"):
            for kn in fam.tuned_decode_knob_sets(sch, dt):
                for cfg in dec.configs(get_scheme(sch), dt, "swiglu", dec.knob_items(kn)):
                    assert dec.spec_for(cfg) in full
    assert fam.tuned_decode_knob_sets("int4_g128", "bf16") and not fam.tuned_decode_knob_sets("int4_g128", "fp16")
    defaults16 = {c for kn in dec.default_knob_sets(True)
                  for c in dec.configs(get_scheme("int4_g128"), "fp16", "swiglu", dec.knob_items(kn))}
    for kn in fam.tuned_decode_knob_sets("int4_g128", "bf16"):
        for cfg in set(dec.configs(get_scheme("int4_g128"), "fp16", "swiglu", dec.knob_items(kn))) - defaults16:
            assert dec.spec_for(cfg) not in full
    smoke = dec.aot_variants("smoke")
    assert len(smoke) >= 4 and set(s.name for s in smoke) <= set(s.name for s in full)


@pytest.mark.skipif(not HAS_DSL, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128_zp", "int4_channel", "nvfp4", "mxfp4"])
def test_compiles_for_sm90a(scheme):
    from w4a16_moe.kernels.cute.decode.gemv import Sm90W4A16DecodeGemv

    for cfg in dec.configs(get_scheme(scheme), "bf16", "geglu"):
        assert Sm90W4A16DecodeGemv(cfg).compile("sm_90a") is not None
    for cfg in dec.configs(get_scheme(scheme), "fp16", "swiglu", dec.knob_items("w4u8c396/w8u4c264")):
        assert cfg.ctas > 0 and Sm90W4A16DecodeGemv(cfg).compile("sm_90a") is not None


@pytest.mark.skipif(not HAS_DSL, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_split_kernels_compile_for_sm90a():
    """The K split is a runtime branch of every decode kernel: the default gate_up kernel and a persistent
    down kernel with programmatic dependent launch (the split's unit dealing and prefetch) compile."""
    from w4a16_moe.kernels.cute.decode.gemv import Sm90W4A16DecodeGemv

    up, _ = dec.configs(get_scheme("int4_g32"), "bf16", "swiglu")
    _, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu", dec.knob_items("w8u8/w8u4c264s2"))
    assert down.ctas == 264 and down.pdl
    for cfg in (up, down):
        assert Sm90W4A16DecodeGemv(cfg).compile("sm_90a") is not None


def test_bad_configs_are_refused():
    if not HAS_DSL:
        pytest.skip("needs the CuTe DSL (nvidia-cutlass-dsl)")
    from w4a16_moe.kernels.cute.decode.config import DecodeGemvConfig
    from w4a16_moe.kernels.cute.decode.gemv import Sm90W4A16DecodeGemv

    with pytest.raises(ValueError, match="even m64_per_block"):
        Sm90W4A16DecodeGemv(DecodeGemvConfig(m64_per_block=1))
    with pytest.raises(ValueError, match="no zero points"):
        Sm90W4A16DecodeGemv(DecodeGemvConfig(fp4=True, zero_point=True))
    with pytest.raises(ValueError, match="warps"):
        Sm90W4A16DecodeGemv(DecodeGemvConfig(warps=3))
    with pytest.raises(ValueError, match="ctas"):
        Sm90W4A16DecodeGemv(DecodeGemvConfig(ctas=-1))


def test_reread_factor():
    assert dec.expected_experts(1, 8, 384) == pytest.approx(8.0)
    assert dec.expected_experts(1, 8, 8) == pytest.approx(8.0)  # a token's experts are distinct
    assert dec.expected_experts(32, 2, 8) == pytest.approx(8.0, abs=1e-3)
    assert dec.reread_factor(32, 2, 8) == pytest.approx(8.0, abs=1e-3)  # 64 routes on 8 experts
    assert dec.reread_factor(1, 8, 8) == pytest.approx(1.0)
    assert dec.reread_factor(2, 8, 8) == pytest.approx(2.0)
    assert dec.expected_experts(0, 8, 8) == 0.0 and dec.reread_factor(0, 8, 8) == 1.0


@pytest.mark.parametrize("experts,top_k,largest", [
    (8, 2, 1),      # few large experts, top-2: 2 tokens re-read each expert 1.14x
    (128, 8, 4),    # 128 small experts, top-8: 4 tokens 1.099x, 5 tokens 1.13x
    (64, 6, 3),     # 64 experts, top-6: 3 tokens 1.0998x, 4 tokens 1.15x
    (384, 8, 10),   # W1's shape untuned (e.g. FP16): 10 tokens 1.099x, 11 tokens 1.108x
    (8, 8, 1),      # top-8 of 8: two tokens read every expert twice
])
def test_decode_rule_by_reread(monkeypatch, experts, top_k, largest):
    """Untuned layers: the decode path only where it reads each expert's weights about once."""
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "auto")
    took = [t for t in range(1, 129) if dec.use_decode(t, top_k, None, experts)]
    assert took == list(range(1, largest + 1))
    for t in took:
        assert t * top_k <= dec.DECODE_MAX_ROUTES and dec.reread_factor(t, top_k, experts) <= dec.MAX_REREAD
    assert dec.use_decode(largest + 1, top_k) == ((largest + 1) * top_k <= dec.DECODE_MAX_ROUTES)  # no E: old rule


def test_decode_rule_by_bytes(monkeypatch):
    """The bytes bound refuses calls the re-read bound lets through: W1's shape (384 experts of 7168 x 256,
    2.75 MB each) takes the decode path up to 8 tokens (176 MB), not 9-10 (198-220 MB, re-read <= 1.1)."""
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "auto")
    eb = 3 * 7168 * 256 // 2
    took = [t for t in range(1, 33) if dec.use_decode(t, 8, None, 384, expert_bytes=eb)]
    assert took == list(range(1, 9))
    assert dec.use_decode(10, 8, None, 384) and not dec.use_decode(10, 8, None, 384, expert_bytes=eb)
    # what decode_refusal says for each bound (None where the call takes the decode kernels)
    assert dec.decode_refusal(8, 8, None, 384, expert_bytes=eb) is None
    assert dec.decode_refusal(10, 8, None, 384, expert_bytes=eb) == "220 MB streamed > 180 MB"
    assert dec.decode_refusal(11, 8, None, 384) == "re-read 1.11x > 1.1"
    assert dec.decode_refusal(17, 8, None, 384) == f"136 routes > {dec.DECODE_MAX_ROUTES}"
    assert dec.decode_refusal(5, 8, 32, 384) == "40 routes > the tuned bound 32"
    assert dec.decode_refusal(0, 8) == "no tokens"
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "1")
    assert dec.decode_refusal(1, 8) == "batch-invariant mode"
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "0")
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    assert dec.decode_refusal(1, 8) == "W4A16_MOE_CUTE_DECODE=0"


def test_default_knobs_by_regime():
    # the expert-parallel hint first (a persistent gate/up grid), then 4-warp gate/up CTAs for a short K or a
    # large grid (NARROW_TILES_PER_SM tiles per SM), else KNOBS; (tokens, top_k, H, gate/up rows, SMs, E, E_global)
    # at most one working gate/up tile per SM and H >= 4096: 16-warp CTAs (one token of E=32 of 256, H=7168,
    # I=2048, top-8: one expected local route, 128 tiles; Kimi-K2 TP8: 8 routes x 16 tiles)
    assert dec.default_knobs(1, 8, 7168, 4096, 132, 32, 256) == dec.WIDE_KNOBS
    assert dec.default_knobs(1, 8, 7168, 512, 132) == dec.WIDE_KNOBS
    assert dec.default_knobs(1, 8, 2048, 3072, 132, 16, 128) == dec.EP_KNOBS  # 96 tiles, but 8 batches of 4
    assert dec.default_knobs(2, 8, 7168, 4096, 132, 32, 256) == dec.WIDE_KNOBS  # 256 tiles: 2 per SM with EP
    assert dec.default_knobs(4, 8, 7168, 4096, 132, 32, 256) == dec.EP_KNOBS  # 512 tiles
    assert dec.default_knobs(2, 1, 5120, 2048, 132) == dec.WIDE_KNOBS  # 128 tiles
    assert dec.default_knobs(3, 1, 5120, 2048, 132) == ""  # 192 tiles: 1 per SM without the hint
    assert dec.default_knobs(4, 8, 2048, 3072, 132, 16, 128) == dec.EP_KNOBS
    assert dec.default_knobs(1, 8, 2048, 1536, 132, 128, 128) == dec.default_knobs(1, 8, 2048, 1536, 132) \
        == dec.NARROW_KNOBS  # 32 units: 4 batches of 8 for 8 warps
    assert dec.default_knobs(1, 4, 2880, 5760, 132) == dec.NARROW_KNOBS  # gpt-oss: 45 units, 6 batches
    # H = 4096 (8 batches): 8 warps while the grid is small; E=8, H=4096, I=14336, top-2: 1792 tiles at one token
    assert dec.default_knobs(1, 8, 4096, 768, 132) == ""  # 192 tiles
    assert dec.default_knobs(1, 8, 4096, 512, 132) == dec.WIDE_KNOBS  # 128 tiles, 16 batches of 4
    assert dec.default_knobs(1, 2, 4096, 28672, 132) == dec.NARROW_KNOBS
    assert dec.default_knobs(2, 8, 7168, 512, 132) == ""  # Kimi-K2 TP8, 2 tokens: 256 tiles
    assert dec.default_knobs(3, 8, 7168, 512, 132) == dec.NARROW_KNOBS  # 384 >= 2.5 x 132
    assert dec.default_knobs(4, 8, 7168, 512, 132) == dec.NARROW_KNOBS
    assert dec.default_knobs(4, 8, 7168, 512, 220) == ""  # ... not on a GPU of 220 SMs
    up, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu", dec.knob_items(dec.WIDE_KNOBS))
    assert (up.warps, up.unroll, up.ctas, down.warps, down.unroll, down.ctas) == (16, 4, 132, 16, 2, 0)
    up, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu", dec.knob_items(dec.EP_KNOBS))
    assert (up.warps, up.unroll, up.ctas, down.ctas) == (8, 8, 264, 0)
    up, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu", dec.knob_items(dec.NARROW_KNOBS))
    assert (up.warps, up.unroll, down.warps, down.unroll) == (4, 8, 8, 4)
    assert down == dec.configs(get_scheme("int4_g128"), "bf16", "swiglu")[1]  # one down kernel for both sets
    # INT4 weights of one scale group per k64 unit: the regime's set with FP32 group scales and half the load
    # batch (the 16-warp and 4-warp sets' regimes are those above); the expert-parallel set is the same
    for args in ((1, 8, 7168, 512, 132), (2, 8, 7168, 512, 132), (4, 8, 7168, 512, 132), (1, 8, 7168, 4096, 132, 32, 256),
                 (4, 8, 7168, 4096, 132, 32, 256)):
        regime = dec.default_knobs(*args)
        assert dec.default_knobs(*args, fp32_scales=True) == dec.FP32_SCALE_KNOB_SETS.get(regime, regime)
    assert dec.FP32_SCALE_KNOB_SETS == {"": "w8u4x/w8u2x", dec.WIDE_KNOBS: "w16u2c132x/w16u2",
                                        dec.NARROW_KNOBS: "w4u4x/w8u2x"}
    assert [n for n in SCHEMES if dec.takes_fp32_scales(get_scheme(n))] == [
        "int4_g64", "int4_g64_zp", "int4_g128", "int4_g128_zp", "int4_channel"]
    up, down = dec.configs(get_scheme("int4_g128"), "bf16", "swiglu",
                           dec.knob_items(dec.FP32_SCALE_KNOB_SETS[dec.WIDE_KNOBS]))
    assert (up.warps, up.unroll, up.ctas, up.fp32_scale, down.warps, down.unroll, down.fp32_scale) == (16, 2, 132, True,
                                                                                                      16, 2, False)
    assert dec.default_knob_sets(False) == ["", dec.WIDE_KNOBS, dec.EP_KNOBS, dec.NARROW_KNOBS]
    assert dec.default_knob_sets(True) == [dec.FP32_SCALE_KNOB_SETS.get(k, k) for k in dec.default_knob_sets(False)]
    # each set of a scheme's kind is in the AOT full set for every scheme and dtype
    full = {s.name for s in dec.aot_variants("full")}
    for sch in SCHEMES:
        for dt in ("bf16", "fp16"):
            for kn in dec.default_knob_sets(dec.takes_fp32_scales(get_scheme(sch))):
                assert {dec.spec_for(c).name for c in dec.configs(get_scheme(sch), dt, "silu", dec.knob_items(kn))} <= full


def test_split_capacity_counts_warps():
    # the split grid aims at SPLIT_WAVES * sms CTAs of 8 warps: 132 of 16 warps, 528 of 4 (H200)
    sch = get_scheme("int4_g128")
    w16, _ = dec.configs(sch, "bf16", "swiglu", dec.knob_items("w16u4c132/w16u2"))
    w8, _ = dec.configs(sch, "bf16", "swiglu")
    w4, _ = dec.configs(sch, "bf16", "swiglu", dec.knob_items(dec.NARROW_KNOBS))
    # one token of E=32 of 256, H=7168, I=2048, top-8: 128 working gate/up tiles
    assert dec.num_splits(w8, 4096, 7168, 1, 8, 132, 32, 256) == 2
    assert dec.num_splits(w16, 4096, 7168, 1, 8, 132, 32, 256) == 1
    # one token of E=128, H=5120, I=1024, top-1: 64 gate/up tiles of 80 units (10 parts of 8)
    assert dec.num_splits(w8, 2048, 5120, 1, 1, 132) == 2  # 10 parts: S = 4 would leave 22 of 32 warps idle
    assert dec.num_splits(w4, 2048, 5120, 1, 1, 132) == 4  # 10 parts over 16 warps; S = 8 adds only idle ones
    assert dec.num_splits(w4, 2048, 16384, 1, 1, 132) == 8  # 256 units, 32 parts: S = 8 fills 8 CTAs x 4 warps

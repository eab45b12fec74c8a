"""The expert-parallel selection hint ``global_num_experts`` on the CPU: the CuTe plans of EP ranks with and
without it (qwen3-235b-ep8, deepseek-ep8), the rules it feeds (tile bucket, split-K, decode cost model),
validation, the plan cache, the tuned-table and autotune keys, the op schema, ``doctor`` and the bench."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import w4a16_moe as wm
from conftest import random_routing, random_weights
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import autotune_store as store, provider, tiles
from w4a16_moe.kernels.cute.autotune_store import Choice, LayerKey, Row
from w4a16_moe.kernels.cute.decode import family as dec
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
from w4a16_moe.validate import MoECall, check_global_experts

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
UNTUNED = DeviceInfo("cuda", "an untuned SM90 GPU", (9, 0), 132)  # no tuned-table rows: the rules
#: (E_local, H, I, top-k, E_global, scheme)
QWEN_EP8 = (16, 4096, 1536, 8, 128, "int4_g128")
DEEPSEEK_EP8 = (32, 7168, 2048, 8, 256, "int4_g128")


@pytest.fixture(autouse=True)
def _kernels_anywhere(monkeypatch, tmp_path):
    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    monkeypatch.setattr(store, "store_dir", lambda: tmp_path / "autotune")
    for v in ("W4A16_MOE_CUTE_DECODE", "W4A16_MOE_BATCH_INVARIANT", "W4A16_MOE_CUTE_FAMILY"):
        monkeypatch.delenv(v, raising=False)
    store.reload()
    provider.clear_plans()
    yield
    store.reload()
    provider.clear_plans()


def _call(layer, tokens, hint=False, finalize="deterministic", routes_only=False):
    e, h, i, k, g, sch = layer
    return MoECall(tokens, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"), finalize, 0,
                   sch, routes_only, global_experts=g if hint else None)


def _tn(p):
    return dict(p.tiles)["tokens_per_tile"]


# ------------------------------------------------------------------------------------------------ the plans
def test_qwen3_235b_ep8_at_512_tokens_gets_smaller_token_tiles():
    plain = provider.plan(_call(QWEN_EP8, 512), H200)
    hinted = provider.plan(_call(QWEN_EP8, 512, hint=True), H200)
    # all routes local: 4096 routes on 16 experts = 256 per expert; the hint: 512 local routes on ~16 experts
    assert (plain.family, _tn(plain)) == ("sm90", 144) and plain.note.startswith("cost model: ~")
    # ~32 routes per local expert: 48-token tiles of 512 weight rows over four consumer warpgroups (candidate 80)
    assert hinted.family == "sm90" and _tn(hinted) == 48 and dict(hinted.tiles) == fam._W4_MR(48)
    assert hinted.note.startswith("cost model: ~") and hinted.note.endswith(
        ", EP hint: 16 of 128 experts, ~512.0 local routes on ~16.0 experts")
    assert "EP hint" in hinted.describe()
    # the grid bound is still the one for any routing of all T * k routes
    assert hinted.max_tiles == -(-4096 // 48) + 16


def test_qwen3_235b_ep8_at_4_tokens_takes_the_decode_path_with_the_hint():
    plain = provider.plan(_call(QWEN_EP8, 4), H200)
    hinted = provider.plan(_call(QWEN_EP8, 4, hint=True), H200)
    # without the hint the cost model sees 32 routes on 16 experts (re-read 2.1x); with it ~4 routes on ~3.6
    assert not plain.decode and _tn(plain) == 8
    assert hinted.decode and hinted.family == "decode"
    assert "cost model: re-read 1.10x" in hinted.note and "EP hint" in hinted.note
    # 8 tokens: ~8 local routes on ~6.5 experts, re-read 1.24x: the grouped GEMMs, hint or not
    assert not provider.plan(_call(QWEN_EP8, 8, hint=True), H200).decode
    # an expert-parallel half never decodes, hint or not
    assert not provider.plan(_call(QWEN_EP8, 4, hint=True, routes_only=True), H200).decode


def test_deepseek_ep8_rules_with_the_hint():
    cases = {  # tokens: (without, with the hint) on a GPU without tuned rows
        4: (("warp", 8), ("decode", None)),  # ~4 local routes on ~3.8 experts: re-read 1.05x
        8: (("warp", 8), ("warp", 8)),  # ~8 local routes on ~7.2 experts: re-read 1.11x
        64: (("warp", 24), ("warp", 8)),  # 512 routes on 32 experts (16 each: TN 24); ~64 local routes on ~28
        512: (("sm90", 144), ("warp", 24)),  # 4096 routes on 32 experts (128 each: TN 144); 512 local routes
        2048: (("sm90", 144), ("sm90", 80)),
    }
    for t, want in cases.items():
        got = []
        for hint in (False, True):
            p = provider.plan(_call(DEEPSEEK_EP8, t, hint), UNTUNED)
            got.append((p.family, None if p.decode else _tn(p)))
        assert tuple(got) == want, t


@pytest.mark.usefixtures("tuned_rows_current")
def test_deepseek_ep8_tuned_rows_serve_hinted_calls_through_their_ep_key():
    # the tuner measured those rows on the EP8 routing (256 global experts): the table holds them under both
    # keys, so a hinted call selects what an unhinted one selected before the hint existed
    for t in (1, 8, 16, 64, 512, 2048, 8192):
        plain = provider.plan(_call(DEEPSEEK_EP8, t), H200)
        hinted = provider.plan(_call(DEEPSEEK_EP8, t, hint=True), H200)
        # (the hint may add the warp-MMA tile loop, W4A16_MOE_TILE_LOOP=auto: the same tiles, a smaller grid, and
        # then no PDL launch, which the unhinted call of a small-expert layer has: warp.family.pdl_launch)
        loop = hinted.grid_tiles > 0
        assert (hinted.family, hinted.tiles) == (plain.family, plain.tiles), t
        launch = (lambda c: dataclasses.replace(c, tile_loop=False, pdl=False)) if loop else (lambda c: c)
        assert tuple(map(launch, hinted.configs)) == tuple(map(launch, plain.configs)), t
        assert not any(getattr(c, "tile_loop", False) for c in plain.configs)
        assert all(getattr(c, "tile_loop", False) == loop for c in hinted.configs), t
        assert not loop or hinted.family == "warp", t
        # both split rules count the expected local routes (fewer tiles, fewer CTAs): a hinted call may split more,
        # except the decode down kernel, whose work per token is its expected local routes: it may split less,
        # and the warp GEMMs, whose smaller grid may take fewer parts where more would end in a tail wave
        if plain.decode:
            assert hinted.splits[0] >= plain.splits[0] and hinted.splits[1] <= plain.splits[1], t
        elif hinted.family == "warp":
            from w4a16_moe.kernels.cute.warp import family as warp

            e, h, i, k, g, _ = DEEPSEEK_EP8
            up, down = hinted.configs
            want = tuple(warp.num_splits(n, kk, cfg, t * k, e, 132, k, g)
                         for n, kk, cfg in ((2 * i, h, up), (h, i, down)))
            assert hinted.splits == want, t
        else:
            assert all(h >= p for h, p in zip(hinted.splits, plain.splits)), t
        assert hinted.note.startswith(plain.note) and "EP hint" in hinted.note
    # a layer whose tuned rows are keyed without E_global never serves a hinted call with them
    kimi = (384, 7168, 256, 8, 768, "int4_g32")
    assert provider.plan(_call(kimi, 2048), H200).note == "tuned row T=2048"
    note = provider.plan(_call(kimi, 2048, hint=True), H200).note
    assert note.startswith("cost model: ~") and ", EP hint: 384 of 768 experts" in note


def test_split_k_counts_the_expected_local_experts():
    from w4a16_moe.formats.schemes import get_scheme

    up, _ = fam.gemm_configs(get_scheme("int4_g128"), "bf16", "swiglu", True, "fused", fam.TILES[0][1])
    # TN 8 at 4 CTAs per SM: 528 CTAs wanted. 64 routes on 32 local experts: ~27.6 expected tiles x 4 row
    # blocks = 112 CTAs -> 5 splits; with 256 global experts ~7.2 experts are hit: 28 CTAs -> 8 splits (at most)
    # (an expert with more than 8 of the 64 routes takes two tiles: slightly above the experts hit)
    assert tiles.expected_tiles(64, 32, 8) == pytest.approx(32 * (1 - (31 / 32) ** 64), rel=1e-3)
    assert fam.num_splits(512, 7168, up, 64, 32, 132) == 5
    assert fam.num_splits(512, 7168, up, 64, 32, 132, 8, 256) == 8
    from w4a16_moe.kernels.cute.warp import family as warp

    wup, _ = warp.gemm_configs(get_scheme("int4_g128"), "bf16", "swiglu", True, "fused", warp.TILES[0][1])
    # BK 128, N = 2048 (7.3 MB per expert at K = 7168): 16 row blocks x ~27.6 tiles = 448 CTAs -> 2 splits would
    # make 896 CTAs, 1.36 waves of 660 slots (the tail band), 4 would add 7% partial traffic: 1; with the hint
    # ~7.2 tiles: 112 CTAs -> 5 splits, of which K = 7168 (56 K tiles, 12 each at least) keeps 4
    assert warp.num_splits(2048, 7168, wup, 64, 32, 132) == 1
    assert warp.num_splits(2048, 7168, wup, 64, 32, 132, 8, 256) == 4
    assert warp.num_splits(2048, 14336, wup, 64, 32, 132, 8, 256) == 5
    # an expert of less than SPLIT_MIN_EXPERT_BYTES (512 x 7168 / 2 = 1.8 MB) never splits, however small the grid
    assert warp.num_splits(512, 7168, wup, 64, 32, 132, 8, 256) == warp.num_splits(512, 7168, wup, 8, 32, 132) == 1


# ------------------------------------------------------------------------------------------------ the rules
def test_expected_local_routes_and_experts():
    r, d = tiles.expected_local(512 * 8, 16, 8, 128)
    assert r == pytest.approx(512.0) and d == pytest.approx(16.0)
    r, d = tiles.expected_local(8 * 8, 16, 8, 128)
    assert r == pytest.approx(8.0) and d == pytest.approx(16 * (1 - (1 - 8 / 128) ** 8))
    assert tiles.expected_local(0, 16, 8, 128) == (0.0, 0.0)
    # without the hint the rule is unchanged; with it routes per expert is ceil(R_local / D_local)
    assert tiles.routes_per_expert(4096, 16) == 256 and tiles.routes_per_expert(4096, 16, 8, 128) == 32
    assert tiles.routes_per_expert(8, 16, 8, 128) == 1
    # 256 tokens: ~256 local routes on 15.999999 experts is 16 per expert, not 17
    assert tiles.routes_per_expert(256 * 8, 16, 8, 128) == 16 and fam.select_tiles(2048, 16, 8, 128) == fam.TILES[2][1]
    assert tiles.active_experts(64, 32) == 32 and tiles.active_experts(64, 32, 8, 256) == 8
    with pytest.raises(ValueError, match="top_k: the expert-parallel rule needs the call's top-k"):
        tiles.routes_per_expert(64, 32, None, 256)


def test_decode_cost_model_with_the_global_expert_count():
    assert dec.expected_experts(8, 8, 16) == pytest.approx(16 * (1 - 0.5 ** 8))
    assert dec.expected_experts(8, 8, 16, 128) == pytest.approx(16 * (1 - (1 - 8 / 128) ** 8))
    assert dec.expected_experts(8, 8, 16, 16) == dec.expected_experts(8, 8, 16)
    assert dec.reread_factor(8, 8, 16) == pytest.approx(64 / dec.expected_experts(8, 8, 16))
    assert dec.reread_factor(8, 8, 16, 128) == pytest.approx(8 / dec.expected_experts(8, 8, 16, 128))
    assert not dec.use_decode(4, 8, None, 16) and dec.use_decode(4, 8, None, 16, 128)
    assert not dec.use_decode(8, 8, None, 16, 128)  # re-read 1.24x
    # the route bound stays on T * top_k (the launch covers every route, skipped ones included)
    assert not dec.use_decode(9, 8, None, 16, 128)


def test_tuned_key_names_the_global_expert_count():
    assert fam.tuned_key("G", 32, 7168, 2048, "int4_g128", "bf16", 8) == "G|e32_h7168_i2048|int4_g128|bf16|k8"
    assert fam.tuned_key("G", 32, 7168, 2048, "int4_g128", "bf16", 8, 256) == "G|e32of256_h7168_i2048|int4_g128|bf16|k8"
    assert fam.tuned_key("G", 32, 7168, 2048, "int4_g128", "bf16", 8, 32) == fam.tuned_key(
        "G", 32, 7168, 2048, "int4_g128", "bf16", 8)


# ------------------------------------------------------------------------------- validation and the cache
def test_check_global_experts():
    assert check_global_experts(None, 16) is None
    assert check_global_experts(16, 16) is None  # every expert local: no hint
    assert check_global_experts(128, 16) == 128 and check_global_experts(128, 16, 112) == 128
    with pytest.raises(ValueError, match=r"global_num_experts: must be >= expert_offset \+ E_local = 120 \+ 16 = 136"):
        check_global_experts(128, 16, 120)
    with pytest.raises(ValueError, match=r"global_num_experts: must be >= expert_offset \+ E_local = 0 \+ 16 = 16"):
        check_global_experts(8, 16)
    for bad in (128.0, True, "128"):
        with pytest.raises(TypeError, match="global_num_experts: expected an int"):
            check_global_experts(bad, 16)


@pytest.fixture(scope="module")
def small():
    w = random_weights("int4_g32", 4, 64, 64)
    tw, ids = random_routing(6, 2, 16, seed=3)
    return w, torch.randn(6, 64, dtype=torch.float16), tw, ids


@pytest.mark.parametrize("bad,exc,msg", [
    (3, ValueError, r"global_num_experts: must be >= expert_offset \+ E_local = 4 \+ 4 = 8 .*got 3"),
    (7, ValueError, r"global_num_experts: must be >= expert_offset \+ E_local = 4 \+ 4 = 8 .*got 7"),
    (16.0, TypeError, r"global_num_experts: expected an int or None, got float"),
    (False, TypeError, r"global_num_experts: expected an int or None, got bool"),
])
def test_fused_moe_rejects_a_bad_hint(small, bad, exc, msg):
    w, x, tw, ids = small
    with pytest.raises(exc, match=msg):
        wm.fused_moe(x, w, tw, ids, expert_offset=4, global_num_experts=bad, backend="reference")


def test_the_hint_does_not_change_results(small):
    w, x, tw, ids = small
    ref = wm.fused_moe(x, w, tw, ids, expert_offset=4, backend="reference")
    for g in (8, 16, 1000):
        assert torch.equal(wm.fused_moe(x, w, tw, ids, expert_offset=4, global_num_experts=g, backend="reference"),
                           ref)
    out = torch.empty_like(x)
    assert wm.fused_moe(x, w, tw, ids, expert_offset=4, global_num_experts=16, backend="reference", out=out) is out
    assert torch.equal(out, ref)


def test_call_description_and_op_schema(small):
    from w4a16_moe.validate import check_moe_call, check_routes_call

    w, x, tw, ids = small
    assert check_moe_call(x, w, tw, ids, expert_offset=4, global_num_experts=16).global_experts == 16
    assert check_moe_call(x, w, tw, ids).global_experts is None
    assert check_moe_call(x, w, tw, ids, global_num_experts=4).global_experts is None  # E_global == E
    local = torch.where(ids < 4, ids, -1)
    assert check_routes_call(x, w, local, global_num_experts=32).global_experts == 32
    for op in (torch.ops.w4a16_moe.fused_moe.default, torch.ops.w4a16_moe.fused_moe_out.default):
        assert "int? global_num_experts=None" in str(op._schema)


def test_plan_cache_keeps_hinted_calls_apart():
    plain, hinted = _call(QWEN_EP8, 512), _call(QWEN_EP8, 512, hint=True)
    assert plain != hinted and hash(plain) != hash(hinted)
    a, b = provider.plan(plain, H200), provider.plan(hinted, H200)
    assert a is not b and _tn(a) != _tn(b)
    assert provider.plan(plain, H200) is a and provider.plan(hinted, H200) is b
    assert ((plain, H200) in provider._PLANS) and ((hinted, H200) in provider._PLANS)


# --------------------------------------------------------------------------------------------- autotune
def test_autotune_store_keys_a_hinted_layer_apart():
    e, h, i, k, g, sch = QWEN_EP8
    plain = LayerKey("NVIDIA H200", e, h, i, sch, "bf16", k, "swiglu", "deterministic")
    hinted = LayerKey("NVIDIA H200", e, h, i, sch, "bf16", k, "swiglu", "deterministic", g)
    assert plain.text() == "NVIDIA H200|e16_h4096_i1536|int4_g128|bf16|k8|swiglu|deterministic"
    assert hinted.text() == "NVIDIA H200|e16of128_h4096_i1536|int4_g128|bf16|k8|swiglu|deterministic"
    assert hinted.filename().startswith("nvidia-h200-e16of128-h4096-i1536-") and hinted.filename() != plain.filename()
    # a row stored for the hinted layer serves only hinted calls, and the other way round
    t48 = candidate_name(fam.TILES[3][1])
    store.update(hinted, [Row(512, Choice("sm90", t48, 2), Choice("sm90", t48, 2), 90.0, 90.0)], [512])
    p = provider.plan(_call(QWEN_EP8, 512, hint=True), H200)
    assert "autotuned row T=512" in p.note and _tn(p) == 48 and p.splits == (2, 2)
    assert "autotuned" not in provider.plan(_call(QWEN_EP8, 512), H200).note
    t80 = candidate_name(fam.TILES[4][1])
    store.update(plain, [Row(512, Choice("sm90", t80, 1), Choice("sm90", t80, 1), 99.0, 99.0)], [512])
    assert _tn(provider.plan(_call(QWEN_EP8, 512), H200)) == 80
    assert _tn(provider.plan(_call(QWEN_EP8, 512, hint=True), H200)) == 48


def test_autotune_candidates_put_the_hinted_rule_first():
    from w4a16_moe.kernels.cute import autotune

    status = lambda spec, arch: ("prebuilt", "")  # noqa: E731
    first = [c for c in autotune.candidates(_call(QWEN_EP8, 512, hint=True), H200, status=status) if not c.decode][0]
    assert first.candidate == candidate_name(fam.TILES[3][1])
    first = [c for c in autotune.candidates(_call(QWEN_EP8, 512), H200, status=status) if not c.decode][0]
    assert first.candidate == candidate_name(fam.TILES[5][1])


def test_warmup_token_counts_follow_the_global_expert_count():
    from w4a16_moe.api import _warmup_token_counts

    # the bucket edges r = 8 .. 128 at T = r * E / k + 1: over the global experts with the hint
    hinted, plain = _warmup_token_counts(128, 8, 8192), _warmup_token_counts(16, 8, 8192)
    assert 2049 in hinted and 2049 not in plain and 17 in plain and 17 not in hinted


# ---------------------------------------------------------------------------------------- doctor, bench
def test_doctor_plans_a_hinted_call():
    from w4a16_moe import doctor

    e, h, i, k, g, sch = QWEN_EP8
    kw = dict(scheme=sch, hidden=h, intermediate=i, experts=e, top_k=k, device="cpu", arch="sm_90a", tokens=512)
    hinted = doctor.report(**kw, global_experts=g)
    assert "tokens_per_tile=48" in hinted["cute_plan"] and "EP hint: 16 of 128 experts" in hinted["cute_plan"]
    assert hinted["case"]["global_experts"] == 128 and hinted["case"]["tokens"] == 512
    assert "tokens_per_tile=144" in doctor.report(**kw)["cute_plan"]
    with pytest.raises(ValueError, match="global_num_experts: must be >= expert_offset"):
        doctor.report(**kw, global_experts=8)


def test_bench_passes_the_layers_global_expert_count(monkeypatch):
    from w4a16_moe.bench import run
    from w4a16_moe.bench.layers import build_workload

    seen = []

    def fake_fused_moe(x, weights, tw, ids, **kw):
        seen.append(kw.get("global_num_experts"))
        return torch.zeros_like(x)

    monkeypatch.setattr(run, "fused_moe", fake_fused_moe)
    for args, want in ((dict(layer="16,4096,1536,8,128"), 128), (dict(layer="16,4096,1536,8"), 16),
                       (dict(preset="qwen3-235b-ep8"), 128), (dict(preset="deepseek-ep8"), 256),
                       (dict(workload="deepseek-ep8"), 256), (dict(preset="kimi-tp8"), 384)):
        wl, _ = build_workload(**args)
        seen.clear()
        fn = run._provider_fn("cute", wl, weights=None)
        fn(torch.zeros(2, wl.hidden), None, None)
        assert seen == [want], args

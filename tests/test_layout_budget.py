"""``W4A16_MOE_LAYOUTS``: a layer's plans read at most one / two packed layout pairs (``kernels/cute/layout_budget.py``).

CPU: on layers of every kind (TP and EP shards, padded, non-gated, FP4, per channel) every plan ``warmup`` makes up to
4096 tokens (both finalize modes, the expert-parallel halves, the decode kernels) and the masked layout's reads one of
the kept pairs, the first of which the decode kernels read (their plans carry its layouts and padded sizes); the
autotuner only times kept pairs and stores their rows apart. GPU (SM90): calls under each budget match the FP32
reference (output poisoned with NaN) and pack no more layouts than the budget; the decode kernels on every layout
a budget can keep (``decode.family.budget_layouts``).
"""

from __future__ import annotations

import pytest
import torch

from w4a16_moe import settings
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import layout_budget as lb
from w4a16_moe.kernels.cute import provider as prov
from w4a16_moe.kernels.cute.decode import family as dec

from conftest import HAS_CUDA, random_weights, run_cute_moe

SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)

#: (E, H, I, top_k, E_global, scheme, activation)
LAYERS = [
    (384, 7168, 256, 8, None, "int4_g32", "swiglu"),  # Kimi-K2 TP8 (tuned rows on the H200)
    (32, 7168, 2048, 8, 256, "int4_g128", "swiglu"),  # DeepSeek-V3 EP8 rank (the hint)
    (16, 5120, 8192, 1, None, "int4_g128", "swiglu"),  # Llama-4 Scout
    (60, 2048, 704, 4, None, "int4_g64", "swiglu"),  # padded K-64 twins
    (128, 2880, 2880, 4, None, "mxfp4", "swiglu_oai"),  # gpt-oss-120b (padded, FP4)
    (64, 2048, 1024, 6, None, "nvfp4", "swiglu"),
    (8, 1024, 512, 2, None, "int4_channel", "relu2"),  # not gated
    (8, 4096, 14336, 2, None, "int4_g128_zp", "swiglu"),  # Mixtral-8x7B
]


@pytest.fixture
def cpu_plans(monkeypatch):
    """Plan as on an H200 with every kernel available, forgetting cached plans around the test."""
    monkeypatch.setattr(prov, "_kernels_available", lambda arch: None)
    prov.clear_plans()
    yield
    prov.clear_plans()


def _plans(layer, max_tokens=4096):
    e, h, i, k, g, scheme, act = layer
    yield from prov.warmup_plans(H200, e, h, i, scheme, torch.bfloat16, torch.device("cuda"), act, k, max_tokens,
                                 has_bias=act == "swiglu_oai", global_experts=g)


def _call(layer, tokens=1):
    from w4a16_moe.validate import MoECall

    e, h, i, k, g, scheme, act = layer
    return MoECall(tokens, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation(act), "deterministic", 0,
                   scheme, has_bias=act == "swiglu_oai", global_experts=g)


@pytest.mark.parametrize("budget", ["1", "2"])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda v: ",".join(map(str, v[:5])) + "-" + v[5])
def test_plans_read_only_the_kept_pairs(layer, budget, cpu_plans):
    from w4a16_moe.validate import MaskedCall

    with settings.override(layouts=budget):
        call = _call(layer)
        keep = lb.kept(call, H200)
        assert keep is not None and 1 <= len(keep) <= int(budget) and len(set(keep)) == len(keep)
        assert keep[0].sm90  # the decode kernels' and the masked layout's pair
        read, decoded = set(), 0
        for t, p in _plans(layer):
            pair = lb.plan_pair(p, _call(layer, t))
            assert pair in keep, (t, p.family, dict(p.tiles), pair, keep)
            read.add(pair)
            if p.decode:
                decoded += 1
                assert dict(p.tiles)["layout"] == keep[0].decode_layout
                assert (p.configs[0].m64_per_block, p.configs[0].k_tile) == keep[0].geometry("w13")
            assert "W4A16_MOE_LAYOUTS=" + budget in p.note
        if layer[5].startswith("int4") and layer[2] <= 2048:
            assert decoded, "the decode kernels serve the smallest calls under a budget too"
        e, h, i, k, g, scheme, act = layer
        if act != "swiglu_oai":  # the masked layout takes no biases
            masked = MaskedCall(e, 64, h, i, torch.bfloat16, torch.device("cuda"), get_activation(act), scheme)
            assert lb.plan_pair(prov.plan(masked, H200), masked) in lb.kept(masked, H200)
    with settings.override(layouts="all"):
        assert lb.kept(call, H200) is None


def test_unbudgeted_layers_read_more_pairs(cpu_plans):
    """The budget is a restriction: Kimi-K2 TP8's fastest plans read four pairs, a budget of two reads two."""
    layer = LAYERS[0]
    pairs = {s: set() for s in ("all", "2")}
    for s in pairs:
        with settings.override(layouts=s):
            prov.clear_plans()
            pairs[s] = {lb.plan_pair(p, _call(layer, t)) for t, p in _plans(layer, 1024)}
    assert len(pairs["2"]) == 2 and len(pairs["all"]) > 2


def test_kept_pairs_are_priced_by_the_cost_model():
    """On Kimi-K2 TP8 the kept pairs are those of the model's best choices: its one pair is an SM90 pair, and the
    budget of two adds the warp family's (which the model picks at decode and mid sizes)."""
    one = lb.kept_pairs(1, 384, 7168, 256, "int4_g32", True, 8, None, 132, "auto")
    two = lb.kept_pairs(2, 384, 7168, 256, "int4_g32", True, 8, None, 132, "auto")
    assert len(one) == 1 and one[0].sm90 and one[0].sizes == (7168, 256)
    assert two[0].sm90 and two[1].w13.startswith("cute-warp:")


def test_autotuner_times_only_kept_pairs(cpu_plans):
    from w4a16_moe.kernels.cute import autotune as at

    layer = LAYERS[0]
    for t in (1, 16, 256):
        call = _call(layer, t)
        with settings.override(layouts="all"):
            free = at.candidates(call, H200, status=lambda spec, arch: ("prebuilt", None))
        with settings.override(layouts="2"):
            prov.clear_plans()
            keep = lb.kept(call, H200)
            cands = at.candidates(call, H200, status=lambda spec, arch: ("prebuilt", None))
            assert cands and len(cands) < len(free)
            from w4a16_moe.kernels.cute import choice_plan

            for c in cands:
                assert lb.plan_pair(choice_plan.plan_of_choice(call, H200, c), call) in keep


def test_autotune_rows_are_keyed_by_budget():
    from w4a16_moe.kernels.cute.autotune_store import LayerKey

    plain = LayerKey("NVIDIA H200", 8, 1024, 512, "int4_g128", "bf16", 2, "swiglu", "deterministic")
    lean = LayerKey("NVIDIA H200", 8, 1024, 512, "int4_g128", "bf16", 2, "swiglu", "deterministic", None, "2")
    assert "layouts" not in plain.text() and plain.text() != lean.text()
    assert plain.filename() != lean.filename() and "layouts2" in lean.filename()


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("W4A16_MOE_LAYOUTS", "3")
    with pytest.raises(ValueError, match="W4A16_MOE_LAYOUTS: expected one of all, 2, 1"):
        settings.get()


def test_budget_decode_kernels_are_in_the_full_aot_set():
    full = set(dec.aot_variants("full"))
    need = set(dec.budget_variants())
    assert need <= full
    from w4a16_moe.formats.schemes import get_scheme

    sch = get_scheme("int4_g128")
    knobs = dec.knob_items(dec.default_knobs(1, 8, 7168, 512, 132, fp32_scales=dec.takes_fp32_scales(sch)))
    for w13, w2 in dec.budget_layouts():
        up, down = dec.configs(sch, "bf16", "swiglu", knobs, False, (w13, w2))
        assert (up.m64_per_block, up.k_tile, down.m64_per_block, down.k_tile) == (*w13, *w2)
        assert dec.spec_for(up) in full and dec.spec_for(down) in full


# ------------------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------------------
GPU_SCHEMES = ["int4_g32", "int4_g128", "int4_g64_zp", "int4_channel", "nvfp4", "mxfp4"]
GPU_LAYER = (16, 1024, 512)  # E, H, I
GPU_TOKENS = (1, 3, 40, 300)
DECODE_SCHEMES = ["int4_g32", "int4_g128", "mxfp4"]
#: the layouts a budget keeps for the decode kernels (beside their default one, which every decode test reads)
DECODE_TEST_LAYOUTS = dec.budget_layouts()


def _pair_for(layout, h, i) -> "lb.Pair":
    (x13, k13), (x2, k2) = layout
    return lb.Pair(f"cute-sm90:w13:x{x13}:k{k13}:", f"cute-sm90:w2:x{x2}:k{k2}:", (h, i))


def needed_specs() -> list:
    """Every KernelSpec the GPU tests launch (build them for sm_90a before running on a DSL-less machine)."""
    from w4a16_moe.kernels.cute import registry
    from w4a16_moe.validate import MoECall

    e, h, i = GPU_LAYER
    out = {}
    saved = prov._kernels_available
    prov._kernels_available = lambda arch: None
    try:
        for budget in ("1", "2"):
            for scheme in GPU_SCHEMES:
                for t in GPU_TOKENS:
                    with settings.override(layouts=budget):
                        prov.clear_plans()
                        call = MoECall(t, 4, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                                       "deterministic", 0, scheme)
                        p = prov.plan(call, H200)
                    fam = registry.get(p.family)
                    out.update({fam.spec_for(c).name: fam.spec_for(c) for c in p.configs})
        from w4a16_moe.formats.schemes import get_scheme

        for layout in DECODE_TEST_LAYOUTS:
            for scheme in DECODE_SCHEMES:
                sch = get_scheme(scheme)
                for knobs in dec.default_knob_sets(dec.takes_fp32_scales(sch)):
                    for dt in ("bf16", "fp16"):
                        for cfg in dec.configs(sch, dt, "swiglu", dec.knob_items(knobs), False, layout):
                            out[dec.spec_for(cfg).name] = dec.spec_for(cfg)
    finally:
        prov._kernels_available = saved
        prov.clear_plans()
    return list(out.values())


def _layout_pairs(w) -> tuple:
    held = w.packed_nbytes()
    return sum(":w13:" in k for k in held), sum(":w2:" in k for k in held)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("budget", ["1", "2"])
@pytest.mark.parametrize("scheme", GPU_SCHEMES)
def test_budget_calls_match_the_reference(scheme, budget, monkeypatch):
    monkeypatch.setenv("W4A16_MOE_LAYOUTS", budget)
    prov.clear_plans()
    e, h, i = GPU_LAYER
    w = random_weights(scheme, e, h, i, dtype=torch.bfloat16, device="cuda", seed=3)
    for t in GPU_TOKENS:
        run_cute_moe(w, t, 4, seed=t)
    n13, n2 = _layout_pairs(w)
    assert 1 <= n13 <= int(budget) and 1 <= n2 <= int(budget)


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("scheme", DECODE_SCHEMES)
@pytest.mark.parametrize("layout", DECODE_TEST_LAYOUTS, ids=lambda v: "w13x{}k{}-w2x{}k{}".format(*v[0], *v[1]))
def test_decode_kernels_on_budget_layouts(layout, scheme, dtype, monkeypatch):
    """The decode kernels reading each layout pair a budget can keep (forced: ``W4A16_MOE_CUTE_DECODE=1``), EP
    offsets with invalid routes included."""
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "1")
    monkeypatch.setenv("W4A16_MOE_LAYOUTS", "2")
    e, h, i = GPU_LAYER
    grouped = _pair_for(((4, 64), (4, 64)), h, i)  # the grouped choices' pair (plans choose tiles first)
    monkeypatch.setattr(lb, "kept", lambda call, info: (_pair_for(layout, h, i), grouped))
    prov.clear_plans()
    w = random_weights(scheme, e, h, i, dtype=dtype, device="cuda", seed=4)

    def reads_layout(x, tw, ids):
        from w4a16_moe.device import probe
        from w4a16_moe.validate import MoECall

        call = MoECall(x.shape[0], tw.shape[1], h, i, e, x.dtype, x.device, get_activation("swiglu"),
                       "deterministic", 0, scheme)
        p = prov.plan(call, probe(x.device))
        assert p.decode and dict(p.tiles)["layout"] == layout

    run_cute_moe(w, 5, 4, dtype=dtype, offset=8, num_global=24, check_path=reads_layout)
    run_cute_moe(w, 2, 4, dtype=dtype, seed=2, check_path=reads_layout)
    assert [k.split(":")[2:4] for k in w.packed_nbytes()] == [
        [f"x{layout[0][0]}", f"k{layout[0][1]}"], [f"x{layout[1][0]}", f"k{layout[1][1]}"]]
    prov.clear_plans()

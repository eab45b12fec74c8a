"""The expert-parallel hint read from a layer's first call (``w4a16_moe.ep_observe``), on the CPU: what the call
that follows is planned with, once per layer, and where no decision is taken (warmup, explicit hints, the
setting, other backends)."""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from conftest import HAS_CUDA, random_routing, random_weights, run_cute_moe
from w4a16_moe import ep_observe, ops
from w4a16_moe.activations import get_activation
from w4a16_moe.validate import MoECall


@pytest.fixture(autouse=True)
def _fresh_decisions(monkeypatch):
    monkeypatch.delenv("W4A16_MOE_EP_OBSERVE", raising=False)
    ep_observe.forget()
    yield
    ep_observe.forget()


@pytest.fixture
def planned(monkeypatch):
    """The ``global_experts`` of every call description the provider selection sees, in call order."""
    from w4a16_moe import providers

    seen = []
    real = providers.select_provider

    def spy(call, backend):  # records, then runs the FP32 reference (this machine has no GPU)
        seen.append(call.global_experts)
        return real(call, "reference")

    monkeypatch.setattr(ops, "select_provider", spy)
    monkeypatch.setattr(providers, "select_provider", lambda call, backend: real(call, "reference"))
    return seen


@pytest.fixture(scope="module")
def layer():
    """4 local experts of a 32-expert model; x and routing of 8 tokens, top-2, uniform over the 32."""
    w = random_weights("int4_g32", 4, 64, 64)
    tw, ids = random_routing(8, 2, 32, seed=5)
    return w, torch.randn(8, 64, dtype=torch.float16), tw, ids


def _ids_with_max(ids, top):
    ids = ids.clone()
    ids[0, 0] = top
    return ids


@pytest.mark.parametrize("offset", [0, 12, 28])  # the first, a middle and the last rank of 8
def test_first_call_decides_the_hint_for_every_later_call(layer, planned, offset):
    w, x, tw, ids = layer
    ids = _ids_with_max(ids.clamp(max=30), 31)  # reaches the last global id
    ref = wm.fused_moe(x, w, tw, ids, expert_offset=offset, backend="reference")
    assert planned == [None]  # backend="reference" neither observes nor needs a hint
    out = wm.fused_moe(x, w, tw, ids, expert_offset=offset)
    assert torch.equal(out, ref)
    local = torch.full_like(ids, offset)  # a later call with only local ids keeps the decision
    wm.fused_moe(x, w, tw, local, expert_offset=offset)
    assert planned == [None, 32, 32]


def test_only_the_cute_and_auto_backends_observe(layer, planned):
    w, x, tw, ids = layer
    wm.fused_moe(x, w, tw, ids, backend="triton")  # Triton plans take no hint: nothing to decide
    wm.fused_moe(x, w, tw, ids, backend="cute")
    assert planned == [None, _estimate(ids)]


def _estimate(ids, experts=4, offset=0):
    return ep_observe.estimate_global_experts(int(ids.max()), experts, offset)


@pytest.mark.parametrize("max_id,experts,offset,want", [
    (31, 4, 0, 32), (17, 4, 0, 32), (16, 4, 0, 32), (15, 4, 0, 16), (3, 4, 0, 4), (0, 4, 8, 16),
    (199, 32, 0, 256), (223, 32, 0, 256), (100, 32, 224, 256), (255, 32, 0, 256), (256, 32, 0, 512),
    (139, 20, 0, 160), (95, 16, 0, 128), (200, 48, 48, 384),  # DeepSeek, GLM-4.5, Qwen3, Kimi EP8 ranks
    (5, 4, 2, 6), (40, 6, 3, 41)])  # a local range off the E grid: the lower bound
def test_the_estimate_is_the_smallest_power_of_two_rank_count_holding_every_id(max_id, experts, offset, want):
    assert ep_observe.estimate_global_experts(max_id, experts, offset) == want


@pytest.mark.parametrize("args", [(-1, 4, 0), (3, 0, 0), (3, 4, -4)])
def test_the_estimate_rejects_impossible_arguments(args):
    with pytest.raises(ValueError, match="estimate_global_experts"):
        ep_observe.estimate_global_experts(*args)


def test_the_hint_holds_every_id_and_the_local_range(layer, planned):
    w, x, tw, ids = layer
    wm.fused_moe(x, w, tw, torch.where(ids < 4, ids, 17), expert_offset=0)
    assert planned == [32]  # ids up to 17 on ranks of 4: 5 ranks seen, 8 assumed
    ep_observe.forget()
    below = torch.full_like(ids, 5)
    below[3, 1] = 1  # below the local range 2..5
    wm.fused_moe(x, w, tw, below, expert_offset=2)
    assert planned == [32, 6]  # off the E grid: max id 5 + 1 = expert_offset + E, the smallest hint accepted


def test_all_local_or_invalid_ids_decide_no_expert_parallelism(layer, planned):
    w, x, tw, ids = layer
    masked = torch.where(ids < 4, ids, -1)  # invalid routes are not another rank's experts
    wm.fused_moe(x, w, tw, masked)
    wm.fused_moe(x, w, tw, ids)  # decided once: later ids do not change the plan
    assert planned == [None, None]


def test_warmup_and_explicit_hints_decide_nothing(layer, planned):
    w, x, tw, ids = layer
    with ep_observe.paused():
        wm.fused_moe(x, w, tw, ids)
    wm.warmup(w, dtype=torch.float16, top_k=2, max_tokens=2, finalize="deterministic", backend="auto")
    wm.fused_moe(x, w, tw, ids, global_num_experts=4)  # the caller said: every expert is local
    assert planned[0] is None and all(g is None for g in planned)
    wm.fused_moe(x, w, tw, ids)
    assert planned[-1] == _estimate(ids)  # the first call that may decide


def test_the_setting_turns_it_off(layer, planned, monkeypatch):
    w, x, tw, ids = layer
    monkeypatch.setenv("W4A16_MOE_EP_OBSERVE", "0")
    wm.fused_moe(x, w, tw, ids)
    monkeypatch.setenv("W4A16_MOE_EP_OBSERVE", "1")
    wm.fused_moe(x, w, tw, ids)
    assert planned == [None, _estimate(ids)]


def test_layers_and_expert_ranges_decide_apart(layer, planned):
    w, x, tw, ids = layer
    other = random_weights("int4_g32", 4, 64, 64, seed=1)
    wm.fused_moe(x, w, tw, ids)
    wm.fused_moe(x, other, tw, torch.where(ids < 4, ids, -1))
    wm.fused_moe(x, w, tw, ids, expert_offset=4)
    wm.fused_moe(x, other, tw, ids)
    g = _estimate(ids)
    assert planned == [g, None, g, None]


#: the GPU test's layer: 16 local experts of 128 (H 1024, I 1024, INT4 g128), 64 tokens top-8; counted all local, the
#: plan takes the WGMMA family's large token tiles, with the hint the warp family's small ones (as the shipped cost
#: model prices them on an H100 and an H200)
EP_LAYER = dict(experts=16, hidden=1024, intermediate=1024, tokens=64, top_k=8, global_experts=128)


@pytest.mark.parametrize("gpu", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_the_gpu_tests_layer_plans_apart_with_the_hint(gpu, monkeypatch):
    """The premise of the GPU test below, checked on the CPU: the hint changes that layer's plan (sm90 -> warp)."""
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider as prov

    monkeypatch.setattr(prov, "_kernels_available", lambda arch: None)
    info = DeviceInfo("cuda", gpu, (9, 0), 132)
    L = EP_LAYER
    fams = []
    for g in (None, L["global_experts"]):
        call = MoECall(L["tokens"], L["top_k"], L["hidden"], L["intermediate"], L["experts"], torch.bfloat16,
                       torch.device("cuda"), get_activation("swiglu"), "deterministic", 0, "int4_g128",
                       global_experts=g)
        fams.append(prov.plan(call, info).family)
        prov.clear_plans()
    assert fams == ["sm90", "warp"]


# ------------------------------------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_CUDA and torch.cuda.get_device_capability()[0] == 9), reason="needs an SM90 GPU")
def test_gpu_unhinted_ep_rank_runs_the_hinted_plan():
    """:data:`EP_LAYER` (16 local experts of 128, 64 tokens top-8): all routes counted local, the plan takes the
    WGMMA family's large token tiles; with the hint (observed on the first call) the warp family's small ones."""
    from w4a16_moe.device import probe
    from w4a16_moe.kernels.cute import provider as prov

    L = EP_LAYER
    w = random_weights("int4_g128", L["experts"], L["hidden"], L["intermediate"], dtype=torch.bfloat16,
                       device="cuda", seed=4)
    t, k = L["tokens"], L["top_k"]
    x, tw, ids, out = run_cute_moe(w, t, k, num_global=L["global_experts"], seed=9)  # the first call decides
    g = ep_observe.observed_global_experts(w.w13.codes, ids, L["experts"], 0)
    assert g == L["global_experts"]  # ids reach 120 or more: 8 ranks of 16
    plain = prov.plan(_call(w, x, t, k, None), probe(x.device))
    hinted = prov.plan(_call(w, x, t, k, g), probe(x.device))
    assert plain.family == "sm90" and hinted.family == "warp"  # the hint changes the plan
    again = torch.full_like(x, float("nan"))
    wm.fused_moe(x, w, tw, ids, backend="cute", out=again)
    hint = wm.fused_moe(x, w, tw, ids, backend="cute", global_num_experts=g)
    assert torch.equal(again, out) and torch.equal(hint, out)  # every call of the layer: the hinted plan


def _call(w, x, t, k, g):
    return MoECall(t, k, w.hidden_size, w.intermediate_size, w.num_experts, x.dtype, x.device,
                   get_activation("swiglu"), "deterministic", 0, w.scheme.name, global_experts=g)

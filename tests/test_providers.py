"""Provider selection with the device probe mocked: no GPU, SM80, SM90, SM100."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe import providers
from w4a16_moe.device import DeviceInfo
from w4a16_moe.validate import check_moe_call

from conftest import random_routing, random_weights

CPU = DeviceInfo("cpu", "cpu")
SM80 = DeviceInfo("cuda", "NVIDIA A100", (8, 0), 108)
SM90 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
SM100 = DeviceInfo("cuda", "NVIDIA B200", (10, 0), 148)
SM75 = DeviceInfo("cuda", "Tesla T4", (7, 5), 40)


@pytest.fixture
def call():
    """A call every CuTe family refuses for its shape: ``H = 100`` breaks their rule (multiples of 8). No 4-bit
    weights have such an ``H`` (their own rule is the same), so the call is the checked one of ``H = 96`` with
    ``hidden`` replaced: what these tests exercise is the provider choice."""
    w = random_weights("int4_channel", 4, 96, 64)
    tw, ids = random_routing(3, 2, 4)
    return dataclasses.replace(check_moe_call(torch.randn(3, 96, dtype=torch.float16), w, tw, ids), hidden=100)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("W4A16_MOE_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("info", [SM80, SM90, SM100])
def test_auto_picks_triton_when_cute_unavailable(call, info):
    d = providers.select_provider(call, "auto", info)
    assert d.provider == "triton"
    assert "cute" in d.rejected and d.rejected["cute"]


def test_auto_picks_cute_when_it_covers_the_case(call, monkeypatch):
    class Stub:
        name = "cute"

        def unavailable_reason(self, c, i):
            return None

        def plan(self, c, i):
            return providers.Plan("cute", "sm90", "sm_90a")

    monkeypatch.setitem(providers._PROVIDERS, "cute", Stub())
    d = providers.select_provider(call, "auto", SM90)
    assert d.provider == "cute" and d.plan.family == "sm90"


def test_providers_are_objects_with_one_interface(call):
    for name in ("cute", "triton", "reference"):
        p = providers.get_provider(name)
        assert p.name == name and providers.PROVIDERS[name] is p
        for m in ("unavailable_reason", "plan", "run", "run_masked", "expert_routes"):
            assert callable(getattr(p, m)), (name, m)
    assert providers.select_provider(call, "reference", CPU).plan.provider == "reference"


def test_no_gpu_raises_clear_error(call):
    with pytest.raises(wm.ProviderUnavailable, match="needs a CUDA GPU, but the tensors are on cpu.*reference"):
        providers.select_provider(call, "auto", CPU)


def test_reference_runs_anywhere(call):
    assert providers.select_provider(call, "reference", CPU).provider == "reference"


# SM80 / SM100 have a CuTe family (the portable warp-MMA one), so what stops them here is the toy shape
@pytest.mark.parametrize("info,match", [(CPU, "not a CUDA GPU"), (SM75, "no CuTe kernel family for sm_75"),
                                        (SM80, "hidden size H = 100 is not a multiple of 8"),
                                        (SM100, "hidden size H = 100 is not a multiple of 8")])
def test_explicit_cute_is_strict(call, info, match):
    with pytest.raises(wm.ProviderUnavailable, match=f"backend='cute' cannot run fused_moe: .*{match}"):
        providers.select_provider(call, "cute", info)


def test_explicit_triton(call):
    assert providers.select_provider(call, "triton", SM90).provider == "triton"
    with pytest.raises(wm.ProviderUnavailable, match="compute capability 7.5 is below 8.0"):
        providers.select_provider(call, "triton", SM75)
    with pytest.raises(wm.ProviderUnavailable, match="not a CUDA GPU"):
        providers.select_provider(call, "triton", CPU)


def test_triton_interpreter_on_cpu(call, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert providers.select_provider(call, "auto", CPU).provider == "triton"


def test_env_variable_applies_to_auto_only(monkeypatch):
    monkeypatch.setenv("W4A16_MOE_BACKEND", "reference")
    assert providers.resolve_backend("auto") == "reference"
    assert providers.resolve_backend("triton") == "triton"
    monkeypatch.setenv("W4A16_MOE_BACKEND", "fast")
    with pytest.raises(ValueError, match="W4A16_MOE_BACKEND: expected one of .* got 'fast'"):
        providers.resolve_backend("auto")


def test_backend_name_checked():
    with pytest.raises(ValueError, match="backend: expected one of"):
        providers.resolve_backend("cuda")
    with pytest.raises(TypeError, match="backend: expected a str"):
        providers.resolve_backend(None)


def test_env_backend_reference_end_to_end(monkeypatch):
    monkeypatch.setenv("W4A16_MOE_BACKEND", "reference")
    w = random_weights("int4_g32", 4, 64, 64)
    tw, ids = random_routing(3, 2, 4)
    x = torch.randn(3, 64, dtype=torch.float16)
    y = wm.fused_moe(x, w, tw, ids)
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), wm.reference_moe(x, w, tw, ids), rtol=1e-3, atol=1e-3)


def test_selection_is_logged(call, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="w4a16_moe"):
        providers.select_provider(call, "auto", SM90)
    assert any("provider triton" in r.message for r in caplog.records)


# ------------------------------------------------------------------------------------------------
# gpt-oss features (per-expert biases, swiglu_oai): every CuTe family runs them
# ------------------------------------------------------------------------------------------------
_BIAS_WHY = "biases (w13_bias/w2_bias) are not supported by this CuTe family's kernels"
_OAI_WHY = "activation swiglu_oai is not supported by this CuTe family's kernels"


def _gpt_oss_call(bias: bool, activation: str, masked: bool = False):
    from w4a16_moe.validate import check_masked_call

    from conftest import with_biases

    w = random_weights("int4_g32", 4, 256, 256)  # a shape the CuTe families accept
    if bias:
        w = with_biases(w, w2=False)
    if masked:
        return check_masked_call(torch.zeros(4, 8, 256, dtype=torch.bfloat16), w,
                                 torch.zeros(4, dtype=torch.int32), activation=activation)
    tw, ids = random_routing(3, 2, 4)
    return check_moe_call(torch.randn(3, 256, dtype=torch.bfloat16), w, tw, ids, activation=activation)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("bias,activation", [
    (True, "swiglu"), (False, "swiglu_oai"), (False, "swiglu_oai(alpha=1.5,limit=3.0)"), (True, "swiglu_oai")])
@pytest.mark.parametrize("info", [SM80, SM90, SM100])
def test_cute_runs_biases_and_swiglu_oai_on_the_grouped_families(info, bias, activation, masked, monkeypatch):
    from w4a16_moe.kernels.cute import provider, registry

    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    provider.clear_plans()
    call = _gpt_oss_call(bias, activation, masked)
    assert call.has_bias == bias
    assert providers.cute_unavailable_reason(call, info) is None
    d = providers.select_provider(call, "auto", info)
    assert d.provider == "cute", d
    p = d.plan
    # SM90: routed calls take the family of the rule's choice (the cost model: 3 tokens x top-2 over 4 experts),
    # masked calls the SM90 tiles; other archs: the warp-MMA family
    if info is SM90:
        from w4a16_moe.kernels.cute.sm90 import family as sm90

        want = "sm90" if masked else sm90.rule_choice(3 * 2, 4, 2, None, call.scheme, call.hidden, call.intermediate,
                                                      call.activation.gated, info.sms)[0]
    else:
        want = "warp"
    assert p.family == want and not p.decode
    up, down = p.configs
    assert up.activation == call.activation.name and up.bias == bias and down.bias == bias  # masked: "y"
    if not masked:  # the decode kernels run them too (this call's re-read factor sends it to the grouped GEMMs)
        assert registry.get("decode").can_implement(call) is None
    provider.clear_plans()


def test_cute_reason_without_gpt_oss_features_is_not_theirs():
    call = _gpt_oss_call(False, "swiglu")
    assert not call.has_bias
    why = providers.cute_unavailable_reason(call, SM90)
    assert why is None or ("bias" not in why and "swiglu_oai" not in why)

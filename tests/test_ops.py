"""The torch ops: registration, fake (meta) implementations, torch.compile without graph breaks."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import w4a16_moe as wm
from w4a16_moe import ops

from conftest import nrmse, random_routing, random_weights


def test_ops_registered():
    for name in ("fused_moe", "fused_moe_out", "fused_moe_masked"):
        assert hasattr(torch.ops.w4a16_moe, name)


@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g32_zp", "nvfp4"])
def test_fake_shapes(scheme):
    w = random_weights(scheme, 4, 64, 64, dtype=torch.bfloat16)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fw = w.to("cpu")
        fw = wm.MoEWeights(fw.scheme, fw.w13.map(mode.from_tensor), fw.w2.map(mode.from_tensor), fw.gated)
        x = torch.empty(5, 64, dtype=torch.bfloat16)
        ids = torch.empty(5, 3, dtype=torch.int32)
        tw = torch.empty(5, 3)
        y = torch.ops.w4a16_moe.fused_moe(x, *ops.weight_args(fw), tw, ids, scheme, "swiglu", "fused", 0, "auto")
        assert y.shape == (5, 64) and y.dtype == torch.bfloat16
        xm = torch.empty(4, 7, 64, dtype=torch.bfloat16)
        ym = torch.ops.w4a16_moe.fused_moe_masked(xm, *ops.weight_args(fw), torch.empty(4, dtype=torch.int32),
                                                  scheme, "swiglu", "auto")
        assert ym.shape == (4, 7, 64)
        with pytest.raises(ValueError, match="x: hidden size 32"):
            torch.ops.w4a16_moe.fused_moe(torch.empty(5, 32, dtype=torch.bfloat16), *ops.weight_args(fw), tw, ids,
                                          scheme, "swiglu", "fused", 0, "auto")


def _compiled_matches(device, backend, dtype, global_num_experts=None):
    torch._dynamo.reset()
    w = random_weights("int4_g32", 4, 128, 64, dtype=dtype, device=device)
    tw, ids = random_routing(6, 2, 4, device=device)
    x = torch.randn(6, 128, dtype=dtype, device=device)
    out = torch.empty_like(x)

    def layer(x, tw, ids):
        y = wm.fused_moe(x, w, tw, ids, backend=backend, global_num_experts=global_num_experts)
        wm.fused_moe(x, w, tw, ids, backend=backend, out=out, global_num_experts=global_num_experts)
        return y * 2

    compiled = torch.compile(layer, fullgraph=True)
    got = compiled(x, tw, ids)
    ref = wm.reference_moe(x, w, tw, ids)
    assert nrmse(got / 2, ref) < 0.02
    assert nrmse(out, ref) < 0.02


def test_torch_compile_fullgraph_cpu_reference():
    _compiled_matches("cpu", "reference", torch.float16)


def test_torch_compile_fullgraph_with_the_ep_hint():
    _compiled_matches("cpu", "reference", torch.float16, global_num_experts=32)


def test_fake_checks_the_ep_hint():
    w = random_weights("int4_g32", 4, 64, 64, dtype=torch.bfloat16)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fw = wm.MoEWeights(w.scheme, w.w13.map(mode.from_tensor), w.w2.map(mode.from_tensor), w.gated)
        x, ids, tw = torch.empty(5, 64, dtype=torch.bfloat16), torch.empty(5, 3, dtype=torch.int32), torch.empty(5, 3)
        args = (x, *ops.weight_args(fw), tw, ids, "int4_g32", "swiglu", "fused", 4, "auto")
        assert torch.ops.w4a16_moe.fused_moe(*args, 64).shape == (5, 64)
        with pytest.raises(ValueError, match=r"global_num_experts: must be >= expert_offset \+ E_local = 4 \+ 4"):
            torch.ops.w4a16_moe.fused_moe(*args, 6)
        with pytest.raises(ValueError, match="global_num_experts: must be >="):
            torch.ops.w4a16_moe.fused_moe_out(*args, torch.empty_like(x), global_num_experts=6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_compile_fullgraph_gpu(dtype):
    _compiled_matches("cuda", "auto", dtype)


def test_op_validates_weights_once_per_tensor_metadata(monkeypatch):
    """The op rebuilds MoEWeights from its tensors per call, re-running validate() only for tensor
    metadata it has not seen (validation reads only metadata); a malformed layout still raises."""
    from w4a16_moe.formats.weights import MoEWeights

    w = random_weights("int4_g32", 4, 64, 64)
    tw, ids = random_routing(3, 2, 4)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    ref = wm.fused_moe(x, w, tw, ids, backend="reference")
    calls = []
    orig = MoEWeights.validate
    monkeypatch.setattr(MoEWeights, "validate", lambda self: (calls.append(1), orig(self))[1])
    ops._VALIDATED.clear()
    for _ in range(3):
        assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="reference"), ref)
    assert len(calls) == 1
    bad = list(ops.weight_args(w))
    bad[5] = bad[5][:, :, :1].contiguous()  # w2.scales of the wrong shape
    with pytest.raises(ValueError, match="w2.scales: expected shape"):
        torch.ops.w4a16_moe.fused_moe(x, *bad, tw, ids, "int4_g32", "swiglu", "deterministic", 0, "reference")


def test_decision_logs_its_plan(caplog, monkeypatch):
    import logging

    w = random_weights("int4_g32", 4, 64, 64)
    tw, ids = random_routing(3, 2, 4)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="w4a16_moe"):
        wm.fused_moe(x, w, tw, ids, backend="reference")
        wm.fused_moe(x, w, tw, ids, backend="reference", global_num_experts=16)
    assert any("provider reference" in m and "plan: provider reference" in m for m in caplog.messages)
    assert any("4 of 16 experts" in m for m in caplog.messages)


@pytest.mark.parametrize("w13_bias,w2_bias", [(True, True), (True, False), (False, True)])
def test_fake_shapes_with_biases(w13_bias, w2_bias):
    from conftest import with_biases

    w = with_biases(random_weights("mxfp4", 4, 64, 64, dtype=torch.bfloat16), w13=w13_bias, w2=w2_bias,
                    dtype=torch.bfloat16)
    args = ops.weight_args(w)
    assert len(args) == 10 and (args[8] is w.w13_bias) and (args[9] is w.w2_bias)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fk = lambda t: None if t is None else mode.from_tensor(t)  # noqa: E731
        fw = wm.MoEWeights(w.scheme, w.w13.map(mode.from_tensor), w.w2.map(mode.from_tensor), w.gated,
                           fk(w.w13_bias), fk(w.w2_bias))
        x = torch.empty(5, 64, dtype=torch.bfloat16)
        ids = torch.empty(5, 3, dtype=torch.int32)
        tw = torch.empty(5, 3)
        for act in ("swiglu_oai", "swiglu_oai(alpha=1.5,limit=10.0)"):
            y = torch.ops.w4a16_moe.fused_moe(x, *ops.weight_args(fw), tw, ids, "mxfp4", act, "fused", 0, "auto")
            assert y.shape == (5, 64) and y.dtype == torch.bfloat16
            ym = torch.ops.w4a16_moe.fused_moe_masked(torch.empty(4, 7, 64, dtype=torch.bfloat16),
                                                      *ops.weight_args(fw), torch.empty(4, dtype=torch.int32),
                                                      "mxfp4", act, "auto")
            assert ym.shape == (4, 7, 64)
        bad = list(ops.weight_args(fw))
        bad[8] = torch.empty(4, 7, dtype=torch.float32) if w13_bias else None
        bad[9] = torch.empty(4, 65, dtype=torch.float32)
        with pytest.raises(ValueError, match="w13_bias: expected" if w13_bias else "w2_bias: expected"):
            torch.ops.w4a16_moe.fused_moe(x, *bad, tw, ids, "mxfp4", "swiglu", "fused", 0, "auto")


@pytest.mark.parametrize("activation", ["swiglu", "swiglu_oai", "swiglu_oai(alpha=1.5,limit=2.0)"])
def test_reference_backend_honours_biases(activation):
    """``fused_moe(backend="reference")`` (through the torch op) equals ``reference_moe`` with biases, and
    differs from the same weights without them; routed (EP offset, invalid ids) and masked."""
    from conftest import with_biases

    from w4a16_moe.activations import get_activation

    plain = random_weights("int4_g32", 4, 64, 64)
    w = with_biases(plain, scale=1.0)
    tw, ids = random_routing(6, 2, 7)
    ids[0, 1] = -1
    x = torch.randn(6, 64, dtype=torch.float16) * 4
    ref = wm.reference_moe(x, w, tw, ids, activation=activation, expert_offset=2)
    for fin in ("deterministic", "fused"):
        got = wm.fused_moe(x, w, tw, ids, activation=activation, finalize=fin, expert_offset=2, backend="reference")
        assert torch.equal(got, ref.to(x.dtype))
    act = get_activation(activation)
    assert torch.equal(wm.fused_moe(x, w, tw, ids, activation=act, expert_offset=2, backend="reference"),
                       ref.to(x.dtype))
    unbiased = wm.reference_moe(x, plain, tw, ids, activation=activation, expert_offset=2)
    assert nrmse(unbiased, ref) > 0.1
    xm = torch.randn(4, 5, 64, dtype=torch.float16)
    mm = torch.tensor([0, 5, 3, 9], dtype=torch.int32)
    refm = wm.reference_moe_masked(xm, w, mm, activation=activation)
    assert torch.equal(wm.fused_moe_masked(xm, w, mm, activation=activation, backend="reference"), refm.half())
    assert (refm[0] == 0).all() and (refm[2, 3:] == 0).all()


def test_torch_compile_fullgraph_cpu_reference_with_biases():
    from conftest import with_biases

    torch._dynamo.reset()
    w = with_biases(random_weights("int4_g32", 4, 128, 64), dtype=torch.bfloat16)
    tw, ids = random_routing(6, 2, 4)
    x = torch.randn(6, 128, dtype=torch.float16)
    act = "swiglu_oai(alpha=1.5,limit=2.0)"
    compiled = torch.compile(lambda x, tw, ids: wm.fused_moe(x, w, tw, ids, activation=act, backend="reference") * 2,
                             fullgraph=True)
    ref = wm.reference_moe(x, w, tw, ids, activation=act)
    assert nrmse(compiled(x, tw, ids) / 2, ref) < 0.01

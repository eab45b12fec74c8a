"""A table of bad inputs: each raises TypeError/ValueError naming the argument and the rule."""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm

from conftest import random_routing, random_weights

T, H, I, E, K = 4, 64, 64, 4, 2


@pytest.fixture(scope="module")
def good():
    w = random_weights("int4_g32", E, H, I)
    tw, ids = random_routing(T, K, E)
    return dict(x=torch.randn(T, H, dtype=torch.float16), weights=w, topk_weights=tw, topk_ids=ids)


def _f32(*s):
    return torch.rand(*s)


CASES = [
    # (name, patch, exception, message regex)
    ("x dtype", dict(x=torch.randn(T, H)), TypeError, r"x: expected dtype torch.bfloat16 or torch.float16, got torch.float32"),
    ("x rank", dict(x=torch.randn(T, H, 1, dtype=torch.float16)), ValueError, r"x: expected a 2-D tensor \[T, H\]"),
    ("x strided", dict(x=torch.randn(H, T, dtype=torch.float16).t()), ValueError, r"x: must be contiguous"),
    ("x hidden", dict(x=torch.randn(T, 32, dtype=torch.float16)), ValueError, r"x: hidden size 32 does not match the weights' hidden size 64"),
    ("x type", dict(x=[[1.0]]), TypeError, r"x: expected a torch.Tensor, got list"),
    ("weights type", dict(weights="int4"), TypeError, r"weights: expected w4a16_moe.MoEWeights, got str"),
    ("ids dtype", dict(topk_ids=torch.zeros(T, K, dtype=torch.float32)), TypeError, r"topk_ids: expected int32 or int64, got torch.float32"),
    ("ids shape", dict(topk_ids=torch.zeros(T + 1, K, dtype=torch.int32)), ValueError, r"topk_ids: expected shape \[T=4, k\], got \(5, 2\)"),
    ("ids k=0", dict(topk_ids=torch.zeros(T, 0, dtype=torch.int32), topk_weights=torch.zeros(T, 0)), ValueError, r"topk_ids: top-k must be at least 1"),
    ("weights dtype", dict(topk_weights=torch.rand(T, K, dtype=torch.float16)), TypeError, r"topk_weights: expected float32, got torch.float16"),
    ("weights shape", dict(topk_weights=_f32(T, K + 1)), ValueError, r"topk_weights: expected shape \(4, 2\) like topk_ids, got \(4, 3\)"),
    ("activation", dict(activation="gelu"), ValueError, r"activation: unknown activation 'gelu'; known: swiglu, geglu, relu2, silu"),
    ("activation gated mismatch", dict(activation="relu2"), ValueError, r"activation: 'relu2' is non-gated, but the weights were built for a gated activation"),
    ("activation type", dict(activation=3), TypeError, r"activation: expected a str, got int"),
    ("finalize", dict(finalize="atomic"), ValueError, r"finalize: expected one of \('deterministic', 'fused'\), got 'atomic'"),
    ("offset type", dict(expert_offset=1.5), TypeError, r"expert_offset: expected an int, got float"),
    ("offset bool", dict(expert_offset=True), TypeError, r"expert_offset: expected an int, got bool"),
    ("offset negative", dict(expert_offset=-1), ValueError, r"expert_offset: must be in \[0, "),
    ("backend", dict(backend="cuda"), ValueError, r"backend: expected one of \('auto', 'cute', 'triton', 'reference'\), got 'cuda'"),
    ("out dtype", dict(out=torch.empty(T, H)), TypeError, r"out: expected dtype torch.float16 like x, got torch.float32"),
    ("out shape", dict(out=torch.empty(T, H + 1, dtype=torch.float16)), ValueError, r"out: expected shape \(4, 64\), got \(4, 65\)"),
    ("global type", dict(global_num_experts=8.0), TypeError, r"global_num_experts: expected an int or None, got float"),
    ("global rule", dict(expert_offset=2, global_num_experts=5), ValueError,
     r"global_num_experts: must be >= expert_offset \+ E_local = 2 \+ 4 = 6 \(the local experts are global ids"),
]


# The reference also accepts FP32 x and ignores backend=, and has no selection hint, so those rows apply to
# fused_moe only.
PARAMS = [(entry, *c) for entry in ("fused_moe", "reference_moe") for c in CASES
          if entry == "fused_moe" or c[0] not in ("x dtype", "backend", "global type", "global rule")]


@pytest.mark.parametrize("entry,name,patch,exc,msg", PARAMS, ids=[f"{p[0]}-{p[1]}" for p in PARAMS])
def test_bad_input(good, entry, name, patch, exc, msg):
    kw = {**good, **patch}
    fn = getattr(wm, entry)
    args = [kw.pop(k) for k in ("x", "weights", "topk_weights", "topk_ids")]
    kw.setdefault("backend", "reference")
    with pytest.raises(exc, match=msg):
        fn(*args, **kw)


MASKED = [
    ("x rank", dict(x=torch.randn(E, 4, dtype=torch.float16)), ValueError, r"x: expected a 3-D tensor \[E, cap, H\]"),
    ("x experts", dict(x=torch.randn(E + 1, 3, H, dtype=torch.float16)), ValueError, r"x: expected 4 experts in dim 0"),
    ("masked dtype", dict(masked_m=torch.zeros(E, dtype=torch.int64)), TypeError, r"masked_m: expected int32, got torch.int64"),
    ("masked shape", dict(masked_m=torch.zeros(E, 1, dtype=torch.int32)), ValueError, r"masked_m: expected shape \(4,\), got \(4, 1\)"),
]


@pytest.mark.parametrize("name,patch,exc,msg", MASKED, ids=[c[0] for c in MASKED])
def test_bad_masked_input(good, name, patch, exc, msg):
    kw = dict(x=torch.randn(E, 3, H, dtype=torch.float16), weights=good["weights"],
              masked_m=torch.ones(E, dtype=torch.int32))
    kw.update(patch)
    with pytest.raises(exc, match=msg):
        wm.fused_moe_masked(kw["x"], kw["weights"], kw["masked_m"], backend="reference")


def test_weights_on_other_device(good, monkeypatch):
    w = good["weights"]
    x = good["x"].to("meta")
    with pytest.raises(ValueError, match=r"weights: on cpu, but x is on meta"):
        wm.fused_moe(x, w, good["topk_weights"], good["topk_ids"], backend="reference")

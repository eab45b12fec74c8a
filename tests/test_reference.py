"""The FP32 references against an independent per-token, per-route loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import w4a16_moe as wm

from conftest import k_for, random_routing, random_weights


def _loop_moe(x, weights, tw, ids, activation, expert_offset):
    """Independent definition: one token, one route at a time, straight from the dequantized weights."""
    w13, w2 = weights.dequantize()
    i = weights.intermediate_size
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - expert_offset
            if not 0 <= e < weights.num_experts:
                continue
            h = w13[e].double() @ x[t].double()
            if activation == "swiglu":
                a = F.silu(h[:i]) * h[i:]
            elif activation == "geglu":
                a = F.gelu(h[:i]) * h[i:]
            elif activation == "relu2":
                a = torch.relu(h) ** 2
            else:
                a = F.silu(h)
            out[t] += float(tw[t, j]) * (w2[e].double() @ a)
    return out


@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g64_zp", "int4_channel", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("activation", ["swiglu", "geglu", "relu2", "silu"])
def test_reference_matches_loop(scheme, activation):
    e, h, i = 5, k_for(scheme, 64), k_for(scheme, 64)
    w = random_weights(scheme, e, h, i, activation=activation, dtype=torch.bfloat16, seed=7)
    x = torch.randn(9, h, dtype=torch.bfloat16)
    tw, ids = random_routing(9, 3, 8, seed=3, dtype=torch.int64)
    ids[0, 1] = -1
    ids[2, 0] = 100
    got = wm.reference_moe(x, w, tw, ids, activation=activation, expert_offset=2)
    want = _loop_moe(x, w, tw, ids, activation, expert_offset=2)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_reference_masked_matches_loop():
    e, cap, h, i = 3, 5, 64, 64
    w = random_weights("int4_g32", e, h, i, dtype=torch.float16)
    x = torch.randn(e, cap, h, dtype=torch.float16)
    masked_m = torch.tensor([2, 0, 9], dtype=torch.int32)  # 9 > cap is clamped
    got = wm.reference_moe_masked(x, w, masked_m)
    w13, w2 = w.dequantize()
    for ex, m in enumerate([2, 0, 5]):
        for r in range(cap):
            if r < m:
                hh = w13[ex] @ x[ex, r].float()
                want = w2[ex] @ (F.silu(hh[:i]) * hh[i:])
                torch.testing.assert_close(got[ex, r], want, rtol=1e-4, atol=1e-5)
            else:
                assert torch.equal(got[ex, r], torch.zeros(h))


def test_reference_empty_and_all_invalid():
    w = random_weights("int4_g32", 2, 64, 32)
    x = torch.randn(0, 64, dtype=torch.float16)
    assert wm.reference_moe(x, w, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int32)).shape == (0, 64)
    x = torch.randn(3, 64, dtype=torch.float16)
    ids = torch.full((3, 2), -1, dtype=torch.int32)
    assert torch.equal(wm.reference_moe(x, w, torch.ones(3, 2), ids), torch.zeros(3, 64))

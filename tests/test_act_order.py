"""GPTQ act order (``desc_act``) over the hidden size: ``MoEWeights.w13_perm``, built by ``from_gptq`` and applied
by the torch ops (x gathered per route) for every provider; the reference un-permutes the weights instead."""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe import ops, routes
from w4a16_moe.distributed import shard_experts, shard_intermediate
from w4a16_moe.formats.weights import check_w13_perm_values

from conftest import gptq_act_order_layer, nrmse, random_routing

E, H, I = 4, 256, 128
LAYERS = [(32, True, "swiglu"), (128, False, "swiglu"), (32, False, "relu2"), (128, True, "silu")]
IDS = [f"g{g}-{'sym' if s else 'zp'}-{a}" for g, s, a in LAYERS]
_CACHE: dict = {}


def _layer(group, sym, activation, **kw):
    key = (group, sym, activation, tuple(sorted(kw.items())))
    if key not in _CACHE:
        _CACHE[key] = gptq_act_order_layer(E, H, I, group=group, sym=sym, activation=activation, **kw)
    return _CACHE[key]


def _sorted_perm(g_idx):
    return torch.argsort(g_idx.long(), dim=1, stable=True)


def _w13_rows(w, g2):
    """w13's rows after from_gptq absorbed w2's act order (over I): the gate and up rows permuted by it."""
    p = _sorted_perm(g2)
    return torch.cat((p, p + I), dim=1) if w.gated else p


def _dense(x, w13, w2, tw, ids, activation, offset=0):
    """FP64 layer output with true-order dense weights (w13 [E, N, H], w2 [E, H, I])."""
    from w4a16_moe.activations import apply_activation

    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - offset
            if 0 <= e < w13.shape[0]:
                h = apply_activation(x[t : t + 1].double() @ w13[e].double().t(), activation)
                out[t] += float(tw[t, j]) * (h @ w2[e].double().t())[0]
    return out


# ------------------------------------------------------------------------------------------------
# from_gptq and dequantize
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("group,sym,activation", LAYERS, ids=IDS)
def test_dequantize_equals_the_library_bit_for_bit(group, sym, activation):
    lay = _layer(group, sym, activation)
    w, d13, d2, g13, g2 = lay.weights, lay.w13, lay.w2, lay.g13, lay.g2
    assert w.w13_perm is not None and w.w13_perm.dtype == torch.int32 and w.w13_perm.is_contiguous()
    assert torch.equal(w.w13_perm, _sorted_perm(g13).int())
    got13, got2 = w.dequantize()
    rows = _w13_rows(w, g2)
    assert torch.equal(got13.to(d13.dtype), torch.gather(d13, 1, rows[:, :, None].expand_as(d13)))
    back2 = torch.empty_like(got2).scatter_(2, _sorted_perm(g2)[:, None, :].expand_as(got2), got2)
    assert torch.equal(back2.to(d2.dtype), d2)
    assert not torch.equal(w.without_w13_perm().dequantize()[0], got13)  # the permutation is real
    # only w13's act order: w13 comes back exactly in checkpoint order
    one = _layer(group, sym, activation, act_order_w2=False)
    assert torch.equal(one.weights.dequantize()[0].to(one.w13.dtype), one.w13)
    assert torch.equal(one.weights.dequantize()[0], one.w13_fp32)  # and the exact FP32 values
    # no act order at all: no permutation is kept
    w0 = _layer(group, sym, activation, act_order_w13=False, act_order_w2=False).weights
    assert w0.w13_perm is None


@pytest.mark.parametrize("group,sym,activation", LAYERS, ids=IDS)
def test_reference_equals_dense_fp64(group, sym, activation):
    lay = _layer(group, sym, activation)
    w = lay.weights
    tw, ids = random_routing(9, 3, E + 2, seed=3)
    ids[1, 2] = -1
    x = torch.randn(9, H, dtype=torch.float16)
    ref = wm.reference_moe(x, w, tw, ids, activation=activation, expert_offset=1)
    want = _dense(x, lay.w13_fp32, lay.w2_fp32, tw, ids, activation, offset=1)
    torch.testing.assert_close(ref.double(), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# the op-level gather against the reference (two formulations)
# ------------------------------------------------------------------------------------------------

def _ulp_close(got, ref):
    """``got`` (x's dtype) within one rounding of the FP32 ``ref``: same math, different summation order."""
    torch.testing.assert_close(got.float(), ref.to(got.dtype).float(), rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("group,sym,activation", LAYERS, ids=IDS)
def test_fused_moe_reference_backend_gathers_x(group, sym, activation):
    w = _layer(group, sym, activation).weights
    t, k, off = 11, 3, 2
    tw, ids = random_routing(t, k, E + off + 1, seed=5)
    ids[0, 1] = -1
    ids[3] = -1  # a token with no local route
    x = torch.randn(t, H, dtype=torch.float16)
    ref = wm.reference_moe(x, w, tw, ids, activation=activation, expert_offset=off)
    got = {}
    for fin in ("deterministic", "fused"):
        got[fin] = wm.fused_moe(x, w, tw, ids, activation=activation, finalize=fin, expert_offset=off,
                                backend="reference")
        _ulp_close(got[fin], ref)
        out = torch.full_like(x, float("nan"))
        assert wm.fused_moe(x, w, tw, ids, activation=activation, finalize=fin, expert_offset=off,
                            backend="reference", out=out) is out
        assert torch.equal(out, got[fin])
    assert torch.equal(got["fused"], got["deterministic"])  # one path: deterministic for both modes
    assert (got["fused"][3] == 0).all()
    plain = wm.fused_moe(x, w.without_w13_perm(), tw, ids, activation=activation, expert_offset=off,
                         backend="reference")
    assert nrmse(plain, ref) > 0.1


def test_int64_ids_zero_tokens_and_top1():
    w = _layer(32, True, "swiglu").weights
    tw, ids = random_routing(5, 1, E, seed=2, dtype=torch.int64)
    x = torch.randn(5, H, dtype=torch.bfloat16)
    _ulp_close(wm.fused_moe(x, w, tw, ids, backend="reference"), wm.reference_moe(x, w, tw, ids))
    x0 = torch.empty(0, H, dtype=torch.bfloat16)
    assert wm.fused_moe(x0, w, tw[:0], ids[:0], backend="reference").shape == (0, H)


def test_gather_in_chunks(monkeypatch):
    """The per-route gather in chunks of routes (here 3 routes a chunk) equals one gather."""
    w = _layer(32, True, "swiglu").weights
    tw, ids = random_routing(7, 2, E, seed=4)
    x = torch.randn(7, H, dtype=torch.float16)
    local = ids.reshape(-1).long()
    whole = ops.permuted_routes_input(x, w.w13_perm, local, 2)
    want = torch.stack([x[r // 2][w.w13_perm[local[r]].long()] for r in range(14)])
    assert torch.equal(whole, want)
    monkeypatch.setattr(ops, "_GATHER_ELEMS", 3 * H)
    assert torch.equal(ops.permuted_routes_input(x, w.w13_perm, local, 2), want)
    one = wm.fused_moe(x, w, tw, ids, backend="reference")
    monkeypatch.undo()
    assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="reference"), one)


@pytest.mark.parametrize("group,sym,activation", LAYERS[:3], ids=IDS[:3])
def test_masked_layout(group, sym, activation):
    w = _layer(group, sym, activation).weights
    xm = torch.randn(E, 5, H, dtype=torch.float16)
    mm = torch.tensor([0, 5, 3, 9], dtype=torch.int32)
    ref = wm.reference_moe_masked(xm, w, mm, activation=activation)
    got = wm.fused_moe_masked(xm, w, mm, activation=activation, backend="reference")
    _ulp_close(got, ref)
    assert (got[0] == 0).all() and (got[2, 3:] == 0).all()
    assert nrmse(wm.fused_moe_masked(xm, w.without_w13_perm(), mm, activation=activation, backend="reference"),
                 ref) > 0.1


def test_expert_routes_half_and_sharding():
    """The expert-parallel halves (routes.expert_routes + combine) and the EP / TP shards keep the permutation."""
    w = _layer(32, False, "swiglu").weights
    tw, ids = random_routing(6, 2, E, seed=6)
    ids[2, 0] = -1
    x = torch.randn(6, H, dtype=torch.float16)
    ref = wm.reference_moe(x, w, tw, ids)
    y, valid = routes.expert_routes(x, w, ids, activation="swiglu", backend="reference")
    assert y.shape == (6, 2, H) and torch.equal(valid, ids >= 0)
    _ulp_close(routes.combine_routes(y, tw, valid, x.dtype, backend="reference"), ref)
    ep = shard_experts(w, 1, 2)
    assert torch.equal(ep.w13_perm, w.w13_perm[2:4])
    _ulp_close(wm.fused_moe(x, ep, tw, ids, expert_offset=2, backend="reference"),
               wm.reference_moe(x, w, tw, torch.where(ids >= 2, ids, -1)))
    parts = [shard_intermediate(w, r, 2) for r in range(2)]
    assert all(torch.equal(p.w13_perm, w.w13_perm) for p in parts)
    tp = sum(wm.reference_moe(x, p, tw, ids) for p in parts)
    torch.testing.assert_close(tp, ref, rtol=1e-5, atol=1e-5)
    moved = w.to("cpu")
    assert torch.equal(moved.w13_perm, w.w13_perm) and "w13_perm=act-order" in repr(w)


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    w = _layer(32, True, "swiglu").weights
    tw, ids = random_routing(6, 2, E)
    x = torch.randn(6, H, dtype=torch.float16)
    out = torch.empty_like(x)
    xm = torch.randn(E, 3, H, dtype=torch.float16)
    mm = torch.tensor([3, 1, 0, 2], dtype=torch.int32)

    def layer(x, tw, ids, xm):
        y = wm.fused_moe(x, w, tw, ids, backend="reference")
        wm.fused_moe(x, w, tw, ids, backend="reference", out=out)
        return y * 2, wm.fused_moe_masked(xm, w, mm, backend="reference")

    got, gotm = torch.compile(layer, fullgraph=True)(x, tw, ids, xm)
    ref = wm.reference_moe(x, w, tw, ids)
    _ulp_close(got / 2, ref)
    _ulp_close(out, ref)
    _ulp_close(gotm, wm.reference_moe_masked(xm, w, mm))


# ------------------------------------------------------------------------------------------------
# bad permutations
# ------------------------------------------------------------------------------------------------

def test_bad_w13_perm_raises():
    w = _layer(32, True, "swiglu").weights
    args = (w.scheme, w.w13, w.w2, w.gated)
    p = w.w13_perm
    w64 = wm.MoEWeights(*args, w13_perm=p.long())
    assert w64.w13_perm.dtype == torch.int32 and torch.equal(w64.w13_perm, p)
    with pytest.raises(ValueError, match=r"w13_perm: expected an int32 tensor of shape \(4, 256\)"):
        wm.MoEWeights(*args, w13_perm=p[:, :128].contiguous())
    with pytest.raises(ValueError, match="w13_perm: expected an int32 tensor"):
        wm.MoEWeights(*args, w13_perm=p.float())
    with pytest.raises(ValueError, match="w13_perm: must be contiguous"):
        wm.MoEWeights(*args, w13_perm=torch.flip(p.t().contiguous(), (0,)).t())
    dup = p.clone()
    dup[1, 5] = dup[1, 6]
    with pytest.raises(ValueError, match=r"w13_perm: row 1 \(expert 1\) is not a permutation of 0\.\.255"):
        wm.MoEWeights(*args, w13_perm=dup)
    with pytest.raises(ValueError, match="w13_perm: row 1"):
        check_w13_perm_values(dup)
    # the op checks the metadata (not the values: no device sync)
    tw, ids = random_routing(3, 2, E)
    x = torch.randn(3, H, dtype=torch.float16)
    base = (x, *ops.weight_args(w), tw, ids, w.scheme.name, "swiglu", "deterministic", 0, "reference", None)
    with pytest.raises(ValueError, match="w13_perm: expected an int32 tensor"):
        torch.ops.w4a16_moe.fused_moe(*base, p[:3].contiguous())
    with pytest.raises(ValueError, match="w13_perm: expected an int32 tensor"):
        torch.ops.w4a16_moe.fused_moe_masked(torch.randn(E, 2, H, dtype=torch.float16), *ops.weight_args(w),
                                             torch.ones(E, dtype=torch.int32), w.scheme.name, "swiglu", "reference",
                                             p.long())


def test_warmup_with_a_permutation_runs():
    w = _layer(32, True, "swiglu").weights
    tokens = wm.warmup(w, dtype=torch.float16, top_k=2, max_tokens=8, backend="reference", masked_capacity=2)
    assert tokens and max(tokens) <= 8


def test_warmup_loads_and_tunes_the_top1_call(monkeypatch):
    """With a w13_perm, warmup loads (and tunes) the CuTe kernels of the call the op runs: top-1 over T*k rows,
    deterministic, the weights without the permutation (the CuTe side recorded, not run)."""
    from types import SimpleNamespace

    from w4a16_moe import providers
    from w4a16_moe.kernels.cute import autotune, provider

    w = _layer(32, True, "swiglu").weights
    seen = {}
    monkeypatch.setattr(providers, "select_provider", lambda call, backend, info=None: SimpleNamespace(provider="cute"))
    monkeypatch.setattr(provider, "cute_warmup", lambda weights, dtype, act, t, k, finalizes, global_experts: seen.update(
        warm=(weights.w13_perm, t, k, finalizes)))
    monkeypatch.setattr(autotune, "autotune_layer", lambda weights, dtype, act, k, t, fins, *a, **kw: seen.update(
        tune=(weights.w13_perm, t, k, fins)))
    wm.warmup(w, dtype=torch.float16, top_k=4, max_tokens=8, backend="reference", autotune=True)
    assert seen["warm"] == (None, 32, 1, ("deterministic",)) and seen["tune"] == (None, 32, 1, ("deterministic",))
    seen.clear()
    wm.warmup(w.without_w13_perm(), dtype=torch.float16, top_k=4, max_tokens=8, backend="reference", autotune=True)
    assert seen["warm"] == (None, 8, 4, ("deterministic", "fused"))

"""The CuTe DSL provider (SM90 kernels) against the FP32 reference, on the GPU.

Every case poisons the output with NaN first and checks NRMSE < 0.02 against ``reference_moe`` on
fresh random inputs. The kernels come from the loader (prebuilt via W4A16_MOE_PREBUILT_DIR, the JIT
cache, or JIT); the module skips without an SM90 GPU.
"""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.providers import select_provider
from w4a16_moe.validate import check_masked_call, check_moe_call

from conftest import HAS_CUDA, nrmse, random_routing, random_weights, replay_on_fresh_data, run_cute_moe

SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")]

INT4 = ["int4_g32", "int4_g64", "int4_g128", "int4_g32_zp", "int4_g64_zp", "int4_g128_zp", "int4_channel"]
FP4 = ["nvfp4", "mxfp4"]
DTYPES = [torch.bfloat16, torch.float16]
TOL = 0.02


@pytest.fixture(autouse=True)
def _grouped_gemms(monkeypatch):
    """These tests cover the grouped GEMMs at every token count: the decode kernels, which small calls use
    by default, have their own suite (test_cute_decode.py)."""
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")


def _weights(scheme, e=8, h=512, i=256, activation="swiglu", dtype=torch.bfloat16, seed=0):
    return random_weights(scheme, e, h, i, activation=activation, dtype=dtype, device="cuda", seed=seed)


def _run(w, t, k, *, activation="swiglu", offset=0, **kw):
    def cute_path(x, tw, ids):
        call = check_moe_call(x, w, tw, ids, activation=activation, expert_offset=offset)
        assert select_provider(call, "cute").provider == "cute"

    return run_cute_moe(w, t, k, activation=activation, offset=offset, tol=TOL, check_path=cute_path, **kw)


@pytest.mark.parametrize("scheme", INT4 + FP4)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_schemes(scheme, dtype, finalize):
    w = _weights(scheme, dtype=dtype)
    _run(w, 33, 4, dtype=dtype, finalize=finalize, offset=8, num_global=24)  # EP: 8 local of 24 experts


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "relu2", "silu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_activations(activation, dtype, finalize):
    w = _weights("int4_g32", activation=activation, dtype=dtype, seed=2)
    _run(w, 21, 3, dtype=dtype, activation=activation, finalize=finalize)


# E=8, k=4: routes per expert r = T/2, tile buckets change at r = 8, 16, 32, 64 (T = 16, 32, 64, 128)
@pytest.mark.parametrize("t", [1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 300, 1000])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_token_counts(t, finalize):
    w = _weights("int4_g128", seed=3)
    _run(w, t, 4, finalize=finalize, seed=t)


def test_zero_tokens():
    w = _weights("int4_g32")
    x = torch.empty(0, w.hidden_size, dtype=torch.bfloat16, device="cuda")
    y = wm.fused_moe(x, w, torch.empty(0, 4, device="cuda"), torch.empty(0, 4, dtype=torch.int32, device="cuda"),
                     backend="cute")
    assert y.shape == (0, w.hidden_size)


@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_all_routes_on_one_expert(finalize):
    w = _weights("int4_g32", seed=4)
    t, k = 200, 2
    ids = torch.full((t, k), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = 5
    _run(w, t, k, finalize=finalize, ids=ids)


@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_all_routes_invalid(finalize):
    w = _weights("int4_g32", seed=5)
    x = torch.randn(17, w.hidden_size, device="cuda").to(torch.bfloat16)
    ids = torch.randint(8, 100, (17, 4), dtype=torch.int32, device="cuda")
    ids[0] = -1
    out = torch.full_like(x, float("nan"))
    wm.fused_moe(x, w, torch.rand(17, 4, device="cuda"), ids, finalize=finalize, backend="cute", out=out)
    assert torch.equal(out, torch.zeros_like(out))


def test_empty_experts_and_int64_ids():
    w = _weights("int4_g64", e=16, seed=6)
    t, k = 40, 2
    g = torch.Generator(device="cpu").manual_seed(6)
    ids = torch.randint(0, 5, (t, k), generator=g).cuda()  # experts 5..15 get nothing; int64 ids
    ids[:, 1] = (ids[:, 0] + 1) % 5
    _run(w, t, k, ids=ids)


def test_deterministic_bitwise():
    w = _weights("int4_g32", seed=7)
    x, tw, ids, out = _run(w, 300, 8)
    for _ in range(3):
        again = wm.fused_moe(x, w, tw, ids, backend="cute")
        assert torch.equal(again, out)


def test_cuda_graph_capture_and_replay():
    w = _weights("int4_g32", seed=8)
    k = 4
    wm.warmup(w, dtype=torch.bfloat16, top_k=k, max_tokens=300, backend="cute")
    for t in (1, 17, 300):
        x = torch.randn(t, w.hidden_size, device="cuda").to(torch.bfloat16)
        tw, ids = random_routing(t, k, 8, seed=t, device="cuda")
        out = torch.full_like(x, float("nan"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            wm.fused_moe(x, w, tw, ids, backend="cute", out=out)
        replay_on_fresh_data(graph, w, x, tw, ids, out, bitwise=True)


@pytest.mark.parametrize("backend,decode", [("cute", "0"), ("cute", "1"), ("triton", "0")])
@pytest.mark.parametrize("group,sym", [(32, True), (128, False)])
def test_gptq_act_order_over_h(monkeypatch, backend, decode, group, sym):
    """GPTQ act order over H (``w13_perm``): the torch op gathers x per route and runs the provider's per-route
    half as top-1 rows; both finalize modes against the reference (which un-permutes the weights instead),
    poisoned outputs, invalid routes, and (cute) a CUDA-graph capture after ``warmup``."""
    from conftest import gptq_act_order_layer

    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", decode)
    w = gptq_act_order_layer(8, 512, 256, group=group, sym=sym, seed=3).weights.to("cuda")
    assert w.w13_perm is not None
    for t in (1, 37):
        x = torch.randn(t, 512, device="cuda").to(torch.bfloat16)
        tw, ids = random_routing(t, 2, 9, seed=t, device="cuda")  # id 8 belongs to nobody
        ref = wm.reference_moe(x, w, tw, ids)
        for fin in ("deterministic", "fused"):
            out = torch.full_like(x, float("nan"))
            wm.fused_moe(x, w, tw, ids, finalize=fin, backend=backend, out=out)
            assert not torch.isnan(out).any()
            assert nrmse(out, ref) < TOL, (t, fin, nrmse(out, ref))
        assert nrmse(wm.fused_moe(x, w.without_w13_perm(), tw, ids, backend=backend), ref) > 0.1
    if backend == "cute":
        wm.warmup(w, dtype=torch.bfloat16, top_k=2, max_tokens=37, backend="cute")
        x = torch.randn(37, 512, device="cuda").to(torch.bfloat16)
        tw, ids = random_routing(37, 2, 8, seed=5, device="cuda")
        out = torch.full_like(x, float("nan"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            wm.fused_moe(x, w, tw, ids, backend="cute", out=out)
        replay_on_fresh_data(graph, w, x, tw, ids, out, bitwise=True)


def test_first_use_inside_capture_raises():
    w = _weights("int4_g128", seed=9)  # never packed nor warmed up
    x = torch.randn(4, w.hidden_size, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(4, 2, 8, device="cuda")
    wm.fused_moe(x[:0], w, tw[:0], ids[:0], backend="cute")  # no-op call: nothing loaded or packed
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="warmup"):
        with torch.cuda.graph(graph):
            wm.fused_moe(x, w, tw, ids, backend="cute")
    y = wm.fused_moe(x, w, tw, ids, backend="cute")  # the provider still works afterwards
    assert nrmse(y, wm.reference_moe(x, w, tw, ids)) < TOL


def test_auto_prefers_cute_on_every_size():
    w = _weights("int4_g32")
    x = torch.randn(3, w.hidden_size, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(3, 2, 8, device="cuda")
    assert select_provider(check_moe_call(x, w, tw, ids), "auto").provider == "cute"
    w4 = _weights("nvfp4")
    assert select_provider(check_moe_call(x, w4, tw, ids), "auto").provider == "cute"
    # sizes that are not multiples of the tiles (nor of 64) run padded on the CuTe kernels, not on Triton
    odd = _weights("int4_g32", h=320, i=160)
    x = torch.randn(3, 320, device="cuda").to(torch.bfloat16)
    d = select_provider(check_moe_call(x, odd, tw, ids), "auto")
    assert d.provider == "cute" and d.plan.pad, d.plan.describe()
    out = torch.full_like(x, float("nan"))
    wm.fused_moe(x, odd, tw, ids, backend="cute", out=out)
    assert not torch.isnan(out).any() and nrmse(out, wm.reference_moe(x, odd, tw, ids)) < TOL


# every candidate tile shape of the tuner (the rule's buckets + deep-pipeline decode shapes), each with
# split-K off and on (deterministic: partials summed in fixed split order)
@pytest.mark.parametrize("bucket", range(len(fam.CANDIDATES)))
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("scheme", ["int4_g32", "nvfp4"])
def test_candidate_tiles_and_split_k(bucket, splits, scheme):
    w = _weights(scheme, h=1024, i=256, seed=20 + bucket)
    with fam.forced(bucket, splits):
        x, tw, ids, out = _run(w, 37, 8, seed=bucket)
        again = wm.fused_moe(x, w, tw, ids, backend="cute")
        assert torch.equal(again, out)  # split-K reduction order is fixed
        _run(w, 37, 8, seed=bucket, finalize="fused")


# every candidate with several row blocks per down CTA, on a down GEMM whose K tiles outnumber the ring's
# stages (K = I = 1024: 8 or 16 K tiles): the activation tile cannot stay resident (as it does for I = 256
# above) and is re-gathered with every stage; split 3 gives 3-6 K tiles per split (resident for most rings)
@pytest.mark.parametrize("bucket", [b for b, t in enumerate(fam.CANDIDATES) if t.get("down_row_blocks_per_cta", 1) > 1])
@pytest.mark.parametrize("splits", [1, 3])
def test_row_block_candidates_long_k(bucket, splits):
    w = _weights("int4_g32", h=1024, i=1024, seed=40 + bucket)
    with fam.forced(bucket, splits):
        x, tw, ids, out = _run(w, 29, 8, seed=bucket)
        assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="cute"), out)


# tn_variants candidates: one expert per route count on each side of every compiled width (TN, TN - 8, ...;
# 0 = an empty expert, 121 = several tiles), top-1 so each count is exact; the second call must repeat the
# first bit for bit (deterministic)
WIDTH_COUNTS = (0, 1, 7, 8, 9, 23, 24, 25, 31, 32, 33, 39, 40, 41, 47, 48, 49, 55, 56, 57, 63, 64, 65, 121)


@pytest.mark.parametrize("bucket", [b for b, t in enumerate(fam.CANDIDATES) if t.get("tn_variants", 1) > 1])
@pytest.mark.parametrize("i", [256, 1024])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_tile_width_variants(bucket, i, finalize):
    w = _weights("int4_g32", e=len(WIDTH_COUNTS), h=1024, i=i, seed=60 + bucket)
    g = torch.Generator(device="cpu").manual_seed(bucket)
    experts = torch.repeat_interleave(torch.arange(len(WIDTH_COUNTS)), torch.tensor(WIDTH_COUNTS))
    ids = experts[torch.randperm(len(experts), generator=g)].view(-1, 1).to(torch.int32).cuda()
    with fam.forced(bucket, 1):
        x, tw, ids, out = _run(w, ids.shape[0], 1, ids=ids, finalize=finalize, seed=bucket)
        if finalize == "deterministic":
            assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="cute"), out)


# programmatic dependent launch (the gate/up GEMM sets up while the route preparation finishes, the down GEMM
# may start while the gate/up grid finishes, the finalize while the down grid finishes): eager and inside a
# CUDA graph (captured once, replayed on fresh inputs), both finalize modes, against the reference and eager
# runs; 200 tokens x 8 take the one-program route preparation, 600 x 8 the two-kernel one (5 programs)
@pytest.mark.parametrize("bucket", [b for b, t in enumerate(fam.CANDIDATES) if t.get("pdl")])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("t", [200, 600])
def test_pdl_candidates_in_cuda_graph(bucket, finalize, t):
    w = _weights("int4_g32", h=1024, i=512, seed=70 + bucket)
    k = 8
    with fam.forced(bucket, 1):
        x, tw, ids, out = _run(w, t, k, finalize=finalize, seed=bucket)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            wm.fused_moe(x, w, tw, ids, backend="cute", finalize=finalize, out=out)
        replay_on_fresh_data(graph, w, x, tw, ids, out, bitwise=finalize == "deterministic")


def test_batch_invariant_mode(monkeypatch):
    """W4A16_MOE_BATCH_INVARIANT=1: a token's output does not depend on the rest of the batch."""
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "1")
    w = _weights("int4_g32", seed=12)
    x, tw, ids, out = _run(w, 300, 4, seed=12)  # a large-tile bucket
    part = wm.fused_moe(x[:3].contiguous(), w, tw[:3].contiguous(), ids[:3].contiguous(), backend="cute")
    assert torch.equal(part, out[:3])  # decode-sized tiles, same bits


def _masked_case(w, cap, masked, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(w.num_experts, cap, w.hidden_size, generator=g).to(dtype).cuda()
    m = torch.tensor(masked, dtype=torch.int32, device="cuda")
    return x, m


@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128_zp", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
def test_masked_layout(scheme, dtype, activation):
    w = _weights(scheme, e=8, activation=activation, dtype=dtype, seed=30)
    for cap, masked in ((16, [0, 1, 16, 7, 9, 99, -3, 8]), (130, [129, 0, 130, 1, 64, 65, 2, 17])):
        x, m = _masked_case(w, cap, masked, dtype, seed=cap)
        call = check_masked_call(x, w, m, activation=activation)
        assert select_provider(call, "auto").provider == "cute"
        out = wm.fused_moe_masked(x, w, m, activation=activation, backend="cute")
        ref = wm.reference_moe_masked(x, w, m, activation=activation)
        live = torch.zeros(w.num_experts, cap, dtype=torch.bool)
        for e, v in enumerate(masked):
            live[e, : max(0, min(v, cap))] = True
        live = live.cuda()
        assert torch.isfinite(out).all()
        assert torch.equal(out[~live], torch.zeros_like(out[~live]))  # rows past masked_m are zeros
        assert nrmse(out[live], ref[live]) < TOL, (cap, nrmse(out[live], ref[live]))
        assert torch.equal(out, wm.fused_moe_masked(x, w, m, activation=activation, backend="cute"))


def test_masked_cuda_graph():
    w = _weights("int4_g64", seed=31)
    cap = 24
    wm.warmup(w, max_tokens=1, top_k=1, backend="cute", masked_capacity=cap, finalize="deterministic")
    x, m = _masked_case(w, cap, [3] * 8, torch.bfloat16, seed=31)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = wm.fused_moe_masked(x, w, m, backend="cute")
    for masked in ([0, 24, 5, 1, 30, 2, 8, 13], [24] * 8):
        m.copy_(torch.tensor(masked, dtype=torch.int32))
        x.copy_(torch.randn_like(x.float()).to(x.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, wm.fused_moe_masked(x, w, m, backend="cute"))
        ref = wm.reference_moe_masked(x, w, m)
        assert nrmse(out, ref) < TOL


# four consumer warpgroups (512 weight rows per CTA, 640 threads): candidates 80-82 (TN 48 / 64 / 40, setmaxnreg
# 32 / 112 or 40 / 104), several tiles per expert, split-K off and on, every width of the tn_variants tiles, a bitwise
# repeat
WG4_TILES = [t for t in fam.CANDIDATES if t.get("consumer_wgs") == 4]
assert [t["tokens_per_tile"] for t in WG4_TILES] == [48, 64, 40]


@pytest.mark.parametrize("tile", range(len(WG4_TILES)))
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_four_consumer_warpgroup_tiles(tile, splits, finalize):
    from w4a16_moe.kernels.cute.sm90.tuned import candidate_name

    name = candidate_name(WG4_TILES[tile])
    w = _weights("int4_g32", h=1024, i=512, seed=90 + tile)
    with fam.forced(name, splits):
        for tokens in (37, 300):
            x, tw, ids, out = _run(w, tokens, 8, finalize=finalize, seed=tile + tokens)
            if finalize == "deterministic":
                assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="cute"), out)

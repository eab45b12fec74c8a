"""Tests of the Triton provider (w4a16_moe.kernels.triton) against the FP32 reference.

Without a GPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1, set below before triton is
imported) with fp16 at tiny shapes. Tests marked ``gpu`` need CUDA (bf16 and fp16, larger shapes, CUDA graphs).

Run: ``PYTHONPATH=python pytest -q tests/test_triton_provider.py``
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # must happen before triton (and our kernels) are imported; harmless if the caller already set it
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

from w4a16_moe.formats.quantize import quantize_matrix  # noqa: E402
from w4a16_moe.formats.schemes import scheme_names  # noqa: E402
from w4a16_moe.formats.weights import MoEWeights  # noqa: E402
from w4a16_moe.kernels.triton import moe as triton_moe  # noqa: E402
from w4a16_moe.kernels.routing import prepare as routing  # noqa: E402
from w4a16_moe.kernels.triton.grouped_gemm import _down_kernel, _gate_up_kernel  # noqa: E402
from w4a16_moe.kernels.triton.moe import (triton_combine_routes, triton_expert_routes,  # noqa: E402
                                          triton_fused_moe, triton_fused_moe_masked)
from w4a16_moe.reference import reference_moe, reference_moe_masked, reference_routes  # noqa: E402
from w4a16_moe.activations import swiglu_oai  # noqa: E402

from conftest import with_biases  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"
TOL = 0.02
SCHEMES = scheme_names()
ACTIVATIONS = [("swiglu", True), ("geglu", True), ("relu2", False), ("silu", False)]
FINALIZE = ["deterministic", "fused"]

if not HAS_CUDA and type(_gate_up_kernel).__name__ != "InterpretedFunction":
    pytest.skip("no GPU and the Triton kernels were not built for the interpreter (triton imported earlier "
                "without TRITON_INTERPRET=1); run this file alone", allow_module_level=True)

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def dims_for(scheme: str) -> tuple[int, int]:
    """Tiny (H, I) honouring the scheme's K multiple; several leave K tails for BLOCK_K 64/128."""
    if "g128" in scheme:
        return 128, 128
    if "g64" in scheme:
        return 128, 64
    if "g32" in scheme or scheme == "mxfp4":
        return 96, 64
    if scheme == "nvfp4":
        return 80, 48
    return 72, 40  # int4_channel: multiple of 8


@functools.lru_cache(maxsize=None)
def make_weights(scheme: str, experts: int, hidden: int, inter: int, gated: bool, dtype=torch.float16,
                 device: str = DEV, scale_dtype=None, seed: int = 0) -> MoEWeights:
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter if gated else inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    kw = {} if scale_dtype is None or not scheme.startswith("int4") else {"scale_dtype": scale_dtype}
    w = MoEWeights(scheme, quantize_matrix(w13.to(dtype), scheme, **kw), quantize_matrix(w2.to(dtype), scheme, **kw),
                   gated)
    return w.to(device)


def make_inputs(tokens, hidden, top_k, experts, *, dtype=torch.float16, ids_dtype=torch.int32, offset=0,
                invalid=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    if invalid:  # local ids, ids of other ranks' experts on both sides, and -1
        ids = torch.randint(-1, offset + 3 * experts, (tokens, top_k), generator=g)
    elif top_k <= experts:  # distinct experts per token, like a real router
        ids = offset + torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :top_k]
    else:
        ids = offset + torch.randint(0, experts, (tokens, top_k), generator=g)
    tw = torch.rand(tokens, top_k, generator=g)
    return x.to(DEV), tw.to(DEV), ids.to(ids_dtype).to(DEV)


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def assert_matches(out: torch.Tensor, ref: torch.Tensor, tol: float = TOL) -> None:
    """Finite, NRMSE below ``tol``, and exact zeros wherever the reference row is exactly zero."""
    assert torch.isfinite(out).all(), "output has NaN/Inf (an element was not written, or garbage leaked)"
    ref = ref.float().to(out.device)
    outf = out.float()
    zero_rows = (ref == 0).all(dim=-1)
    assert (outf[zero_rows] == 0).all(), "rows that must be zero are not"
    den = ref.norm()
    if den == 0:
        return
    err = ((outf - ref).norm() / den).item()
    assert err < tol, f"NRMSE {err:.4g} >= {tol}"


def run_moe(x, w, tw, ids, activation, finalize, offset=0):
    out = poisoned(x.shape, x.dtype)
    triton_fused_moe(x, w, tw, ids, activation=activation, finalize=finalize, expert_offset=offset, out=out)
    return out


def check_moe(x, w, tw, ids, activation, finalize, offset=0, tol=TOL):
    out = run_moe(x, w, tw, ids, activation, finalize, offset)
    ref = reference_moe(x, w, tw, ids, activation=activation, expert_offset=offset)
    assert_matches(out, ref, tol)
    return out, ref


# --------------------------------------------------------------------------------------------------
# every scheme x activation x finalize
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("activation,gated", ACTIVATIONS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_scheme_activation(scheme, activation, gated, finalize):
    hidden, inter = dims_for(scheme)
    w = make_weights(scheme, 4, hidden, inter, gated)
    x, tw, ids = make_inputs(7, hidden, 2, 4)
    check_moe(x, w, tw, ids, activation, finalize)


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_int4_scale_dtypes(scale_dtype):
    w = make_weights("int4_g32_zp", 4, 64, 32, True, scale_dtype=scale_dtype)
    x, tw, ids = make_inputs(5, 64, 2, 4)
    check_moe(x, w, tw, ids, "swiglu", "deterministic")


# --------------------------------------------------------------------------------------------------
# token counts, top-k, id dtypes, expert parallelism
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("tokens", [0, 1, 2, 7, 33])
def test_token_counts(tokens, ids_dtype, finalize):
    w = make_weights("int4_g32", 4, 96, 64, True)
    x, tw, ids = make_inputs(tokens, 96, 2, 4, ids_dtype=ids_dtype)
    if tokens == 0:
        out = poisoned((0, 96), torch.float16)
        triton_fused_moe(x, w, tw, ids, activation="swiglu", finalize=finalize, expert_offset=0, out=out)
        assert out.shape == (0, 96)
        return
    check_moe(x, w, tw, ids, "swiglu", finalize)


@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("top_k", [1, 3, 6])
def test_top_k(top_k, finalize):
    w = make_weights("int4_g64", 4, 128, 64, False)
    x, tw, ids = make_inputs(9, 128, top_k, 4)  # top-k 6 > E: experts repeat inside a token
    check_moe(x, w, tw, ids, "relu2", finalize)


@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("scheme,ids_dtype", [("int4_g64_zp", torch.int64), ("nvfp4", torch.int32),
                                              ("mxfp4", torch.int64)])
def test_expert_parallel(scheme, ids_dtype, finalize):
    hidden, inter = dims_for(scheme)
    w = make_weights(scheme, 4, hidden, inter, True)
    x, tw, ids = make_inputs(33, hidden, 3, 4, ids_dtype=ids_dtype, offset=8, invalid=True)
    ids[0] = -1  # a token with no valid route at all: exact zeros
    check_moe(x, w, tw, ids, "swiglu", finalize, offset=8)


def test_int64_ids_far_out_of_range():
    """int64 ids that would alias a local expert if truncated to int32 must be ignored."""
    w = make_weights("int4_g32", 4, 96, 64, True)
    x, tw, ids = make_inputs(6, 96, 2, 4, ids_dtype=torch.int64, offset=8)
    ids[:3, 0] = ids[:3, 0] + 2**32  # low 32 bits still look like a local expert
    check_moe(x, w, tw, ids, "swiglu", "deterministic", offset=8)


@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("tokens", [33, 70])
def test_all_routes_one_expert(tokens, finalize):
    """Every route on one expert: several row-blocks of one expert (BLOCK_M 32 and 64)."""
    w = make_weights("int4_g64", 4, 128, 64, True)
    x, tw, _ = make_inputs(tokens, 128, 2, 4)
    ids = torch.full((tokens, 2), 5 + 2, dtype=torch.int32, device=DEV)
    check_moe(x, w, tw, ids, "swiglu", finalize, offset=5)


@pytest.mark.parametrize("finalize", FINALIZE)
def test_all_routes_invalid(finalize):
    w = make_weights("int4_g32", 4, 96, 64, True)
    x, tw, _ = make_inputs(7, 96, 2, 4)
    ids = torch.tensor([[-1, 4], [100, -1], [-5, 9]] + [[4, 4]] * 4, dtype=torch.int32, device=DEV)
    out = run_moe(x, w, tw, ids, "swiglu", finalize, offset=0)
    assert (out == 0).all()


@pytest.mark.parametrize("finalize", FINALIZE)
def test_multi_kernel_route_prep(monkeypatch, finalize):
    """Force the two-kernel (histogram, place) route preparation used for T*k > SMALL_ROUTES."""
    monkeypatch.setattr(routing, "SMALL_ROUTES", 0)
    w = make_weights("int4_g32", 4, 96, 64, True)
    x, tw, ids = make_inputs(33, 96, 3, 4, offset=4, invalid=True, ids_dtype=torch.int64)
    check_moe(x, w, tw, ids, "swiglu", finalize, offset=4)


def test_determinism():
    w = make_weights("nvfp4", 4, 80, 48, True)
    x, tw, ids = make_inputs(33, 80, 4, 4, offset=4, invalid=True)
    a = run_moe(x, w, tw, ids, "swiglu", "deterministic", offset=4)
    b = run_moe(x, w, tw, ids, "swiglu", "deterministic", offset=4)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# --------------------------------------------------------------------------------------------------
# expert-parallel halves: expert_routes + combine_routes == deterministic fused_moe, bit for bit
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("top_k", [1, 3])
def test_expert_routes_and_combine(top_k):
    offset = 4
    w = make_weights("int4_g64_zp", 4, 128, 64, True)
    x, tw, ids = make_inputs(21, 128, top_k, 4, offset=offset, invalid=True)
    local = torch.where((ids >= offset) & (ids < offset + 4), ids - offset, -1)
    y, valid = triton_expert_routes(x, w, local, activation="swiglu")
    assert y.shape == (21, top_k, 128) and y.dtype == x.dtype
    ref_y, ref_valid = reference_routes(x, w, local, activation="swiglu")
    assert torch.equal(valid.cpu(), ref_valid.cpu())
    assert_matches(y[valid].reshape(-1, 128), ref_y[ref_valid].reshape(-1, 128))
    y[~valid] = float("nan")  # invalid entries are unspecified: combine must not read them
    combined = triton_combine_routes(y, tw, valid)
    fused = run_moe(x, w, tw, ids, "swiglu", "deterministic", offset=offset)
    assert torch.equal(combined.view(torch.int16), fused.view(torch.int16))


def test_expert_routes_empty():
    w = make_weights("int4_g32", 4, 96, 64, True)
    x = torch.zeros(0, 96, dtype=torch.float16, device=DEV)
    local = torch.zeros(0, 2, dtype=torch.int32, device=DEV)
    y, valid = triton_expert_routes(x, w, local, activation="swiglu")
    assert y.shape == (0, 2, 96) and valid.shape == (0, 2)
    out = triton_combine_routes(y, torch.zeros(0, 2, device=DEV), valid)
    assert out.shape == (0, 96)


# --------------------------------------------------------------------------------------------------
# route preparation invariants (both implementations)
# --------------------------------------------------------------------------------------------------
def test_masked_route_plan():
    cap, block_m, hidden = 16, 8, 40
    masked = [0, 3, 20, -1, 7, 16]
    m = torch.tensor(masked, dtype=torch.int32, device=DEV)
    out = torch.full((len(masked), cap, hidden), float("nan"), dtype=torch.float16, device=DEV)
    plan = routing.prepare_masked_routes(m, cap, block_m, out)
    counts = [max(0, min(v, cap)) for v in masked]
    starts = [0]
    blocks = [0]
    for c in counts:
        starts.append(starts[-1] + c)
        blocks.append(blocks[-1] + -(-c // block_m))
    assert plan.route_start.cpu().tolist() == starts
    assert plan.block_start.cpu().tolist() == blocks
    got = plan.sorted_routes[: starts[-1]].cpu().tolist()
    assert got == [e * cap + r for e, c in enumerate(counts) for r in range(c)]
    o = out.cpu()
    for e, c in enumerate(counts):
        assert torch.isnan(o[e, :c]).all()  # live rows are left to the GEMMs
        assert (o[e, c:] == 0).all()  # rows past masked_m are zeros



def _check_plan(ids: torch.Tensor, experts: int, offset: int, block_m: int) -> None:
    junk = torch.full((1 << 16,), -7, dtype=torch.int32, device=ids.device)  # likely reused by the plan's ws
    del junk
    plan = routing.prepare_routes(ids.contiguous(), experts, offset, block_m, zeroed=37)
    assert plan.zeroed.shape == (37,) and (plan.zeroed == 0).all()
    flat = ids.reshape(-1).long().cpu()
    local = flat - offset
    valid = (local >= 0) & (local < experts)
    counts = torch.bincount(local[valid], minlength=experts)
    start = plan.route_start.cpu().long()
    assert start.tolist() == [0] + torch.cumsum(counts, 0).tolist()
    blocks = (counts + block_m - 1) // block_m
    assert plan.block_start.cpu().tolist() == [0] + torch.cumsum(blocks, 0).tolist()
    sorted_routes = plan.sorted_routes.cpu().long()
    for e in range(experts):
        got = sorted(sorted_routes[start[e]:start[e + 1]].tolist())
        assert got == torch.nonzero(valid & (local == e)).flatten().tolist()
    info = plan.block_info.cpu().long()
    expect = []
    for e in range(experts):
        for b in range(triton.cdiv(int(counts[e]), block_m)):
            expect.append([e, int(start[e]) + b * block_m, int(start[e + 1])])
    assert info.shape[0] >= len(expect)
    assert info[: len(expect), :3].tolist() == expect
    assert (info[len(expect):, 0] == experts).all()


def _force_path(monkeypatch, path: str) -> None:
    """``single``: the one-program kernel; ``two``: the histogram + place kernels; ``spans``: the same with
    16-route chunks and at most 3 programs, so that programs own several chunks and each sums the others'
    histogram rows."""
    if path != "single":
        monkeypatch.setattr(routing, "SMALL_ROUTES", 0)
    if path == "spans":
        monkeypatch.setattr(routing, "_CHUNK", 16)
        monkeypatch.setattr(routing, "_MAX_PROGRAMS", 3)


@pytest.mark.parametrize("path", ["single", "two", "spans"])
@pytest.mark.parametrize("experts,tokens,top_k,block_m", [(4, 7, 2, 16), (5, 40, 3, 32), (3, 1, 1, 16)])
def test_route_plan(monkeypatch, path, experts, tokens, top_k, block_m):
    _force_path(monkeypatch, path)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(-1, 2 * experts + 3, (tokens, top_k), generator=g).to(DEV)
    _check_plan(ids, experts, 3, block_m)
    _check_plan(ids.to(torch.int32), experts, 0, block_m)


@pytest.mark.parametrize("path", ["single", "two", "spans"])
def test_route_plan_skewed(monkeypatch, path):
    """Many experts (E_PAD 512 -> 8 blocks per step) and one expert owning 25 row-blocks."""
    _force_path(monkeypatch, path)
    ids = torch.full((200, 2), 3 + 7, dtype=torch.int64)
    ids[::17, 1] = 3 + 299
    ids[5, 0] = -1
    _check_plan(ids.to(DEV), 300, 3, 16)


@gpu
@needs_gpu
@pytest.mark.parametrize("path", ["single", "two", "spans"])
@pytest.mark.parametrize("experts,tokens,top_k,block_m", [(8, 700, 8, 32), (384, 2048, 8, 56), (3, 5, 2, 16)])
def test_route_plan_gpu(monkeypatch, path, experts, tokens, top_k, block_m):
    """The plan's invariants on the GPU (compiled kernels; on SM90 launched with PDL), W1's 384 experts
    included; several launches back to back on one stream, checked after each."""
    _force_path(monkeypatch, path)
    g = torch.Generator().manual_seed(tokens)
    for offset in (0, 5):
        ids = torch.randint(-1, experts + 2 * offset + 1, (tokens, top_k), generator=g).to(DEV)
        _check_plan(ids, experts, offset, block_m)


# --------------------------------------------------------------------------------------------------
# masked (DeepEP low-latency) layout
# --------------------------------------------------------------------------------------------------
def run_masked(scheme, activation, gated, masked, cap, dtype=torch.float16, hidden=None, inter=None, tol=TOL):
    experts = len(masked)
    h0, i0 = dims_for(scheme)
    hidden, inter = hidden or h0, inter or i0
    w = make_weights(scheme, experts, hidden, inter, gated, dtype=dtype)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(experts, cap, hidden, generator=g).to(dtype).to(DEV)
    masked_m = torch.tensor(masked, dtype=torch.int32, device=DEV)
    ref = reference_moe_masked(x, w, masked_m, activation=activation)
    for e, m in enumerate(masked):  # rows at or past masked_m must not be read
        x[e, max(0, min(m, cap)):] = float("nan")
    out = poisoned(x.shape, dtype)
    triton_fused_moe_masked(x, w, masked_m, activation=activation, out=out)
    for e, m in enumerate(masked):
        assert (out[e, max(0, min(m, cap)):] == 0).all()
    assert_matches(out.reshape(-1, hidden), ref.reshape(-1, hidden), tol)
    return out


MASKED_M = [0, 5, 20, 27, -3]  # empty, partial, full cap, > cap, negative (cap = 20)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_masked_schemes(scheme):
    run_masked(scheme, "swiglu", True, MASKED_M, 20)


@pytest.mark.parametrize("activation,gated", ACTIVATIONS[1:])
def test_masked_activations(activation, gated):
    run_masked("int4_g64_zp", activation, gated, MASKED_M, 20)


def test_masked_multi_block():
    """cap 70 -> BLOCK_M 64: two row-blocks per expert, the second partial or empty."""
    run_masked("int4_g32", "swiglu", True, [70, 64, 66, 3], 70)


def test_masked_cap_zero():
    w = make_weights("int4_g32", 4, 96, 64, True)
    x = torch.zeros(4, 0, 96, dtype=torch.float16, device=DEV)
    out = torch.zeros_like(x)
    triton_fused_moe_masked(x, w, torch.zeros(4, dtype=torch.int32, device=DEV), activation="swiglu", out=out)


# --------------------------------------------------------------------------------------------------
# gpt-oss experts: per-expert biases and the clamped SwiGLU
# --------------------------------------------------------------------------------------------------
OAI_CUSTOM = swiglu_oai(alpha=1.5, limit=2.0).name
BIASES = {"none": (False, False), "w13": (True, False), "w2": (False, True), "both": (True, True)}
OAI_X_SCALE = 6.0  # pre-activations of std ~6: the default limit 7 clamps gate and up on a good share
OAI_B_SCALE = 3.0  # biases of the same order, so that they matter next to the larger outputs


def biased(w, which: str, dtype=torch.float32, scale=0.5):
    b13, b2 = BIASES[which]
    return with_biases(w, w13=b13, w2=b2, dtype=dtype, scale=scale) if b13 or b2 else w


def _clamped_share(x, w, limit):
    """Share of gate/up pre-activations beyond +-limit (the clamps of swiglu_oai are exercised)."""
    w13, _ = w.dequantize()
    h = x.float().to(w13.device) @ w13[0].t()
    if w.w13_bias is not None:
        h = h + w.w13_bias[0].float()
    return (h.abs() > limit).float().mean().item()


def _check_bias_matters(x, w, tw, ids, activation, offset=0):
    """The reference with biases differs from the one without: a provider ignoring them fails."""
    if not w.has_bias:
        return
    plain = MoEWeights(w.scheme, w.w13, w.w2, w.gated)
    a = reference_moe(x, w, tw, ids, activation=activation, expert_offset=offset)
    b = reference_moe(x, plain, tw, ids, activation=activation, expert_offset=offset)
    assert (a - b).norm() > 0.1 * a.norm()


@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("activation", ["swiglu", "swiglu_oai", OAI_CUSTOM])
@pytest.mark.parametrize("bias", list(BIASES))
def test_bias_and_swiglu_oai(bias, activation, finalize):
    w = biased(make_weights("int4_g32", 4, 96, 64, True), bias, scale=0.5 if activation == "swiglu" else OAI_B_SCALE)
    x, tw, ids = make_inputs(9, 96, 2, 4)
    if activation != "swiglu":
        x = x * OAI_X_SCALE
        assert _clamped_share(x, w, swiglu_oai().limit if activation == "swiglu_oai" else 2.0) > 0.1
    _check_bias_matters(x, w, tw, ids, activation)
    check_moe(x, w, tw, ids, activation, finalize)


def test_swiglu_oai_is_not_swiglu():
    """The clamped activation's output differs from plain swiglu on the same weights (no silent fallback)."""
    w = make_weights("int4_g32", 4, 96, 64, True)
    x, tw, ids = make_inputs(9, 96, 2, 4)
    x = x * OAI_X_SCALE
    a = run_moe(x, w, tw, ids, "swiglu_oai", "deterministic")
    b = run_moe(x, w, tw, ids, "swiglu", "deterministic")
    assert (a.float() - b.float()).norm() > 0.1 * a.float().norm()


@pytest.mark.parametrize("activation,gated", ACTIVATIONS[2:])
def test_bias_non_gated(activation, gated):
    w = biased(make_weights("int4_g64_zp", 4, 128, 64, gated), "both")
    x, tw, ids = make_inputs(9, 128, 2, 4)
    _check_bias_matters(x, w, tw, ids, activation)
    for finalize in FINALIZE:
        check_moe(x, w, tw, ids, activation, finalize)


@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("scheme", ["mxfp4", "nvfp4", "int4_channel"])
def test_bias_oai_schemes_expert_parallel(scheme, finalize):
    """EP offset, invalid routes (-1, other ranks' experts) and both biases with the custom swiglu_oai."""
    h, i = dims_for(scheme)
    w = biased(make_weights(scheme, 5, h, i, True), "both", scale=OAI_B_SCALE)
    x, tw, ids = make_inputs(13, h, 3, 5, offset=5, invalid=True)
    x = x * OAI_X_SCALE
    _check_bias_matters(x, w, tw, ids, OAI_CUSTOM, offset=5)
    check_moe(x, w, tw, ids, OAI_CUSTOM, finalize, offset=5)


def test_bias_oai_expert_routes_and_combine():
    w = biased(make_weights("int4_g32", 4, 96, 64, True), "both", scale=OAI_B_SCALE)
    x, tw, ids = make_inputs(11, 96, 3, 4, invalid=True)
    x = x * OAI_X_SCALE
    y, valid = triton_expert_routes(x, w, ids, activation="swiglu_oai")
    ref_y, ref_valid = reference_routes(x, w, ids, activation="swiglu_oai")
    assert torch.equal(valid.cpu(), ref_valid.cpu())
    assert_matches(torch.where(valid[..., None], y, 0).reshape(-1, 96), ref_y.reshape(-1, 96))
    out = triton_combine_routes(y, tw, valid)
    det = run_moe(x, w, tw, ids, "swiglu_oai", "deterministic")
    assert torch.equal(out, det)


@pytest.mark.parametrize("activation", ["swiglu_oai", OAI_CUSTOM])
@pytest.mark.parametrize("bias", ["w13", "w2", "both"])
def test_masked_bias_oai(bias, activation):
    """Masked layout: unweighted rows with biases; rows past masked_m stay zero (no bias leaks into them)."""
    experts, cap, hidden, inter = len(MASKED_M), 20, 96, 64
    w = biased(make_weights("int4_g32", experts, hidden, inter, True), bias, scale=OAI_B_SCALE)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(experts, cap, hidden, generator=g) * OAI_X_SCALE).to(torch.float16).to(DEV)
    masked_m = torch.tensor(MASKED_M, dtype=torch.int32, device=DEV)
    ref = reference_moe_masked(x, w, masked_m, activation=activation)
    for e, m in enumerate(MASKED_M):
        x[e, max(0, min(m, cap)):] = float("nan")
    out = poisoned(x.shape, torch.float16)
    triton_fused_moe_masked(x, w, masked_m, activation=activation, out=out)
    for e, m in enumerate(MASKED_M):
        assert (out[e, max(0, min(m, cap)):] == 0).all()
    assert_matches(out.reshape(-1, hidden), ref.reshape(-1, hidden))


def test_bias_through_the_op_on_triton():
    """``fused_moe(backend="triton")`` carries the biases and the activation parameters to the kernels."""
    import w4a16_moe as wm

    w = biased(make_weights("int4_g32", 4, 96, 64, True), "both", scale=OAI_B_SCALE)
    x, tw, ids = make_inputs(9, 96, 2, 4, offset=4, invalid=True)
    x = x * OAI_X_SCALE
    act = swiglu_oai(alpha=1.5, limit=2.0)
    ref = reference_moe(x, w, tw, ids, activation=act, expert_offset=4)
    for finalize in FINALIZE:
        assert_matches(wm.fused_moe(x, w, tw, ids, activation=act, finalize=finalize, expert_offset=4,
                                    backend="triton"), ref)
    xm = x[:8].reshape(4, 2, 96).contiguous()
    mm = torch.tensor([2, 1, 0, 2], dtype=torch.int32, device=DEV)
    refm = reference_moe_masked(xm, w, mm, activation=act)
    assert_matches(wm.fused_moe_masked(xm, w, mm, activation=act.name, backend="triton").reshape(-1, 96),
                   refm.reshape(-1, 96))


def test_config_table_bounded():
    seen = {triton_moe.select_configs(m, gated)[0].block_m for m in range(1, 5000) for gated in (True, False)}
    assert seen == {16, 32, 64, 128}
    for m in (1, 17, 33, 65, 10**6):
        up, down = triton_moe.select_configs(m, True, masked=True)
        assert up.block_m == down.block_m <= 64


# --------------------------------------------------------------------------------------------------
# ahead-of-time compilation for sm90 / sm80 (no GPU needed: Triton ships ptxas)
# --------------------------------------------------------------------------------------------------
_AOT_SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from w4a16_moe.kernels.routing import finalize as fz, prepare as rt
from w4a16_moe.kernels.triton import grouped_gemm as gg
from w4a16_moe.kernels.triton.moe import CONFIG_TABLE

def build(jf, sig, consts, arch, warps=4, stages=3):
    full = {n: ("constexpr" if n in consts else sig[n]) for n in jf.arg_names}
    # pointers are 16-byte aligned at run time: tell the compiler, as the launcher's specialization does
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(jf.arg_names) if full[n].startswith("*")}
    k = triton.compile(ASTSource(jf, full, consts, attrs), target=GPUTarget("cuda", arch, 32),
                       options=dict(num_warps=warps, num_stages=stages))
    assert k.metadata.shared <= 160 * 1024, k.metadata.shared

SCHEMES = [  # KIND, G, PER_CHANNEL, HAS_ZP, HAS_GSCALE, scale pointer type
    (0, 64, False, True, False, "*bf16"), (1, 16, False, False, True, "*u8"),
    (2, 32, False, False, False, "*u8"), (0, None, True, False, False, "*fp32")]
H, I = 1024, 384
n = 0
for arch in (90, 80):
    for block_m in (16, 128):
        cg, cp, cd = CONFIG_TABLE[block_m]
        for i, (kind, g, pc, zp, gs, sty) in enumerate(SCHEMES):
            dt = ("bf16", "fp16")[i % 2]
            act, mode = i % 4, i % 3
            if i == 0 and block_m == 128:
                act = 4  # swiglu_oai
            bias = i % 2 == 1 or act == 4  # bf16 biases on odd schemes, fp32 with swiglu_oai
            masked = mode == 2 and block_m != 128
            cfg = cg if act in (0, 1, 4) else cp
            common = dict(codes_ptr="*u8", scales_ptr=sty, zeros_ptr="*u8", gscale_ptr="*fp32" if gs else "*u8",
                          bias_ptr=("*fp32" if act == 4 else "*bf16") if bias else "*u8",
                          sorted_ptr="*i32", block_info_ptr="*i32", masked_m_ptr="*i32", num_m="i32", cap="i32")
            scheme = dict(KIND=kind, PER_CHANNEL=pc, HAS_ZP=zp, HAS_GSCALE=gs, HAS_BIAS=bias, TOPK=8, H=H, I=I,
                          GROUP_M=8)
            build(gg._gate_up_kernel, dict(common, x_ptr="*" + dt, inter_ptr="*" + dt, alpha="fp32", limit="fp32"),
                  dict(scheme, G=g or H, MASKED=masked, GATED=act in (0, 1, 4), ACT=act, BM=cfg.block_m,
                       BN=cfg.block_n, BK=cfg.block_k), arch, cfg.num_warps, cfg.num_stages)
            build(gg._down_kernel, dict(common, inter_ptr="*" + dt, out_ptr="*" + dt, topk_w_ptr="*fp32"),
                  dict(scheme, G=g or I, MODE=2 if masked else mode % 2, BM=cd.block_m, BN=cd.block_n,
                       BK=cd.block_k), arch, cd.num_warps, cd.num_stages)
            n += 2
    ids = dict(ids_ptr="*i64", num_routes="i32", expert_offset="i32", num_experts="i32")
    pdl = arch >= 90  # griddepcontrol needs sm_90
    build(rt._route_prep_single_kernel, dict(ids, counts_ptr="*i32", cursor_ptr="*i32", sorted_ptr="*i32",
          route_start_ptr="*i32", block_start_ptr="*i32", block_info_ptr="*i32", num_blocks="i32",
          zero_ptr="*i32", num_zero="i32"),
          dict(BLOCK_M=16, E_PAD=512, CHUNK=1024, J_CHUNK=8, PDL=pdl), arch)
    build(rt._masked_prep_kernel, dict(masked_m_ptr="*i32", cap="i32", num_experts="i32", sorted_ptr="*i32",
          route_start_ptr="*i32", block_start_ptr="*i32", out_ptr="*bf16", H="i32"),
          dict(BLOCK_M=8, BLOCK_E=32, ROWS=16, BLOCK_H=1024, PDL=pdl), arch)
    for e_pad in (8, 512):  # few experts (histogram of 8 bins) and W1's 384
        build(rt._route_hist_kernel, dict(ids, hist_ptr="*i32", span="i32", zero_ptr="*i32", num_zero="i32"),
              dict(E_PAD=e_pad, CHUNK=1024, PDL=pdl), arch)
        build(rt._route_place_kernel, dict(ids, hist_ptr="*i32", span="i32", cursor_ptr="*i32", sorted_ptr="*i32",
              route_start_ptr="*i32", block_start_ptr="*i32", block_info_ptr="*i32", num_blocks="i32"),
              dict(BLOCK_M=64, E_PAD=e_pad, CHUNK=1024, J_CHUNK=16, HIST_ROWS=4096 // e_pad, PDL=pdl), arch)
    for from_mask in (False, True):
        build(fz._finalize_kernel, dict(ybuf_ptr="*bf16", topk_w_ptr="*fp32", ids_ptr="*i32", valid_ptr="*u8",
              out_ptr="*bf16", H="i32", LDY="i32", num_experts="i32", expert_offset="i32"),
              dict(TOPK=8, FROM_MASK=from_mask, BLOCK_H=1024, PDL=pdl), arch)
    n += 8
print("compiled", n)
"""


def test_kernels_compile_for_sm90_and_sm80():
    """Catch GPU-only compile errors on machines without a GPU (the interpreter accepts more than the
    compiler). Runs in a subprocess because this process may have built the kernels for the interpreter."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    import w4a16_moe

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(w4a16_moe.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "compiled 48" in res.stdout


# --------------------------------------------------------------------------------------------------
# GPU-only tests
# --------------------------------------------------------------------------------------------------
def _compiled_variants() -> int:
    total = 0
    for k in (_gate_up_kernel, _down_kernel):
        for cache in getattr(k, "device_caches", {}).values():
            total += len(cache[0])
    return total


@gpu
@needs_gpu
@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_accuracy(dtype, scheme, finalize):
    w = make_weights(scheme, 8, 512, 256, True, dtype=dtype)
    for tokens in (1, 64, 300):
        x, tw, ids = make_inputs(tokens, 512, 4, 8, dtype=dtype, offset=8, invalid=True)
        check_moe(x, w, tw, ids, "swiglu", finalize, offset=8)


@gpu
@needs_gpu
@pytest.mark.parametrize("activation,gated", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_activations_large(dtype, activation, gated):
    """T*k = 32768 routes: multi-kernel route prep and BLOCK_M 128."""
    w = make_weights("int4_g128", 16, 1024, 512, gated, dtype=dtype)
    x, tw, ids = make_inputs(4096, 1024, 8, 16, dtype=dtype)
    for finalize in FINALIZE:
        check_moe(x, w, tw, ids, activation, finalize)


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_determinism(dtype):
    w = make_weights("mxfp4", 16, 1024, 512, True, dtype=dtype)
    x, tw, ids = make_inputs(2048, 1024, 8, 16, dtype=dtype, offset=16, invalid=True)
    a = run_moe(x, w, tw, ids, "swiglu", "deterministic", offset=16)
    for _ in range(3):
        b = run_moe(x, w, tw, ids, "swiglu", "deterministic", offset=16)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@gpu
@needs_gpu
@pytest.mark.parametrize("scheme", ["int4_g128", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_masked(dtype, scheme):
    run_masked(scheme, "swiglu", True, [0, 17, 128, 200, -1, 64, 1, 127], 128, dtype=dtype, hidden=512, inter=256)


@gpu
@needs_gpu
@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_cuda_graph(dtype, finalize):
    """Capture one graph per token count and replay with new data; no recompilation across token counts."""
    experts, hidden, inter, top_k = 8, 512, 256, 2
    w = make_weights("int4_g64_zp", experts, hidden, inter, True, dtype=dtype)
    token_counts = (1, 3, 8, 16, 31)  # all in the BLOCK_M = 16 bucket (<= 16 expected rows per expert)
    x, tw, ids = make_inputs(31, hidden, top_k, experts, dtype=dtype)
    run_moe(x, w, tw, ids, "swiglu", finalize)  # warm-up compiles the variants of this bucket
    torch.cuda.synchronize()
    variants = _compiled_variants()
    graphs = {}
    for t in token_counts:
        bufs = make_inputs(t, hidden, top_k, experts, dtype=dtype, seed=t)
        out = torch.empty(t, hidden, dtype=dtype, device=DEV)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up on a side stream before capture, as recommended
            triton_fused_moe(*bufs[:1], w, *bufs[1:], activation="swiglu", finalize=finalize, expert_offset=0,
                             out=out)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            triton_fused_moe(bufs[0], w, bufs[1], bufs[2], activation="swiglu", finalize=finalize, expert_offset=0,
                             out=out)
        graphs[t] = (graph, bufs, out)
    for t, (graph, (x_s, tw_s, ids_s), out) in graphs.items():
        for seed in (100, 200):
            x_n, tw_n, ids_n = make_inputs(t, hidden, top_k, experts, dtype=dtype, seed=seed + t, invalid=True)
            x_s.copy_(x_n), tw_s.copy_(tw_n), ids_s.copy_(ids_n)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert_matches(out, reference_moe(x_n, w, tw_n, ids_n, activation="swiglu"))
    assert _compiled_variants() == variants, "token count caused recompilation"


@gpu
@needs_gpu
def test_gpu_masked_cuda_graph():
    experts, cap, hidden, inter = 8, 64, 512, 256
    w = make_weights("nvfp4", experts, hidden, inter, True, dtype=torch.bfloat16)
    x = torch.randn(experts, cap, hidden, device=DEV).to(torch.bfloat16)
    masked_m = torch.zeros(experts, dtype=torch.int32, device=DEV)
    out = torch.empty_like(x)
    triton_fused_moe_masked(x, w, masked_m, activation="swiglu", out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_fused_moe_masked(x, w, masked_m, activation="swiglu", out=out)
    for counts in ([0, 1, 64, 70, -2, 33, 5, 63], [64] * 8):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        x.copy_(torch.randn_like(x, dtype=torch.float32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference_moe_masked(x, w, masked_m, activation="swiglu")
        assert_matches(out.reshape(-1, hidden), ref.reshape(-1, hidden))



@gpu
@needs_gpu
@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("activation", ["swiglu", "swiglu_oai", OAI_CUSTOM])
@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_bias_swiglu_oai(dtype, bias, activation, finalize):
    """Biases (BF16 with BF16 activations, FP32 with FP16) x activation x finalize, EP offset and invalid ids."""
    bdt = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    scale = 0.5 if activation == "swiglu" else OAI_B_SCALE
    w = biased(make_weights("mxfp4", 8, 512, 256, True, dtype=dtype), bias, dtype=bdt, scale=scale)
    for tokens in (1, 64, 300):
        x, tw, ids = make_inputs(tokens, 512, 4, 8, dtype=dtype, offset=8, invalid=True)
        if activation != "swiglu":
            x = x * OAI_X_SCALE
        check_moe(x, w, tw, ids, activation, finalize, offset=8)


@gpu
@needs_gpu
@pytest.mark.parametrize("activation,gated", ACTIVATIONS[2:])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_bias_non_gated(dtype, activation, gated):
    w = biased(make_weights("int4_g128", 8, 512, 256, gated, dtype=dtype), "both")
    x, tw, ids = make_inputs(300, 512, 4, 8, dtype=dtype)
    for finalize in FINALIZE:
        check_moe(x, w, tw, ids, activation, finalize)


@gpu
@needs_gpu
@pytest.mark.parametrize("finalize", FINALIZE)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_gpt_oss_layer_shape(dtype, finalize):
    """gpt-oss's H = I = 2880 (K tails for BLOCK_K 64/128), MXFP4, BF16 biases, default swiglu_oai, top-4,
    BLOCK_M 16 to 128 buckets."""
    w = biased(make_weights("mxfp4", 8, 2880, 2880, True, dtype=dtype), "both", dtype=torch.bfloat16,
               scale=OAI_B_SCALE)
    for tokens in (1, 40, 700):
        x, tw, ids = make_inputs(tokens, 2880, 4, 8, dtype=dtype, offset=8, invalid=True)
        check_moe(x * OAI_X_SCALE, w, tw, ids, "swiglu_oai", finalize, offset=8)


@gpu
@needs_gpu
@pytest.mark.parametrize("activation", ["swiglu_oai", OAI_CUSTOM])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_masked_bias_oai(dtype, activation):
    experts, cap, hidden, inter = 8, 128, 512, 256
    masked = [0, 17, 128, 200, -1, 64, 1, 127]
    w = biased(make_weights("mxfp4", experts, hidden, inter, True, dtype=dtype), "both", dtype=torch.bfloat16,
               scale=OAI_B_SCALE)
    x = (torch.randn(experts, cap, hidden, device=DEV) * OAI_X_SCALE).to(dtype)
    masked_m = torch.tensor(masked, dtype=torch.int32, device=DEV)
    ref = reference_moe_masked(x, w, masked_m, activation=activation)
    out = poisoned(x.shape, dtype)
    triton_fused_moe_masked(x, w, masked_m, activation=activation, out=out)
    for e, m in enumerate(masked):
        assert (out[e, max(0, min(m, cap)):] == 0).all()
    assert_matches(out.reshape(-1, hidden), ref.reshape(-1, hidden))


@gpu
@needs_gpu
@pytest.mark.parametrize("finalize", FINALIZE)
def test_gpu_bias_oai_cuda_graph_and_compile(finalize):
    """The biased gpt-oss layer through ``fused_moe``: captured in a CUDA graph and under torch.compile."""
    import w4a16_moe as wm

    experts, hidden, inter, top_k = 8, 512, 256, 4
    w = biased(make_weights("mxfp4", experts, hidden, inter, True, dtype=torch.bfloat16), "both",
               dtype=torch.bfloat16, scale=OAI_B_SCALE)
    x, tw, ids = make_inputs(16, hidden, top_k, experts, dtype=torch.bfloat16)
    x = x * OAI_X_SCALE
    kw = dict(activation=OAI_CUSTOM, finalize=finalize, backend="auto")  # auto: CuTe on SM90, else Triton
    wm.warmup(w, activation=OAI_CUSTOM, top_k=top_k, max_tokens=16, finalize=finalize)
    out = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wm.fused_moe(x, w, tw, ids, out=out, **kw)
    for seed in (3, 4):
        x_n, tw_n, ids_n = make_inputs(16, hidden, top_k, experts, dtype=torch.bfloat16, seed=seed, invalid=True)
        x.copy_(x_n * OAI_X_SCALE), tw.copy_(tw_n), ids.copy_(ids_n)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, reference_moe(x, w, tw, ids, activation=OAI_CUSTOM))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, tw, ids: wm.fused_moe(x, w, tw, ids, **kw) * 2, fullgraph=True)
    assert_matches(compiled(x, tw, ids) / 2, reference_moe(x, w, tw, ids, activation=OAI_CUSTOM))


@pytest.mark.parametrize("finalize", FINALIZE)
def test_gptq_act_order_over_h(finalize):
    """Weights with a ``w13_perm`` (GPTQ act order over H) through ``fused_moe(backend="triton")``: the op gathers x
    per route and runs the Triton per-route half as top-1 rows (invalid and foreign ids included), and masked."""
    import w4a16_moe as wm
    from conftest import gptq_act_order_layer

    experts, hidden, inter = 4, 128, 64
    w = gptq_act_order_layer(experts, hidden, inter, group=32, sym=False, seed=2).weights.to(DEV)
    for tokens in (1, 6):
        x, tw, ids = make_inputs(tokens, hidden, 2, experts, offset=1, invalid=True, seed=tokens)
        out = torch.full_like(x, float("nan"))
        wm.fused_moe(x, w, tw, ids, finalize=finalize, expert_offset=1, backend="triton", out=out)
        assert_matches(out, reference_moe(x, w, tw, ids, expert_offset=1))
    xm = torch.randn(experts, 3, hidden).half().to(DEV)
    mm = torch.tensor([3, 0, 2, 1], dtype=torch.int32, device=DEV)
    assert_matches(wm.fused_moe_masked(xm, w, mm, backend="triton"), reference_moe_masked(xm, w, mm))

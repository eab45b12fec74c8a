"""The warp-MMA (mma.sync) grouped GEMMs on the GPU, one GEMM at a time, against an FP64 torch reference.

Every case builds random weights (quantized with the scheme, so the reference uses the exact dequantized
weights), a route plan from ``prepare_routes`` (random routing, empty experts, one expert, EP offsets with
invalid ids), poisons the output with NaN (FP32 atomics: zeros), launches the kernel obtained from the
loader (``get_kernel(spec, arch)``; on the GPU machine from ``W4A16_MOE_PREBUILT_DIR``) and checks:

* NRMSE < 0.02 against FP64 (typical ~0.003) on every valid row; rows that must not be written stay NaN;
* split-K (1, 2, 4): bit-identical results over repeated runs (``h`` and ``y`` epilogues), counters re-armed;
* CUDA-graph capture + replay (route prep + both GEMMs) equals the eager result bit for bit;
* row-block streaming (short-K launches whose CTAs run several row blocks, unevenly): every scheme kind, biases.

Failures name the case and print NRMSE, the worst element (row, column, got, expected) and which rows /
column blocks are wrong.

Kernels needed (prebuilt for sm_90a on a machine without the DSL)::

    PYTHONPATH=python python tests/test_warp_kernel.py --specs warp_specs.json      # writes the spec list
    PYTHONPATH=python python -m w4a16_moe aot --archs sm_90a --specs warp_specs.json --out DIR -j 2
    W4A16_MOE_PREBUILT_DIR=DIR python -m pytest -q -s tests/test_warp_kernel.py

``W4A16_WARP_ARCH`` overrides the arch the kernels are requested for (default: sm_90a on SM90, sm_100a on
SM100; other GPUs skip unless it is set). ``test_bench_w1`` prints the W1 decode timings (pytest ``-s``).
"""

from __future__ import annotations

import functools
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import w4a16_moe as wm  # noqa: E402
from w4a16_moe.activations import apply_activation, get_activation  # noqa: E402
from w4a16_moe.formats.schemes import SCHEMES, get_scheme  # noqa: E402
from w4a16_moe.kernels.cute.warp import family as fam  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
#: W4A16_WARP_FAKE=1: run the harness on the CPU with a torch stand-in for the kernel (checks the test itself;
#: route prep then needs TRITON_INTERPRET=1). Never set on the GPU machine.
FAKE = os.environ.get("W4A16_WARP_FAKE") == "1"
DEV = "cpu" if FAKE else "cuda"


def _arch():
    env = os.environ.get("W4A16_WARP_ARCH")
    if env:
        return env
    if FAKE:
        return "sm_90a"
    if not HAS_CUDA:
        return None
    return {9: "sm_90a", 10: "sm_100a"}.get(torch.cuda.get_device_capability()[0])


ARCH = _arch()
pytestmark = [pytest.mark.skipif(not FAKE and (not HAS_CUDA or ARCH is None),
                                 reason="needs a CUDA GPU with a loader arch (SM90/SM100)")]
if not FAKE:
    pytestmark.append(pytest.mark.gpu)

E, H, I, TOPK = 16, 512, 256, 8
TOL = 0.02
ALL_SCHEMES = list(SCHEMES)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BUCKETS = {f"t{t['tokens_per_tile']}": t for _, t in fam.TILES}
#: the same tiles as the provider launches them with PDL (warp.family.pdl_launch: small-expert layers)
PDL_BUCKETS = {b + "pdl": dict(t, pdl=True) for b, t in BUCKETS.items()}
#: TN 16 / 24 / 32 with the K loop built for their occupied token blocks too (``occupancy``), plain, with PDL and
#: looping over their tiles
_T24 = {f"t{t['tokens_per_tile']}": t for t in fam.model_tiles()}["t24"]
OCC_BUCKETS = {f"t{t['tokens_per_tile']}occ{sfx}": dict(t, occupancy=True, **extra)
               for t in (BUCKETS["t16"], _T24, BUCKETS["t32"])
               for sfx, extra in (("", {}), ("pdl", {"pdl": True}), ("tl", {"tile_loop": True}))}
#: the K-tile-64 twins of TN 8 / 16 (family.K64_TILES), on the schemes they are built for
K64_BUCKETS = {f"t{t['tokens_per_tile']}k64": dict(t) for t in fam.K64_TILES}
K64_SCHEMES = ["int4_g32", "int4_g64_zp", "int4_channel"]
TOKENS = [0, 1, 7, 8, 9, 33, 300]

# parametrization tables (also the source of needed_specs())
SCHEME_BUCKETS = ["t8", "t32"]
ACTIVATIONS = ["swiglu", "geglu", "relu2", "silu"]
EDGE_CASES = ["random", "empty_experts", "one_expert", "ep_invalid", "all_invalid"]
GEMMS = ["gate_up", "down_y", "down_atomic"]


def _cfgs(scheme: str, dtype: str, activation: str, bucket: str):
    """(gate_up, down y, down atomic_f32) configs."""
    sch = get_scheme(scheme)
    gated = get_activation(activation).gated
    tiles = {**BUCKETS, **PDL_BUCKETS, **OCC_BUCKETS, **OCC_PLAIN, **K64_BUCKETS}[bucket]
    up, down_y = fam.gemm_configs(sch, dtype, activation, gated, "deterministic", tiles)
    _, down_a = fam.gemm_configs(sch, dtype, activation, gated, "fused", tiles)
    return {"gate_up": up, "down_y": down_y, "down_atomic": down_a}


def needed_specs() -> list:
    """Every KernelSpec this module launches (build them for ARCH before running on a DSL-less machine)."""
    cfgs = []
    for scheme in ALL_SCHEMES:
        for dt in DTYPES:
            for b in SCHEME_BUCKETS:
                cfgs += _cfgs(scheme, dt, "swiglu", b).values()
    for act in ACTIVATIONS:
        for dt in DTYPES:
            for b in ("t8", "t64"):
                cfgs.append(_cfgs("int4_g32", dt, act, b)["gate_up"])
    for b in BUCKETS:
        cfgs += _cfgs("int4_g128", "bf16", "swiglu", b).values()
        cfgs += _cfgs("int4_g32", "bf16", "swiglu", b).values()  # W1 benchmark
    for b in PDL_CASES:
        cfgs += _cfgs("int4_g32", "bf16", "swiglu", b).values()
    for b in list(OCC_BUCKETS) + list(OCC_PLAIN):
        for scheme in OCC_SCHEMES:
            cfgs += _cfgs(scheme, "bf16", "swiglu", b).values()
    for b in K64_BUCKETS:
        for scheme in K64_SCHEMES:
            cfgs += _cfgs(scheme, "bf16", "swiglu", b).values()
    out, seen = [], set()
    for s in [fam.spec_for(c) for c in cfgs] + stream_specs():
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _kernel(cfg):
    from w4a16_moe.loader import get_kernel

    return get_kernel(fam.spec_for(cfg), ARCH)


@functools.lru_cache(maxsize=None)
def _weights(scheme: str, dtype: str, activation: str = "swiglu", seed: int = 0):
    """(MoEWeights on cuda, exact FP64 w13 [E, N13, H], exact FP64 w2 [E, H, I])."""
    g = torch.Generator().manual_seed(seed)
    gated = get_activation(activation).gated
    n13 = 2 * I if gated else I
    w13 = torch.randn(E, n13, H, generator=g) / H**0.5
    w2 = torch.randn(E, H, I, generator=g) / I**0.5
    w = wm.quantize_experts(w13.to(DTYPES[dtype]), w2.to(DTYPES[dtype]), scheme, activation=activation)
    r13, r2 = w.dequantize()
    return w.to(DEV), r13.double().to(DEV), r2.double().to(DEV)


@functools.lru_cache(maxsize=64)
def _packed(scheme: str, dtype: str, activation: str, which: str, layout: tuple):
    from w4a16_moe.kernels.cute.warp.pack import pack_warp

    w, _, _ = _weights(scheme, dtype, activation)
    qm = w.w13 if which == "w13" else w.w2
    warps, mw, bk = layout
    return pack_warp(qm, warps=warps, m16_per_warp=mw, k_tile=bk, compute_dtype=DTYPES[dtype],
                     interleave_gate_up=(which == "w13" and w.gated))


def _packed_for(cfg, scheme: str, activation: str, which: str):
    return _packed(scheme, cfg.dtype, activation, which, (cfg.warps, cfg.m16_per_warp, cfg.k_tile))


def _routing(t: int, case: str, seed: int):
    """(ids int32 [t, k] cuda, topk weights FP32 [t, k] cuda, expert_offset)."""
    g = torch.Generator().manual_seed(seed)
    offset = 0
    if case == "random":
        ids = torch.rand(t, E, generator=g).topk(TOPK, dim=1).indices
    elif case == "empty_experts":  # experts 5..15 get nothing
        ids = torch.randint(0, 5, (t, TOPK), generator=g)
    elif case == "one_expert":
        ids = torch.full((t, TOPK), 3)
    elif case == "ep_invalid":  # 16 local experts at offset 16 of 48; -1 and other ranks' ids are invalid
        offset = 16
        ids = torch.randint(-1, 48, (t, TOPK), generator=g)
    elif case == "all_invalid":
        ids = torch.randint(E, 3 * E, (t, TOPK), generator=g)
        if t:
            ids[0] = -1
    else:
        raise ValueError(case)
    tw = torch.softmax(torch.randn(t, TOPK, generator=g), dim=1)
    return ids.to(torch.int32).to(DEV), tw.float().to(DEV), offset


def _plan(ids, offset, tn):
    from w4a16_moe.kernels.routing.prepare import prepare_routes

    return prepare_routes(ids, E, offset, tn)


def _launch(cfg, packed, act, out, plan, tw_flat, n, k, num_routes, splits=1, ws=None, counters=None):
    """One kernel launch with the SM90-family ABI (scratch allocated here unless given)."""
    max_tiles = fam.max_tiles(num_routes, E, cfg.tokens_per_tile)
    if splits > 1:
        if ws is None:
            ws = torch.empty(cfg.ws_floats(n, max_tiles, splits), dtype=torch.float32, device=DEV)
        if counters is None:
            counters = torch.zeros(cfg.counters_len(n, max_tiles), dtype=torch.int32, device=DEV)
    else:
        ws = counters = plan.route_start  # never read when num_splits == 1
    if FAKE:
        _fake_kernel(cfg, packed, act, out, plan, tw_flat, n, k)
        return ws, counters
    _kernel(cfg)(
        packed.data.data_ptr(), act.data_ptr(), out.data_ptr(), plan.sorted_routes.data_ptr(),
        plan.route_start.data_ptr(), plan.block_start.data_ptr(), tw_flat.data_ptr(), ws.data_ptr(),
        counters.data_ptr(), E, n, k, num_routes, TOPK, max_tiles, splits, torch.cuda.current_stream().cuda_stream,
    )
    return ws, counters


def _sync():
    if not FAKE:
        torch.cuda.synchronize()


def _fake_kernel(cfg, packed, act, out, plan, tw_flat, n, k):
    """Torch stand-in with the kernel's contract (W4A16_WARP_FAKE=1 only): weights from unpack_warp, rounded to
    the compute dtype; slots of expert e are route_start[e] .. route_start[e+1]-1."""
    from w4a16_moe.formats.quantize import dequantize_matrix
    from w4a16_moe.kernels.cute.warp.pack import unpack_warp

    qm = unpack_warp(packed)
    wd = dequantize_matrix(qm)
    if qm.global_scale is not None:  # the kernel rounds e2m1 * scale, and applies the global scale in FP32
        wd = (wd / qm.global_scale[:, :, None]).to(act.dtype).double() * qm.global_scale[:, :, None].double()
    else:
        wd = wd.to(act.dtype).double()
    rs = plan.route_start.tolist()
    bias = tw_flat.view(E, n).double() if cfg.bias else torch.zeros(E, n, dtype=torch.float64, device=act.device)
    for e in range(E):
        for s in range(rs[e], rs[e + 1]):
            route = int(plan.sorted_routes[s])
            if cfg.mode == "gate_up":
                v = wd[e] @ act[route // TOPK].double() + bias[e]
                out[s] = apply_activation(v, cfg.activation).to(out.dtype)
            else:
                v = wd[e] @ act[s].double() + bias[e]
                if cfg.epi == "y":
                    out[route] = v.to(out.dtype)
                else:
                    out[route // TOPK] += (tw_flat[route].double() * v).float()


def _nrmse(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    den = ref.norm().item()
    num = (got - ref).norm().item()
    return num / den if den > 0 else num


def _check(name: str, got: torch.Tensor, ref: torch.Tensor, tol: float = TOL, row_ids=None) -> float:
    """NRMSE check with a diagnostic message (worst element, bad rows / column blocks)."""
    got, ref = got.double(), ref.double()
    if got.numel() == 0:
        return 0.0
    nan = torch.isnan(got)
    err = _nrmse(torch.nan_to_num(got, nan=1e30), ref)
    if err < tol and not nan.any():
        return err
    diff = (torch.nan_to_num(got, nan=1e30) - ref).abs()
    flat = int(diff.argmax())
    r, c = divmod(flat, got.shape[1])
    scale = ref.abs().mean().item() + 1e-30
    bad = diff > 0.1 * scale + 0.05 * ref.abs()
    rows = torch.nonzero(bad.any(1)).flatten().tolist()
    colb = torch.nonzero(bad.any(0).view(-1, 8).any(1)).flatten().tolist() if got.shape[1] % 8 == 0 else []
    rid = f" (id {int(row_ids[r])})" if row_ids is not None else ""
    msg = (f"{name}: NRMSE {err:.4g} (tol {tol}), NaN {int(nan.sum())}/{got.numel()}; worst at row {r}{rid} col {c}: "
           f"got {got[r, c].item():.5g} expected {ref[r, c].item():.5g}; bad rows {len(rows)}/{got.shape[0]} "
           f"{rows[:16]}; bad 8-col blocks {len(colb)}/{got.shape[1] // 8} {colb[:16]}")
    raise AssertionError(msg)


def _valid(plan):
    nvalid = int(plan.route_start[-1].item())
    return nvalid, plan.sorted_routes[:nvalid].long()


def _expert_of(ids, routes, offset):
    return ids.flatten().long()[routes] - offset


def _ref_gate_up(x, ids, plan, offset, r13, activation):
    """FP64 h rows of the valid slots (in slot order)."""
    nvalid, routes = _valid(plan)
    es = _expert_of(ids, routes, offset)
    xs = x.double()[routes // TOPK]
    hpre = torch.empty(nvalid, r13.shape[1], dtype=torch.float64, device=DEV)
    for e in range(E):
        sel = es == e
        if sel.any():
            hpre[sel] = xs[sel] @ r13[e].T
    return apply_activation(hpre, activation)


def _ref_down(hin, ids, plan, offset, r2):
    """FP64 y rows of the valid slots (in slot order)."""
    nvalid, routes = _valid(plan)
    es = _expert_of(ids, routes, offset)
    hs = hin.double()[:nvalid]
    y = torch.empty(nvalid, H, dtype=torch.float64, device=DEV)
    for e in range(E):
        sel = es == e
        if sel.any():
            y[sel] = hs[sel] @ r2[e].T
    return y


def _run_case(scheme, dtype, activation, bucket, gemm, t, case="random", seed=0, splits=1, repeats=1):
    """Run one GEMM case and check it; returns the checked kernel outputs (valid rows) of every repeat (same
    inputs, same split-K counters: they must have been re-armed by the previous launch)."""
    cfg = _cfgs(scheme, dtype, activation, bucket)[gemm]
    w, r13, r2 = _weights(scheme, dtype, activation)
    dt = DTYPES[dtype]
    name = f"{cfg.name()} T={t} case={case} splits={splits}"
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(t, H, generator=g).to(dt).to(DEV)
    ids, tw, offset = _routing(t, case, seed)
    r = t * TOPK
    if r == 0:  # zero tokens: nothing to launch (grid y would be 0); the provider returns early as well
        return []
    plan = _plan(ids, offset, cfg.tokens_per_tile)
    nvalid, routes = _valid(plan)
    outs = []
    counters = hin = yref = None
    for _ in range(repeats):
        if gemm == "gate_up":
            p = _packed_for(cfg, scheme, activation, "w13")
            n13 = w.w13.n
            out = torch.full((r, I), float("nan"), dtype=dt, device=DEV)
            _, counters = _launch(cfg, p, x, out, plan, tw.flatten(), n13, H, r, splits, counters=counters)
            _sync()
            _check(name, out[:nvalid], _ref_gate_up(x, ids, plan, offset, r13, activation), row_ids=routes)
            assert torch.isnan(out[nvalid:]).all(), f"{name}: rows past the valid slots were written"
            # in route-id order: the route preparation may order an expert's slots differently from call to call
            outs.append(out[:nvalid][routes.argsort()])
        else:
            p = _packed_for(cfg, scheme, activation, "w2")
            if hin is None:
                hin = torch.full((r, I), float("nan"), dtype=dt, device=DEV)
                hin[:nvalid] = torch.randn(nvalid, I, generator=g).to(dt).to(DEV)
                yref = _ref_down(hin, ids, plan, offset, r2)
            if gemm == "down_y":
                out = torch.full((r, H), float("nan"), dtype=dt, device=DEV)
                _, counters = _launch(cfg, p, hin, out, plan, tw.flatten(), H, I, r, splits, counters=counters)
                _sync()
                _check(name, out[routes], yref, row_ids=routes)
                written = torch.zeros(r, dtype=torch.bool, device=DEV)
                written[routes] = True
                assert torch.isnan(out[~written]).all(), f"{name}: rows of invalid routes were written"
                outs.append(out[routes])
            else:
                out = torch.zeros(t, H, dtype=torch.float32, device=DEV)
                _, counters = _launch(cfg, p, hin, out, plan, tw.flatten(), H, I, r, splits, counters=counters)
                _sync()
                ref = torch.zeros(t, H, dtype=torch.float64, device=DEV)
                ref.index_add_(0, routes // TOPK, yref * tw.flatten().double()[routes][:, None])
                _check(name, out, ref)
                outs.append(out)
        if splits > 1:
            assert int(counters.abs().sum()) == 0, f"{name}: split-K counters not re-armed"
    return outs


# ------------------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [1, 33])
@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("bucket", SCHEME_BUCKETS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_schemes(scheme, dtype, bucket, gemm, t):
    if scheme == "mxfp4" and dtype == "fp16":
        try:
            _packed_for(_cfgs(scheme, dtype, "swiglu", bucket)[gemm], scheme, "swiglu",
                        "w13" if gemm == "gate_up" else "w2")
        except ValueError as e:  # E8M0 scales outside fp16's exact range: refused at pack time, by design
            pytest.skip(str(e))
    _run_case(scheme, dtype, "swiglu", bucket, gemm, t, case="ep_invalid" if t == 33 else "random", seed=t)


@pytest.mark.parametrize("t", [7, 300])
@pytest.mark.parametrize("bucket", ["t8", "t64"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations(activation, dtype, bucket, t):
    _run_case("int4_g32", dtype, activation, bucket, "gate_up", t, seed=t)


@pytest.mark.parametrize("t", [1, 33, 300])
@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("scheme", K64_SCHEMES)
@pytest.mark.parametrize("bucket", list(K64_BUCKETS))
def test_k64_twins(bucket, scheme, gemm, t):
    _run_case(scheme, "bf16", "swiglu", bucket, gemm, t, case="ep_invalid" if t == 33 else "random", seed=t)


@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("bucket", list(BUCKETS))
def test_token_counts(bucket, gemm, t):
    _run_case("int4_g128", "bf16", "swiglu", bucket, gemm, t, seed=t)


@pytest.mark.parametrize("case", EDGE_CASES)
@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("bucket", ["t8", "t64"])
def test_routing_edge_cases(case, gemm, bucket):
    for t in (9, 300):
        _run_case("int4_g32", "bf16", "swiglu", bucket, gemm, t, case=case, seed=t)


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("bucket", ["t8", "t32"])
def test_split_k_deterministic(splits, gemm, bucket):
    for t in (1, 33):
        outs = _run_case("int4_g32", "bf16", "swiglu", bucket, gemm, t, case="ep_invalid", seed=t, splits=splits,
                         repeats=3)
        if gemm != "down_atomic":  # FP32 atomics are order-nondeterministic by design
            for o in outs[1:]:
                assert torch.equal(o, outs[0]), f"{gemm} {bucket} splits={splits} T={t}: not bit-identical"


#: PDL kernels (griddepcontrol; launched here after the test's own kernels, so the waits return at once): TN 8 and
#: 64, with and without split-K; the down GEMM issues its first weight stages before its wait (streaming at TN 8)
PDL_CASES = ["t8pdl", "t64pdl"]


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("bucket", PDL_CASES)
def test_pdl_kernels(bucket, gemm, splits):
    assert all(c.pdl for c in _cfgs("int4_g32", "bf16", "swiglu", bucket).values())
    for t in (1, 33, 300):
        outs = _run_case("int4_g32", "bf16", "swiglu", bucket, gemm, t, case="ep_invalid", seed=t, splits=splits,
                         repeats=2)
        if gemm != "down_atomic":
            assert torch.equal(outs[1], outs[0]), f"{gemm} {bucket} splits={splits} T={t}: not bit-identical"


# ------------------------------------------------------------------------------------------------------------
# occupancy: a tile with routes in at most half its token blocks runs the K loop built for those blocks
# ------------------------------------------------------------------------------------------------------------
#: the same tiles without ``occupancy`` (the reference the occupancy kernels must match bit for bit)
OCC_PLAIN = {b + "plain": dict(t, occupancy=False) for b, t in OCC_BUCKETS.items()}
#: INT4 g128 (FP32 partial sums per scale group up to TN 32) and g32 (scales on the weights)
OCC_SCHEMES = ["int4_g128", "int4_g32"]


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("scheme", OCC_SCHEMES)
@pytest.mark.parametrize("bucket", list(OCC_BUCKETS))
def test_occupancy(bucket, scheme, gemm):
    """Token counts whose tiles are all small (1, 9: 0.5 / 4.5 routes per expert), mixed (33) and mostly full
    (300), some routes invalid: checked against the FP64 reference, NaN-poisoned, and bit-identical to the kernel
    without ``occupancy`` (the occupied blocks run the same MMAs in the same order); with split-K too."""
    cfg = _cfgs(scheme, "bf16", "swiglu", bucket)[gemm]
    assert cfg.occupancy and len(cfg.occupancy_levels) == 2
    for t in (1, 9, 33, 300):
        for splits in ((1, 2) if not cfg.tile_loop else (1,)):
            got = _run_case(scheme, "bf16", "swiglu", bucket, gemm, t, case="ep_invalid", seed=t, splits=splits)
            ref = _run_case(scheme, "bf16", "swiglu", bucket + "plain", gemm, t, case="ep_invalid", seed=t,
                            splits=splits)
            if gemm != "down_atomic":  # FP32 atomics are order-nondeterministic by design
                assert torch.equal(got[0], ref[0]), f"{cfg.name()} T={t} splits={splits}: differs from the plain kernel"


# ------------------------------------------------------------------------------------------------------------
# row-block streaming: short-K launches with grids large enough that a CTA runs several row blocks
# ------------------------------------------------------------------------------------------------------------
#: (gemm, scheme, tile, bias, H, I, tokens): H = 2944 / 5888 are 23 / 46 row blocks (not multiples of the row
#: blocks per CTA: the last CTA of each tile runs fewer). INT4 groups of 64 / 128 take the FP32-scale path; TN 32
#: with groups of 128 a padded stage. Only the down kernels stream (the gate/up kernels are built with one row
#: block per CTA: ``family.UP_ROW_BLOCKS``, tests/test_warp_pack.py).
STREAM_CASES = [
    ("down_y", "int4_g128", "t8", False, 2944, 256, 300),
    ("down_y", "int4_g64_zp", "t16", False, 2944, 512, 1000),
    ("down_y", "int4_g32", "t24", False, 2944, 256, 1000),
    ("down_atomic", "int4_g128", "t32", False, 5888, 256, 1000),
    ("down_y", "nvfp4", "t8", False, 2944, 256, 300),
    ("down_y", "mxfp4", "t8", True, 2944, 256, 300),
    ("down_y", "int4_g128", "t16occ", False, 2944, 256, 1000),
    ("down_atomic", "int4_g32", "t24occ", False, 5888, 256, 1000),
]
_STREAM_TILES = {f"t{t['tokens_per_tile']}": t for t in fam.model_tiles() if t not in fam.K64_TILES}
_STREAM_TILES.update({k + "occ": dict(t, occupancy=True) for k, t in _STREAM_TILES.items() if k in ("t16", "t24")})


def _stream_cfg(gemm, scheme, tile, bias):
    act = "swiglu_oai" if bias else "swiglu"
    sch = get_scheme(scheme)
    up, down = fam.gemm_configs(sch, "bf16", act, True, "fused" if gemm == "down_atomic" else "deterministic",
                                _STREAM_TILES[tile], bias)
    return (up if gemm == "gate_up" else down), act


def stream_specs() -> list:
    return [fam.spec_for(_stream_cfg(g, s, b, bias)[0]) for g, s, b, bias, _, _, _ in STREAM_CASES]


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_row_block_streaming(case):
    """Several row blocks per CTA (each stored from the ring stage its last K tile was consumed from, the next
    row block's weights already in flight) against the FP64 reference; NaN-poisoned outputs; biases and NVFP4
    global scales are per row block."""
    from w4a16_moe.kernels.cute.warp.config import stream_row_blocks
    from w4a16_moe.kernels.cute.warp.pack import pack_warp

    gemm, scheme, tile, bias, h, i, t = case
    cfg, act = _stream_cfg(gemm, scheme, tile, bias)
    r = t * TOPK
    n, k = (2 * i, h) if gemm == "gate_up" else (h, i)
    mt = fam.max_tiles(r, E, cfg.tokens_per_tile)
    rbc = stream_row_blocks(cfg, n, k, mt, 1)
    assert rbc > 1 and (n // cfg.rows_per_cta) % rbc, f"{cfg.name()}: the case must stream unevenly (rbc {rbc})"
    g = torch.Generator().manual_seed(7)
    w13 = torch.randn(E, 2 * i, h, generator=g) / h**0.5
    w2 = torch.randn(E, h, i, generator=g) / i**0.5
    b13 = torch.randn(E, 2 * i, generator=g) * 0.1 if bias else None
    b2 = torch.randn(E, h, generator=g) * 0.1 if bias else None
    w = wm.quantize_experts(w13.bfloat16(), w2.bfloat16(), scheme, activation=act)
    r13, r2 = (m.double().to(DEV) for m in w.dequantize())
    w = w.to(DEV)
    qm = w.w13 if gemm == "gate_up" else w.w2
    p = pack_warp(qm, warps=cfg.warps, m16_per_warp=cfg.m16_per_warp, k_tile=cfg.k_tile,
                  compute_dtype=torch.bfloat16, interleave_gate_up=(gemm == "gate_up"))
    x = torch.randn(t, h, generator=g).bfloat16().to(DEV)
    ids, tw, offset = _routing(t, "ep_invalid", 3)
    plan = _plan(ids, offset, cfg.tokens_per_tile)
    nvalid, routes = _valid(plan)
    es = _expert_of(ids, routes, offset)
    name = f"{cfg.name()} n={n} k={k} rbc={rbc}"
    if bias:  # the kernels' FP32 bias table [E, n] rides in the topk_weights slot (gate/up: [gate | up] rows)
        slot = (b13 if gemm == "gate_up" else b2).float().contiguous().to(DEV)
    else:
        slot = tw.flatten().contiguous()
    if gemm == "gate_up":
        out = torch.full((r, i), float("nan"), dtype=torch.bfloat16, device=DEV)
        _launch(cfg, p, x, out, plan, slot, n, k, r)
        _sync()
        pre = torch.empty(nvalid, 2 * i, dtype=torch.float64, device=DEV)
        xs = x.double()[routes // TOPK]
        for e in range(E):
            sel = es == e
            if sel.any():
                pre[sel] = xs[sel] @ r13[e].T + (b13[e].double().to(DEV) if bias else 0.0)
        _check(name, out[:nvalid], apply_activation(pre, act), row_ids=routes)
        assert torch.isnan(out[nvalid:]).all(), f"{name}: rows past the valid slots were written"
        return
    hin = torch.full((r, i), float("nan"), dtype=torch.bfloat16, device=DEV)
    hin[:nvalid] = torch.randn(nvalid, i, generator=g).bfloat16().to(DEV)
    yref = torch.empty(nvalid, h, dtype=torch.float64, device=DEV)
    for e in range(E):
        sel = es == e
        if sel.any():
            yref[sel] = hin.double()[:nvalid][sel] @ r2[e].T + (b2[e].double().to(DEV) if bias else 0.0)
    if gemm == "down_y":
        out = torch.full((r, h), float("nan"), dtype=torch.bfloat16, device=DEV)
        _launch(cfg, p, hin, out, plan, slot, n, k, r)
        _sync()
        _check(name, out[routes], yref, row_ids=routes)
        written = torch.zeros(r, dtype=torch.bool, device=DEV)
        written[routes] = True
        assert torch.isnan(out[~written]).all(), f"{name}: rows of invalid routes were written"
    else:
        out = torch.zeros(t, h, dtype=torch.float32, device=DEV)
        _launch(cfg, p, hin, out, plan, slot, n, k, r)
        _sync()
        ref = torch.zeros(t, h, dtype=torch.float64, device=DEV)
        ref.index_add_(0, routes // TOPK, yref * tw.flatten().double()[routes][:, None])
        _check(name, out, ref)


@pytest.mark.skipif(FAKE, reason="GPU only")
@pytest.mark.parametrize("splits", [1, 4])
def test_cuda_graph_capture_replay(splits):
    """Route prep + gate_up + down (y) captured once, replayed on fresh inputs: equal to eager, bit for bit."""
    scheme, dtype, act = "int4_g32", "bf16", "swiglu"
    cfgs = _cfgs(scheme, dtype, act, "t8")
    up, down = cfgs["gate_up"], cfgs["down_y"]
    w, _, _ = _weights(scheme, dtype, act)
    p13, p2 = _packed_for(up, scheme, act, "w13"), _packed_for(down, scheme, act, "w2")
    t = 17
    r = t * TOPK
    x = torch.randn(t, H, device=DEV).to(torch.bfloat16)
    ids, tw, _ = _routing(t, "random", 0)
    twf = tw.flatten().contiguous()
    hbuf = torch.empty(r, I, dtype=torch.bfloat16, device=DEV)
    y = torch.empty(r, H, dtype=torch.bfloat16, device=DEV)

    def step():
        plan = _plan(ids, 0, up.tokens_per_tile)
        _launch(up, p13, x, hbuf, plan, twf, w.w13.n, H, r, splits)
        _launch(down, p2, hbuf, y, plan, twf, H, I, r, splits)
        return plan

    step()  # warm-up: kernel modules loaded, Triton route prep compiled
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan = step()
    for seed in (1, 2):
        x.copy_(torch.randn(t, H, device=DEV).to(torch.bfloat16))
        ids2, tw2, _ = _routing(t, "random", seed)
        ids.copy_(ids2)
        twf.copy_(tw2.flatten())
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _, routes = _valid(plan)
        got = y[routes].clone()
        y.fill_(float("nan"))
        step()
        torch.cuda.synchronize()
        assert torch.equal(got, y[routes]), f"graph replay (seed {seed}, splits {splits}) differs from eager"


# ------------------------------------------------------------------------------------------------------------
# W1 decode timing (prints; no assertion on speed)
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(FAKE, reason="GPU only")
def test_bench_w1():
    """W1 = Kimi TP8 shard (E=384, H=7168, I=256, top-8, int4_g32, bf16): per-GEMM kernel time at 1/8/32
    tokens (CUDA events, rotating 8 routings so that the touched weights do not stay in L2), against the
    weight-bandwidth floor (bytes of the experts touched / 4.0 TB/s)."""
    from w4a16_moe.formats.weights import QuantizedMatrix
    from w4a16_moe.kernels.cute.warp.pack import pack_warp

    e_n, h, i, k = 384, 7168, 256, 8
    sch = get_scheme("int4_g32")
    gen = torch.Generator(device=DEV).manual_seed(0)

    def qm(n, kk):
        codes = torch.randint(0, 256, (e_n, n, kk // 2), dtype=torch.uint8, device=DEV, generator=gen)
        scales = (torch.rand(e_n, n, kk // 32, device=DEV, generator=gen) * 0.02 + 0.001).to(torch.bfloat16)
        return QuantizedMatrix(sch, codes, scales)

    w13, w2 = qm(2 * i, h), qm(h, i)
    rows = []
    for t in (1, 8, 32):
        tiles = fam.select_tiles(t * k, e_n)
        up, down_y = fam.gemm_configs(sch, "bf16", "swiglu", True, "deterministic", tiles)
        _, down_a = fam.gemm_configs(sch, "bf16", "swiglu", True, "fused", tiles)
        p13 = pack_warp(w13, warps=up.warps, m16_per_warp=up.m16_per_warp, k_tile=up.k_tile, interleave_gate_up=True)
        p2 = pack_warp(w2, warps=down_y.warps, m16_per_warp=down_y.m16_per_warp, k_tile=down_y.k_tile)
        per_expert = (p13.data.numel() + p2.data.numel()) / e_n
        r = t * k
        x = torch.randn(t, h, device=DEV).to(torch.bfloat16)
        hbuf = torch.randn(r, i, device=DEV).to(torch.bfloat16)
        y = torch.empty(r, h, dtype=torch.bfloat16, device=DEV)
        acc = torch.zeros(t, h, dtype=torch.float32, device=DEV)
        plans, touched = [], []
        for s in range(8):
            ids = torch.rand(t, e_n, device=DEV, generator=gen).topk(k, dim=1).indices.to(torch.int32)
            plans.append((_plan_n(ids, e_n, up.tokens_per_tile), torch.rand(t * k, device=DEV)))
            touched.append(len(torch.unique(ids)))
        s_up = fam.num_splits(2 * i, h, up, r, e_n)
        s_dn = fam.num_splits(h, i, down_y, r, e_n)
        res = {}
        for label, cfg, pk, act, out, n, kk, sp in (
            ("gate_up", up, p13, x, hbuf, 2 * i, h, s_up),
            ("down_y", down_y, p2, hbuf, y, h, i, s_dn),
            ("down_atomic", down_a, p2, hbuf, acc, h, i, s_dn),
        ):
            mt = fam.max_tiles(r, e_n, cfg.tokens_per_tile)
            ws = torch.empty(max(1, cfg.ws_floats(n, mt, sp)), dtype=torch.float32, device=DEV)
            cnt = torch.zeros(max(1, cfg.counters_len(n, mt)), dtype=torch.int32, device=DEV)
            times = []
            for it in range(40):
                plan, twf = plans[it % 8]
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                _kernel(cfg)(pk.data.data_ptr(), act.data_ptr(), out.data_ptr(), plan.sorted_routes.data_ptr(),
                             plan.route_start.data_ptr(), plan.block_start.data_ptr(), twf.data_ptr(), ws.data_ptr(),
                             cnt.data_ptr(), e_n, n, kk, r, k, mt, sp, torch.cuda.current_stream().cuda_stream)
                b.record()
                torch.cuda.synchronize()
                if it >= 8:
                    times.append(a.elapsed_time(b) * 1e3)
            res[label] = (sorted(times)[len(times) // 2], sp)
        floor = sum(touched) / len(touched) * per_expert / 4.0e12 * 1e6
        rows.append((t, res, floor))
    print("\nW1 warp-MMA kernels (us, median; splits):")
    for t, res, floor in rows:
        tot = res["gate_up"][0] + res["down_y"][0]
        print(f"  T={t:3d}: gate_up {res['gate_up'][0]:7.1f} (s{res['gate_up'][1]})  down_y {res['down_y'][0]:7.1f} "
              f"(s{res['down_y'][1]})  down_atomic {res['down_atomic'][0]:7.1f}  sum {tot:7.1f}  "
              f"floor {floor:6.1f}  ({tot / floor:.2f}x)")
    path = os.environ.get("W4A16_WARP_BENCH_JSON")
    if path:
        with open(path, "w") as f:
            json.dump([{"tokens": t, "us": {k_: v[0] for k_, v in res.items()},
                        "splits": {k_: v[1] for k_, v in res.items()}, "floor_us": fl} for t, res, fl in rows], f, indent=1)


def _plan_n(ids, num_experts, tn):
    from w4a16_moe.kernels.routing.prepare import prepare_routes

    return prepare_routes(ids, num_experts, 0, tn)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="write the specs this test needs (for python -m w4a16_moe aot --specs)")
    ap.add_argument("--specs", required=True)
    a = ap.parse_args()
    specs = needed_specs()
    with open(a.specs, "w") as f:
        json.dump([s.to_json() for s in specs], f)
    print(f"{len(specs)} specs -> {a.specs}")

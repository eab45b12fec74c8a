"""The route-major decode kernels (``kernels/cute/decode/gemv.py``) through the CuTe provider, on an SM90 GPU.

``W4A16_MOE_CUTE_DECODE=1`` forces the decode path for every routed call; each case poisons the output with
NaN and checks NRMSE < 0.02 against the FP32 reference (``reference_moe``) on fresh random inputs: every
scheme and dtype, both finalize modes, every activation, EP offsets with invalid routes, token counts past
the decode rule's bound, sizes whose K does not split evenly over the warps, top-k 1 and 8, int64 ids
(out-of-int32 ids stay invalid), bit-identical repeats, CUDA-graph capture and replay after ``warmup``,
and the automatic choice (decode for small calls, the grouped GEMMs beyond the bound). The tests marked
with the ``grid`` fixture run twice: on the default one-CTA-per-unit grids and on persistent grids far
smaller than the work (:data:`PERSISTENT`: many units per CTA, several compaction windows at 200 tokens).
"""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.kernels.cute.decode import family as dec
from w4a16_moe.kernels.cute import overrides
from w4a16_moe.kernels.cute import provider as prov

from conftest import HAS_CUDA, nrmse, random_routing, random_weights, run_cute_moe

SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")]

SCHEMES = ["int4_g32", "int4_g64", "int4_g128", "int4_g32_zp", "int4_g64_zp", "int4_g128_zp", "int4_channel",
           "nvfp4", "mxfp4"]
DTYPES = [torch.bfloat16, torch.float16]
TOL = 0.02
#: persistent decode grids of 5 (gate_up) and 3 (down) CTAs: every CTA takes many work units, and calls with
#: more than 32 * 4 routes (tokens) compact them in several windows
PERSISTENT = "w4u8c5/w4u4c3"


@pytest.fixture(autouse=True)
def _force_decode(monkeypatch):
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "1")
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)


@pytest.fixture(params=[None, PERSISTENT], ids=["grid", "persistent"])
def grid(request):
    """The decode kernels' grid: the default knob set's, or :data:`PERSISTENT`."""
    if request.param is None:
        yield None
        return
    with overrides.forced_decode(dec.parse_knobs(request.param)):
        yield request.param


def _decodes(x, w, tokens, top_k) -> bool:
    """Whether the plan of a routed ``tokens`` x ``top_k`` call on these weights runs the decode kernels."""
    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import probe
    from w4a16_moe.validate import MoECall

    call = MoECall(tokens, top_k, w.hidden_size, w.intermediate_size, w.num_experts, x.dtype, x.device,
                   get_activation("swiglu"), "deterministic", 0, w.scheme.name)
    return prov.plan(call, probe(x.device)).decode


def _weights(scheme, e=8, h=512, i=256, activation="swiglu", dtype=torch.bfloat16, seed=0):
    return random_weights(scheme, e, h, i, activation=activation, dtype=dtype, device="cuda", seed=seed)


def _run(w, t, k, **kw):
    def decode_path(x, tw, ids):  # the call really takes the decode path
        assert _decodes(x, w, x.shape[0], tw.shape[1])

    return run_cute_moe(w, t, k, tol=TOL, check_path=decode_path, **kw)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_schemes(scheme, dtype, finalize, grid):
    w = _weights(scheme, dtype=dtype)
    _run(w, 5, 4, dtype=dtype, finalize=finalize, offset=8, num_global=24)  # EP: 8 local of 24 experts


#: knob sets with the gate/up L2 prefetch (``f``) and FP32 group scales (``x``; FP4 schemes ignore it): the plain
#: grid, a persistent grid of 5 / 3 CTAs (many units per CTA: the next unit's prefetch, several windows at 33
#: tokens), and a K split of 2 (the prefetch split between the split CTAs)
PREFETCH_FP32_KNOBS = ["w8u8fx/w8u4x", "w4u8c5fx/w4u4c3x", "w8u8fxs2/w8u4xs2"]


@pytest.mark.parametrize("knobs", PREFETCH_FP32_KNOBS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_l2_prefetch_and_fp32_scales(scheme, dtype, knobs):
    w = _weights(scheme, dtype=dtype, seed=5)
    with overrides.forced_decode(dec.parse_knobs(knobs)):
        _run(w, 5, 4, dtype=dtype, offset=8, num_global=24)  # EP: 8 local of 24 experts, invalid routes
        x, tw, ids, out = _run(w, 33, 4, dtype=dtype, seed=3)
        again = torch.full_like(out, float("nan"))
        wm.fused_moe(x, w, tw, ids, backend="cute", out=again)
        assert torch.equal(again, out)  # deterministic: bit-identical repeats


@pytest.mark.parametrize("activation", ["swiglu", "geglu", "relu2", "silu"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_activations(activation, dtype):
    w = _weights("int4_g32", activation=activation, dtype=dtype, seed=2)
    _run(w, 3, 4, dtype=dtype, activation=activation)


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_wide_regime_knob_set(scheme, dtype, activation):
    """The wide regime's default set (``WIDE_KNOBS``: 16 warps, persistent over 132 CTAs; the FP32-scale variant where
    the scheme takes FP32 scales), which calls with few routes on many gate/up tiles get: its NVFP4 gate/up kernels
    use a little local memory (accepted: faster than unroll 2, docs/perf/2026-12-04-local-memory)."""
    from w4a16_moe.formats.schemes import get_scheme

    wide = dec.default_knob_sets(dec.takes_fp32_scales(get_scheme(scheme)))[1]
    assert wide.startswith("w16u") and "c132" in wide
    w = _weights(scheme, h=1024, i=512, activation=activation, dtype=dtype, seed=7)
    with overrides.forced_decode(dec.parse_knobs(wide)):
        _run(w, 2, 4, dtype=dtype, activation=activation)
        _run(w, 3, 4, dtype=dtype, activation=activation, offset=8, num_global=24, seed=4)


@pytest.mark.parametrize("t", [1, 2, 7, 8, 9, 33, 200])
def test_token_counts(t, grid):
    w = _weights("int4_g128", seed=3)
    _run(w, t, 4, seed=t)


@pytest.mark.parametrize("h,i", [(768, 384), (1024, 128), (256, 256)])
@pytest.mark.parametrize("k", [1, 8])
def test_uneven_k_splits(h, i, k, grid):
    """K / 64 units that do not divide over the warps (parts past the end are empty), short and long K."""
    w = _weights("int4_g32", e=16, h=h, i=i, seed=4)
    _run(w, 3, k, seed=h + i + k)


def test_all_routes_invalid(grid):
    w = _weights("int4_g32", seed=5)
    x = torch.randn(6, w.hidden_size, device="cuda").to(torch.bfloat16)
    ids = torch.randint(8, 100, (6, 4), dtype=torch.int32, device="cuda")
    ids[0] = -1
    out = torch.full_like(x, float("nan"))
    wm.fused_moe(x, w, torch.rand(6, 4, device="cuda"), ids, backend="cute", out=out)
    assert torch.equal(out, torch.zeros_like(out))


def test_all_routes_on_one_expert(grid):
    w = _weights("int4_g64", seed=6)
    ids = torch.full((9, 3), -1, dtype=torch.int32, device="cuda")
    ids[:, 1] = 5
    _run(w, 9, 3, ids=ids)


def test_int64_ids_out_of_int32_range(grid):
    w = _weights("int4_g32", seed=7)
    t, k = 4, 4
    _, rid = random_routing(t, k, w.num_experts, seed=7, device="cuda")
    ids = rid.to(torch.int64)
    ids[0, 0] = 2**32 + 3  # would alias expert 3 if truncated to int32: must stay invalid
    ids[1, 2] = -(2**40)
    _run(w, t, k, ids=ids)


def test_deterministic_bitwise(grid):
    w = _weights("int4_g32", seed=8)
    x, tw, ids, out = _run(w, 8, 8)
    for _ in range(3):
        assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="cute"), out)
        assert torch.equal(wm.fused_moe(x, w, tw, ids, finalize="fused", backend="cute"), out)


def test_persistent_grid_is_bit_identical():
    """A persistent grid runs the same work units as the one-CTA-per-unit grid: the same bits, with EP
    offsets, invalid routes and tokens without a valid route (their rows are zeros)."""
    w = _weights("int4_g128", seed=12)
    t, k = 33, 4
    x = torch.randn(t, w.hidden_size, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(t, k, 24, seed=12, device="cuda")  # 8 local experts at offset 8 of 24
    ids[3] = 2  # token 3: no local route
    outs = []
    for knobs in ("w4u8/w4u4", "w4u8c5/w4u4c3", "w4u8c396/w4u4c528"):
        with overrides.forced_decode(dec.parse_knobs(knobs)):
            out = torch.full_like(x, float("nan"))
            wm.fused_moe(x, w, tw, ids, backend="cute", expert_offset=8, out=out)
            outs.append(out)
    assert torch.equal(outs[0][3], torch.zeros_like(outs[0][3]))
    assert nrmse(outs[0], wm.reference_moe(x, w, tw, ids, expert_offset=8)) < TOL
    assert torch.equal(outs[1], outs[0]) and torch.equal(outs[2], outs[0])


def _graph_replays(w, t, k, seed):
    """Warm up, capture one call in a CUDA graph: its replay equals the eager call, and a replay on new inputs
    matches the reference."""
    wm.warmup(w, top_k=k, max_tokens=t, backend="cute")
    x = torch.randn(t, w.hidden_size, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(t, k, w.num_experts, seed=seed, device="cuda")
    out = torch.full_like(x, float("nan"))
    eager = wm.fused_moe(x, w, tw, ids, backend="cute")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wm.fused_moe(x, w, tw, ids, backend="cute", out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    x.copy_(torch.randn_like(x))  # new inputs, same graph
    graph.replay()
    assert nrmse(out, wm.reference_moe(x, w, tw, ids)) < TOL


def test_cuda_graph_capture_and_replay(grid):
    _graph_replays(_weights("int4_g32", seed=9), 4, 8, seed=9)


def test_auto_rule(monkeypatch):
    """Without the env override: decode for small calls, grouped GEMMs beyond the bound, never in
    batch-invariant mode; both paths agree with the reference."""
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "auto")
    w = _weights("int4_g32", seed=10)
    x = torch.zeros(1, w.hidden_size, device="cuda", dtype=torch.bfloat16)
    # the largest decode call of this layer (8 experts, top-8: one token; two re-read every expert twice)
    small = max(t for t in range(1, dec.DECODE_MAX_ROUTES + 1) if dec.use_decode(t, 8, None, w.num_experts))
    assert _decodes(x, w, small, 8)
    assert not _decodes(x, w, small + 1, 8)
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "1")
    assert not _decodes(x, w, 1, 8)
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "0")
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    assert not _decodes(x, w, 1, 8)
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "auto")
    _run(w, small, 8, seed=11)


# ------------------------------------------------------------------------------------------------------
# K split across CTAs (decode.gemv: partials in the provider's scratch, the tile's last CTA sums them)
# ------------------------------------------------------------------------------------------------------
#: forced K splits on the 4-warp kernels of ``scripts/device_specs.TEST_DECODE_KNOBS`` (a split is a launch
#: parameter: the same kernel specs). On the split layer (:func:`_split_weights`) gate_up has 32 k64 units
#: in 4 parts and down 8 units in 2 parts per route, so every split CTA gets a share of the work at S <= 4.
SPLIT_KNOBS = {s: f"w4u8s{s}/w4u4s{s}" for s in (1, 2, 3, 4)}
SPLIT_SCHEMES = ["int4_g32", "int4_g128", "int4_g128_zp", "int4_channel", "mxfp4", "nvfp4"]


def _split_weights(scheme="int4_g32", seed=20, dtype=torch.bfloat16):
    return _weights(scheme, e=8, h=2048, i=512, dtype=dtype, seed=seed)


def _plan(x, w, tokens, top_k, finalize="deterministic"):
    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import probe
    from w4a16_moe.validate import MoECall

    call = MoECall(tokens, top_k, w.hidden_size, w.intermediate_size, w.num_experts, x.dtype, x.device,
                   get_activation("swiglu"), finalize, 0, w.scheme.name)
    return prov.plan(call, probe(x.device))


def _counters_rearmed():
    """Every arrival counter of the decode scratch is back at 0 (the last CTA of each tile re-arms it)."""
    torch.cuda.synchronize()
    for _, cnt in prov._DECODE_SCRATCH.values():
        assert int(cnt.abs().sum()) == 0


@pytest.mark.parametrize("scheme", SPLIT_SCHEMES)
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.parametrize("split", [1, 2, 4])
def test_split_schemes(scheme, finalize, split):
    """A forced K split against the FP32 reference (NaN-poisoned output), EP offset with invalid routes."""
    w = _split_weights(scheme)
    with overrides.forced_decode(dec.parse_knobs(SPLIT_KNOBS[split])):
        x = torch.zeros(5, w.hidden_size, device="cuda", dtype=torch.bfloat16)
        assert _plan(x, w, 5, 4, finalize).splits == (split, split)
        _run(w, 5, 4, finalize=finalize, offset=8, num_global=24, seed=split)  # 8 local of 24 experts
    _counters_rearmed()


@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_split_rule_choice(finalize):
    """The rule's split (one token of I = 2048: the down kernel splits on a 132-SM GPU) against the reference,
    fp16 too."""
    for dtype in DTYPES:
        w = _weights("int4_g128", e=8, h=2048, i=2048, dtype=dtype, seed=21)
        x = torch.zeros(1, w.hidden_size, device="cuda", dtype=dtype)
        p = _plan(x, w, 1, 4, finalize)
        assert max(p.splits) > 1, p.describe()
        _run(w, 1, 4, dtype=dtype, finalize=finalize, seed=22)
        _run(w, 1, 4, dtype=dtype, finalize=finalize, offset=8, num_global=24, seed=23)
    _counters_rearmed()


@pytest.mark.parametrize("split", [2, 3, 4])
def test_split_is_bit_identical(split):
    """Two runs of one split give the same bits; so do the persistent grids with that split (the same
    work units and partial order); tokens without a valid route get zeros."""
    w = _split_weights("int4_g128", seed=24)
    t, k = 9, 4
    x = torch.randn(t, w.hidden_size, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(t, k, 24, seed=24, device="cuda")  # 8 local experts at offset 8 of 24
    ids[3] = 2  # token 3: no local route
    outs = []
    for knobs in (SPLIT_KNOBS[split], SPLIT_KNOBS[split], f"w4u8c5s{split}/w4u4c3s{split}",
                  f"w4u8c396s{split}/w4u4c528s{split}"):
        with overrides.forced_decode(dec.parse_knobs(knobs)):
            for fin in ("deterministic", "fused"):
                out = torch.full_like(x, float("nan"))
                wm.fused_moe(x, w, tw, ids, backend="cute", expert_offset=8, finalize=fin, out=out)
                outs.append(out)
    assert torch.equal(outs[0][3], torch.zeros_like(outs[0][3]))
    assert nrmse(outs[0], wm.reference_moe(x, w, tw, ids, expert_offset=8)) < TOL
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    _counters_rearmed()


def test_split_all_routes_invalid():
    w = _split_weights(seed=25)
    x = torch.randn(2, w.hidden_size, device="cuda").to(torch.bfloat16)
    ids = torch.randint(8, 100, (2, 4), dtype=torch.int32, device="cuda")
    for split in (2, 4):
        with overrides.forced_decode(dec.parse_knobs(SPLIT_KNOBS[split])):
            out = torch.full_like(x, float("nan"))
            wm.fused_moe(x, w, torch.rand(2, 4, device="cuda"), ids, backend="cute", out=out)
            assert torch.equal(out, torch.zeros_like(out))
    _counters_rearmed()


def test_split_cuda_graph_capture_and_replay():
    """The split's scratch is allocated by warmup, so capture allocates nothing; replays reproduce eager."""
    with overrides.forced_decode(dec.parse_knobs(SPLIT_KNOBS[3])):
        _graph_replays(_split_weights(seed=26), 2, 4, seed=26)
    _counters_rearmed()


def test_rule_splits_the_small_grid_layers():
    """On this GPU the rule splits one-token calls of the layers whose decode grids are too small: few large
    experts (E=8, H=4096, I=14336, top-2: 64 down CTAs) and, with the 8-warp knobs, Kimi-K2 TP8 (E=384, H=7168,
    I=256, top-8: 128 gate/up tiles), which by default takes 16-warp CTAs instead (one per SM, no split; INT4
    g128: the FP32-scale set of that regime)."""
    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import probe
    from w4a16_moe.validate import MoECall

    dev = torch.device("cuda", torch.cuda.current_device())
    for e, h, i, k, knobs in ((8, 4096, 14336, 2, None), (384, 7168, 256, 8, "w8u8/w8u4")):
        call = MoECall(1, k, h, i, e, torch.bfloat16, dev, get_activation("swiglu"), "deterministic", 0,
                       "int4_g128")
        p = prov.plan(call, probe(dev))
        assert p.decode, p.describe()
        assert knobs or max(p.splits) > 1, p.describe()
        if knobs:
            wide = dec.FP32_SCALE_KNOB_SETS[dec.WIDE_KNOBS]  # (INT4 g128)
            assert dict(p.tiles)["knobs"] == dec.knob_items(wide) and p.splits == (1, 1), p.describe()
            prov.clear_plans()
            with overrides.forced_decode(dec.parse_knobs(knobs)):
                p = prov.plan(call, probe(dev))
            assert p.splits[0] > 1, p.describe()
            prov.clear_plans()

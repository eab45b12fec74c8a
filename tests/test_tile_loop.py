"""Tile-loop warp-MMA grouped GEMMs (``tile_loop``, ``W4A16_MOE_TILE_LOOP``): CTAs loop over the token tiles past a
launch grid sized from the expected tiles, instead of a grid of the bound of any routing.

CPU: the loop grid rule, the plans each setting gives (which calls loop, grid y, the tests' forced grid), the AOT
sets (every warp-MMA tile with and without the loop), and the compiled kernels' SASS (no local memory, the CTAs per
SM of the kernels without the loop). GPU (SM90): the loop kernels on forced grids of 1-3 CTA rows (CTAs loop over
several tiles) and on the setting's grid on expert-parallel ranks with invalid routes, against the FP32 reference on
NaN-poisoned outputs, both finalize modes, split-K, and CUDA graphs; deterministic outputs must equal the kernels
without the loop bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import w4a16_moe as wm
from conftest import HAS_CUDA, nrmse, random_routing, random_weights, replay_on_fresh_data, run_cute_moe
from w4a16_moe import settings
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo, probe
from w4a16_moe.kernels.cute import overrides, provider, registry, tiles
from w4a16_moe.kernels.cute.warp import family as warp_fam
from w4a16_moe.kernels.cute.warp.config import WarpGemmConfig
from w4a16_moe.validate import MoECall

UNTUNED = DeviceInfo("cuda", "an untuned SM90 GPU", (9, 0), 132)
DEEPSEEK_EP8 = (32, 7168, 2048, 8, 256)
QWEN3_EP8 = (16, 4096, 1536, 8, 128)


def _call(layer, tokens, hint=True):
    e, h, i, k, g = layer
    return MoECall(tokens, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                   "deterministic", 0, "int4_g128", False, global_experts=g if hint else None)


@pytest.fixture
def plans(monkeypatch):
    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    monkeypatch.setenv("W4A16_MOE_TUNED_TABLE", "0")
    monkeypatch.setenv("W4A16_MOE_AUTOTUNE", "0")
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    provider.clear_plans()
    yield
    provider.clear_plans()


# ------------------------------------------------------------------------------------------------ CPU: the rule
def test_loop_grid_is_the_expected_tiles_with_a_margin():
    # DeepSeek-V3 EP8 rank at 4096 tokens, TN 80: ~128 local routes on each of 32 experts, 2 tiles each
    exp = tiles.expected_tiles(4096 * 8, 32, 80, 8, 256)
    assert 64.0 <= exp < 66.0
    bound = provider._max_tiles(4096 * 8, 32, 80)
    got = tiles.loop_grid(4096 * 8, 32, 80, 8, 256, bound)
    assert got == int(-(-exp * tiles.LOOP_MARGIN // 1)) + tiles.LOOP_SLACK and got < bound / 5
    # capped by the bound, and at least one CTA row
    assert tiles.loop_grid(8, 8, 96, 1, None, 1) == 1
    assert tiles.loop_grid(4096, 8, 96, 1, None, 3) == 3
    assert tiles.loop_grid(1, 256, 8, 1, 256) >= 1


@pytest.mark.parametrize("layer,tokens", [(DEEPSEEK_EP8, 8), (QWEN3_EP8, 16), (QWEN3_EP8, 64)])
def test_auto_loops_on_expert_parallel_ranks_at_decode_sizes(plans, layer, tokens):
    # the rows where the study measured the loop faster (0.91-0.95 x): loop grid <= half the bound
    p = provider.plan(_call(layer, tokens), UNTUNED)
    assert p.family == "warp" and all(c.tile_loop and c.name().endswith("_tl") for c in p.configs)
    tn = p.configs[0].tokens_per_tile
    assert p.max_tiles == provider._max_tiles(tokens * layer[3], layer[0], tn)
    assert p.grid_tiles == tiles.loop_grid(tokens * layer[3], layer[0], tn, layer[3], layer[4], p.max_tiles)
    assert 0 < p.grid_tiles <= provider.TILE_LOOP_AUTO_FRACTION * p.max_tiles
    assert f"grid y {p.grid_tiles} of {p.max_tiles} token tiles" in p.describe()
    # the split-K scratch is sized for the bound, whatever the grid
    provider.clear_plans()
    with settings.override(tile_loop="0"):
        q = provider.plan(_call(layer, tokens), UNTUNED)
    assert q.counters == p.counters and q.grid_tiles == 0 and not any(c.tile_loop for c in q.configs)
    assert "grid y" not in q.describe()


@pytest.mark.parametrize("layer,tokens,hint", [
    ((128, 2048, 768, 8, None), 256, False),  # loop / bound ~0.7 (measured 1.01-1.04 x): no loop
    ((128, 4096, 384, 8, None), 64, False),
    ((8, 4096, 14336, 2, None), 4, False),
    (DEEPSEEK_EP8, 4096, True),  # the SM90 family never loops
])
def test_auto_does_not_loop_where_the_bound_is_tight_or_on_sm90(plans, layer, tokens, hint):
    p = provider.plan(_call(layer, tokens, hint), UNTUNED)
    assert not any(getattr(c, "tile_loop", False) for c in p.configs) and p.grid_tiles == 0, p.describe()


def test_setting_one_loops_every_warp_call_and_forced_grids(plans):
    with settings.override(tile_loop="1"):
        p = provider.plan(_call((128, 2048, 768, 8, None), 256, hint=False), UNTUNED)
    assert p.family == "warp" and all(c.tile_loop for c in p.configs) and 0 < p.grid_tiles <= p.max_tiles
    provider.clear_plans()
    with settings.override(tile_loop="0"), overrides.forced_loop_grid(2):
        f = provider.plan(_call(DEEPSEEK_EP8, 512), UNTUNED)
    assert f.family == "warp" and all(c.tile_loop for c in f.configs) and f.grid_tiles == 2
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="loop_grid must be >= 1"):
            overrides.forced_loop_grid(bad)


def test_every_warp_tile_ships_with_and_without_the_loop():
    # auto may take the loop kernels of any warp tile of any scheme (expert-parallel ranks): the AOT sets hold both,
    # and beside the plain kernels their PDL twins (warp.family.pdl_launch; the loop kernels are never PDL ones)
    for subset in ("smoke", "full"):
        specs = registry.get("warp").aot_variants(subset)
        loop = {s.name for s in specs if dict(s.params)["tile_loop"]}
        plain = [s for s in specs if not dict(s.params)["tile_loop"] and not dict(s.params)["pdl"]]
        pdl = {s.name for s in specs if dict(s.params)["pdl"]}
        assert len(loop) == len(plain) == len(pdl) > 0
        for s in plain:
            twin = warp_fam.spec_for(WarpGemmConfig(**dict(dict(s.params), tile_loop=True)))
            assert twin.name in loop, s.name
            assert warp_fam.spec_for(WarpGemmConfig(**dict(dict(s.params), pdl=True))).name in pdl, s.name


def test_tile_loop_is_a_codegen_field():
    assert WarpGemmConfig(tile_loop=True).name().endswith("_tl") and "_tl" not in WarpGemmConfig().name()
    a = warp_fam.spec_for(WarpGemmConfig())
    b = warp_fam.spec_for(WarpGemmConfig(tile_loop=True))
    assert a.name != b.name


# ------------------------------------------------------------------------------------------------ CPU: the SASS
#: warp-MMA kernels built and checked: the decode-size and the mid-size tile of the rule
WARP_SASS_CASES = [("gate_up", dict(tokens_per_tile=8, k_tile=128)), ("down", dict(tokens_per_tile=24, k_tile=128))]


def test_tile_loop_kernels_keep_their_occupancy_without_local_memory(tmp_path):
    pytest.importorskip("cutlass", reason="the CuTe DSL (nvidia-cutlass-dsl) is needed to cross-compile")
    from w4a16_moe.loader import sass
    from w4a16_moe.loader.toolchain import BuildError, find_cuda_toolkit

    try:
        find_cuda_toolkit()
        sass.find_nvdisasm()
    except (BuildError, sass.SassToolError) as e:
        pytest.skip(str(e))
    specs = [warp_fam.spec_for(WarpGemmConfig(mode=m, group=128, tile_loop=loop, **t))
             for m, t in WARP_SASS_CASES for loop in (True, False)]
    (tmp_path / "specs.json").write_text(json.dumps([s.to_json() for s in specs]))
    env = dict(os.environ, W4A16_MOE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "w4a16_moe", "aot", "--archs", "sm_90a", "--specs",
                        str(tmp_path / "specs.json"), "--out", str(tmp_path / "pb"), "-j", "2"],
                       capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rep = sass.check_dir(tmp_path / "pb")
    assert len(rep["kernels"]) == 2 * len(WARP_SASS_CASES)
    by_spec = {s.name: dict(s.params) for s in specs}
    ctas = {}
    for k in rep["kernels"]:
        p = by_spec[k["name"]]
        assert k["opcodes"].get("HMMA", 0) > 1 and not k["opcodes"].get("LDL") and not k["opcodes"].get("STL"), k
        # CTAs per SM that the registers allow (8-register allocation steps)
        key = tuple(sorted((a, b) for a, b in p.items() if a != "tile_loop"))
        ctas.setdefault(key, {})[p["tile_loop"]] = 65536 // (32 * p["warps"] * -(-k["registers"] // 8) * 8)
    # the loop costs no occupancy: as many CTAs fit on an SM as without it
    assert all(v[True] == v[False] for v in ctas.values()), ctas
    assert rep["ok"], rep["problems"]


# ------------------------------------------------------------------------------------------------ GPU
SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
needs_sm90 = pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
TOL = 0.02


@pytest.fixture
def grouped(monkeypatch):
    """The warp-MMA grouped GEMMs at every token count (the decode kernels have their own suite)."""
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    monkeypatch.setenv("W4A16_MOE_CUTE_FAMILY", "warp")
    provider.clear_plans()
    yield
    provider.clear_plans()


def _weights(scheme="int4_g32", e=8, h=1024, i=256, seed=0):
    return random_weights(scheme, e, h, i, dtype=torch.bfloat16, device="cuda", seed=seed)


def provider_call(w, t, k, **kw):
    """The static description of a ``t``-token top-``k`` call on ``w`` (what plans are made of)."""
    from w4a16_moe.validate import check_moe_call

    x = torch.zeros(t, w.hidden_size, dtype=torch.bfloat16, device="cuda")
    tw, ids = random_routing(t, k, w.num_experts, seed=0, device="cuda")
    return check_moe_call(x, w, tw, ids, **kw)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128", "nvfp4"])
@pytest.mark.parametrize("tokens", [5, 37, 300])
@pytest.mark.parametrize("grid", [1, 3])
@pytest.mark.usefixtures("grouped")
def test_forced_loop_grids(scheme, tokens, grid):
    # 5-300 tokens x top-8 on 8 experts: 8-48 tiles; a grid of 1 or 3 CTA rows loops over them
    w = _weights(scheme, seed=190 + tokens)
    with settings.override(tile_loop="0"), overrides.forced_loop_grid(grid):
        p = provider.plan(provider_call(w, tokens, 8), probe(torch.device("cuda")))
        assert p.family == "warp" and p.grid_tiles == grid and all(c.tile_loop for c in p.configs)
        x, tw, ids, out = run_cute_moe(w, tokens, 8, tol=TOL, seed=tokens)
        run_cute_moe(w, tokens, 8, tol=TOL, seed=tokens, finalize="fused")
    with settings.override(tile_loop="0"):
        assert torch.equal(out, wm.fused_moe(x, w, tw, ids, backend="cute"))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("tokens", [1, 4, 16, 64])
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.usefixtures("grouped")
def test_auto_on_expert_parallel_ranks(tokens, finalize):
    # an EP rank: experts 8..15 of 64 (offset 8); ids of other ranks and -1 are not local; the hint sizes the
    # grid from the ~1/8 of routes that are local, which auto takes at these sizes
    w = _weights(e=8, h=512, i=256, seed=7)
    g = torch.Generator(device="cpu").manual_seed(tokens)
    x = torch.randn(tokens, w.hidden_size, generator=g).to(torch.bfloat16).cuda()
    tw, ids = random_routing(tokens, 8, 64, seed=tokens, device="cuda")
    ids[0, 0] = -1
    with settings.override(tile_loop="auto"):
        p = provider.plan(provider_call(w, tokens, 8, expert_offset=8, global_num_experts=64),
                          probe(torch.device("cuda")))
        assert all(c.tile_loop for c in p.configs) and 0 < p.grid_tiles < p.max_tiles, p.describe()
        out = torch.full_like(x, float("nan"))
        wm.fused_moe(x, w, tw, ids, expert_offset=8, global_num_experts=64, backend="cute", finalize=finalize,
                     out=out)
        ref = wm.reference_moe(x, w, tw, ids, expert_offset=8)
        assert not torch.isnan(out).any() and nrmse(out, ref) < TOL
    if finalize == "deterministic":
        with settings.override(tile_loop="0"):
            plain = wm.fused_moe(x, w, tw, ids, expert_offset=8, global_num_experts=64, backend="cute")
        assert torch.equal(out, plain)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.usefixtures("grouped")
def test_split_k_with_the_loop(splits, monkeypatch):
    # split-K CTAs of a tile count arrivals per (tile, row block): looping CTAs must find every split's partials
    w = _weights("int4_g128", e=8, h=1024, i=1024, seed=33)
    monkeypatch.setattr(warp_fam, "num_splits", lambda *a, **kw: splits)
    with settings.override(tile_loop="0"), overrides.forced_loop_grid(2):
        p = provider.plan(provider_call(w, 37, 8), probe(torch.device("cuda")))
        assert p.splits[0] == splits and p.grid_tiles == 2 and all(c.tile_loop for c in p.configs)
        x, tw, ids, out = run_cute_moe(w, 37, 8, tol=TOL, seed=5)
    provider.clear_plans()
    with settings.override(tile_loop="0"):
        assert torch.equal(out, wm.fused_moe(x, w, tw, ids, backend="cute"))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.usefixtures("grouped")
def test_loop_kernels_in_a_cuda_graph(finalize):
    w = _weights(i=512, seed=170)
    with overrides.forced_loop_grid(3):
        x, tw, ids, out = run_cute_moe(w, 300, 8, tol=TOL, seed=3, finalize=finalize)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            wm.fused_moe(x, w, tw, ids, backend="cute", finalize=finalize, out=out)
        replay_on_fresh_data(graph, w, x, tw, ids, out, bitwise=finalize == "deterministic", tol=TOL)

"""The selection grid (``kernels/cute/tiles.py``): a routed call decides at its own token count up to 256 tokens and
at a grid of 16 points per octave above, so that ``warmup`` loads and packs everything any count up to its
``max_tokens`` runs: a CUDA graph can then be captured at any count (a first use inside capture raises)."""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from conftest import HAS_CUDA, nrmse, random_routing, random_weights, warmup_specs
from w4a16_moe import settings
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import provider as prov
from w4a16_moe.kernels.cute import registry
from w4a16_moe.kernels.cute.tiles import SELECTION_DENSE, selection_grid, selection_points
from w4a16_moe.validate import MoECall

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9

#: (E, H, I, top_k, E_global), scheme: Kimi-K2 TP8 (warp and SM90 tiles), Qwen3 TP4, a DeepSeek EP8 rank, a padded
#: layer, gpt-oss (FP4: the rule's buckets)
LAYERS = [((384, 7168, 256, 8, None), "int4_g32"), ((128, 4096, 384, 8, None), "int4_g128"),
          ((32, 7168, 2048, 8, 256), "int4_g128"), ((60, 2048, 704, 4, None), "int4_g32"),
          ((128, 2880, 2880, 4, None), "mxfp4")]


def test_selection_points_and_grid():
    assert [selection_points(t) for t in (1, 255, 256)] == [(1,), (255,), (256,)]
    assert selection_points(272) == (272,) and selection_points(300) == (288, 304)
    assert selection_points(513) == (512, 544) and selection_points(8191) == (7936, 8192)
    assert selection_grid(100) == list(range(1, 101))
    assert selection_grid(300) == [*range(1, 257), 272, 288, 304]
    assert len(selection_grid(8192)) == SELECTION_DENSE + 5 * 16
    for max_tokens in (257, 300, 1000, 1024, 5000):
        grid = set(selection_grid(max_tokens))
        for t in range(1, max_tokens + 1):
            points = selection_points(t)
            assert set(points) <= grid and points[0] <= t <= points[-1], (max_tokens, t)


def _call(layer, scheme, t, finalize="deterministic", routes_only=False):
    e, h, i, k, g = layer
    return MoECall(t, k, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"), finalize, 0, scheme,
                   routes_only, global_experts=g)


def _kernels_and_layouts(p) -> set:
    fam = registry.get(p.family)
    return {(fam.spec_for(c).name, fam.layout_key(w, c, ""), p.pad) for c, w in zip(p.configs, ("w13", "w2"))}


@pytest.mark.parametrize("layouts", ["all", "2"])
@pytest.mark.parametrize("layer,scheme", LAYERS, ids=[f"{s}-{'x'.join(map(str, L[:3]))}" for L, s in LAYERS])
def test_warmup_plans_hold_every_token_count(_kernels_anywhere, layer, scheme, layouts):
    """Every plan of 1..max_tokens tokens (both finalize modes, the expert-parallel halves) runs kernels and packed
    layouts among those of ``warmup``'s plans; off the grid, one grid point's kernels, the one the cost model prices
    faster at that count."""
    max_tokens = 1100
    e, h, i, k, g = layer
    with settings.override(layouts=layouts):
        prov.clear_plans()
        warm = set()
        for _, p in prov.warmup_plans(H200, e, h, i, scheme, torch.bfloat16, torch.device("cuda"), "swiglu", k,
                                      max_tokens, ("deterministic", "fused"), False, g):
            warm |= _kernels_and_layouts(p)
        off_grid = 0
        for fin in ("deterministic", "fused"):
            for t in range(1, max_tokens + 1):
                for routes_only in ((False, True) if fin == "deterministic" else (False,)):
                    p = prov.plan(_call(layer, scheme, t, fin, routes_only), H200)
                    got = _kernels_and_layouts(p)
                    assert got <= warm, (t, fin, routes_only, got - warm)
                    points = selection_points(t)
                    if len(points) == 1 or p.decode:
                        continue
                    off_grid += 1
                    at = {pt: prov.plan(_call(layer, scheme, pt, fin, routes_only), H200) for pt in points}
                    assert any(_kernels_and_layouts(q) == got for q in at.values()), (t, fin)
                    assert f"(selection grid {points[0]} / {points[1]})" in p.note, p.note
                    us = {pt: prov._predicted_us(q, p_call := _call(layer, scheme, t, fin, routes_only), H200)
                          for pt, q in at.items()}
                    if None not in us.values() and len({frozenset(_kernels_and_layouts(q)) for q in at.values()}) == 2:
                        chosen = int(p.note.rsplit("decided at T=", 1)[1].split(" ")[0])
                        assert us[chosen] <= min(us.values()) + 1e-9, (t, us, chosen, p_call)
        assert off_grid > 1000


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
def test_capture_between_grid_points():
    """After ``warmup(max_tokens=400)``, CUDA graphs of counts between grid points capture (nothing left to load or
    pack) and replay the reference: Qwen3-235B's TP-4 shard, whose plans at 335 tokens ran kernels the warmup of
    1..256 and the powers of two did not load."""
    e, h, i, k = 128, 4096, 384, 8
    w = random_weights("int4_g128", e, h, i, dtype=torch.bfloat16, device="cuda", seed=11)
    wm.warmup(w, dtype=torch.bfloat16, top_k=k, max_tokens=400, finalize=("deterministic",), backend="cute")
    for t in (300, 335, 390):
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        tw, ids = random_routing(t, k, e, seed=t, device="cuda")
        out = torch.full_like(x, float("nan"))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            wm.fused_moe(x, w, tw, ids, backend="cute", out=out)
        for seed in (t, t + 1):  # replay on the captured inputs, then on fresh ones
            if seed != t:
                x.copy_(torch.randn(t, h, device="cuda").to(torch.bfloat16))
                tw2, ids2 = random_routing(t, k, e, seed=seed, device="cuda")
                tw.copy_(tw2)
                ids.copy_(ids2)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = wm.reference_moe(x, w, tw, ids)
            assert not torch.isnan(out).any()
            assert nrmse(out, ref) < 0.02, (t, seed, nrmse(out, ref))


def needed_specs() -> list:
    """Every KernelSpec the GPU test launches, on an H100 or an H200 (build them for sm_90a before running on a
    DSL-less machine)."""
    return warmup_specs(128, 4096, 384, "int4_g128", 8, 400, ("deterministic",))

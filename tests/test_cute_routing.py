"""The CuTe DSL route preparation / finalize (family ``w4a16_routing``): specs and compiles (CPU), and the
same results as the Triton kernels on the GPU (bit-identical plans up to the order inside an expert,
bit-identical finalize output)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from w4a16_moe.kernels.cute.routing import family
from w4a16_moe.kernels.cute.routing.config import E_PADS, RoutingConfig
from w4a16_moe.loader.spec import SUPPORTED_ARCHS, KernelSpec

HAS_DSL = importlib.util.find_spec("cutlass") is not None
needs_dsl = pytest.mark.skipif(not HAS_DSL, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")


# --------------------------------------------------------------------------------------------------
# CPU: specs, variants, compiles
# --------------------------------------------------------------------------------------------------
def test_specs_round_trip_and_are_unique():
    specs = family.variants()
    assert len(specs) == len(set(specs)) == len({s.name for s in specs})
    for s in specs:
        assert s.family == family.FAMILY
        cfg = family.config_from_spec(s)
        assert family.spec_for(cfg) == s
        assert KernelSpec.from_json(s.to_json()) == s
    modes = {family.config_from_spec(s).mode for s in specs}
    assert modes == {"single", "hist", "place", "masked", "finalize", "pad"}
    assert set(family.aot_variants("smoke")) <= set(family.aot_variants("full")) == set(specs)
    with pytest.raises(ValueError, match="subset"):
        family.aot_variants("nope")


def test_every_selectable_config_is_a_variant():
    specs = set(family.variants())
    for pdl in (True, False):
        for ids in ("int32", "int64"):
            for e in (1, 63, 64, 127, 128, 255, 256, 384, 511, 1023):
                for mode in ("single", "hist", "place"):
                    assert family.spec_for(family.route_config(mode, ids, e, pdl)) in specs
        assert family.spec_for(family.masked_config(pdl)) in specs
        for dt in ("bf16", "fp16"):
            for src in ("int32", "int64", "mask"):
                for vec in (8, 1):
                    assert family.spec_for(family.finalize_config(dt, src, vec, pdl)) in specs
        for vec in (8, 1):
            assert family.spec_for(family.pad_config(vec, pdl)) in specs


def test_warmup_configs_are_variants():
    from w4a16_moe.kernels.cute.routing import launch

    specs = set(family.variants())
    cfgs = launch.configs_for(384, torch.device("cpu"))
    assert len(cfgs) == 6 + 12 + 2 + 1 and {family.spec_for(c) for c in cfgs} <= specs


def test_bad_configs_are_named():
    assert family.e_pad_for(63) == 64 and family.e_pad_for(64) == 128 and family.e_pad_for(256) == 512
    assert family.e_pad_for(1023) == 1024
    with pytest.raises(ValueError, match="num_experts"):
        family.e_pad_for(E_PADS[-1])
    with pytest.raises(ValueError, match="mode"):
        RoutingConfig(mode="sort")
    with pytest.raises(ValueError, match="e_pad"):
        RoutingConfig(e_pad=100)
    with pytest.raises(ValueError, match="ids"):
        RoutingConfig(ids="int16")
    with pytest.raises(ValueError, match="source"):
        family.finalize_config("bf16", "bool", 8, True)
    with pytest.raises(ValueError, match="vec"):
        family.pad_config(4, True)


def test_pad_copy_rejects_bad_arguments():
    launch = _launch()
    with pytest.raises(TypeError, match="x: expected a 16-bit dtype"):
        launch.pad_copy_cute(torch.zeros(2, 8), 16)
    with pytest.raises(ValueError, match="x: must be contiguous"):
        launch.pad_copy_cute(torch.zeros(8, 2, dtype=torch.bfloat16).t(), 16)
    with pytest.raises(ValueError, match="width: expected >= x's last size 8"):
        launch.pad_copy_cute(torch.zeros(2, 8, dtype=torch.bfloat16), 4)


def test_finalize_rejects_a_ybuf_that_is_not_row_major():
    launch = _launch()
    w, out = torch.zeros(2, 2), torch.zeros(2, 8, dtype=torch.bfloat16)
    for y in (torch.zeros(4, 6, dtype=torch.bfloat16), torch.zeros(16, 4, dtype=torch.bfloat16).t(),
              torch.zeros(3, 8, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match=r"ybuf: expected a row-major \[4, >= 8\] tensor"):
            launch.launch_finalize_cute(y, w, out, topk_ids=torch.zeros(2, 2, dtype=torch.int32), num_experts=1)


def test_routing_setting_auto_takes_the_cute_kernels_only_when_all_are_prebuilt(monkeypatch):
    """``W4A16_MOE_ROUTING=auto`` (the default): CuTe routing where every spec of the family is prebuilt for the
    arch and E fits its tables, else Triton; ``cute`` / ``triton`` force one."""
    from w4a16_moe import settings
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.loader import prebuilt

    assert settings.get().routing == "auto"
    have = set()
    monkeypatch.setattr(prebuilt, "lookup", lambda spec, arch: ((object(), "ok") if (spec.name, arch) in have
                                                               else (None, "not prebuilt")))
    provider._routing_prebuilt.cache_clear()
    assert not provider.cute_routing("sm_90a", 8)  # nothing prebuilt: Triton
    have.update((s.name, "sm_90a") for s in family.aot_variants("full")[:-1])
    provider._routing_prebuilt.cache_clear()
    assert not provider.cute_routing("sm_90a", 8)  # one missing: Triton
    have.update((s.name, "sm_90a") for s in family.aot_variants("full"))
    provider._routing_prebuilt.cache_clear()
    assert provider.cute_routing("sm_90a", 8) and provider.cute_routing("sm_90a", E_PADS[-1] - 1)
    assert not provider.cute_routing("sm_90a", E_PADS[-1])  # beyond the largest table: Triton
    assert not provider.cute_routing("sm_80", 8)  # the family needs SM90+ (griddepcontrol)
    assert provider._routing("sm_90a", 8)[0].__name__ == "prepare_routes_cute"
    assert provider._routing("sm_90a", 2048)[0].__name__ == "prepare_routes"
    assert provider.routing_choice("sm_90a", 8) == (
        "cute (W4A16_MOE_ROUTING=auto: every CuTe routing kernel is prebuilt for sm_90a)")
    assert provider.routing_choice("sm_90a", 2048).startswith("triton (W4A16_MOE_ROUTING=auto: 2048 local experts")
    from w4a16_moe import doctor

    assert doctor.report(device="cpu", arch="sm_90a", experts=8)["routing"].startswith("cute (")
    monkeypatch.setenv("W4A16_MOE_ROUTING", "triton")
    assert not provider.cute_routing("sm_90a", 8)
    assert provider.routing_choice("sm_90a", 8) == "triton (W4A16_MOE_ROUTING=triton)"
    monkeypatch.setenv("W4A16_MOE_ROUTING", "cute")
    assert provider.cute_routing("sm_80", 8)
    provider._routing_prebuilt.cache_clear()


def test_family_modules_do_not_import_the_dsl():
    import subprocess

    code = ("import sys; import w4a16_moe.kernels.cute.routing.family as f, w4a16_moe.kernels.cute.routing.launch; "
            "f.variants(); print('cutlass' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_module_fits_the_aot_build():
    from w4a16_moe import aot

    fams, absent = aot.load_families(("w4a16_moe.kernels.cute.routing.family",))
    assert not absent and len(fams) == 1
    f = fams[0]
    assert f.name == family.FAMILY and "sm_90a" in f.archs
    assert len(f.variants("smoke")) == 7 and len(f.variants("full")) == len(family.variants())


def test_descriptor_implements_the_family_protocol():
    from w4a16_moe.kernels.cute.registry import KernelFamily

    d = family.DESCRIPTOR
    assert isinstance(d, KernelFamily) and d.role == "routing" and d.spec_family == family.FAMILY
    assert d.supports((9, 0), "sm_90a") is None and "sm_90a" in d.supports((8, 0), "sm_80")
    assert d.aot_variants("smoke") == family.aot_variants("smoke")


def test_registry_entry_resolves():
    from w4a16_moe.loader.spec import get_family

    family.ensure_registered()
    info = get_family(family.FAMILY)
    assert [p.name for p in info.source_files()] == ["kernels.py", "config.py", "ptx.py"]


@needs_dsl
def test_every_variant_compiles_for_sm90a():
    for s in family.variants():
        assert family._compile(s, "sm_90a") is not None, s.name


@needs_dsl
def test_variants_compile_for_sm100a():
    """Every mode and code path (both PDL settings, int64 ids, both vector widths) on a second arch."""
    assert "sm_100a" in SUPPORTED_ARCHS and "sm_100a" in family.ARCHS
    for s in family.variants(e_pads=(64,), ids=("int64",), dtypes=("fp16",)):
        assert family._compile(s, "sm_100a") is not None, s.name


@needs_dsl
def test_export_fits_the_torch_op_abi(tmp_path):
    """One kernel per mode through the loader's build: the exported C ABI is the grouped-GEMM op's."""
    from w4a16_moe.loader import build, library
    from w4a16_moe.loader.toolchain import preload_dsl_runtime
    from w4a16_moe.loader.torch_op import GEMM_ARGS

    preload_dsl_runtime()
    specs = [family.spec_for(family.route_config("single", "int32", 8, True)),
             family.spec_for(family.finalize_config("bf16", "int64", 8, True)),
             family.spec_for(family.pad_config(8, True))]
    meta = build.build_library(specs, "sm_90a", tmp_path / "routing.so")
    for k in meta["kernels"]:
        assert tuple((a["name"], a["kind"]) for a in k["abi"]["args"]) == GEMM_ARGS
        assert all(a["ctype"] == "int32_t" for a in k["abi"]["args"] if a["kind"] == "scalar")
    lib = library.load_library(tmp_path / "routing.so")
    assert all(s.name in lib for s in specs)


# --------------------------------------------------------------------------------------------------
# GPU: the same results as the Triton kernels
# --------------------------------------------------------------------------------------------------
DEV = "cuda"


def _launch():
    from w4a16_moe.kernels.cute.routing import launch

    return launch


def _triton_routing():
    try:
        from w4a16_moe.kernels.routing import prepare as routing  # after the move
    except ImportError:
        from w4a16_moe.kernels.triton import routing
    return routing


def _triton_finalize():
    try:
        from w4a16_moe.kernels.routing import finalize as fin
    except ImportError:
        from w4a16_moe.kernels.triton import finalize as fin
    return fin


def _dirty(n: int = 1 << 20) -> None:
    """Leave garbage in the caching allocator so that unwritten outputs would show."""
    junk = torch.full((n,), -7, dtype=torch.int32, device=DEV)
    del junk


def _expected(ids, experts, offset, block_m):
    flat = ids.reshape(-1).cpu().long()
    local = flat - offset
    valid = (local >= 0) & (local < experts)
    counts = torch.bincount(local[valid], minlength=experts)
    return valid, local, counts


def _same_plan(cute_plan, tri_plan, ids, experts, offset, block_m, zeroed):
    valid, local, counts = _expected(ids, experts, offset, block_m)
    assert cute_plan.num_blocks == tri_plan.num_blocks and cute_plan.block_m == tri_plan.block_m == block_m
    rs = cute_plan.route_start.cpu()
    assert torch.equal(rs, tri_plan.route_start.cpu())
    assert rs.tolist() == [0] + torch.cumsum(counts, 0).tolist()
    assert torch.equal(cute_plan.block_start.cpu(), tri_plan.block_start.cpu())
    assert cute_plan.block_info.shape == tri_plan.block_info.shape == (cute_plan.num_blocks, 4)
    assert torch.equal(cute_plan.block_info[:, :3].cpu(), tri_plan.block_info[:, :3].cpu())
    used = int(cute_plan.block_start[-1])
    info = cute_plan.block_info.cpu()
    assert (info[used:, 0] == experts).all() and (info[used:, 1:3] == 0).all()
    total = int(rs[-1])
    cs, ts = cute_plan.sorted_routes.cpu().long(), tri_plan.sorted_routes.cpu().long()
    for e in torch.nonzero(counts).flatten().tolist():
        a, b = int(rs[e]), int(rs[e + 1])
        want = torch.nonzero(valid & (local == e)).flatten()
        assert torch.equal(torch.sort(cs[a:b]).values, want), f"expert {e}"
        assert torch.equal(torch.sort(ts[a:b]).values, want)
    assert total == int(valid.sum())
    if zeroed:
        assert cute_plan.zeroed.shape == (zeroed,) and (cute_plan.zeroed == 0).all()
    else:
        assert cute_plan.zeroed is None and tri_plan.zeroed is None


def _random_ids(tokens, top_k, experts, offset, dtype, seed, invalid=True):
    g = torch.Generator().manual_seed(seed)
    lo, hi = (offset - 3, offset + experts + 5) if invalid else (offset, offset + experts)
    ids = torch.randint(max(lo, -1) if dtype == torch.int32 else lo, hi, (tokens, top_k), generator=g)
    if invalid and dtype == torch.int64 and ids.numel() > 3:
        ids.view(-1)[::97] = (1 << 40) + offset  # wraps to a valid id if truncated to 32 bits
        ids.view(-1)[1::101] = -(1 << 33) + offset
    return ids.to(dtype).to(DEV)


def _force_two(monkeypatch, path):
    launch, routing = _launch(), _triton_routing()
    if path != "single":
        monkeypatch.setattr(launch, "SMALL_ROUTES", 0)
        monkeypatch.setattr(routing, "SMALL_ROUTES", 0)
    if path == "spans":
        monkeypatch.setattr(launch, "_CHUNK", 16)
        monkeypatch.setattr(launch, "_MAX_PROGRAMS", 3)


ROUTINGS = [  # tokens, top_k, experts, offset, block_m
    (1, 1, 1, 0, 16), (3, 2, 4, 0, 16), (7, 8, 64, 0, 64), (40, 3, 5, 3, 32), (64, 8, 256, 0, 64),
    (100, 6, 63, 64, 16), (512, 8, 384, 0, 128), (512, 8, 32, 32, 64), (1, 8, 1000, 0, 16),
    (2048, 2, 8, 0, 128), (4097, 1, 256, 0, 64), (2048, 8, 256, 512, 64), (8192, 8, 384, 0, 128),
    (9000, 6, 64, 0, 32), (16384, 8, 1023, 0, 16),
]


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("tokens,top_k,experts,offset,block_m", ROUTINGS)
def test_route_plan_matches_triton(monkeypatch, pdl, dtype, tokens, top_k, experts, offset, block_m):
    monkeypatch.setenv("W4A16_MOE_PDL", pdl)
    launch, routing = _launch(), _triton_routing()
    ids = _random_ids(tokens, top_k, experts, offset, dtype, seed=tokens + experts)
    for zeroed in (0, 37, 5000):
        _dirty()
        tri = routing.prepare_routes(ids, experts, offset, block_m, zeroed=zeroed)
        _dirty()
        got = launch.prepare_routes_cute(ids, experts, offset, block_m, zeroed=zeroed)
        torch.cuda.synchronize()
        _same_plan(got, tri, ids, experts, offset, block_m, zeroed)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["single", "two", "spans"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("tokens,top_k,experts,offset,block_m", [(1, 1, 1, 0, 16), (40, 3, 5, 3, 32),
                                                                 (200, 2, 300, 3, 16), (333, 8, 64, 0, 64)])
def test_route_plan_paths(monkeypatch, path, dtype, tokens, top_k, experts, offset, block_m):
    """Both paths at every size: the two-kernel path on small inputs, and with 16-route spans (3 CTAs
    owning several chunks each, every CTA summing the others' histogram rows)."""
    _force_two(monkeypatch, path)
    launch, routing = _launch(), _triton_routing()
    ids = _random_ids(tokens, top_k, experts, offset, dtype, seed=7)
    tri = routing.prepare_routes(ids, experts, offset, block_m, zeroed=11)
    got = launch.prepare_routes_cute(ids, experts, offset, block_m, zeroed=11)
    _same_plan(got, tri, ids, experts, offset, block_m, 11)


@pytest.mark.gpu
def test_route_plan_skewed_and_empty():
    launch, routing = _launch(), _triton_routing()
    ids = torch.full((6000, 2), 3 + 7, dtype=torch.int64)
    ids[::17, 1] = 3 + 299
    ids = ids.to(DEV)
    for i in (ids, ids[:100].contiguous(), torch.full((50, 4), -1, dtype=torch.int32, device=DEV),
              torch.full((5000, 1), 900, dtype=torch.int32, device=DEV)):
        tri = routing.prepare_routes(i, 300, 3, 16, zeroed=3)
        got = launch.prepare_routes_cute(i, 300, 3, 16, zeroed=3)
        _same_plan(got, tri, i, 300, 3, 16, 3)


@pytest.mark.gpu
def test_route_plan_in_graph_capture():
    launch = _launch()
    ids = _random_ids(64, 8, 256, 0, torch.int32, seed=1)
    assert len(launch.warm(256, ids.device)) == 21  # load the kernels first
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan = launch.prepare_routes_cute(ids, 256, 0, 64, zeroed=8)
    g.replay()
    torch.cuda.synchronize()
    _same_plan(plan, _triton_routing().prepare_routes(ids, 256, 0, 64, zeroed=8), ids, 256, 0, 64, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("experts,cap,hidden,block_m", [(1, 1, 8, 16), (8, 64, 7168, 64), (32, 48, 100, 16),
                                                        (288, 16, 512, 128), (5, 1000, 33, 64)])
def test_masked_plan_matches_triton(monkeypatch, pdl, experts, cap, hidden, block_m):
    monkeypatch.setenv("W4A16_MOE_PDL", pdl)
    launch, routing = _launch(), _triton_routing()
    g = torch.Generator().manual_seed(experts + cap)
    masked_m = torch.randint(-3, cap + 4, (experts,), generator=g, dtype=torch.int32).to(DEV)
    base = torch.randn(experts, cap, hidden, generator=g).to(torch.bfloat16).to(DEV)
    out_t, out_c = base.clone(), base.clone()
    for zeroed in (0, 77):
        tri = routing.prepare_masked_routes(masked_m, cap, block_m, out_t, zeroed=zeroed)
        _dirty()
        got = launch.prepare_masked_routes_cute(masked_m, cap, block_m, out_c, zeroed=zeroed)
        torch.cuda.synchronize()
        assert torch.equal(got.route_start.cpu(), tri.route_start.cpu())
        assert torch.equal(got.block_start.cpu(), tri.block_start.cpu())
        n = int(tri.route_start[-1])
        assert torch.equal(got.sorted_routes[:n].cpu(), tri.sorted_routes[:n].cpu())
        assert got.block_info.shape == (0, 4) and got.num_blocks == 0 and got.block_m == block_m
        assert torch.equal(out_c.view(torch.int16), out_t.view(torch.int16))
        if zeroed:
            assert (got.zeroed == 0).all() and got.zeroed.shape == (zeroed,)
        else:
            assert got.zeroed is None


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("source", ["int32", "int64", "mask"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens,top_k,hidden", [(1, 1, 8), (3, 8, 7168), (17, 6, 1000), (5, 2, 7),
                                                 (300, 8, 2048), (2, 4, 4100),
                                                 (9, 10, 256), (4, 17, 40), (6, 16, 1024),  # batches of routes
                                                 (3, 40, 72)])  # more routes than a warp's lanes
def test_finalize_bit_identical_to_triton(monkeypatch, pdl, source, dtype, tokens, top_k, hidden):
    monkeypatch.setenv("W4A16_MOE_PDL", pdl)
    launch, fin = _launch(), _triton_finalize()
    g = torch.Generator().manual_seed(tokens * hidden)
    experts, offset = 16, 8
    ids = torch.randint(0, 32, (tokens, top_k), generator=g)
    valid = (ids >= offset) & (ids < offset + experts)
    ybuf = (torch.randn(tokens * top_k, hidden, generator=g) * 3).to(dtype)
    ybuf[~valid.reshape(-1)] = float("nan")  # never written in real use: must not leak into out
    w = torch.rand(tokens, top_k, generator=g, dtype=torch.float32)
    ybuf, w, ids_d, valid_d = ybuf.to(DEV), w.to(DEV), ids.to(DEV), valid.to(DEV)
    if source == "int32":
        ids_d = ids_d.to(torch.int32)
    kw = dict(valid=valid_d) if source == "mask" else dict(topk_ids=ids_d, num_experts=experts,
                                                            expert_offset=offset)
    out_t = torch.full((tokens, hidden), 5.0, dtype=dtype, device=DEV)
    out_c = torch.full((tokens, hidden), -5.0, dtype=dtype, device=DEV)
    fin.launch_finalize(ybuf, w, out_t, **kw)
    launch.launch_finalize_cute(ybuf, w, out_c, **kw)
    torch.cuda.synchronize()
    assert not out_c.isnan().any()
    assert torch.equal(out_c.view(torch.int16), out_t.view(torch.int16))
    # the unaligned (vec = 1) path on a view that starts 2 bytes into its storage
    if hidden % 8 == 0:
        big = torch.empty(tokens * hidden + 1, dtype=dtype, device=DEV)
        out_u = big[1:].view(tokens, hidden)
        launch.launch_finalize_cute(ybuf, w, out_u, **kw)
        assert torch.equal(out_u.view(torch.int16), out_t.view(torch.int16))


@pytest.mark.gpu
def test_bad_inputs_are_named():
    launch = _launch()
    ids = torch.zeros(4, 2, dtype=torch.int16, device=DEV)
    with pytest.raises(TypeError, match="topk_ids"):
        launch.prepare_routes_cute(ids, 8, 0, 16)
    with pytest.raises(ValueError, match="num_experts"):
        launch.prepare_routes_cute(ids.int(), 5000, 0, 16)
    with pytest.raises(ValueError, match="block_m"):
        launch.prepare_routes_cute(ids.int(), 8, 0, 0)
    out = torch.empty(4, 64, dtype=torch.float32, device=DEV)
    with pytest.raises(TypeError, match="out"):
        launch.launch_finalize_cute(out.repeat(2, 1), torch.ones(4, 2, device=DEV), out, topk_ids=ids.int(),
                                    num_experts=8)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens,top_k,hidden,ld", [(3, 8, 2880, 3072), (5, 2, 1000, 1024), (4, 6, 100, 128),
                                                    (2, 4, 7, 64), (300, 8, 2048, 2056)])
def test_finalize_reads_a_padded_ybuf_through_its_stride(monkeypatch, pdl, dtype, tokens, top_k, hidden, ld):
    """A padded plan's ``y [R, Hp]``: the first ``H`` columns are combined, the padding (NaN here) never read;
    bit-identical to the Triton finalize on the same buffer and to the CuTe one on a dense copy."""
    monkeypatch.setenv("W4A16_MOE_PDL", pdl)
    launch, fin = _launch(), _triton_finalize()
    g = torch.Generator().manual_seed(tokens + ld)
    ids = torch.randint(0, 12, (tokens, top_k), generator=g, dtype=torch.int32).to(DEV)
    wide = torch.full((tokens * top_k, ld), float("nan"), dtype=dtype)
    wide[:, :hidden] = torch.randn(tokens * top_k, hidden, generator=g).to(dtype)
    wide = wide.to(DEV)
    w = torch.rand(tokens, top_k, generator=g).to(DEV)
    kw = dict(topk_ids=ids, num_experts=8, expert_offset=2)
    out_t = torch.full((tokens, hidden), 5.0, dtype=dtype, device=DEV)
    out_c = torch.full((tokens, hidden), -5.0, dtype=dtype, device=DEV)
    out_d = torch.full((tokens, hidden), 7.0, dtype=dtype, device=DEV)
    fin.launch_finalize(wide, w, out_t, **kw)
    launch.launch_finalize_cute(wide, w, out_c, **kw)
    launch.launch_finalize_cute(wide[:, :hidden].contiguous(), w, out_d, **kw)
    torch.cuda.synchronize()
    assert not out_c.isnan().any()
    assert torch.equal(out_c.view(torch.int16), out_t.view(torch.int16))
    assert torch.equal(out_c.view(torch.int16), out_d.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["1", "0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,width", [((3, 2880), 3072), ((1, 1000), 1024), ((7, 96), 128), ((2, 5, 40), 64),
                                         ((4, 7), 16), ((4097, 2048), 2056), ((2, 8), 8)])
def test_pad_copy_matches_torch(monkeypatch, pdl, dtype, shape, width):
    """Every element of the padded buffer written once: ``x``'s bits, then exact zeros (NaN and -0.0 kept)."""
    monkeypatch.setenv("W4A16_MOE_PDL", pdl)
    launch = _launch()
    g = torch.Generator().manual_seed(width)
    x = torch.randn(*shape, generator=g).to(dtype)
    x.view(-1)[::13] = float("nan")
    x.view(-1)[1::17] = -0.0
    x = x.to(DEV)
    _dirty()
    got = launch.pad_copy_cute(x, width)
    want = torch.nn.functional.pad(x, (0, width - shape[-1]))
    torch.cuda.synchronize()
    assert got.shape == (*shape[:-1], width) and got.dtype == dtype
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    # the unaligned (vec = 1) path: x starting 2 bytes into its storage
    big = torch.empty(x.numel() + 1, dtype=dtype, device=DEV)
    xu = big[1:].view(shape)
    xu.copy_(x)
    assert torch.equal(launch.pad_copy_cute(xu, width).view(torch.int16), want.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_combine_routes_on_the_cute_finalize(monkeypatch, dtype):
    """``routes.combine_routes`` (the expert-parallel combine and the act-order path's) takes the CuTe finalize
    where the CuTe routing family is in use, the Triton one otherwise: the same bits, NaN routes never read."""
    import w4a16_moe.kernels.triton.moe as triton_moe
    from w4a16_moe.routes import combine_routes

    g = torch.Generator().manual_seed(3)
    y = torch.randn(37, 6, 2880, generator=g).to(dtype)
    valid = torch.rand(37, 6, generator=g) > 0.3
    y[~valid] = float("nan")
    tw = torch.rand(37, 6, generator=g)
    y, valid, tw = y.to(DEV), valid.to(DEV), tw.to(DEV)
    monkeypatch.setenv("W4A16_MOE_ROUTING", "triton")
    want = combine_routes(y, tw, valid, dtype)
    monkeypatch.setenv("W4A16_MOE_ROUTING", "cute")

    def fail(*args, **kwargs):
        raise AssertionError("the Triton finalize was launched")

    import w4a16_moe.kernels.routing.finalize as triton_finalize

    monkeypatch.setattr(triton_moe, "launch_finalize", fail)
    monkeypatch.setattr(triton_finalize, "launch_finalize", fail)
    got = combine_routes(y, tw, valid, dtype)
    assert not got.isnan().any() and torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert combine_routes(y[:0], tw[:0], valid[:0], dtype).shape == (0, 2880)

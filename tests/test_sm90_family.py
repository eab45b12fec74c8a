"""The SM90 family's host side on the CPU: several row blocks per CTA (``row_blocks_per_cta``, also
ping-pong) in the configs, the spec names, the split-K rule and the kernel's shared-memory plan (the GPU cases are in
test_cute_provider.py, which runs every candidate tile shape, these included)."""

from __future__ import annotations

import importlib.util

import pytest

from w4a16_moe.formats.schemes import get_scheme
from w4a16_moe.kernels.cute import overrides
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90.config import Sm90GemmConfig, pingpong_unordered

RB_CANDIDATES = [i for i, t in enumerate(fam.CANDIDATES) if t.get("down_row_blocks_per_cta", 1) > 1]


def test_row_block_candidates_only_change_the_down_kernel():
    assert RB_CANDIDATES, "no candidate runs several row blocks per down CTA"
    for b in RB_CANDIDATES:
        tiles = fam.CANDIDATES[b]
        up, down = fam.gemm_configs(get_scheme("int4_g32"), "bf16", "swiglu", True, "deterministic", tiles)
        assert up.row_blocks_per_cta == 1 and down.row_blocks_per_cta == tiles["down_row_blocks_per_cta"]
        assert f"_r{down.row_blocks_per_cta}" in down.name() and "_r" not in up.name()
        # the packed layouts (row block, K tile) and the routing (token tile) are those of the base shape
        assert (down.tokens_per_tile, up.tokens_per_tile) == (tiles["tokens_per_tile"],) * 2


def test_split_rule_counts_ctas_not_row_blocks():
    one = Sm90GemmConfig(mode="down", m64_per_block=4, tokens_per_tile=64, k_tile=128)
    seven = Sm90GemmConfig(mode="down", m64_per_block=4, tokens_per_tile=64, k_tile=128, row_blocks_per_cta=7)
    # W1 down (N = H = 7168: 28 row blocks of 256), 8 routes on 8 experts
    assert fam.num_splits(7168, 256, one, 8, 384) == 1  # 28 * 8 = 224 CTAs >= 132
    assert fam.num_splits(7168, 256, seven, 8, 384) == 1  # 4 * 8 = 32 CTAs, but 2 K tiles: too short to split
    assert fam.num_splits(7168, 2048, seven, 8, 384) == 1  # 16 K tiles: a split would keep fewer than 12
    # K = 14336 (112 K tiles): 5 splits would fill the GPU, but their FP32 partials (16 * TN * s / K = 0.36 of the
    # weight bytes) cost more than the SMs they fill; 3 keep them within a quarter
    assert fam.num_splits(7168, 14336, seven, 8, 384) == 3


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_row_block_kernel_plan_and_compile():
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm

    base = dict(mode="down", m64_per_block=4, tokens_per_tile=64, k_tile=128, stages=3, consumer_wgs=2)
    one = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base))
    several = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, row_blocks_per_cta=7))
    # RB > 1: the staging tile [TN][64X + 4] FP32 gets its own region next to the B ring
    assert several.e_region == 64 * (256 + 4) * 4 and one.e_region == 0
    assert several.smem_bytes == one.smem_bytes - one.b_region + several.b_region + several.e_region
    with pytest.raises(ValueError, match="row_blocks_per_cta must be >= 1"):
        Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, row_blocks_per_cta=0))
    several.compile("sm_90a")  # cross-compiles without a GPU


PP_CANDIDATES = [i for i, t in enumerate(fam.CANDIDATES) if t.get("down_pingpong")]


def test_pingpong_candidates():
    assert PP_CANDIDATES, "no ping-pong candidate"
    for b in PP_CANDIDATES:
        up, down = fam.gemm_configs(get_scheme("int4_g32"), "bf16", "swiglu", True, "deterministic",
                                    fam.CANDIDATES[b])
        assert down.pingpong and not up.pingpong and "_pp" in down.name()
        assert down.consumer_wgs == 2 and down.row_blocks_per_cta > 1


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_pingpong_kernel_plan_and_compile():
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm

    base = dict(mode="down", m64_per_block=2, tokens_per_tile=64, k_tile=64, stages=8, consumer_wgs=2,
                row_blocks_per_cta=14)
    both = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base))
    pp = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, pingpong=1))
    # each warpgroup owns whole row blocks (both m64 blocks), stages one and consumes a stage alone
    assert (pp.XW, both.XW) == (2, 1) and (pp.nepi, both.nepi) == (128, 256)
    assert pp.e_region == 2 * both.e_region == 2 * 64 * (128 + 4) * 4
    for bad in (dict(base, consumer_wgs=1), dict(base, row_blocks_per_cta=1)):
        with pytest.raises(ValueError, match="pingpong needs consumer_wgs == 2 and row_blocks_per_cta >= 2"):
            Sm90W4A16GroupedGemm(Sm90GemmConfig(**bad, pingpong=1))
    pp.compile("sm_90a")
    # pingpong=2: the mainloops take turns except where they may overlap soundly (pingpong_unordered)
    free = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, pingpong=2))
    assert free.cfg.name().endswith("_pp2") and (free.XW, free.nepi, free.e_region) == (pp.XW, pp.nepi, pp.e_region)
    with pytest.raises(ValueError, match="pingpong must be 0, 1 or 2"):
        Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, pingpong=3))
    free.compile("sm_90a")


def _waits_only_on_own_fills(stages: int, nk: int, row_blocks: int = 64) -> bool:
    """In the ring of a ping-pong kernel (row block r = ring sequences r nk .. r nk + nk - 1, consumed by
    warpgroup r % 2): whether every stage a warpgroup waits on was last filled (g - stages) for a row block
    of that same warpgroup, or never, i.e. whether unordered mainloops keep every parity wait sound."""
    return all(g < stages or ((g - stages) // nk) % 2 == (g // nk) % 2 for g in range(row_blocks * nk))


@pytest.mark.parametrize("stages", range(1, 33))
def test_pingpong_runs_unordered_only_where_every_wait_is_sound(stages):
    for nk in range(0, 3 * stages + 1):
        sound = nk > 0 and _waits_only_on_own_fills(stages, nk)
        assert pingpong_unordered(stages, nk) == sound, (stages, nk)


def test_pingpong_unordered_cases():
    # the rings that faulted unordered (the old rule: nk < S): 4 stages at nk 3 (Qwen3-235B TP4's down GEMM
    # at split-K 2, docs/perf/2026-12-07-autotune-behind), 6 stages at nk 4 (docs/perf/2026-12-05-wide-pp-down)
    for stages, nk in ((4, 3), (6, 4)):
        assert not pingpong_unordered(stages, nk) and not _waits_only_on_own_fills(stages, nk)
    # the W1 down GEMMs whose unordered gain was measured (K = 256 in K tiles of 64: nk 4, 2 at split-K 2)
    for stages, nk in ((16, 4), (8, 4), (16, 2), (8, 2), (16, 1)):
        assert pingpong_unordered(stages, nk)


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_b_slots_plan():
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm

    base = dict(mode="down", m64_per_block=2, tokens_per_tile=56, k_tile=64, stages=16, consumer_wgs=2,
                row_blocks_per_cta=28, pingpong=1)
    four = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, b_slots=4))
    full = Sm90W4A16GroupedGemm(Sm90GemmConfig(**dict(base, stages=8)))
    assert four.cfg.name().endswith("_pp_b4") and (four.BS, full.BS) == (4, 8)
    assert four.b_region == 4 * 56 * 64 * 2 and full.b_region == 8 * 56 * 64 * 2
    for bad in (dict(base, b_slots=17), dict(base, b_slots=4, row_blocks_per_cta=1, pingpong=0)):
        with pytest.raises(ValueError, match="b_slots needs row_blocks_per_cta >= 2 and 1 <= b_slots <= stages"):
            Sm90W4A16GroupedGemm(Sm90GemmConfig(**bad))
    # the overlap schedule holds tile g - 1 until tile g is full: one stage or one B slot would deadlock
    for bad in (dict(base, b_slots=1), dict(base, stages=1, pingpong=0, row_blocks_per_cta=1)):
        with pytest.raises(ValueError, match="the overlap schedule needs stages >= 2 and b_slots != 1"):
            Sm90W4A16GroupedGemm(Sm90GemmConfig(**bad))
    Sm90W4A16GroupedGemm(Sm90GemmConfig(**dict(base, b_slots=1, schedule="serial")))  # serial: released at once
    four.compile("sm_90a")


VARIANT_CANDIDATES = [i for i, t in enumerate(fam.CANDIDATES) if t.get("tn_variants", 1) > 1]


def test_tn_variant_candidates_apply_to_both_gemms():
    assert VARIANT_CANDIDATES, "no candidate compiles several token-tile widths"
    for b in VARIANT_CANDIDATES:
        tiles = fam.CANDIDATES[b]
        up, down = fam.gemm_configs(get_scheme("int4_g32"), "bf16", "swiglu", True, "deterministic", tiles)
        v = tiles["tn_variants"]
        assert up.tn_variants == down.tn_variants == v
        assert f"_v{v}" in up.name() and f"_v{v}" in down.name()
        # the routing's token tile (block_start) stays TN: the widest variant
        assert up.tokens_per_tile == down.tokens_per_tile == tiles["tokens_per_tile"]


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_tn_variants_plan_validation_and_sass(tmp_path):
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm
    from w4a16_moe.loader import sass, toolchain

    base = dict(mode="gate_up", m64_per_block=4, tokens_per_tile=56, k_tile=128, stages=5, consumer_wgs=2)
    k = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, tn_variants=3))
    one = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base))
    assert k.tns == (56, 48, 40) and one.tns == (56,)
    # the shared-memory plan is the widest variant's
    assert (k.b_stage, k.epi_bytes, k.smem_bytes) == (one.b_stage, one.epi_bytes, one.smem_bytes)
    for bad in (dict(base, tn_variants=0), dict(base, tn_variants=5), dict(base, tokens_per_tile=16, tn_variants=3)):
        with pytest.raises(ValueError, match=r"tn_variants must be in \[1, 4\]"):
            Sm90W4A16GroupedGemm(Sm90GemmConfig(**bad))
    # one kernel holds a WGMMA of each width, and no local memory
    toolchain.preload_dsl_runtime()
    k.compile("sm_90a").export_to_c(str(tmp_path), "k", function_prefix="k")
    (cubin,) = sass.extract_cubins((tmp_path / "k.o").read_bytes())
    text = sass.disassemble(cubin.data)
    for tn in (56, 48, 40):
        assert f"HGMMA.64x{tn}x16" in text, tn
    ops = sass.opcode_counts(text)
    assert not ops["LDL"] and not ops["STL"]


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_mma_kblocks_names_validation_and_compile():
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm

    base = dict(mode="down", m64_per_block=2, tokens_per_tile=56, k_tile=64, stages=16, consumer_wgs=2,
                row_blocks_per_cta=28, pingpong=2, b_slots=4)
    four = Sm90GemmConfig(**base, mma_kblocks=4)
    assert four.name().endswith("_pp2_b4_f4") and "_f" not in Sm90GemmConfig(**base).name()
    for bad in (dict(base, mma_kblocks=3), dict(base, mma_kblocks=8), dict(base, mma_kblocks=0),
                dict(base, mma_kblocks=2, schedule="serial")):
        with pytest.raises(ValueError, match="mma_kblocks must divide k_tile / 16"):
            Sm90W4A16GroupedGemm(Sm90GemmConfig(**bad))
    Sm90W4A16GroupedGemm(four).compile("sm_90a")
    # the candidates that set it apply it to both GEMMs
    for b, tiles in enumerate(fam.CANDIDATES):
        if tiles.get("mma_kblocks", 1) > 1:
            up, down = fam.gemm_configs(get_scheme("int4_g32"), "bf16", "swiglu", True, "deterministic", tiles)
            assert up.mma_kblocks == down.mma_kblocks == tiles["mma_kblocks"], b


def test_forced_overrides_the_choice_and_always_clears():
    args = (2048, 8, 384, 7168, 256, "int4_g32", "bf16", "NVIDIA H200")
    unforced = fam.choose_with_family(*args)
    with fam.forced(5, 3):
        assert fam.choose_with_family(*args) == ("sm90", dict(fam.CANDIDATES[5]), 3)
    assert overrides.current().candidate is None
    with pytest.raises(RuntimeError):
        with fam.forced(7):
            assert fam.choose_with_family(*args)[1:] == (dict(fam.CANDIDATES[7]), None)
            raise RuntimeError
    assert overrides.current().candidate is None
    with fam.forced(None):  # forces nothing
        assert fam.choose_with_family(*args) == unforced


@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the CuTe DSL (nvidia-cutlass-dsl)")
def test_four_consumer_warpgroups_plan_and_compile():
    """512 weight rows per CTA in four consumer warpgroups of two m64 blocks each (640 threads), with and without
    setmaxnreg: the budgets must fit what 640 threads can launch with (96 registers each)."""
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm

    base = dict(mode="gate_up", m64_per_block=8, tokens_per_tile=48, k_tile=64, stages=4, consumer_wgs=4)
    k = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base))
    assert (k.threads, k.ncons, k.XW) == (640, 512, 2) and k.smem_bytes <= 227 * 1024
    mr = Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, setmaxnreg=True, producer_regs=32, consumer_regs=112))
    with pytest.raises(ValueError, match="consumer_wgs must be 1, 2 or 4"):
        Sm90W4A16GroupedGemm(Sm90GemmConfig(**dict(base, m64_per_block=6, consumer_wgs=3)))
    with pytest.raises(ValueError, match="budgets within 96 registers x 640 threads"):
        Sm90W4A16GroupedGemm(Sm90GemmConfig(**base, setmaxnreg=True, producer_regs=40, consumer_regs=112))
    with pytest.raises(ValueError, match="setmaxnreg needs consumer_wgs >= 2"):
        Sm90W4A16GroupedGemm(Sm90GemmConfig(**dict(base, consumer_wgs=1), setmaxnreg=True))
    k.compile("sm_90a")
    mr.compile("sm_90a")

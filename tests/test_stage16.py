"""The SM90 down GEMM's 16-bit staging tile (``Sm90GemmConfig.stage16``, tile key ``down_stage16``): the ``y``
epilogue rounds the accumulators to x's dtype as it stages them, then copies 16-byte rows to ``y``; split-K partials
go from the accumulators to the FP32 workspace.

CPU: the config's rules and the staging tile's size. GPU (SM90): every SM90 tile the cost model chooses among
(``family.TILES`` and ``MODEL_TILES``) with the 16-bit staging tile against the same tile with the FP32 one, bit for
bit, with split-K 1 and 3, a resident and a re-gathered activation tile (I = 256 / 1024), INT4 g32 and g128, BF16 and
FP16, NVFP4 on the rule's tiles, on NaN-poisoned outputs checked against the FP32 reference. Since the 16-bit tile is
the default of that epilogue, the FP32 one is the tile with ``down_stage16: False``.
"""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from conftest import HAS_CUDA, random_weights, run_cute_moe
from w4a16_moe.formats.schemes import get_scheme
from w4a16_moe.kernels.cute import provider
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90.config import Sm90GemmConfig
from w4a16_moe.kernels.cute.sm90.tuned import candidate_name

#: the SM90 tiles selection chooses among (the rule's and the cost model's)
SHIPPED = [dict(t) for _, t in fam.TILES] + [dict(t) for t in fam.MODEL_TILES]


def with_stage16(t: dict, on: bool) -> dict:
    return {**t, "down_stage16": on}


PP = dict(mode="down", m64_per_block=2, tokens_per_tile=112, k_tile=64, stages=8, consumer_wgs=2, row_blocks_per_cta=28,
          pingpong=2, b_slots=4, tn_variants=4, pdl=True, mma_kblocks=2, setmaxnreg=True, producer_regs=72,
          consumer_regs=216)


def test_stage16_rules_and_staging_size():
    pytest.importorskip("cutlass", reason="the CuTe DSL (nvidia-cutlass-dsl) is needed")
    from w4a16_moe.kernels.cute.sm90.grouped_gemm import Sm90W4A16GroupedGemm

    k16 = Sm90W4A16GroupedGemm(Sm90GemmConfig(**PP, stage16=True))
    k32 = Sm90W4A16GroupedGemm(Sm90GemmConfig(**PP))
    assert k16.cfg.name().endswith("_e16") and not k32.cfg.name().endswith("_e16")
    assert k16.epi_bytes == 112 * (128 + 8) * 2 and k32.epi_bytes == 112 * (128 + 4) * 4
    # ping-pong: one staging tile per warpgroup
    assert k32.smem_bytes - k16.smem_bytes == 2 * (k32.epi_bytes - k16.epi_bytes)
    for bad in (dict(PP, mode="gate_up", row_blocks_per_cta=1, pingpong=0, b_slots=0), dict(PP, epilogue="atomic_f32"),
                dict(PP, bias=True)):
        with pytest.raises(ValueError, match="stage16 needs the down GEMM's y epilogue without bias"):
            Sm90W4A16GroupedGemm(Sm90GemmConfig(**bad, stage16=True))


@pytest.mark.parametrize("tile", range(len(SHIPPED)))
def test_stage16_is_the_y_epilogues_only(tile):
    """``down_stage16`` reaches the deterministic down GEMM without bias; the gate/up GEMM, the fused finalize's
    ``atomic_f32`` epilogue and a biased ``y`` epilogue keep the FP32 staging tile."""
    t = with_stage16(SHIPPED[tile], True)
    s = get_scheme("int4_g128")
    up, down = fam.gemm_configs(s, "bf16", "swiglu", True, "deterministic", t)
    assert down.stage16 and not up.stage16
    # the default: the tile without the key stages in 16 bits
    assert fam.gemm_configs(s, "bf16", "swiglu", True, "deterministic", SHIPPED[tile]) == (up, down)
    assert not fam.gemm_configs(s, "bf16", "swiglu", True, "deterministic", with_stage16(t, False))[1].stage16
    for fin, bias in (("fused", False), ("deterministic", True)):
        assert not fam.gemm_configs(s, "bf16", "swiglu", True, fin, t, bias)[1].stage16


# ------------------------------------------------------------------------------------------------ GPU
SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9
needs_sm90 = pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")


@pytest.fixture
def as_candidates(monkeypatch):
    """Every shipped tile with and without the 16-bit staging tile as SM90 candidates of this test (by name)."""
    names = {candidate_name(d): d for t in SHIPPED for d in (with_stage16(t, True), with_stage16(t, False))}
    monkeypatch.setattr(fam, "CANDIDATES_BY_NAME", {**fam.CANDIDATES_BY_NAME, **names})
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    provider.clear_plans()
    yield
    provider.clear_plans()


#: (scheme, dtype) pairs: both INT4 group layouts in BF16, FP16 (the other rounding of the staging tile), and NVFP4
#: (on the rule's tiles: FP4 calls take no cost-model tile)
CASES = [("int4_g32", torch.bfloat16), ("int4_g128", torch.bfloat16), ("int4_g128", torch.float16),
         ("nvfp4", torch.bfloat16)]
RULE_TILES = len(fam.TILES)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("tile", range(len(SHIPPED)))
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("i", [256, 1024])
def test_stage16_equals_the_fp32_staging(as_candidates, tile, case, splits, i):
    scheme, dtype = CASES[case]
    if not fam.scheme_ok(SHIPPED[tile], scheme) or (scheme == "nvfp4" and tile >= RULE_TILES):
        pytest.skip(f"tile {tile} is not built for {scheme}")
    t16, t32 = with_stage16(SHIPPED[tile], True), with_stage16(SHIPPED[tile], False)
    # 8 experts x ~150 routes: each expert a full tile and a narrower one (the token-width variants)
    w = random_weights(scheme, 8, 1024, i, dtype=dtype, device="cuda", seed=tile)
    with fam.forced(candidate_name(t16), splits):
        x, tw, ids, out = run_cute_moe(w, 150, 8, dtype=dtype, seed=tile + 3)
        assert torch.equal(wm.fused_moe(x, w, tw, ids, backend="cute"), out)  # split order fixed
    with fam.forced(candidate_name(t32), splits):
        ref32 = wm.fused_moe(x, w, tw, ids, backend="cute")
    # one rounding of the same FP32 sums, staged in 16 bits instead of 32
    assert torch.equal(out, ref32)

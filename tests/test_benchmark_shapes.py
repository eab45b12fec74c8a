"""Both GPU providers at the benchmark shapes (W1 kimi-tp8, W2 deepseek-ep8) in BF16 and FP16.

The benchmark itself checks BF16 at every row before timing; this covers FP16 too, at a few token
counts, with the benchmark's own data (targets.md), the output poisoned with NaN first.
"""

from __future__ import annotations

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.bench.workloads import SEED, WORKLOADS, make_inputs, make_weights

from conftest import HAS_CUDA, nrmse

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("backend", ["triton", "cute"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("workload", ["kimi-tp8", "deepseek-ep8"])
def test_benchmark_shapes(workload, dtype, backend):
    if backend == "cute" and (not HAS_CUDA or torch.cuda.get_device_capability()[0] != 9):
        pytest.skip("the CuTe kernels need SM90")
    wl = WORKLOADS[workload]
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    weights = make_weights(wl, gen, "cuda")
    for t in (1, 33, 512):
        x, tw, ids = make_inputs(wl, t, gen, "cuda")
        x = x.to(dtype)
        out = torch.full_like(x, float("nan"))
        wm.fused_moe(x, weights, tw, ids, backend=backend, out=out)
        ref = wm.reference_moe(x, weights, tw, ids)
        assert torch.isfinite(out).all()
        assert nrmse(out, ref) < 0.02, (t, nrmse(out, ref))

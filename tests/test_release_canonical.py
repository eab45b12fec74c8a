"""``warmup(..., release_canonical=True)`` / ``MoEWeights.release_canonical``: the canonical 4-bit tensors freed after
warmup, the packed layouts kept; calls warmup prepared keep running, everything else that would read the canonical
tensors raises a clear error."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import w4a16_moe as wm
from conftest import HAS_CUDA, nrmse, random_routing, random_weights, warmup_specs

SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


@dataclass
class _Layout:
    data: torch.Tensor


def _canonical_bytes(w) -> int:
    return sum(t.untyped_storage().nbytes() for m in (w.w13, w.w2) for t in (m.codes, m.scales, m.zeros)
               if t is not None)


@pytest.mark.parametrize("scheme", ["int4_g32", "int4_g128_zp", "nvfp4"])
def test_release_keeps_packed_layouts_and_refuses_the_rest(scheme):
    w = random_weights(scheme, 8, 256, 128, seed=1)
    x = torch.randn(3, 256).half()
    tw, ids = random_routing(3, 2, 8, seed=1)
    ref = wm.reference_moe(x, w, tw, ids)
    packed = w.packed_for("test:a", lambda ww: _Layout(ww.w13.codes.clone()))
    before = _canonical_bytes(w)
    assert not w.canonical_released
    assert w.release_canonical() == before > 0
    assert w.canonical_released and _canonical_bytes(w) == 0
    assert w.packed_for("test:a", lambda ww: pytest.fail("rebuilt")) is packed  # still cached, still whole
    assert packed.data.untyped_storage().nbytes() == packed.data.numel()
    assert w.release_canonical() == 0  # nothing left to free
    assert w.num_experts == 8 and w.w13.codes.shape == (8, 256, 128) and ref.shape == x.shape  # metadata stays
    for what, fn in [("packing the layout 'test:b'", lambda: w.packed_for("test:b", lambda ww: None)),
                     ("the FP32 reference", lambda: wm.reference_moe(x, w, tw, ids)),
                     ("MoEWeights.dequantize", w.dequantize),
                     ("MoEWeights.to", lambda: w.to("cpu"))]:
        with pytest.raises(RuntimeError, match="release_canonical=True") as err:
            fn()
        assert what in str(err.value)


def test_release_leaves_storage_a_layout_shares():
    w = random_weights("int4_g32", 4, 128, 64, seed=2)
    w.packed_for("test:shared", lambda ww: _Layout(ww.w13.codes.view(-1)))  # a layout that is the canonical codes
    freed = w.release_canonical()
    assert w.w13.codes.untyped_storage().nbytes() == w.w13.codes.numel()  # kept: the layout reads it
    assert freed == _canonical_bytes(random_weights("int4_g32", 4, 128, 64, seed=2)) - w.w13.codes.numel()
    assert not w.canonical_released  # w13's codes are whole


def test_warmup_release_argument_errors():
    w = random_weights("int4_g32", 4, 128, 64, seed=3)
    with pytest.raises(TypeError, match="release_canonical: expected a bool"):
        wm.warmup(w, top_k=2, max_tokens=4, release_canonical="yes", backend="reference")
    with pytest.raises(ValueError, match="provider 'reference', which reads the canonical tensors"):
        wm.warmup(w, top_k=2, max_tokens=4, release_canonical=True, backend="reference")
    assert not w.canonical_released


@pytest.mark.gpu
@pytest.mark.skipif(not SM90, reason="needs an SM90 GPU")
def test_gpu_calls_after_release():
    """Warmup of 1..300 tokens, then release: the memory drops by the canonical bytes, calls of 1..300 tokens in both
    finalize modes (poisoned outputs) match the reference of an unreleased copy, a graph captures at 277 tokens,
    and an FP16 call (a layout never packed) or the Triton provider raises."""
    e, h, i, k = 8, 512, 256, 4
    w = random_weights("int4_g32", e, h, i, dtype=torch.bfloat16, device="cuda", seed=4)
    keep = wm.MoEWeights(w.scheme, w.w13.map(torch.clone), w.w2.map(torch.clone), w.gated)  # for the reference
    wm.warmup(w, dtype=torch.bfloat16, top_k=k, max_tokens=300, backend="cute")
    torch.cuda.synchronize()
    canonical = _canonical_bytes(w)
    before = torch.cuda.memory_allocated()
    wm.warmup(w, dtype=torch.bfloat16, top_k=k, max_tokens=300, backend="cute", release_canonical=True)
    torch.cuda.synchronize()
    assert w.canonical_released
    assert before - torch.cuda.memory_allocated() >= canonical * 0.99
    for t in (1, 17, 299, 300):
        x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
        tw, ids = random_routing(t, k, e, seed=t, device="cuda")
        ref = wm.reference_moe(x, keep, tw, ids)
        for fin in ("deterministic", "fused"):
            out = torch.full_like(x, float("nan"))
            wm.fused_moe(x, w, tw, ids, finalize=fin, backend="cute", out=out)
            assert not torch.isnan(out).any() and nrmse(out, ref) < 0.02, (t, fin, nrmse(out, ref))
    t = 277
    x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
    tw, ids = random_routing(t, k, e, seed=7, device="cuda")
    out = torch.full_like(x, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wm.fused_moe(x, w, tw, ids, backend="cute", out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert nrmse(out, wm.reference_moe(x, keep, tw, ids)) < 0.02
    with pytest.raises(RuntimeError, match="release_canonical=True"):
        wm.fused_moe(x.half(), w, tw, ids, backend="cute")
    with pytest.raises(RuntimeError, match="provider triton"):
        wm.fused_moe(x, w, tw, ids, backend="triton")


def needed_specs() -> list:
    """Every KernelSpec the GPU test launches on an H100 or an H200 (build them for sm_90a before running on a
    DSL-less machine): warmup's, and the FP16 call's that must raise (its kernels load)."""
    from w4a16_moe.activations import get_activation
    from w4a16_moe.validate import MoECall

    fp16 = MoECall(277, 4, 512, 256, 8, torch.float16, torch.device("cuda"), get_activation("swiglu"), "deterministic",
                   0, "int4_g32")
    return warmup_specs(8, 512, 256, "int4_g32", 4, 300, ("deterministic", "fused"), calls=(fp16,))

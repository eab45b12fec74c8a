"""The benchmark workloads (docs/benchmarks.md), their synthetic data and the floor model.

Data (exactly as docs/benchmarks.md specifies): generator seed 20260908 on the GPU; int4 codes uniform
random; scales uniform in [0.75, 1.25] / (4.6 * sqrt(K)) stored in BF16; x ~ N(0, 1) in BF16;
``topk_ids`` = top-k of uniform random scores over the global experts (distinct per token);
``topk_weights`` = softmax of N(0, 1) logits in FP32; fresh routing and activations per token count.
Routes to experts outside the local range contribute nothing (another rank's work).

Beyond targets.md (other layers, ``bench --layer/--preset``): ``dtype`` ``fp16`` draws the same numbers and
stores x and the INT4 scales in FP16; ``*_zp`` schemes add zero points uniform in 6..10 (drawn after the
scales); the FP4 schemes take the same codes (uniform E2M1) with scales chosen so that the weights have the
RMS of the INT4 ones (NVFP4: E4M3 scales ``(0.75 + 0.5 u) * 256`` and a per-row global scale; MXFP4:
E8M0 exponents rounding ``log2`` of the INT4 scale). Non-gated activations draw ``w13`` with ``I`` rows.
Layers with per-expert biases (``bias``, the ``gpt-oss-120b`` preset) then draw ``w13_bias`` ``[E, 2I|I]`` and
``w2_bias`` ``[E, H]`` as ``0.25 * N(0, 1)`` in BF16, after all the weights (``scripts/peers/mxfp4_data.py`` draws
the same layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..activations import get_activation
from ..formats.fp4 import e4m3_encode, e8m0_encode_floor
from ..formats.schemes import get_scheme
from ..formats.weights import MoEWeights, QuantizedMatrix

__all__ = ["Workload", "WORKLOADS", "DTYPES", "make_weights", "make_inputs", "benchmark_rows", "floor_us", "SEED",
           "COPY_BW", "BF16_FLOPS"]

SEED = 20260908
COPY_BW = 4.3e12  # B/s, device-to-device copy measured on the H200 (bytes read + written)
BF16_FLOPS = 7.9e14  # FLOP/s, bf16 GEMM measured on the H200
LAUNCH_FLOOR_US = 6.0  # one graph-replayed launch chain costs a few microseconds
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# RMS of INT4 values (code - 8, codes uniform 0..15) over the RMS of E2M1 values (codes uniform)
_FP4_RMS_RATIO = math.sqrt(21.5 / 8.5625)
BIAS_STD = 0.25


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    global_experts: int
    local_experts: int
    hidden: int
    intermediate: int
    top_k: int
    scheme: str
    tokens: tuple
    dtype: str = "bf16"
    activation: str = "swiglu"
    bias: bool = False

    @property
    def gated(self) -> bool:
        return get_activation(self.activation).gated

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


WORKLOADS = {
    "kimi-tp8": Workload(
        "kimi-tp8", "W1: Kimi-K2 TP8 shard, E=384, H=7168, I=256, top-8, INT4 g32",
        384, 384, 7168, 256, 8, "int4_g32", (1, 8, 32, 256, 1024, 2048),
    ),
    "deepseek-ep8": Workload(
        "deepseek-ep8", "W2: DeepSeek EP8 rank, 256 global / 32 local experts, H=7168, I=2048, top-8, INT4 g128",
        256, 32, 7168, 2048, 8, "int4_g128", tuple(2**i for i in range(14)),
    ),
}


def _matrix(gen: torch.Generator, scheme: str, e: int, n: int, k: int, device,
            dtype: torch.dtype = torch.bfloat16) -> QuantizedMatrix:
    sch = get_scheme(scheme)
    codes = torch.randint(0, 256, (e, n, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    g = sch.group_for(k)
    u = torch.rand(e, n, k // g, generator=gen, device=device)
    if sch.kind == "int4":
        scales = ((0.75 + 0.5 * u) / (4.6 * math.sqrt(k))).to(dtype)
        zeros = None
        if sch.zero_point:
            zeros = torch.randint(6, 11, (e, n, k // g), generator=gen, device=device,
                                  dtype=torch.int32).to(torch.uint8)
        return QuantizedMatrix(sch, codes, scales, zeros)
    if sch.kind == "nvfp4":
        scales = e4m3_encode((0.75 + 0.5 * u) * 256.0)
        gs = torch.full((e, n), _FP4_RMS_RATIO / (256.0 * 4.6 * math.sqrt(k)), dtype=torch.float32, device=device)
        return QuantizedMatrix(sch, codes, scales, global_scale=gs)
    exp = torch.round(torch.log2((0.75 + 0.5 * u) * _FP4_RMS_RATIO / (4.6 * math.sqrt(k))))
    return QuantizedMatrix(sch, codes, e8m0_encode_floor(exp))


def make_weights(wl: Workload, gen: torch.Generator, device="cuda") -> MoEWeights:
    """Random quantized local experts of ``wl`` (codes and scales drawn directly, no dense weights)."""
    n13 = 2 * wl.intermediate if wl.gated else wl.intermediate
    w13 = _matrix(gen, wl.scheme, wl.local_experts, n13, wl.hidden, device, wl.torch_dtype)
    w2 = _matrix(gen, wl.scheme, wl.local_experts, wl.hidden, wl.intermediate, device, wl.torch_dtype)
    b13 = b2 = None
    if wl.bias:
        b13 = (torch.randn(wl.local_experts, n13, generator=gen, device=device) * BIAS_STD).to(torch.bfloat16)
        b2 = (torch.randn(wl.local_experts, wl.hidden, generator=gen, device=device) * BIAS_STD).to(torch.bfloat16)
    return MoEWeights(get_scheme(wl.scheme), w13, w2, wl.gated, b13, b2)


def make_inputs(wl: Workload, tokens: int, gen: torch.Generator, device="cuda"):
    """``(x [T, H] bf16 (the workload's dtype), topk_weights [T, k] fp32, topk_ids [T, k] int32)`` for one row."""
    x = torch.randn(tokens, wl.hidden, generator=gen, device=device).to(wl.torch_dtype)
    scores = torch.rand(tokens, wl.global_experts, generator=gen, device=device)
    ids = scores.topk(wl.top_k, dim=1).indices.to(torch.int32)
    logits = torch.randn(tokens, wl.top_k, generator=gen, device=device)
    return x, torch.softmax(logits, dim=1), ids


def benchmark_rows(wl: Workload, tokens, gen: torch.Generator, device="cuda") -> dict:
    """``{T: (x, topk_weights, topk_ids)}`` for ``tokens``: a token count of the workload gets exactly the
    full benchmark's row (every row drawn from ``gen`` in the workload's order, the unrequested ones
    dropped), so a subset run (``--tokens``) measures the same data as the full run; other counts are drawn
    afterwards, in the order given."""
    want = list(tokens)
    out = {}
    for t in wl.tokens:
        row = make_inputs(wl, t, gen, device)
        if t in want:
            out[t] = row
    for t in want:
        if t not in out:
            out[t] = make_inputs(wl, t, gen, device)
    return out


def floor_us(wl: Workload, weights: MoEWeights, tokens: int, topk_ids: torch.Tensor, expert_offset: int = 0) -> dict:
    """The physical floor of one row on the H200 from its actual routing.

    bytes = weights (codes + scales + zero points) of the distinct local experts present in ``topk_ids``
    + tokens*H*2 bytes in and out; flops = 2 * local routes * (H*2I + I*H) (H*I + I*H when not gated);
    floor = max(bytes / 4.3e12, flops / 7.9e14); floor_eff = max(floor, 6 us).
    """
    local = topk_ids.long() - expert_offset
    valid = (local >= 0) & (local < weights.num_experts)
    present = int(torch.unique(local[valid]).numel())
    routes = int(valid.sum())
    per_expert = weights.nbytes_per_expert()
    act_bytes = tokens * wl.hidden * 2 * 2
    nbytes = present * per_expert + act_bytes
    n13 = 2 * wl.intermediate if wl.gated else wl.intermediate
    flops = 2 * routes * (wl.hidden * n13 + wl.intermediate * wl.hidden)
    floor = max(nbytes / COPY_BW, flops / BF16_FLOPS) * 1e6
    return {
        "floor_us": floor,
        "floor_eff_us": max(floor, LAUNCH_FLOOR_US),
        "bytes": nbytes,
        "flops": flops,
        "experts_present": present,
        "local_routes": routes,
    }

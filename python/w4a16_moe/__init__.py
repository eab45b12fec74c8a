"""w4a16-moe: fused Mixture-of-Experts GPU kernels with 4-bit weights and 16-bit activations.

Public API::

    weights = w4a16_moe.quantize_experts(w13, w2, "int4_g32", activation="swiglu")
    weights = w4a16_moe.load_experts(ckpt_dir, "model.layers.3.mlp.experts")  # from a HF checkpoint
    y = w4a16_moe.fused_moe(x, weights, topk_weights, topk_ids)          # [T, H]
    y = w4a16_moe.fused_moe_masked(x_ll, weights, masked_m)              # DeepEP low-latency layout
    ref = w4a16_moe.reference_moe(x, weights, topk_weights, topk_ids)    # FP32, any device
"""

from ._version import __version__
from .activations import ACTIVATIONS, get_activation
from .api import fused_moe, fused_moe_masked, quantize_experts, warmup
from .checkpoints import CheckpointError, load_experts
from .formats import SCHEMES, MoEWeights, QuantizedMatrix, get_scheme, scheme_names
from .providers import ProviderUnavailable
from .reference import reference_moe, reference_moe_masked

__all__ = [
    "__version__",
    "ACTIVATIONS",
    "CheckpointError",
    "SCHEMES",
    "MoEWeights",
    "QuantizedMatrix",
    "ProviderUnavailable",
    "fused_moe",
    "fused_moe_masked",
    "get_activation",
    "get_scheme",
    "load_experts",
    "quantize_experts",
    "reference_moe",
    "reference_moe_masked",
    "scheme_names",
    "warmup",
]

"""w4a16-moe: fused Mixture-of-Experts GPU kernels with 4-bit weights and 16-bit activations."""

from ._version import __version__
from .activations import ACTIVATIONS, get_activation
from .formats import SCHEMES, MoEWeights, QuantizedMatrix, get_scheme, scheme_names
from .reference import reference_moe, reference_moe_masked

__all__ = [
    "__version__",
    "ACTIVATIONS",
    "SCHEMES",
    "MoEWeights",
    "QuantizedMatrix",
    "get_activation",
    "get_scheme",
    "scheme_names",
    "reference_moe",
    "reference_moe_masked",
]

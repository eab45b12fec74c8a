"""4-bit weight formats: schemes, canonical storage, quantization and checkpoint converters."""

from .converters import (
    from_awq,
    from_compressed_tensors,
    from_compressed_tensors_fp4,
    from_gptq,
    from_modelopt_nvfp4,
    from_mxfp4,
    from_trtllm_per_channel,
    to_compressed_tensors,
    to_modelopt_nvfp4,
    to_trtllm_per_channel,
)
from .quantize import dequantize_matrix, quantize_matrix
from .schemes import SCHEMES, Scheme, get_scheme, scheme_names
from .weights import MoEWeights, QuantizedMatrix, pack_nibbles, unpack_nibbles

__all__ = [
    "SCHEMES",
    "Scheme",
    "get_scheme",
    "scheme_names",
    "MoEWeights",
    "QuantizedMatrix",
    "pack_nibbles",
    "unpack_nibbles",
    "quantize_matrix",
    "dequantize_matrix",
    "from_compressed_tensors",
    "to_compressed_tensors",
    "from_trtllm_per_channel",
    "to_trtllm_per_channel",
    "from_modelopt_nvfp4",
    "to_modelopt_nvfp4",
    "from_compressed_tensors_fp4",
    "from_mxfp4",
    "from_gptq",
    "from_awq",
]

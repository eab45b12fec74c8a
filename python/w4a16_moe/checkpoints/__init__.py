"""Loading MoE expert weights from Hugging Face checkpoint directories (:func:`load_experts`)."""

from .config import QuantFormat, detect_format
from .loader import load_experts
from .shards import CheckpointError, ShardReader

__all__ = ["load_experts", "CheckpointError", "QuantFormat", "detect_format", "ShardReader"]

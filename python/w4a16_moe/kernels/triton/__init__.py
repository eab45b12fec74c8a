"""Triton provider: fused W4A16 MoE kernels that run on any CUDA GPU Triton supports (sm80+).

Entry points (arguments validated by the caller): :func:`triton_fused_moe` and :func:`triton_fused_moe_masked`.
Modules: :mod:`.routing` (GPU route grouping), :mod:`.grouped_gemm` (dequantizing grouped GEMMs),
:mod:`.finalize` (deterministic top-k combine), :mod:`.moe` (orchestration and the tile-config table).
"""

from .moe import (CONFIG_TABLE, select_configs, triton_combine_routes, triton_expert_routes, triton_fused_moe,
                  triton_fused_moe_masked)

__all__ = ["triton_fused_moe", "triton_fused_moe_masked", "triton_expert_routes", "triton_combine_routes",
           "select_configs", "CONFIG_TABLE"]

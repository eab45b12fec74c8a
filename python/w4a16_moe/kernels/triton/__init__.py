"""Triton provider: fused W4A16 MoE kernels that run on any CUDA GPU Triton supports (sm80+).

Entry points (arguments validated by the caller): :func:`triton_fused_moe` and :func:`triton_fused_moe_masked`.
Modules: :mod:`.grouped_gemm` (dequantizing grouped GEMMs), :mod:`.moe` (orchestration and the tile-config
table); route preparation and the deterministic top-k combine are shared with the CuTe provider
(:mod:`w4a16_moe.kernels.routing`).
"""

from .moe import (CONFIG_TABLE, select_configs, triton_combine_routes, triton_expert_routes, triton_fused_moe,
                  triton_fused_moe_masked)

__all__ = ["triton_fused_moe", "triton_fused_moe_masked", "triton_expert_routes", "triton_combine_routes",
           "select_configs", "CONFIG_TABLE"]

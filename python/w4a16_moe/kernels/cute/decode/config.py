"""Static configuration of one route-major decode kernel (no CuTe DSL import).

Kept apart from the kernel module (:mod:`.gemv`) so that selecting kernels and looking up prebuilt
ones at run time never imports ``cutlass``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..common.codes import act_tag, is_gated

__all__ = ["DecodeGemvConfig"]


@dataclass(frozen=True)
class DecodeGemvConfig:
    """Static configuration of one compiled decode kernel (every field shapes the generated code).

    The kernel reads the SM90 fragment-ready weight layout (:mod:`..sm90.pack`) of ``m64_per_block`` x
    ``k_tile``, so it shares the packed copy with the WGMMA family's tiles of the same layout.
    """

    mode: str = "gate_up"  # "gate_up": h[route] = act(W13_e x[token]); "down": out[token] = sum_j w_j W2_e h[route_j]
    dtype: str = "bf16"  # activation / compute dtype: "bf16" | "fp16"
    group: int = 32  # scale group along K; 0 = per channel
    zero_point: bool = False
    fp4: bool = False  # E2M1 codes (NVFP4 / MXFP4; effective scales folded at pack time, see sm90/pack.py)
    activation: str = "swiglu"  # gate_up only
    m64_per_block: int = 2  # X of the packed layout (64-row blocks per row block)
    k_tile: int = 128  # BK of the packed layout
    warps: int = 8  # warps per CTA; they split the K range (gate_up) or the (route, K part) items (down)
    unroll: int = 4  # k64 units per load batch (16-byte weight loads in flight per thread: X * unroll)
    pdl: bool = True  # down: programmatic dependent launch (prefetch the weights into L2 while gate/up runs)
    ctas: int = 0  # > 0: a persistent grid of at most this many CTAs over the compacted work (see decode.gemv)
    # gate_up: each CTA asks L2 for its work unit's weights (one bulk prefetch) before it loads them, and a
    # persistent CTA for its next unit's while it works on one (see decode.gemv)
    l2_prefetch: bool = False
    # INT4: the group scale applied in FP32 to each group's mma.sync sum instead of to every weight in 16 bits
    # before it (one packed multiply per two weights fewer; no rounding of the scaled weight; see decode.gemv)
    fp32_scale: bool = False
    # per-expert FP32 bias added before the output is stored (gate_up: the w13 bias before the activation;
    # down: the token's weighted w2 biases, sum_j w_j b2[e_j]); the table [E, n] rides in the route_start slot
    bias: bool = False

    @property
    def gated(self) -> bool:
        return is_gated(self.mode, self.activation)

    def name(self) -> str:
        g = "ch" if self.group == 0 else str(self.group)
        zp = ("zp" if self.zero_point else "") + ("f4" if self.fp4 else "")
        act = ("_" + act_tag(self.activation)) if self.mode == "gate_up" else ""
        pdl = "_pdl" if self.pdl and self.mode == "down" else ""
        ctas = f"_c{self.ctas}" if self.ctas else ""
        ctas += "_l2pf" if self.l2_prefetch and self.mode == "gate_up" else ""
        ctas += "_s32" if self.fp32_scale else ""
        bias = "_bias" if self.bias else ""
        return (f"dec_{self.mode}_{self.dtype}_g{g}{zp}_x{self.m64_per_block}_k{self.k_tile}"
                f"_w{self.warps}_u{self.unroll}{act}{pdl}{ctas}{bias}")

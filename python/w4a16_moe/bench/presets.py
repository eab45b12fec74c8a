"""Named MoE layers for ``bench --preset``: the layers of ``../shared/tools/peers`` (``peer_bench.py
--list-presets``), with the same shapes, group sizes and default token counts, so that the project's
benchmark and the peers tool measure the same layers under the same names.

``E_local < E_global`` is one expert-parallel rank that owns the global ids ``0 .. E_local - 1``; routes to
the other ids are other ranks' work and contribute nothing. The peers tool's presets are SwiGLU with INT4
symmetric group-quantized weights (``int4_g<group>``). A preset may carry its own ``scheme``, ``activation``
and per-expert ``bias``: ``gpt-oss-120b`` (MXFP4, ``swiglu_oai``, biases) is the layer that
``scripts/peers/mxfp4_bench.py`` measures beside Humming's MXFP4 MoE, under the same name and with the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Preset", "PRESETS", "DEFAULT_TOKENS", "INT4_PRESETS", "layer_name"]

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Preset:
    local_experts: int
    hidden: int
    intermediate: int
    top_k: int
    global_experts: int
    group: int
    what: str
    tokens: tuple = DEFAULT_TOKENS
    scheme: Optional[str] = None  # None: int4_g<group>
    activation: str = "swiglu"
    bias: bool = False  # per-expert biases (drawn by workloads.make_weights)

    @property
    def default_scheme(self) -> str:
        return self.scheme or f"int4_g{self.group}"


PRESETS = {
    "kimi-tp8": Preset(384, 7168, 256, 8, 384, 32, "Kimi-K2 MoE layer, TP8 shard (I = 2048 / 8)"),
    "deepseek-ep8": Preset(32, 7168, 2048, 8, 256, 128, "DeepSeek-V3/R1 MoE layer, one EP8 rank (32 of 256 experts)"),
    "deepseek-tp8": Preset(256, 7168, 256, 8, 256, 128, "DeepSeek-V3/R1 MoE layer, TP8 shard (I = 2048 / 8)"),
    "qwen3-235b-tp4": Preset(128, 4096, 384, 8, 128, 128, "Qwen3-235B-A22B MoE layer, TP4 shard (I = 1536 / 4)"),
    "qwen3-235b-ep8": Preset(16, 4096, 1536, 8, 128, 128, "Qwen3-235B-A22B MoE layer, one EP8 rank (16 of 128)"),
    "glm45-ep8": Preset(20, 5120, 1536, 8, 160, 128, "GLM-4.5 MoE layer, one EP8 rank (20 of 160 experts)"),
    "llama4-scout": Preset(16, 5120, 8192, 1, 16, 128, "Llama-4-Scout MoE layer, whole (routed experts only)"),
    "llama4-maverick-tp8": Preset(128, 5120, 1024, 1, 128, 128,
                                  "Llama-4-Maverick MoE layer, TP8 shard (I = 8192 / 8; routed experts only)"),
    "gpt-oss-120b": Preset(128, 2880, 2880, 4, 128, 32,
                           "gpt-oss-120b MoE layer, whole (MXFP4, per-expert biases, swiglu_oai)",
                           (1, 4, 16, 64, 256, 1024, 4096), "mxfp4", "swiglu_oai", True),
}
# the presets of the peers tool (shared/tools/peers/peer_bench.py --list-presets)
INT4_PRESETS = tuple(n for n, p in PRESETS.items() if p.scheme is None and p.activation == "swiglu" and not p.bias)


def layer_name(preset: "str | None", local_experts: int, hidden: int, intermediate: int, top_k: int,
               global_experts: int, scheme: str, activation: str = "swiglu") -> str:
    """The layer's name in records: the peers tool's naming (``<preset>`` or ``<preset>-g<G>`` when the group
    differs from the preset's; ``E<E>-H<H>-I<I>-k<K>[-of<E_global>]-g<G>`` for other layers), with the scheme
    instead of ``g<G>`` when it is not INT4 symmetric and ``-<activation>`` when it is not SwiGLU. A preset's own
    scheme and activation (``gpt-oss-120b``: mxfp4, swiglu_oai) add nothing."""
    sym = scheme.startswith("int4_g") and not scheme.endswith("_zp")
    tail = (f"g{scheme[len('int4_g'):]}" if sym else scheme)
    own_activation = "swiglu"
    if preset is not None:
        p = PRESETS[preset]
        own_activation = p.activation
        name = preset if scheme == p.default_scheme else f"{preset}-{tail}"
    else:
        name = f"E{local_experts}-H{hidden}-I{intermediate}-k{top_k}"
        if global_experts != local_experts:
            name += f"-of{global_experts}"
        name += f"-{tail}"
    return name if activation == own_activation else f"{name}-{activation}"

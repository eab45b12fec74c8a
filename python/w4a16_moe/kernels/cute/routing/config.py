"""Static configuration of one route-preparation / finalize kernel (no CuTe DSL import).

Kept apart from the kernel module (:mod:`.kernels`) so that selecting kernels and looking up prebuilt ones
at run time never imports ``cutlass``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RoutingConfig", "MODES", "E_PADS", "FINALIZE_VECS", "ROUTE_MODES"]

#: ``single``: the whole preparation in one CTA (up to SMALL_ROUTES routes); ``hist`` + ``place``: the
#: two-kernel path over P CTAs; ``masked``: the masked (DeepEP low-latency) layout; ``finalize``: the
#: deterministic top-k combine; ``pad``: the zero-padded copy of a padded plan's activations.
MODES = ("single", "hist", "place", "masked", "finalize", "pad")
ROUTE_MODES = ("single", "hist", "place")
#: shared-memory table sizes of the route modes (entries; at least num_experts + 1)
E_PADS = (64, 128, 256, 512, 1024)
#: columns per thread of the finalize and the pad copy (8: 16-byte accesses, needs row widths % 8 == 0 and 16-byte
#: aligned rows)
FINALIZE_VECS = (8, 1)


@dataclass(frozen=True)
class RoutingConfig:
    """Static configuration of one compiled kernel (every field shapes the generated code; fields a mode
    does not use keep their defaults, so each kernel has exactly one spec)."""

    mode: str = "single"
    ids: str = "int32"  # dtype of topk_ids: "int32" | "int64" (route modes; finalize with from_mask=False)
    e_pad: int = 256  # route modes: shared-memory table entries (>= num_experts + 1); hist row width
    dtype: str = "bf16"  # finalize: dtype of ybuf / out ("bf16" | "fp16")
    from_mask: bool = False  # finalize: validity from a uint8 mask [T, k] instead of the ids
    vec: int = 8  # finalize / pad: columns per thread
    warps: int = 8  # warps per CTA
    pdl: bool = True  # programmatic dependent launch (griddepcontrol; SM90 and later)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {self.mode!r}")
        if self.ids not in ("int32", "int64"):
            raise ValueError(f"ids: expected 'int32' or 'int64', got {self.ids!r}")
        if self.dtype not in ("bf16", "fp16"):
            raise ValueError(f"dtype: expected 'bf16' or 'fp16', got {self.dtype!r}")
        if self.e_pad not in E_PADS:
            raise ValueError(f"e_pad: expected one of {E_PADS}, got {self.e_pad}")
        if self.vec not in FINALIZE_VECS:
            raise ValueError(f"vec: expected one of {FINALIZE_VECS}, got {self.vec}")
        if self.warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"warps: expected 1, 2, 4, 8, 16 or 32, got {self.warps}")

    def name(self) -> str:
        pdl = "_pdl" if self.pdl else ""
        if self.mode == "finalize":
            src = "mask" if self.from_mask else self.ids
            return f"route_finalize_{self.dtype}_{src}_v{self.vec}_w{self.warps}{pdl}"
        if self.mode == "masked":
            return f"route_masked_w{self.warps}{pdl}"
        if self.mode == "pad":
            return f"pad_copy_v{self.vec}_w{self.warps}{pdl}"
        return f"route_{self.mode}_{self.ids}_e{self.e_pad}_w{self.warps}{pdl}"

"""Expert activations: names, whether they are gated, and their FP32 definitions.

Gated activations read ``h = x @ w13.T`` of width ``2I`` as ``gate = h[:, :I]``, ``up = h[:, I:]``:

* ``swiglu``: ``silu(gate) * up``
* ``geglu``:  ``gelu(gate) * up`` (exact erf GELU)

Non-gated activations read ``h`` of width ``I``:

* ``relu2``: ``relu(h) ** 2``
* ``silu``:  ``silu(h)``
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Activation", "ACTIVATIONS", "get_activation", "apply_activation"]


@dataclass(frozen=True)
class Activation:
    name: str
    gated: bool
    code: int  # stable small integer used by kernels


ACTIVATIONS = {
    "swiglu": Activation("swiglu", True, 0),
    "geglu": Activation("geglu", True, 1),
    "relu2": Activation("relu2", False, 2),
    "silu": Activation("silu", False, 3),
}


def get_activation(name: "str | Activation") -> Activation:
    if isinstance(name, Activation):
        return name
    if not isinstance(name, str):
        raise TypeError(f"activation: expected a str, got {type(name).__name__}")
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"activation: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}"
        ) from None


def apply_activation(h: torch.Tensor, activation: "str | Activation") -> torch.Tensor:
    """Activation of ``h`` (``[..., 2I]`` when gated, ``[..., I]`` otherwise) in FP32, or FP64 for FP64 input."""
    act = get_activation(activation)
    h = h if h.dtype == torch.float64 else h.float()
    if act.gated:
        i = h.shape[-1] // 2
        gate, up = h[..., :i], h[..., i:]
        if act.name == "swiglu":
            return torch.nn.functional.silu(gate) * up
        return torch.nn.functional.gelu(gate) * up
    if act.name == "relu2":
        return torch.relu(h).square()
    return torch.nn.functional.silu(h)

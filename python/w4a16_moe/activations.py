"""Expert activations: names, whether they are gated, and their FP32 definitions.

Gated activations read ``h = x @ w13.T`` of width ``2I`` as ``gate = h[:, :I]``, ``up = h[:, I:]``:

* ``swiglu``: ``silu(gate) * up``
* ``geglu``:  ``gelu(gate) * up`` (exact erf GELU)
* ``swiglu_oai`` (gpt-oss): ``g = min(gate, limit)``, ``u = clamp(up, -limit, limit)``,
  ``g * sigmoid(alpha * g) * (u + 1)``; ``alpha = 1.702`` and ``limit = 7.0`` unless given as
  ``"swiglu_oai(alpha=1.5,limit=10.0)"``. The canonical string form (what :attr:`Activation.name`
  holds and the torch ops carry) is ``"swiglu_oai"`` for the defaults, else
  ``"swiglu_oai(alpha=A,limit=L)"`` with both values in Python's shortest ``repr`` form.

Non-gated activations read ``h`` of width ``I``:

* ``relu2``: ``relu(h) ** 2``
* ``silu``:  ``silu(h)``
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["Activation", "ACTIVATIONS", "get_activation", "apply_activation", "swiglu_oai"]

OAI_ALPHA = 1.702
OAI_LIMIT = 7.0


@dataclass(frozen=True)
class Activation:
    """One activation: ``name`` is its canonical string (parameters included), ``kind`` its family."""

    name: str
    gated: bool
    code: int  # stable small integer used by kernels
    kind: str = ""
    alpha: Optional[float] = None
    limit: Optional[float] = None

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", self.name)


ACTIVATIONS = {
    "swiglu": Activation("swiglu", True, 0),
    "geglu": Activation("geglu", True, 1),
    "relu2": Activation("relu2", False, 2),
    "silu": Activation("silu", False, 3),
    "swiglu_oai": Activation("swiglu_oai", True, 4, "swiglu_oai", OAI_ALPHA, OAI_LIMIT),
}

_OAI_RE = re.compile(r"^swiglu_oai\((.*)\)$")


def swiglu_oai(alpha: float = OAI_ALPHA, limit: float = OAI_LIMIT) -> Activation:
    """The gpt-oss activation with ``alpha`` and ``limit`` (finite, positive); its ``name`` is canonical."""
    for arg, v in (("alpha", alpha), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"activation: swiglu_oai {arg} must be a finite positive number, got {v!r}")
    alpha, limit = float(alpha), float(limit)
    if alpha == OAI_ALPHA and limit == OAI_LIMIT:
        return ACTIVATIONS["swiglu_oai"]
    return Activation(f"swiglu_oai(alpha={alpha!r},limit={limit!r})", True, 4, "swiglu_oai", alpha, limit)


def _parse_oai(name: str) -> Activation:
    body = _OAI_RE.match(name.replace(" ", ""))
    if body is None:
        raise ValueError(f"activation: cannot parse {name!r}; expected 'swiglu_oai(alpha=A,limit=L)'")
    params: dict[str, float] = {}
    for part in filter(None, body.group(1).split(",")):
        key, sep, val = part.partition("=")
        if not sep or key not in ("alpha", "limit") or key in params:
            raise ValueError(
                f"activation: {name!r}: expected parameters alpha=... and/or limit=... (each once), got {part!r}"
            )
        try:
            params[key] = float(val)
        except ValueError:
            raise ValueError(f"activation: {name!r}: {key} must be a number, got {val!r}") from None
    return swiglu_oai(**params)


def get_activation(name: "str | Activation") -> Activation:
    """The :class:`Activation` for a name (``"swiglu"``, ``"swiglu_oai(alpha=1.702,limit=7.0)"``, ...)."""
    if isinstance(name, Activation):
        return name
    if not isinstance(name, str):
        raise TypeError(f"activation: expected a str, got {type(name).__name__}")
    act = ACTIVATIONS.get(name)
    if act is not None:
        return act
    if name.startswith("swiglu_oai("):
        return _parse_oai(name)
    raise ValueError(
        f"activation: unknown activation {name!r}; known: {', '.join(ACTIVATIONS)} "
        f"(and 'swiglu_oai(alpha=A,limit=L)')"
    ) from None


def apply_activation(h: torch.Tensor, activation: "str | Activation") -> torch.Tensor:
    """Activation of ``h`` (``[..., 2I]`` when gated, ``[..., I]`` otherwise) in FP32, or FP64 for FP64 input."""
    act = get_activation(activation)
    h = h if h.dtype == torch.float64 else h.float()
    if act.gated:
        i = h.shape[-1] // 2
        gate, up = h[..., :i], h[..., i:]
        if act.kind == "swiglu":
            return torch.nn.functional.silu(gate) * up
        if act.kind == "swiglu_oai":
            g = gate.clamp(max=act.limit)
            u = up.clamp(-act.limit, act.limit)
            return g * torch.sigmoid(act.alpha * g) * (u + 1)
        return torch.nn.functional.gelu(gate) * up
    if act.kind == "relu2":
        return torch.relu(h).square()
    return torch.nn.functional.silu(h)

"""Providers (CuTe, Triton, reference) and the rules that pick one for a call.

``backend=`` on a call, or the environment variable ``W4A16_MOE_BACKEND`` when the call says
``"auto"``, chooses among ``auto | cute | triton | reference``:

* ``auto``: CuTe when the device, scheme, dtype, shapes and kernel availability allow it, else Triton;
  without a usable GPU it raises (use ``backend="reference"`` or :func:`w4a16_moe.reference_moe`).
* ``cute``: strict; raises ``ProviderUnavailable`` naming the unmet condition.
* ``triton``: always Triton (raises only if Triton itself cannot run there).
* ``reference``: the FP32 reference on any device, cast to x's dtype.

Every decision is logged on the ``w4a16_moe`` logger (``W4A16_MOE_LOG=info`` shows them).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from typing import Optional, Union

from . import settings
from .device import DeviceInfo, probe
from .log import logger
from .validate import MaskedCall, MoECall

__all__ = [
    "BACKENDS",
    "Decision",
    "ProviderUnavailable",
    "resolve_backend",
    "select_provider",
    "triton_unavailable_reason",
    "cute_unavailable_reason",
]

BACKENDS = ("auto", "cute", "triton", "reference")
Call = Union[MoECall, MaskedCall]


class ProviderUnavailable(RuntimeError):
    """The requested provider cannot run this call; the message names the unmet condition."""


@dataclass(frozen=True)
class Decision:
    provider: str
    reason: str
    rejected: dict = field(default_factory=dict)  # provider -> why not


def resolve_backend(backend: object) -> str:
    """Apply ``W4A16_MOE_BACKEND`` when the call says ``"auto"``; validate the name."""
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return settings.get().backend
    return backend


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_unavailable_reason(call: Call, info: DeviceInfo) -> Optional[str]:
    """Why the Triton provider cannot run ``call`` on ``info`` (``None`` when it can)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    if info.type == "cpu" and _interpreting():
        return None  # TRITON_INTERPRET=1: Triton's CPU interpreter (tests, small shapes)
    if not info.is_cuda:
        return f"device {info.type} is not a CUDA GPU"
    if info.capability < (8, 0):
        return f"compute capability {info.capability[0]}.{info.capability[1]} is below 8.0"
    return None


def cute_unavailable_reason(call: Call, info: DeviceInfo) -> Optional[str]:
    """Why the CuTe provider cannot run ``call`` on ``info`` (``None`` when it can)."""
    from .kernels.cute.provider import unavailable_reason

    return unavailable_reason(call, info)


def select_provider(call: Call, backend: str, info: Optional[DeviceInfo] = None) -> Decision:
    """Pick the provider for ``call`` under ``backend`` (already resolved by :func:`resolve_backend`)."""
    info = info if info is not None else probe(call.device)
    op = "fused_moe_masked" if isinstance(call, MaskedCall) else "fused_moe"
    if backend == "reference":
        return _log(Decision("reference", "requested"), call)
    if backend == "triton":
        why = triton_unavailable_reason(call, info)
        if why:
            raise ProviderUnavailable(f"backend='triton' cannot run {op}: {why}")
        return _log(Decision("triton", "requested"), call)
    if backend == "cute":
        why = cute_unavailable_reason(call, info)
        if why:
            raise ProviderUnavailable(f"backend='cute' cannot run {op}: {why}")
        return _log(Decision("cute", "requested"), call)
    rejected = {}
    why_cute = cute_unavailable_reason(call, info)
    if why_cute is None:
        return _log(Decision("cute", "auto: CuTe covers this case"), call)
    rejected["cute"] = why_cute
    why_triton = triton_unavailable_reason(call, info)
    if why_triton is None:
        return _log(Decision("triton", f"auto: CuTe unavailable ({why_cute})", rejected), call)
    rejected["triton"] = why_triton
    hint = "use w4a16_moe.reference_moe or backend='reference' for the FP32 reference on any device"
    if not info.is_cuda:
        raise ProviderUnavailable(f"{op} needs a CUDA GPU, but the tensors are on {info.type}; {hint}")
    raise ProviderUnavailable(f"{op}: no provider can run on {info.name} (CuTe: {why_cute}; Triton: {why_triton}); {hint}")


def _log(decision: Decision, call: Call) -> Decision:
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "provider %s for %s (%s, %s, %s): %s",
            decision.provider, type(call).__name__, call.scheme, str(call.dtype).replace("torch.", ""),
            call.activation.name, decision.reason,
        )
    return decision

"""Providers (CuTe, Triton, reference) and the rules that pick one for a call.

``backend=`` on a call, or the environment variable ``W4A16_MOE_BACKEND`` when the call says
``"auto"``, chooses among ``auto | cute | triton | reference``:

* ``auto``: CuTe when the device, scheme, dtype, shapes and kernel availability allow it, else Triton;
  without a usable GPU it raises (use ``backend="reference"`` or :func:`w4a16_moe.reference_moe`).
* ``cute``: strict; raises ``ProviderUnavailable`` naming the unmet condition.
* ``triton``: always Triton (raises only if Triton itself cannot run there).
* ``reference``: the FP32 reference on any device, cast to x's dtype.

Every provider is an object with one interface (:class:`Provider`): ``unavailable_reason(call, info)``,
``plan(call, info)`` (a :class:`~w4a16_moe.plan.Plan`, cached per call shape) and ``run`` / ``run_masked`` /
``expert_routes`` executing a plan; :data:`PROVIDERS` lists them. Every decision is logged on the
``w4a16_moe`` logger with its plan (``W4A16_MOE_LOG=info`` shows them).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Optional, Protocol, Union

from . import settings
from .device import DeviceInfo, probe
from .log import logger
from .plan import Decision, Plan
from .validate import MaskedCall, MoECall

__all__ = [
    "BACKENDS",
    "Decision",
    "Plan",
    "Provider",
    "PROVIDERS",
    "get_provider",
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


class Provider(Protocol):
    """One provider: why it cannot run a call, the plan of a call it can run, and the execution of a plan.
    ``run*`` take validated arguments and the call's description (``call``)."""

    name: str

    def unavailable_reason(self, call: Call, info: DeviceInfo) -> Optional[str]: ...

    def plan(self, call: Call, info: DeviceInfo) -> Plan: ...

    def run(self, plan: Plan, call: MoECall, x, weights, topk_weights, topk_ids, out) -> None: ...

    def run_masked(self, plan: Plan, call: MaskedCall, x, weights, masked_m, out) -> None: ...

    def expert_routes(self, plan: Plan, call: MoECall, x, weights, local_ids) -> tuple: ...


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
    return get_provider("cute").unavailable_reason(call, info)


class TritonProvider:
    """The Triton provider (:mod:`w4a16_moe.kernels.triton`): its own tile table, chosen per launch."""

    name = "triton"

    def unavailable_reason(self, call, info):
        return triton_unavailable_reason(call, info)

    def plan(self, call, info):
        return Plan("triton")

    def run(self, plan, call, x, weights, topk_weights, topk_ids, out):
        from .kernels.triton.moe import triton_fused_moe

        triton_fused_moe(x, weights, topk_weights, topk_ids, activation=call.activation.name,
                         finalize=call.finalize, expert_offset=call.expert_offset, out=out)

    def run_masked(self, plan, call, x, weights, masked_m, out):
        from .kernels.triton.moe import triton_fused_moe_masked

        triton_fused_moe_masked(x, weights, masked_m, activation=call.activation.name, out=out)

    def expert_routes(self, plan, call, x, weights, local_ids):
        from .kernels.triton.moe import triton_expert_routes

        return triton_expert_routes(x, weights, local_ids, activation=call.activation.name)


class ReferenceProvider:
    """The FP32 reference (:mod:`w4a16_moe.reference`) on any device, cast to x's dtype."""

    name = "reference"

    def unavailable_reason(self, call, info):
        return None

    def plan(self, call, info):
        return Plan("reference", note="FP32, any device")

    def run(self, plan, call, x, weights, topk_weights, topk_ids, out):
        from .reference import combine_routes, reference_routes

        y, valid = reference_routes(x, weights, topk_ids, activation=call.activation.name,
                                    expert_offset=call.expert_offset)
        out.copy_(combine_routes(y, topk_weights, valid))

    def run_masked(self, plan, call, x, weights, masked_m, out):
        from .reference import reference_masked

        out.copy_(reference_masked(call, x, weights, masked_m))

    def expert_routes(self, plan, call, x, weights, local_ids):
        from .reference import reference_routes

        return reference_routes(x, weights, local_ids, activation=call.activation.name)


_PROVIDERS: dict = {}


def get_provider(name: str) -> Provider:
    """The provider object named ``name`` (``cute``, ``triton``, ``reference``)."""
    p = _PROVIDERS.get(name)
    if p is None:
        if name == "cute":
            from .kernels.cute.provider import PROVIDER as p
        elif name == "triton":
            p = TritonProvider()
        elif name == "reference":
            p = ReferenceProvider()
        else:
            raise ValueError(f"unknown provider {name!r}; expected one of {BACKENDS[1:]}")
        _PROVIDERS[name] = p
    return p


class _Providers(dict):
    """``PROVIDERS[name]``: the provider objects, created on first use."""

    def __missing__(self, name):
        return get_provider(name)


PROVIDERS = _Providers()


def select_provider(call: Call, backend: str, info: Optional[DeviceInfo] = None) -> Decision:
    """Pick the provider for ``call`` under ``backend`` (already resolved by :func:`resolve_backend`); the
    decision carries that provider's plan of the call."""
    info = info if info is not None else probe(call.device)
    op = "fused_moe_masked" if isinstance(call, MaskedCall) else "fused_moe"
    if backend in ("reference", "triton", "cute"):
        prov = get_provider(backend)
        why = prov.unavailable_reason(call, info)
        if why:
            raise ProviderUnavailable(f"backend={backend!r} cannot run {op}: {why}")
        return _log(Decision(backend, "requested", {}, prov.plan(call, info)), call)
    rejected = {}
    cute = get_provider("cute")
    why_cute = cute.unavailable_reason(call, info)
    if why_cute is None:
        return _log(Decision("cute", "auto: CuTe covers this case", {}, cute.plan(call, info)), call)
    rejected["cute"] = why_cute
    triton = get_provider("triton")
    why_triton = triton.unavailable_reason(call, info)
    if why_triton is None:
        return _log(Decision("triton", f"auto: CuTe unavailable ({why_cute})", rejected, triton.plan(call, info)),
                    call)
    rejected["triton"] = why_triton
    hint = "use w4a16_moe.reference_moe or backend='reference' for the FP32 reference on any device"
    if not info.is_cuda:
        raise ProviderUnavailable(f"{op} needs a CUDA GPU, but the tensors are on {info.type}; {hint}")
    raise ProviderUnavailable(f"{op}: no provider can run on {info.name} (CuTe: {why_cute}; Triton: {why_triton}); {hint}")


def _log(decision: Decision, call: Call) -> Decision:
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "provider %s for %s (%s, %s, %s%s): %s; plan: %s",
            decision.provider, type(call).__name__, call.scheme, str(call.dtype).replace("torch.", ""),
            call.activation.name,
            f", {call.experts} of {call.global_experts} experts" if getattr(call, "global_experts", None) else "",
            decision.reason, decision.plan.describe() if decision.plan else "none",
        )
    return decision

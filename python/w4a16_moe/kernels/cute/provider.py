"""The CuTe DSL provider: which calls its kernels cover, and how a call is launched.

The SM90 kernel family is being built (see the CuTe issue); until its kernels are available through
the loader, every call reports the reason below and ``auto`` selects Triton.
"""

from __future__ import annotations

from typing import Optional

from ...device import DeviceInfo

__all__ = ["unavailable_reason"]


def unavailable_reason(call, info: DeviceInfo) -> Optional[str]:
    if not info.is_cuda:
        return f"device {info.type} is not a CUDA GPU"
    if info.capability[0] != 9:
        return f"no CuTe kernel family for {info.arch} (SM90 only)"
    return "no CuTe kernels are built into this version"

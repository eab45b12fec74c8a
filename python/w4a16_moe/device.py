"""What device a call runs on, in the terms provider selection needs.

:func:`probe` is the single place the package asks the driver about a GPU; tests replace it with
a mock to exercise provider selection for machines they do not have (no GPU, SM80, SM90, SM100).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from .archs import DEFAULT_SM_COUNT, arch_of_capability

__all__ = ["DeviceInfo", "probe", "arch_name"]


@dataclass(frozen=True)
class DeviceInfo:
    """A device as provider selection sees it.

    Attributes:
        type: ``"cuda"``, ``"cpu"``, ... (``torch.device.type``).
        name: marketing name (``"NVIDIA H200"``), or the type for non-CUDA devices.
        capability: ``(major, minor)`` compute capability for CUDA devices, else ``None``.
        sm_count: number of streaming multiprocessors (CUDA only).
    """

    type: str
    name: str
    capability: Optional[tuple[int, int]] = None
    sm_count: Optional[int] = None

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda" and self.capability is not None

    @property
    def sms(self) -> int:
        """SM count that kernel selection targets (split-K): the device's, else :data:`DEFAULT_SM_COUNT`
        (an H100 / H200 SXM: a description without a device, e.g. in the tuner's unit tests)."""
        return self.sm_count or DEFAULT_SM_COUNT

    @property
    def arch(self) -> Optional[str]:
        """The compile target name: ``sm_90a`` / ``sm_100a`` (arch-specific features) or ``sm_80``."""
        return arch_name(self.capability) if self.capability else None


def arch_name(capability: tuple[int, int]) -> str:
    return arch_of_capability(*capability)


@functools.lru_cache(maxsize=None)
def _probe_cuda(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo("cuda", props.name, (props.major, props.minor), props.multi_processor_count)


def probe(device: "torch.device | str") -> DeviceInfo:
    """Describe ``device`` (cached per CUDA device index; never touches device memory)."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return _probe_cuda(index)
    return DeviceInfo(dev.type, dev.type)

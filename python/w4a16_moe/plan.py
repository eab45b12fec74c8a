"""The plan of one call: what a provider decided to run, computed once per call shape and then executed.

:func:`w4a16_moe.providers.select_provider` returns a :class:`Decision` carrying the chosen provider's
:class:`Plan`; the provider's ``run`` executes it without selecting anything again. Plans depend only on the
call's static description (:class:`~w4a16_moe.validate.MoECall` / ``MaskedCall``), the device, the settings
and the selection overrides, so providers cache them by that key (no device memory is read, nothing syncs).
``python -m w4a16_moe doctor`` and ``W4A16_MOE_LOG=info`` print :meth:`Plan.describe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["Plan", "Decision"]


@dataclass(frozen=True)
class Plan:
    """What one call runs.

    Attributes:
        provider: ``"cute"``, ``"triton"`` or ``"reference"``.
        family: the CuTe kernel family (``"sm90"``, ``"warp"``, ``"decode"``); None for other providers.
        arch: the arch its kernels are built for.
        decode: the route-major decode kernels run the call (no route preparation, no finalize pass).
        tiles: the tile parameters (sorted items of the family's tile dict; the decode knobs for ``decode``).
        splits: split-K parts of the (gate_up, down) GEMMs; decode: the K split of each decode kernel over
            CTAs (1: none).
        configs: the (gate_up, down) kernel configs.
        specs: their kernel spec names.
        max_tiles: an upper bound on the token tiles of any routing: grid y of the grouped GEMMs, and what their
            split-K scratch is sized for.
        grid_tiles: grid y of the grouped GEMMs whose kernels loop over token tiles (``tile_loop``), at most
            ``max_tiles`` (0: ``max_tiles``).
        counters: split-K tile counters the route preparation zeroes (decode: the arrival counters its
            split kernels use, in the provider's per-device scratch).
        note: anything else selection decided (e.g. the tuned row it used).
        pad: ``(Hp, Ip)``, the padded hidden and intermediate sizes the CuTe kernels run when the layer's
            ``(H, I)`` are not multiples of their tiles (:mod:`w4a16_moe.kernels.cute.padding`); ``()``
            when the layer runs unpadded.
    """

    provider: str
    family: Optional[str] = None
    arch: Optional[str] = None
    decode: bool = False
    tiles: tuple = ()
    splits: tuple = (1, 1)
    configs: tuple = ()
    specs: tuple = ()
    max_tiles: int = 0
    grid_tiles: int = 0
    counters: int = 0
    note: str = ""
    pad: tuple = ()

    def describe(self) -> str:
        """One line for logs and ``doctor``."""
        if self.family is None:
            return f"provider {self.provider}" + (f" ({self.note})" if self.note else "")
        tiles = ", ".join(f"{k}={v}" for k, v in self.tiles)
        names = " + ".join(c.name() for c in self.configs)
        return (f"provider {self.provider}, family {self.family} ({self.arch}){', decode' if self.decode else ''}: "
                f"{'knobs' if self.decode else 'tiles'} {{{tiles}}}, {'K split' if self.decode else 'split-K'} "
                f"{self.splits[0]}/{self.splits[1]}, kernels {names}"
                + (f", grid y {self.grid_tiles} of {self.max_tiles} token tiles" if 0 < self.grid_tiles < self.max_tiles
                   else "")
                + (f", padded to H {self.pad[0]}, I {self.pad[1]}" if self.pad else "")
                + (f" ({self.note})" if self.note else ""))


@dataclass(frozen=True)
class Decision:
    """The provider chosen for a call, why, what the others said, and its :class:`Plan`."""

    provider: str
    reason: str
    rejected: dict = field(default_factory=dict)  # provider -> why not
    plan: Optional[Plan] = None

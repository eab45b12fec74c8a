"""The 4-bit weight schemes w4a16-moe understands.

A *scheme* says how one 4-bit weight code and its scale(s) turn into a real number. Every scheme
stores a matrix ``W[N, K]`` (``N`` output rows, ``K`` the reduction dimension) as 4-bit codes plus
one scale per group of ``group_size`` consecutive values along ``K``:

==================  =============  ==========================  =====================================
scheme              code meaning   scale (per group along K)   exact dequantization (FP32)
==================  =============  ==========================  =====================================
``int4_g{32,64,128}``  unsigned 0..15, q + 8   BF16/FP16/FP32      ``(code - 8) * scale``
``int4_g{..}_zp``   unsigned 0..15  BF16/FP16/FP32, zero uint8  ``(code - zero) * scale``
``int4_channel``    unsigned 0..15  one per row (group = K)     ``(code - 8) * scale``
``nvfp4``           E2M1            FP8 E4M3 per 16, FP32 per   ``e2m1(code) * e4m3(scale) * global``
                                    row global
``mxfp4``           E2M1            E8M0 per 32                 ``e2m1(code) * 2**(scale - 127)``
==================  =============  ==========================  =====================================

The byte layout of the stored tensors is documented in :mod:`w4a16_moe.formats.weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Scheme", "SCHEMES", "get_scheme", "scheme_names"]


@dataclass(frozen=True)
class Scheme:
    """Static description of one 4-bit weight format.

    Attributes:
        name: the public name, e.g. ``"int4_g32"``.
        kind: ``"int4"``, ``"nvfp4"`` or ``"mxfp4"``: how a code maps to a value.
        group_size: values along K sharing one scale; ``None`` means one scale per output row.
        zero_point: whether each group also stores a 4-bit zero point (asymmetric INT4).
    """

    name: str
    kind: str
    group_size: Optional[int]
    zero_point: bool = False

    @property
    def is_int4(self) -> bool:
        return self.kind == "int4"

    @property
    def is_fp4(self) -> bool:
        return self.kind in ("nvfp4", "mxfp4")

    @property
    def per_channel(self) -> bool:
        return self.group_size is None

    @property
    def has_global_scale(self) -> bool:
        return self.kind == "nvfp4"

    def group_for(self, k: int) -> int:
        """Group size used for a matrix with reduction size ``k`` (``k`` itself when per channel)."""
        return k if self.group_size is None else self.group_size

    def min_k_multiple(self) -> int:
        """The multiple of K every matrix of this scheme must have (groups and whole int32 words)."""
        return 8 if self.group_size is None else max(self.group_size, 8)

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.name


def _build() -> dict[str, Scheme]:
    table: dict[str, Scheme] = {}
    for g in (32, 64, 128):
        table[f"int4_g{g}"] = Scheme(f"int4_g{g}", "int4", g)
        table[f"int4_g{g}_zp"] = Scheme(f"int4_g{g}_zp", "int4", g, zero_point=True)
    table["int4_channel"] = Scheme("int4_channel", "int4", None)
    table["nvfp4"] = Scheme("nvfp4", "nvfp4", 16)
    table["mxfp4"] = Scheme("mxfp4", "mxfp4", 32)
    return table


SCHEMES: dict[str, Scheme] = _build()


def scheme_names() -> list[str]:
    return list(SCHEMES)


def get_scheme(scheme: "str | Scheme") -> Scheme:
    """Return the :class:`Scheme` for a name (or pass a Scheme through).

    Raises:
        TypeError: if ``scheme`` is neither a str nor a Scheme.
        ValueError: naming the known schemes if the name is unknown.
    """
    if isinstance(scheme, Scheme):
        return scheme
    if not isinstance(scheme, str):
        raise TypeError(f"scheme: expected a scheme name (str), got {type(scheme).__name__}")
    try:
        return SCHEMES[scheme]
    except KeyError:
        raise ValueError(
            f"scheme: unknown scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}"
        ) from None

"""Quantized expert weights: the canonical storage every provider starts from.

Byte layout of one :class:`QuantizedMatrix` holding ``E`` experts of ``W[N, K]`` (``N`` output rows,
``K`` the reduction dimension, ``g`` the scheme's group size, ``g = K`` for per-channel):

``codes``  uint8 ``[E, N, K/2]``, contiguous. Element ``(n, k)`` is the low nibble of byte ``k // 2``
           when ``k`` is even and the high nibble when ``k`` is odd. Read as little-endian int32 words
           this is exactly compressed-tensors ``pack-quantized`` (eight codes per word along K, the
           first in bits 0..3).
``scales`` ``[E, N, K/g]``: BF16/FP16/FP32 for INT4 schemes, ``torch.float8_e4m3fn`` for NVFP4 (one per
           16 values), uint8 E8M0 exponents for MXFP4 (one per 32 values).
``zeros``  uint8 ``[E, N, K/g]`` zero-point codes 0..15, INT4 ``*_zp`` schemes only.
``global_scale`` FP32 ``[E, N]``, NVFP4 only: the per-expert, per-matrix ModelOpt ``weight_scale_2``,
           stored per output row so the gate and up halves of a fused ``w13`` may differ.

``w13_perm`` int32 ``[E, H]`` (optional; GPTQ act order over the hidden size): column ``j`` of expert ``e``'s
           stored ``w13`` multiplies ``x[:, w13_perm[e, j]]``, i.e. the layer computes ``w13_e @ x[w13_perm[e]]``.
           The torch ops gather ``x`` once per route (:mod:`w4a16_moe.ops`), so no provider reads it.

A provider that prefers another layout (a permuted one for register-side dequantization, say)
derives it once with :meth:`MoEWeights.packed_for` and keeps it cached beside the canonical tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch

from .schemes import Scheme, get_scheme

__all__ = ["QuantizedMatrix", "MoEWeights", "pack_nibbles", "unpack_nibbles", "check_w13_perm",
           "check_w13_perm_values"]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Pack uint8 codes ``[..., K]`` (values 0..15) into bytes ``[..., K/2]``, even index in the low nibble."""
    c = codes.to(torch.uint8)
    return ((c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: bytes ``[..., K/2]`` to uint8 codes ``[..., K]``."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


@dataclass
class QuantizedMatrix:
    """One stacked expert matrix ``W[E, N, K]`` in a scheme's canonical layout (see module docstring)."""

    scheme: Scheme
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor] = None
    global_scale: Optional[torch.Tensor] = None

    @property
    def num_experts(self) -> int:
        return self.codes.shape[0]

    @property
    def n(self) -> int:
        return self.codes.shape[1]

    @property
    def k(self) -> int:
        return self.codes.shape[2] * 2

    @property
    def group_size(self) -> int:
        return self.scheme.group_for(self.k)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def tensors(self) -> dict[str, Optional[torch.Tensor]]:
        return {
            "codes": self.codes,
            "scales": self.scales,
            "zeros": self.zeros,
            "global_scale": self.global_scale,
        }

    def nbytes(self, experts: Optional[int] = None) -> int:
        """Bytes of codes, scales, zero points and global scales for ``experts`` experts (default all)."""
        total = 0
        for t in self.tensors().values():
            if t is not None:
                total += t.numel() * t.element_size()
        if experts is None:
            return total
        return total * experts // self.num_experts

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "QuantizedMatrix":
        return replace(
            self,
            codes=fn(self.codes),
            scales=fn(self.scales),
            zeros=None if self.zeros is None else fn(self.zeros),
            global_scale=None if self.global_scale is None else fn(self.global_scale),
        )

    def validate(self, name: str) -> None:
        """Check dtypes, shapes and contiguity; raise ValueError/TypeError naming ``name``."""
        sch = self.scheme
        c = self.codes
        if not isinstance(c, torch.Tensor) or c.dtype != torch.uint8 or c.dim() != 3:
            raise TypeError(f"{name}.codes: expected a uint8 tensor [E, N, K/2], got {_describe(c)}")
        e, n, k = self.num_experts, self.n, self.k
        mult = sch.min_k_multiple()
        if k % mult:
            raise ValueError(f"{name}: reduction size {k} is not a multiple of {mult} (scheme {sch.name})")
        g = self.group_size
        want = (e, n, k // g)
        s = self.scales
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != want:
            raise ValueError(f"{name}.scales: expected shape {want}, got {_describe(s)}")
        if sch.kind == "int4" and s.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"{name}.scales: INT4 scales must be bfloat16, float16 or float32, got {s.dtype}")
        if sch.kind == "nvfp4" and s.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name}.scales: NVFP4 scales must be float8_e4m3fn, got {s.dtype}")
        if sch.kind == "mxfp4" and s.dtype != torch.uint8:
            raise TypeError(f"{name}.scales: MXFP4 scales must be uint8 E8M0 exponents, got {s.dtype}")
        if sch.zero_point:
            z = self.zeros
            if not isinstance(z, torch.Tensor) or z.dtype != torch.uint8 or tuple(z.shape) != want:
                raise ValueError(f"{name}.zeros: expected uint8 {want}, got {_describe(z)}")
        elif self.zeros is not None:
            raise ValueError(f"{name}.zeros: scheme {sch.name} has no zero points, got a tensor")
        if sch.has_global_scale:
            gs = self.global_scale
            if not isinstance(gs, torch.Tensor) or gs.dtype != torch.float32 or tuple(gs.shape) != (e, n):
                raise ValueError(f"{name}.global_scale: expected float32 {(e, n)}, got {_describe(gs)}")
        elif self.global_scale is not None:
            raise ValueError(f"{name}.global_scale: scheme {sch.name} has no global scale, got a tensor")
        for key, t in self.tensors().items():
            if t is None:
                continue
            if t.device != c.device:
                raise ValueError(f"{name}.{key}: on {t.device}, but codes are on {c.device}")
            if not t.is_contiguous():
                raise ValueError(f"{name}.{key}: must be contiguous")


def layout_cache(anchor: torch.Tensor) -> dict:
    """The dict of derived layouts attached to ``anchor`` (created on first use)."""
    cache = getattr(anchor, "_w4a16_layouts", None)
    if cache is None:
        cache = {}
        anchor._w4a16_layouts = cache
    return cache


def _tensors(value: Any):
    """Yield the tensors reachable from ``value`` (tensors, dataclasses, sequences, dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name))
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _tensor_bytes(value: Any, skip: set) -> int:
    """Bytes of the distinct tensor storages reachable from ``value``, less those whose storage is in ``skip``."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors(value)}
    return sum(n for ptr, n in storages.items() if ptr not in skip)


def _describe(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)}"
    return type(t).__name__


_BIAS_DTYPES = (torch.float32, torch.bfloat16)


def check_w13_perm(perm: Any, num_experts: int, hidden: int, device: torch.device) -> None:
    """Metadata rules of ``w13_perm`` (int32 ``[E, H]``, contiguous, on w13's device); reads no values."""
    if not isinstance(perm, torch.Tensor) or perm.dtype != torch.int32 or tuple(perm.shape) != (num_experts, hidden):
        raise ValueError(f"w13_perm: expected an int32 tensor of shape {(num_experts, hidden)} ([E, H]: per expert, "
                         f"the input channel of each stored w13 column), got {_describe(perm)}")
    if perm.device != device:
        raise ValueError(f"w13_perm: on {perm.device}, but w13 is on {device}")
    if not perm.is_contiguous():
        raise ValueError("w13_perm: must be contiguous")


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return t.device.type == "meta" or is_fake(t)


def check_w13_perm_values(perm: torch.Tensor) -> None:
    """Every row of ``w13_perm [E, H]`` must be a permutation of ``0 .. H-1`` (reads the values: a device sync;
    fake / meta tensors are skipped)."""
    if _is_fake(perm):
        return
    h = perm.shape[1]
    want = torch.arange(h, device=perm.device, dtype=perm.dtype)
    bad = (torch.sort(perm, dim=1).values != want).any(dim=1)
    if bool(bad.any()):
        e = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"w13_perm: row {e} (expert {e}) is not a permutation of 0..{h - 1} (each row must hold "
                         "every input channel exactly once)")


@dataclass(repr=False)
class MoEWeights:
    """Quantized weights of one MoE layer's experts.

    ``w13`` holds ``[E, 2I, H]`` (gate rows ``0..I-1``, then up rows) when ``gated``, else ``[E, I, H]``;
    ``w2`` holds ``[E, H, I]``. Optional per-expert biases (gpt-oss): ``w13_bias [E, 2I|I]`` (same row
    order as ``w13``) and ``w2_bias [E, H]``, FP32 or BF16, added after each GEMM. Optional ``w13_perm``
    int32 ``[E, H]`` (int64 accepted, stored as int32): GPTQ act order over the hidden size, each row a
    permutation of ``0..H-1``; expert ``e`` computes ``w13_e @ x[w13_perm[e]]`` (see the module docstring).
    Build it with :func:`w4a16_moe.quantize_experts`, :func:`w4a16_moe.load_experts` or one of the ``from_*``
    converters; every provider reads it through :meth:`packed_for`.
    """

    scheme: Scheme
    w13: QuantizedMatrix
    w2: QuantizedMatrix
    gated: bool
    w13_bias: Optional[torch.Tensor] = None
    w2_bias: Optional[torch.Tensor] = None
    w13_perm: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        self.scheme = get_scheme(self.scheme)
        p = self.w13_perm
        if isinstance(p, torch.Tensor) and p.dtype == torch.int64:
            self.w13_perm = p.to(torch.int32).contiguous()
        self.validate()
        if self.w13_perm is not None:
            check_w13_perm_values(self.w13_perm)

    @classmethod
    def trusted(cls, scheme: Scheme, w13: QuantizedMatrix, w2: QuantizedMatrix, gated: bool,
                w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                w13_perm: Optional[torch.Tensor] = None) -> "MoEWeights":
        """Wrap tensors whose metadata already passed :meth:`validate` (the torch ops' per-call rebuild)."""
        w = cls.__new__(cls)
        w.scheme, w.w13, w.w2, w.gated = scheme, w13, w2, gated
        w.w13_bias, w.w2_bias, w.w13_perm = w13_bias, w2_bias, w13_perm
        return w

    def without_w13_perm(self) -> "MoEWeights":
        """The same tensors without ``w13_perm`` (the layer in its stored column order; shares every tensor
        and the provider layouts cached on them)."""
        return MoEWeights.trusted(self.scheme, self.w13, self.w2, self.gated, self.w13_bias, self.w2_bias)

    # -- shape -----------------------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return self.w13.num_experts

    @property
    def hidden_size(self) -> int:
        return self.w13.k

    @property
    def intermediate_size(self) -> int:
        return self.w2.k

    @property
    def device(self) -> torch.device:
        return self.w13.device

    @property
    def has_bias(self) -> bool:
        return self.w13_bias is not None or self.w2_bias is not None

    def __repr__(self) -> str:
        bias = "+".join(n for n, b in (("w13", self.w13_bias), ("w2", self.w2_bias)) if b is not None) or "none"
        perm = ", w13_perm=act-order" if self.w13_perm is not None else ""
        return (
            f"MoEWeights(scheme={self.scheme.name}, E={self.num_experts}, H={self.hidden_size}, "
            f"I={self.intermediate_size}, gated={self.gated}, device={self.device}, bias={bias}{perm})"
        )

    def validate(self) -> None:
        """Check that w13 and w2 agree with each other and the scheme."""
        for name, m in (("w13", self.w13), ("w2", self.w2)):
            if not isinstance(m, QuantizedMatrix):
                raise TypeError(f"{name}: expected a QuantizedMatrix, got {type(m).__name__}")
            if m.scheme != self.scheme:
                raise ValueError(f"{name}: scheme {m.scheme.name} differs from the weights' {self.scheme.name}")
            m.validate(name)
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        if self.w2.num_experts != e:
            raise ValueError(f"w2: {self.w2.num_experts} experts, but w13 has {e}")
        if self.w2.n != h and self.w13.n == self.w2.n:
            raise ValueError(
                f"w13: shape looks transposed: its {self.w13.n} rows equal w2's output rows H, but w13 must be "
                f"[E, 2I|I, H] (rows = outputs, codes [E, N, H/2]); got codes of shape {tuple(self.w13.codes.shape)}"
            )
        if self.w2.n != h:
            raise ValueError(
                f"w2: expected {h} output rows (w13's hidden size H={h}: w2 is [E, H, I]), got {self.w2.n} "
                f"(w2 codes of shape {tuple(self.w2.codes.shape)})"
            )
        n13 = 2 * i if self.gated else i
        if self.w13.n != n13:
            kind = "gated (2I rows)" if self.gated else "non-gated (I rows)"
            raise ValueError(f"w13: expected {n13} rows for a {kind} layer with I={i} (from w2), got {self.w13.n}")
        if self.w2.device != self.w13.device:
            raise ValueError(f"w2: on {self.w2.device}, but w13 is on {self.w13.device}")
        for name, b, want in (("w13_bias", self.w13_bias, (e, n13)), ("w2_bias", self.w2_bias, (e, h))):
            if b is None:
                continue
            if not isinstance(b, torch.Tensor) or b.dtype not in _BIAS_DTYPES or tuple(b.shape) != want:
                raise ValueError(f"{name}: expected a float32 or bfloat16 tensor of shape {want}, got {_describe(b)}")
            if b.device != self.w13.device:
                raise ValueError(f"{name}: on {b.device}, but w13 is on {self.w13.device}")
            if not b.is_contiguous():
                raise ValueError(f"{name}: must be contiguous")
        if self.w13_perm is not None:
            check_w13_perm(self.w13_perm, e, h, self.w13.device)

    # -- canonical tensors ---------------------------------------------------------------------
    @property
    def canonical_released(self) -> bool:
        """Whether :meth:`release_canonical` freed the canonical codes (``w4a16_moe.warmup(..., release_canonical=True)``):
        the weights then run only through the packed layouts built before."""
        c = self.w13.codes
        return c.numel() > 0 and not _is_fake(c) and c.untyped_storage().nbytes() == 0

    def require_canonical(self, what: str) -> None:
        """Raise a ``RuntimeError`` naming ``what`` when the canonical tensors were released."""
        if self.canonical_released:
            raise RuntimeError(
                f"{what} reads the canonical 4-bit tensors of {self}, which warmup(..., release_canonical=True) "
                "released: only calls whose kernels and packed layouts that warmup prepared (the CuTe provider, its "
                "dtype, top_k, finalize modes and expert-parallel hint, up to its max_tokens) can run; keep them "
                "(release_canonical=False) for anything else")

    def release_canonical(self) -> int:
        """Free the storage of the canonical codes, scales and zero points (their tensor objects stay, empty, so that
        the packed layouts cached on them stay reachable), unless a packed layout shares it; returns the bytes
        freed. Every later call must then read layouts already packed (:meth:`packed_for` raises otherwise), and
        whatever reads the canonical tensors (the Triton and reference providers, :meth:`dequantize`, :meth:`to`)
        raises. :func:`w4a16_moe.warmup` calls it with ``release_canonical=True`` after packing every layout its
        token counts run."""
        shared = {t.untyped_storage().data_ptr() for _, value in self._layouts() for t in _tensors(value)
                  if not _is_fake(t)}
        freed = 0
        for m in (self.w13, self.w2):
            for key in ("codes", "scales", "zeros"):
                t = getattr(m, key)
                if not isinstance(t, torch.Tensor) or _is_fake(t):
                    continue
                st = t.untyped_storage()
                if st.data_ptr() in shared or st.nbytes() == 0:
                    continue
                freed += st.nbytes()
                st.resize_(0)
        return freed

    def to(self, device: "torch.device | str") -> "MoEWeights":
        """A copy on ``device`` (provider-specific packed layouts are not copied; they are rebuilt)."""
        self.require_canonical("MoEWeights.to")
        return MoEWeights(
            self.scheme, self.w13.map(lambda t: t.to(device)), self.w2.map(lambda t: t.to(device)), self.gated,
            None if self.w13_bias is None else self.w13_bias.to(device),
            None if self.w2_bias is None else self.w2_bias.to(device),
            None if self.w13_perm is None else self.w13_perm.to(device),
        )

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact FP32 ``(w13 [E, 2I|I, H], w2 [E, H, I])``, ``w13``'s columns in the true input order (with a
        ``w13_perm``, stored column ``j`` of expert ``e`` goes to column ``w13_perm[e, j]``)."""
        from .quantize import dequantize_matrix

        self.require_canonical("MoEWeights.dequantize")
        w13 = dequantize_matrix(self.w13)
        if self.w13_perm is not None:
            idx = self.w13_perm.long()[:, None, :].expand_as(w13)
            w13 = torch.empty_like(w13).scatter_(2, idx, w13)
        return w13, dequantize_matrix(self.w2)

    def nbytes_per_expert(self) -> int:
        return (self.w13.nbytes() + self.w2.nbytes()) // self.num_experts

    def packed_for(self, key: str, build: Callable[["MoEWeights"], Any]) -> Any:
        """Return (and cache) a provider-specific layout derived once from the canonical tensors.

        The cache hangs off the ``w13.codes`` tensor object, so it survives the weights being
        re-wrapped (the torch ops rebuild a MoEWeights from its tensors on every call) and is freed
        with the tensors. Keys name the provider and every parameter of the layout.
        """
        cache = layout_cache(self.w13.codes)
        if key not in cache:
            self.require_canonical(f"packing the layout {key!r}, which was not packed before,")
            cache[key] = build(self)
        return cache[key]

    def packed_nbytes(self) -> dict[str, int]:
        """Bytes of each provider layout cached on these weights (``{key: bytes}``), beside the canonical tensors'
        ``nbytes_per_expert() * num_experts``.

        Each layout is a full copy of the 4-bit codes and scales in one kernel family's order (per row block,
        K tile and padding), plus the FP32 bias tables of layers with biases; they are built by the first call
        (or :func:`w4a16_moe.warmup`) whose plan reads them and live as long as the canonical tensors. Tensors
        shared with the canonical ones are not counted.
        """
        own = {t.untyped_storage().data_ptr() for t in (*self.w13.tensors().values(), *self.w2.tensors().values(),
                                                         self.w13_bias, self.w2_bias) if isinstance(t, torch.Tensor)}
        return {key: _tensor_bytes(value, own) for key, value in self._layouts()}

    def _layouts(self):
        """Yield ``(key, layout)`` of every provider layout cached on these weights: on ``w13.codes``, and the bias
        tables on the bias tensors (keys prefixed ``w13_bias:`` / ``w2_bias:``)."""
        anchors = [("", self.w13.codes)] + [(f"{n}:", b) for n, b in (("w13_bias", self.w13_bias),
                                                                      ("w2_bias", self.w2_bias)) if b is not None]
        for prefix, anchor in anchors:
            for key, value in getattr(anchor, "_w4a16_layouts", {}).items():
                yield prefix + key, value

    # The converters (``from_compressed_tensors``, ``to_modelopt_nvfp4``, ...) are attached by
    # :mod:`w4a16_moe.formats.converters` as the functions themselves, so their signatures and
    # docstrings show in ``help(MoEWeights)`` and ``inspect.signature``.

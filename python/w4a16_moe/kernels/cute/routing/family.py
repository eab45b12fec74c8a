"""The route-preparation / finalize kernels as the loader sees them: specs and variant sets.

Every compiled kernel is a :class:`~w4a16_moe.loader.KernelSpec` of family ``w4a16_routing`` whose params are
all fields of :class:`~.config.RoutingConfig`; the same specs feed JIT and AOT. The kernels use plain
global loads / stores, shared-memory atomics and ``griddepcontrol`` (programmatic dependent launch), so
they are built for SM90 and later (:data:`ARCHS`); a ``pdl=False`` spec also compiles for SM80-SM89.

Which spec a call uses (:func:`route_config`, :func:`finalize_config`, :func:`pad_config`) depends only on
host-side facts: the mode (from ``T * k`` and the layout), the ids dtype, the smallest :data:`~.config.E_PADS`
entry above the local expert count, the output dtype, the finalize / pad vector width (row widths and
alignment) and PDL.

Registered CuTe families live in :mod:`w4a16_moe.kernels.cute.registry` (one line each); until this module is
listed there, :func:`ensure_registered` (run on import) makes the loader know the family. Build a prebuilt
directory of this family alone (e.g. for GPU tests before it is in the AOT build's
``FAMILY_MODULES``): ``python -m w4a16_moe aot --families w4a16_moe.kernels.cute.routing.family --archs sm_90a
--out DIR``, then ``W4A16_MOE_PREBUILT_DIR=DIR``.

This module imports neither ``cutlass`` nor the kernel module.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ....archs import PDL_ARCHS
from ....loader.spec import KernelSpec, config_codec
from .config import E_PADS, FINALIZE_VECS, ROUTE_MODES, RoutingConfig

__all__ = ["FAMILY", "ARCHS", "spec_for", "config_from_spec", "route_config", "masked_config",
           "finalize_config", "pad_config", "e_pad_for", "variants", "aot_variants", "WARPS", "REGISTRY_ENTRY",
           "ensure_registered", "SASS_EXPECT", "DESCRIPTOR", "RoutingFamily"]

FAMILY = "w4a16_routing"
#: SM90 and later (griddepcontrol); see the module docstring for SM80-SM89
ARCHS = PDL_ARCHS
#: instructions every kernel must contain (the AOT SASS check): none; local memory is still refused
SASS_EXPECT = ()
#: warps per CTA of each mode
WARPS = {"single": 8, "hist": 8, "place": 8, "masked": 4, "finalize": 4, "pad": 4}
#: ``(compile_fn, sources)`` of the family (the loader's registration; also :data:`DESCRIPTOR`)
REGISTRY_ENTRY = (
    "w4a16_moe.kernels.cute.routing.family:_compile",
    ("w4a16_moe.kernels.cute.routing.kernels", "w4a16_moe.kernels.cute.routing.config",
     "w4a16_moe.kernels.cute.common.ptx"),
)


def _compile(spec: KernelSpec, arch: str):
    """The family's compile function (registered in :mod:`w4a16_moe.loader.spec` with its source modules)."""
    from .kernels import kernel_class

    cfg = config_from_spec(spec)
    return kernel_class(cfg.mode)(cfg, arch).compile(arch)


spec_for, config_from_spec = config_codec(FAMILY, RoutingConfig)


def e_pad_for(num_experts: int) -> int:
    """The smallest table size holding ``num_experts`` entries plus the total (ValueError past the largest)."""
    for p in E_PADS:
        if num_experts + 1 <= p:
            return p
    raise ValueError(f"num_experts: the CuTe route preparation handles at most {E_PADS[-1] - 1} local experts, "
                     f"got {num_experts} (use the Triton route preparation)")


def route_config(mode: str, ids_dtype: str, num_experts: int, pdl: bool) -> RoutingConfig:
    """Config of a route-preparation kernel (``mode`` in ``single`` / ``hist`` / ``place``)."""
    if mode not in ROUTE_MODES:
        raise ValueError(f"mode: expected one of {ROUTE_MODES}, got {mode!r}")
    return RoutingConfig(mode=mode, ids=ids_dtype, e_pad=e_pad_for(num_experts), warps=WARPS[mode], pdl=pdl)


def masked_config(pdl: bool) -> RoutingConfig:
    return RoutingConfig(mode="masked", warps=WARPS["masked"], pdl=pdl)


def finalize_config(dtype: str, source: str, vec: int, pdl: bool) -> RoutingConfig:
    """``source``: ``"int32"`` / ``"int64"`` (validity from the ids) or ``"mask"`` (from a uint8 mask)."""
    if source not in ("int32", "int64", "mask"):
        raise ValueError(f"source: expected 'int32', 'int64' or 'mask', got {source!r}")
    return RoutingConfig(mode="finalize", ids="int32" if source == "mask" else source, dtype=dtype,
                         from_mask=source == "mask", vec=vec, warps=WARPS["finalize"], pdl=pdl)


def pad_config(vec: int, pdl: bool) -> RoutingConfig:
    """The zero-padded copy (``vec`` 8: both row widths multiples of 8, 16-byte aligned rows; else 1)."""
    return RoutingConfig(mode="pad", vec=vec, warps=WARPS["pad"], pdl=pdl)


def variants(pdl: Iterable[bool] = (True, False), e_pads: Iterable[int] = E_PADS,
             ids: Iterable[str] = ("int32", "int64"), dtypes: Iterable[str] = ("bf16", "fp16"),
             vecs: Iterable[int] = FINALIZE_VECS, modes: Optional[Iterable[str]] = None) -> list:
    """Every spec :mod:`.launch` can select (defaults: all of them), in a fixed order."""
    modes = tuple(modes) if modes is not None else ("single", "hist", "place", "masked", "finalize", "pad")
    cfgs = []
    for p in pdl:
        for m in modes:
            if m in ROUTE_MODES:
                cfgs += [RoutingConfig(mode=m, ids=i, e_pad=e, warps=WARPS[m], pdl=p) for i in ids for e in e_pads]
            elif m == "masked":
                cfgs.append(masked_config(p))
            elif m == "finalize":
                cfgs += [finalize_config(d, s, v, p) for d in dtypes for s in (*ids, "mask") for v in vecs]
            elif m == "pad":
                cfgs += [pad_config(v, p) for v in vecs]
            else:
                raise ValueError(f"modes: unknown mode {m!r}")
    out, seen = [], set()
    for c in cfgs:
        s = spec_for(c)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def aot_variants(subset: str) -> list:
    """``"smoke"``: int32 ids, E_PAD 256, BF16, with PDL; ``"full"``: every variant."""
    if subset == "full":
        return variants()
    if subset == "smoke":
        return variants(pdl=(True,), e_pads=(256,), ids=("int32",), dtypes=("bf16",), vecs=(8,))
    raise ValueError(f"subset: expected smoke or full, got {subset!r}")


def ensure_registered() -> None:
    """Register the family with the loader unless the CuTe family registry lists this module (then the
    loader finds it there). Reads the registry's static module list only: no import cycle."""
    from ....loader.spec import register_family
    from ..registry import FAMILY_MODULES

    if __name__ in FAMILY_MODULES:
        return
    try:
        register_family(FAMILY, REGISTRY_ENTRY[0], sources=REGISTRY_ENTRY[1])
    except ValueError:  # already registered and resolved in this process
        pass

class RoutingFamily:
    """This family as :class:`~w4a16_moe.kernels.cute.registry.KernelFamily` (role ``"routing"``): the provider's
    GEMM selection skips it (it picks ``"grouped"`` / ``"decode"`` roles); the loader, the AOT build and the
    SASS check read ``spec_family``, ``archs``, ``compile_fn``, ``sources``, ``sass_*`` and ``aot_variants``.
    The GEMM-only members (``configs``, ``layout_key``, ``pack``, ``rows_per_cta``) do not apply."""

    name = "routing"
    spec_family = FAMILY
    archs = ARCHS
    role = "routing"
    beside = None
    compile_fn = REGISTRY_ENTRY[0]
    sources = REGISTRY_ENTRY[1]
    sass_expect = SASS_EXPECT
    sass_allow_local = ()
    sass_local_budget = ()
    sass_serial_ok = ()

    def __repr__(self) -> str:
        return "KernelFamily(routing)"

    def config_type(self) -> type:
        return RoutingConfig

    def supports(self, capability, arch) -> Optional[str]:
        return None if arch in self.archs else f"the CuTe route preparation is built for {', '.join(self.archs)} only"

    def can_implement(self, call) -> Optional[str]:
        return "route preparation / finalize kernels, not a GEMM family"

    def configs(self, scheme, dtype, activation, gated, finalize, tiles):
        raise NotImplementedError("the routing family has no GEMM configs (see routing.launch)")

    def spec_for(self, cfg):
        return spec_for(cfg)

    def aot_variants(self, subset):
        return aot_variants(subset)

    def layout_key(self, which, cfg, dtype) -> str:
        raise NotImplementedError("the routing family reads no packed weights")

    def pack(self, qm, cfg, dtype, interleave):
        raise NotImplementedError("the routing family reads no packed weights")

    def rows_per_cta(self, cfg) -> int:
        raise NotImplementedError("the routing family has no weight rows")


DESCRIPTOR = RoutingFamily()

# importing the family (the AOT build does) makes it known to the loader and to its compile workers
ensure_registered()

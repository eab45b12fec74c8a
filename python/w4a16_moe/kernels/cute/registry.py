"""The CuTe kernel families: the interface each implements (:class:`KernelFamily`) and the one registry.

A family is a package under ``kernels/cute/`` whose ``family`` module defines ``DESCRIPTOR``, an object with
the attributes and methods of :class:`KernelFamily`. :data:`FAMILY_MODULES` lists them, one line each, in
order of preference on a device; everything that needs to know the families reads this registry:

* the loader (:func:`w4a16_moe.loader.spec.get_family`): compile function and source modules of a spec family;
* the AOT build (:mod:`w4a16_moe.aot`): archs and variant sets per subset;
* the SASS check (:mod:`w4a16_moe.loader.sass`): the instructions each family's kernels must contain, the
  local memory and the serialized WGMMA pipelines it accepts;
* the CuTe provider and ``doctor``: which family serves a device, its configs, packed layouts and checks.

Adding a family: its own package (config, kernel, ``family.py`` with ``DESCRIPTOR``), plus one line in
:data:`FAMILY_MODULES`. Nothing here (nor in any ``family`` module) imports ``cutlass``; the compile
function is named as a ``"module:function"`` string and imported only to compile.
"""

from __future__ import annotations

import functools
import importlib
from typing import Optional, Protocol, runtime_checkable

__all__ = ["KernelFamily", "FAMILY_MODULES", "families", "get", "by_spec_family", "GRID_Y_MAX", "shape_reason",
           "feature_reason"]

#: one line per family (the module defining ``DESCRIPTOR``), in order of preference on a device
FAMILY_MODULES = (
    "w4a16_moe.kernels.cute.sm90.family",
    "w4a16_moe.kernels.cute.warp.family",
    "w4a16_moe.kernels.cute.decode.family",
    "w4a16_moe.kernels.cute.routing.family",
)

#: CUDA's grid y limit (the token-tile dimension of every family's launch)
GRID_Y_MAX = 65535


@runtime_checkable
class KernelFamily(Protocol):
    """What the loader, AOT, the SASS check, ``doctor`` and the provider need of a kernel family."""

    #: short name: plans, ``W4A16_MOE_CUTE_FAMILY``, tuned-table rows ("sm90", "warp", "decode")
    name: str
    #: the loader family of its :class:`~w4a16_moe.loader.KernelSpec` s (e.g. ``"sm90_w4a16_gemm"``)
    spec_family: str
    #: ``--gpu-arch`` values it compiles for
    archs: tuple
    #: "grouped" (runs any routed or masked call) or "decode" (small routed calls next to a grouped family)
    role: str
    #: for a "decode" family: the grouped family it runs beside (and whose packed layout it reads)
    beside: Optional[str]
    #: ``"module:function"`` compiling one spec for one arch (``compile_fn(spec, arch)``)
    compile_fn: str
    #: modules whose source shapes the generated code (hashed into the JIT-cache key)
    sources: tuple
    #: instructions every kernel of the family must contain (the AOT SASS check)
    sass_expect: tuple
    #: archs on which local-memory instructions are only a warning in the SASS check (any amount, any kernel)
    sass_allow_local: tuple
    #: per-kernel local-memory budgets of the SASS check (:func:`w4a16_moe.loader.sass.budget_rules`): one dict
    #: per rule, ``{"archs": (...), "params": {exact kernel params}, "LDL": n, "STL": m, "why": "one line"}``; a
    #: kernel a rule matches may have at most ``LDL`` / ``STL`` such instructions (a warning), no more. ``()``: none
    sass_local_budget: tuple
    #: kernels whose serialized WGMMA pipeline the SASS check accepts (:func:`w4a16_moe.loader.sass.serial_rules`):
    #: ``{"archs": (...), "params": {exact kernel params}, "why": "one line"}`` per rule (a warning); any other
    #: serialized kernel fails the check. ``()``: none
    sass_serial_ok: tuple

    def config_type(self) -> type:
        """The static config dataclass of one kernel (no DSL import)."""

    def supports(self, capability: tuple, arch: str) -> Optional[str]:
        """None when the family runs on a device of ``capability`` / ``arch``, else why not."""

    def can_implement(self, call) -> Optional[str]:
        """None when the family's kernels cover ``call`` (a :class:`~w4a16_moe.validate.MoECall` or
        ``MaskedCall``: shapes, dtype, activation, layer features such as biases: :func:`shape_reason`), else
        why not. Needs no ``cutlass``."""

    def configs(self, scheme, dtype: str, activation: str, gated: bool, finalize: str, tiles: dict) -> tuple:
        """``(gate_up, down)`` kernel configs of one call with ``tiles`` (family-specific knobs); the grouped
        families also take ``bias=`` (the call's ``has_bias``), which a family without biases never sees."""

    def spec_for(self, cfg):
        """The :class:`~w4a16_moe.loader.KernelSpec` of a config."""

    # grouped families (role "grouped") also have:
    #   select_tiles(num_routes, num_experts, top_k=None, global_experts=None) -> tiles (the rule; masked calls)
    #   choose(tokens, top_k, E, H, I, scheme, dtype, gpu, global_experts=None, gated=True, sm_count=...) ->
    #       (family name, tiles, splits or None): a routed call's choice, which may name another registered
    #       family (the SM90 tuned table's warp rows, the SM90 cost model's warp tiles)
    #   num_splits(n, k, cfg, num_routes, num_experts, sm_count, top_k=None, global_experts=None, arch=None)
    #   -> split-K parts (global_experts: the call's expert-parallel hint, MoECall.global_experts; see .tiles;
    #   arch: the arch the kernels run on, for families whose rule counts CTA slots)
    #   max_grid_y: the launch's grid-y limit

    def aot_variants(self, subset: str) -> list:
        """The specs of an AOT subset (``"smoke"`` or ``"full"``)."""

    def layout_key(self, which: str, cfg, dtype) -> str:
        """Cache key of the packed layout of ``which`` ("w13" / "w2") that ``cfg`` reads."""

    def pack(self, qm, cfg, dtype, interleave: bool):
        """The packed layout of one quantized matrix for ``cfg`` (``interleave``: gated w13)."""

    def rows_per_cta(self, cfg) -> int:
        """Weight rows one CTA computes (split-K workspace and tile-counter sizes)."""


@functools.lru_cache(maxsize=None)
def families() -> tuple:
    """Every registered family's descriptor, in :data:`FAMILY_MODULES` order."""
    out = []
    for mod in FAMILY_MODULES:
        d = importlib.import_module(mod).DESCRIPTOR
        assert isinstance(d, KernelFamily), f"{mod}.DESCRIPTOR does not implement KernelFamily"
        out.append(d)
    return tuple(out)


def get(name: str) -> KernelFamily:
    """The family named ``name`` (short name, e.g. ``"sm90"``)."""
    for f in families():
        if f.name == name:
            return f
    raise KeyError(f"unknown CuTe kernel family {name!r}; registered: {', '.join(f.name for f in families())}")


def by_spec_family(spec_family: str) -> Optional[KernelFamily]:
    """The family whose specs are of loader family ``spec_family`` (None: not a registered CuTe family)."""
    for f in families():
        if f.spec_family == spec_family:
            return f
    return None


def feature_reason(call, *, bias: bool = False, swiglu_oai: bool = False) -> Optional[str]:
    """The layer features of ``call`` a family does not implement (None when it uses none of them): per-expert
    biases (unless ``bias``), the gpt-oss activation ``swiglu_oai`` (unless ``swiglu_oai``). Each family's
    ``can_implement`` says what it supports (the grouped families both, the decode kernels neither)."""
    if getattr(call, "has_bias", False) and not bias:
        return "biases (w13_bias/w2_bias) are not supported by this CuTe family's kernels"
    if call.activation.kind == "swiglu_oai" and not swiglu_oai:
        return "activation swiglu_oai is not supported by this CuTe family's kernels"
    return None


def shape_reason(call, *, bias: bool = False, swiglu_oai: bool = False) -> Optional[str]:
    """The feature, shape and dtype rules of a family (None when ``call`` meets them): the features of
    :func:`feature_reason` (``bias`` / ``swiglu_oai``: the family implements them), H and I multiples of 8
    (whole int32 words of codes) and of the scheme's group size: the rule of the weights themselves (the provider
    pads every such size up to the kernels' tiles, :mod:`.padding`)."""
    import torch

    why = feature_reason(call, bias=bias, swiglu_oai=swiglu_oai)
    if why:
        return why

    from ...formats.schemes import get_scheme

    if call.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {call.dtype} is not bfloat16 or float16"
    from .padding import SHAPE_MULTIPLE

    sch = get_scheme(call.scheme)
    for name, size in (("hidden size H", call.hidden), ("intermediate size I", call.intermediate)):
        if size % SHAPE_MULTIPLE:
            return f"{name} = {size} is not a multiple of {SHAPE_MULTIPLE} (provider cute)"
        g = sch.group_size
        if g is not None and size % g:
            return f"{name} = {size} is not a multiple of the group size {g} (scheme {sch.name}, provider cute)"
    return None

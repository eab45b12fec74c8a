"""The route-major decode kernels as the loader sees them: specs, variant sets, and when a call uses them.

Every compiled kernel is a :class:`~w4a16_moe.loader.KernelSpec` of family ``w4a16_decode_gemv`` whose params
are all fields of :class:`~.config.DecodeGemvConfig`; the same specs feed JIT and AOT. The kernels
(:mod:`.gemv`) read the SM90 packed layout and use only ``mma.sync`` and plain global loads; they are
built for sm_90a (where they run next to the WGMMA family).

When (:func:`use_decode`): a routed call (not the masked layout) with ``T * top_k <= DECODE_MAX_ROUTES``
routes that reads each expert's weights about once (:func:`reread_factor` <= :data:`MAX_REREAD`: the
decode kernels stream an expert's weights once per route that hits it, the grouped GEMMs once per expert),
unless ``W4A16_MOE_BATCH_INVARIANT=1`` (a route's result must then not depend on its batch; the
decode path combines in a different order than the grouped GEMMs) or ``W4A16_MOE_CUTE_DECODE=0``. The
tuned table may bound it per layer shape instead (a measured bound on ``T * top_k``, no re-read test), and names the knob set per token count
(``sm90/tuned.json``, ``"decode"``: key -> ``{"max_routes": R, "knobs": [[tokens, "w8u8/w8u4"], ...]}``, written
by ``python -m w4a16_moe tune --decode-knobs ...`` + ``scripts/merge_tuned.py``).
``W4A16_MOE_CUTE_DECODE=1`` forces it for every routed call that fits one launch (tests).

This module imports neither ``cutlass`` nor the kernel module.
"""

from __future__ import annotations

import functools
from typing import Iterable, Optional

from .... import settings
from ....archs import SM90_ARCHS
from ....loader.spec import KernelSpec, config_codec
from ..sm90 import family as sm90_family
from ..sm90.family import group_param  # the decode kernels read the SM90 layout: same group convention

__all__ = ["FAMILY", "ARCHS", "LAYOUT", "spec_for", "config_from_spec", "configs", "num_parts", "use_decode",
           "expected_experts", "reread_factor", "MAX_REREAD", "variants", "aot_variants", "DECODE_MAX_ROUTES", "MAX_GRID_Y"]

FAMILY = "w4a16_decode_gemv"
ARCHS = SM90_ARCHS
#: instructions every kernel of the family must contain (the AOT SASS check)
SASS_EXPECT = ("HMMA",)
MAX_GRID_Y = 65535
#: default bound on T * top_k for the decode path (the tuned table can say otherwise per layer shape)
DECODE_MAX_ROUTES = 64

#: the largest expected re-read factor (:func:`reread_factor`) at which an untuned layer takes the decode path.
#: The decode kernels stream an expert's weights once per route that hits it, the grouped GEMMs once per
#: expert (plus route preparation and, deterministic, a finalize pass: a few us). At small batches both are
#: weight-bandwidth bound, so the decode path wins while its extra launch savings outweigh the extra bytes:
#: at a factor of 1.5 it streams 50% more weight bytes than the grouped GEMMs, about what the saved launches
#: and the grouped GEMMs' partly idle tensor-core tiles are worth at decode sizes; well beyond it the
#: re-reads dominate (8 experts, top-2, 32 tokens: factor 8, the decode path several times slower than
#: the grouped GEMMs). A starting point, to be calibrated (the autotuner measures it per layer).
MAX_REREAD = 1.5

#: the packed layouts the decode kernels read (w13, w2): those of the WGMMA family's decode tile
#: (``sm90.family.CANDIDATES[9]``), so both paths share one packed copy of each matrix
LAYOUT = {"w13": dict(m64_per_block=2, k_tile=128), "w2": dict(m64_per_block=4, k_tile=64)}
#: per-mode codegen knobs (warps per CTA, k64 units per load batch)
#: (the H200 sweep at revision 2cae0a5+: w8u8/w8u4 is within 8% of the best set at 1-16 tokens of W1 and
#: 1-8 tokens of W2; the tuned table names the best set per row)
KNOBS = {"gate_up": dict(warps=8, unroll=8), "down": dict(warps=8, unroll=4)}


def _compile(spec: KernelSpec, arch: str):
    """The family's compile function (registered in :mod:`w4a16_moe.loader.spec` with its source modules)."""
    from .gemv import Sm90W4A16DecodeGemv

    return Sm90W4A16DecodeGemv(config_from_spec(spec), arch).compile(arch)


def kernel_config(**fields):
    from .config import DecodeGemvConfig

    return DecodeGemvConfig(**fields)


spec_for, config_from_spec = config_codec(FAMILY, kernel_config)


@functools.lru_cache(maxsize=4096)
def configs(scheme, dtype: str, activation: str, knobs: tuple = ()) -> tuple:
    """(gate_up, down) :class:`DecodeGemvConfig` of a call; ``knobs``: ``(("gate_up", {...}), ...)``
    items overriding :data:`KNOBS` (the tuner's variants)."""
    over = dict(knobs)
    base = dict(dtype=dtype, group=group_param(scheme), zero_point=scheme.zero_point, fp4=scheme.is_fp4)
    up = kernel_config(mode="gate_up", activation=activation, **base, **LAYOUT["w13"],
                       **dict(KNOBS["gate_up"], **dict(over.get("gate_up", ()))))
    down = kernel_config(mode="down", **base, **LAYOUT["w2"], **dict(KNOBS["down"], **dict(over.get("down", ()))))
    return up, down


def _as_items(knobs: dict) -> tuple:
    """``{"gate_up": {...}, "down": {...}}`` as the hashable ``knobs`` argument of :func:`configs`."""
    return tuple((m, tuple(sorted(v.items()))) for m, v in sorted(knobs.items()))


def parse_knobs(text: str) -> dict:
    """``"w8u4/w8u2"`` (gate_up / down: warps ``w``, unroll ``u``; optional suffixes, in this order: ``c<N>``
    a persistent grid of at most N CTAs, and on the down part ``p0`` to turn its programmatic dependent
    launch off) -> ``{"gate_up": {...}, "down": {...}}``."""
    import re

    out = {}
    for mode_, part in zip(("gate_up", "down"), text.split("/")):
        m = re.fullmatch(r"w(\d+)u(\d+)(?:c(\d+))?(p0)?", part.strip())
        if not m or (m.group(4) and mode_ != "down"):
            raise ValueError(f"decode knobs: expected wNuM[cN][/wNuM[cN][p0]], got {text!r}")
        out[mode_] = dict(warps=int(m.group(1)), unroll=int(m.group(2)))
        if m.group(3):
            out[mode_]["ctas"] = int(m.group(3))
        if m.group(4):
            out[mode_]["pdl"] = False
    return out


def num_parts(cfg, k: int) -> int:
    """K parts per route: about ``unroll`` k64 units each (one load batch), at most one per warp. A long K
    (gate/up: K = H) gets one part per warp; a short one (down in a TP shard: K = I = 256 is 4 units) stays
    in one part, so the warps take different routes instead of one unit of every route each."""
    units = k // 64
    return max(1, min(cfg.warps, -(-units // cfg.unroll)))


def mode() -> str:
    return settings.get().cute_decode


def expected_experts(tokens: int, top_k: int, num_experts: int, num_global_experts: Optional[int] = None) -> float:
    """Expected distinct local experts hit by ``tokens`` tokens of ``top_k`` routes each, under uniform routing
    over ``num_global_experts`` experts of which ``num_experts`` are local (None: every route local, the
    call's default when it carries no ``global_num_experts`` hint): ``D = E * (1 - (1 - k/E_global)^T)``.
    A token's ``k`` experts are distinct, so an expert misses one token with probability ``1 - k/E_global``;
    without the hint this is ``E * (1 - (1 - 1/E)^R)`` (``R = T * k`` independent routes) with the
    draws of one token taken without replacement: exact for one token (``D = k``), the same when ``k << E``."""
    if tokens <= 0 or num_experts <= 0:
        return 0.0
    g = max(num_experts, num_global_experts or num_experts)
    miss = max(0.0, 1.0 - min(top_k, g) / g)
    return num_experts * (1.0 - miss ** tokens)


def reread_factor(tokens: int, top_k: int, num_experts: int, num_global_experts: Optional[int] = None) -> float:
    """``R / D``: how many times the decode path streams each hit expert's weights (``R`` = the expected local
    routes ``T * top_k * E / E_global``, ``D`` = :func:`expected_experts`); 1.0 means every route hits its
    own expert."""
    d = expected_experts(tokens, top_k, num_experts, num_global_experts)
    g = max(num_experts, num_global_experts or num_experts)
    return tokens * top_k * num_experts / g / d if d > 0 else 1.0


def use_decode(tokens: int, top_k: int, max_routes: Optional[int] = None,
               num_experts: Optional[int] = None, num_global_experts: Optional[int] = None) -> bool:
    """Whether a routed call of ``tokens`` x ``top_k`` runs on the decode kernels (see the module docstring);
    ``max_routes`` is the tuned bound on ``T * top_k`` for the layer shape, when there is one (0: never; it is
    then the only test). Without one: at most :data:`DECODE_MAX_ROUTES` routes and, when ``num_experts`` (the
    local experts) is given, a re-read factor of at most :data:`MAX_REREAD` (``num_global_experts``: the
    expert-parallel hint, routes uniform over that many experts; the route bound stays on ``T * top_k``,
    the launch's size, skipped routes included)."""
    s = settings.get()
    m = s.cute_decode
    if m == "0" or s.batch_invariant or tokens == 0:
        return False
    if tokens * top_k > MAX_GRID_Y:
        return False
    if m == "1":
        return True
    if max_routes is not None:
        return tokens * top_k <= max_routes
    if tokens * top_k > DECODE_MAX_ROUTES:
        return False
    return num_experts is None or reread_factor(tokens, top_k, num_experts, num_global_experts) <= MAX_REREAD


def knob_items(text: Optional[str]) -> tuple:
    """A knob-set string (or None: the defaults) as the hashable ``knobs`` argument of :func:`configs`."""
    return _as_items(parse_knobs(text)) if text else ()


def variants(schemes: Optional[Iterable] = None, dtypes=("bf16", "fp16"),
             activations=("swiglu", "geglu", "relu2", "silu"), knobs: Optional[Iterable[tuple]] = None) -> list:
    """Every spec the provider can select for the given schemes (default: every scheme): the default knobs,
    plus the knob sets the tuned table names for that scheme and dtype (``knobs`` given: exactly those)."""
    from ....formats.schemes import SCHEMES

    if schemes is None:
        schemes = list(SCHEMES.values())
    out, seen = [], set()
    for sch in schemes:
        for dt in dtypes:
            sets = list(knobs) if knobs is not None else [()] + [
                knob_items(k) for k in sm90_family.tuned_decode_knob_sets(sch.name, dt)]
            for kn in sets:
                for act in activations:
                    for cfg in configs(sch, dt, act, kn):
                        spec = spec_for(cfg)
                        if spec not in seen:
                            seen.add(spec)
                            out.append(spec)
    return out


def aot_variants(subset: str) -> list:
    """``"smoke"``: int4_g32 + int4_g128, BF16, SwiGLU; ``"full"``: every scheme, dtype and activation."""
    from ....formats.schemes import get_scheme

    if subset == "full":
        return variants()
    if subset == "smoke":
        return variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16",),
                        activations=("swiglu",))
    raise ValueError(f"subset: expected smoke or full, got {subset!r}")


class DecodeFamily:
    """The route-major decode kernels as :class:`~w4a16_moe.kernels.cute.registry.KernelFamily`: small
    routed calls beside the SM90 family, reading its packed layout."""

    name = "decode"
    spec_family = FAMILY
    archs = ARCHS
    role = "decode"
    beside = "sm90"
    compile_fn = f"{__name__}:_compile"
    sources = ("w4a16_moe.kernels.cute.decode.gemv", "w4a16_moe.kernels.cute.decode.config",
               "w4a16_moe.kernels.cute.common.ptx", "w4a16_moe.kernels.cute.common.codes",
               "w4a16_moe.kernels.cute.common.epilogue", "w4a16_moe.kernels.cute.common.grid", "w4a16_moe.kernels.cute.common.dequant")
    sass_expect = SASS_EXPECT
    sass_allow_local = ()
    max_grid_y = MAX_GRID_Y

    def __repr__(self) -> str:
        return "KernelFamily(decode)"

    def config_type(self) -> type:
        from .config import DecodeGemvConfig

        return DecodeGemvConfig

    def supports(self, capability, arch) -> Optional[str]:
        return None if arch in self.archs else f"the decode kernels are built for {', '.join(self.archs)} only"

    def can_implement(self, call) -> Optional[str]:
        from ...cute.registry import shape_reason
        from ....validate import MaskedCall

        if isinstance(call, MaskedCall):
            return "the decode kernels take routed calls only"
        if call.tokens * call.top_k > MAX_GRID_Y:
            return f"{call.tokens * call.top_k} routes exceed one launch"
        return shape_reason(call)

    def configs(self, scheme, dtype, activation, gated, finalize, tiles):
        """``tiles``: ``{"knobs": knob items}`` (:func:`knob_items`; ``()``: the defaults)."""
        return configs(scheme, dtype, activation, tiles.get("knobs", ()))

    def spec_for(self, cfg):
        return spec_for(cfg)

    def aot_variants(self, subset):
        return aot_variants(subset)

    def layout_key(self, which, cfg, dtype) -> str:
        return sm90_family.layout_key(which, cfg, dtype)

    def pack(self, qm, cfg, dtype, interleave):
        return sm90_family.pack(qm, cfg, dtype, interleave)

    def rows_per_cta(self, cfg) -> int:
        return 64 * cfg.m64_per_block


DESCRIPTOR = DecodeFamily()

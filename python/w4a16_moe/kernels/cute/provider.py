"""The CuTe DSL provider: which calls its kernels cover, and how a call is launched.

One ``fused_moe`` call on SM90 runs (no host synchronization; capturable in a CUDA graph):

1. route preparation (the Triton route-prep kernel: sorted routes, ``route_start``, ``block_start``);
2. the gate/up grouped GEMM (:mod:`.sm90_grouped_gemm`, mode ``gate_up``): ``h[slot] = act(W13_e x[t])``;
3. the down grouped GEMM: ``y[route] = W2_e h[slot]`` (deterministic) or ``out32[t] += w * y`` (fused,
   FP32 atomics);
4. deterministic: the fixed top-k-order FP32 finalize (the Triton provider's kernel, shared so both
   providers combine identically); fused: one cast of ``out32``.

Small routed calls (``T * top_k`` up to a tuned bound, by default 64 routes; see :mod:`.decode_family`)
skip all of that on SM90: two route-major decode kernels (:mod:`.decode_gemv`) read each route's expert
id straight from ``topk_ids``, write ``h`` by route, and the down kernel combines every token's routes in
fixed order straight into ``out`` (no route preparation, no finalize pass; deterministic, both finalize
modes). ``W4A16_MOE_CUTE_DECODE=0|1`` turns them off / forces them; batch-invariant mode never uses them.

Two kernel families share the launch ABI and the routing contract: the Hopper WGMMA family
(:mod:`.sm90_family`, SM90 only) and the portable warp-MMA family (:mod:`.warp_family`, SM80 to SM120;
compile-verified only on archs other than SM90). A device gets the SM90 family on compute capability 9.x,
else the warp family when it was built for that arch; ``W4A16_MOE_CUTE_FAMILY=sm90|warp`` forces one
(e.g. ``warp`` to run the portable family on an H200).

Weights are permuted once per (family, tile shape, dtype) into the family's fragment-ready layout
(:mod:`.sm90_pack`, :mod:`.warp_pack`) and cached beside the canonical tensors. Kernels come from the
loader (prebuilt, JIT cache, JIT).
The first use of a kernel (module load, weight packing) must not happen inside CUDA-graph capture:
call :func:`w4a16_moe.warmup` before capturing.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Optional

import torch

from ... import settings
from ...device import DeviceInfo
from .sm90 import family as fam

__all__ = ["unavailable_reason", "cute_fused_moe", "cute_fused_moe_masked", "cute_expert_routes", "cute_warmup",
           "batch_invariant", "Family", "family_for"]

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _kernels_available(arch: str) -> Optional[str]:
    """None when kernels can be had (prebuilt manifest for arch, or the CuTe DSL for JIT), else why not.
    Cached per arch and the environment that decides it (this runs on every call)."""
    s = settings.get()
    return _kernels_available_cached(arch, s.prebuilt_dir, s.disable_jit)


@functools.lru_cache(maxsize=None)
def _kernels_available_cached(arch: str, _prebuilt_env, _jit_env) -> Optional[str]:
    from ...loader import jit_cache, prebuilt

    if prebuilt.summary().get("per_arch", {}).get(arch):
        return None
    if jit_cache.jit_disabled():
        return "no prebuilt kernels for this arch and JIT is disabled (W4A16_MOE_DISABLE_JIT=1)"
    if importlib.util.find_spec("cutlass") is None:
        return "no prebuilt kernels for this arch and the CuTe DSL (nvidia-cutlass-dsl) is not installed for JIT"
    return None


class Family:
    """One CuTe kernel family as the provider drives it (see the module docstring)."""

    def __init__(self, name: str, module, arch: str):
        self.name, self.module, self.arch = name, module, arch

    def __repr__(self) -> str:
        return f"Family({self.name}, {self.arch})"

    def select(self, tokens, top_k, e, h, i, scheme, dt, gpu) -> tuple:
        """``(family, tiles, splits or None)`` of a call: on SM90 the tuned table may hand a layer shape
        to the warp-MMA family where it measured faster (same arch, same launch ABI)."""
        if self.name == "sm90":
            name, tiles, splits = self.module.choose_with_family(tokens, top_k, e, h, i, scheme, dt, gpu)
            if name == "warp":
                from .warp import family as warp_family

                return Family("warp", warp_family, self.arch), tiles, splits
            return self, tiles, splits
        return self, self.module.select_tiles(tokens * top_k, e), None

    def tuned_token_counts(self, gpu, e, h, i, scheme, dt, top_k) -> list:
        if self.name == "sm90":
            return self.module.tuned_token_counts(gpu, e, h, i, scheme, dt, top_k)
        return []

    @property
    def sm90_layout(self) -> bool:
        """The WGMMA family and the decode kernels read the same packed layout (one copy serves both)."""
        return self.name in ("sm90", "decode")

    def rows_per_cta(self, cfg) -> int:
        return 64 * cfg.m64_per_block if self.sm90_layout else cfg.rows_per_cta

    def layout_key(self, which: str, cfg, dtype: torch.dtype) -> str:
        """Cache key of a packed layout: the matrix, the family's row block and K tile, the dtype."""
        if self.sm90_layout:
            return f"cute-sm90:{which}:x{cfg.m64_per_block}:k{cfg.k_tile}:{dtype}"
        return f"cute-warp:{which}:w{cfg.warps}:m{cfg.m16_per_warp}:k{cfg.k_tile}:{dtype}"

    def pack(self, qm, cfg, dtype: torch.dtype, interleave: bool):
        if self.sm90_layout:
            from .sm90.pack import pack_sm90

            return pack_sm90(qm, m64_per_block=cfg.m64_per_block, k_tile=cfg.k_tile, compute_dtype=dtype,
                             interleave_gate_up=interleave)
        from .warp.pack import layout_for, pack_warp

        return pack_warp(qm, **layout_for(cfg), compute_dtype=dtype, interleave_gate_up=interleave)


def family_for(info: DeviceInfo) -> "tuple[Optional[Family], Optional[str]]":
    """``(family, None)`` for a CUDA device, or ``(None, why not)``."""
    forced = settings.get().cute_family
    arch = info.arch
    sm90 = info.capability[0] == 9
    if forced == "sm90" or (forced == "auto" and sm90):
        if not sm90:
            return None, f"W4A16_MOE_CUTE_FAMILY=sm90, but the SM90 family needs compute capability 9.x ({arch})"
        return Family("sm90", fam, "sm_90a"), None
    try:
        from .warp import family as warp_family
    except ImportError as exc:  # pragma: no cover - the module ships with the package
        return None, f"the portable warp-MMA family is unavailable ({exc})"
    if arch not in warp_family.ARCHS:
        return None, f"no CuTe kernel family for {arch} (the warp-MMA family is built for {', '.join(warp_family.ARCHS)})"
    return Family("warp", warp_family, arch), None


def unavailable_reason(call, info: DeviceInfo) -> Optional[str]:
    """Why the CuTe kernels cannot run ``call`` on ``info`` (None when they can)."""
    from ...formats.schemes import get_scheme
    from ...validate import MaskedCall

    if not info.is_cuda:
        return f"device {info.type} is not a CUDA GPU"
    family, why = family_for(info)
    if family is None:
        return why
    fm = family.module
    sch = get_scheme(call.scheme)
    if call.dtype not in _DTYPES:
        return f"dtype {call.dtype} is not bfloat16 or float16"
    h, i = call.hidden, call.intermediate
    rows13 = 2 * i if call.activation.gated else i
    for name, n, k in (("w13", rows13, h), ("w2", h, i)):
        if n % 256:
            return f"{name}: output size {n} is not a multiple of 256 (scheme {sch.name}, provider cute)"
        if k % 128:
            return f"{name}: reduction size {k} is not a multiple of 128 (scheme {sch.name}, provider cute)"
    if call.activation.gated and i % 128:
        return f"w13: intermediate size {i} is not a multiple of 128 (gated, provider cute)"
    if isinstance(call, MaskedCall):
        tn = _masked_tiles(family, call.experts, call.capacity)["tokens_per_tile"]
        if call.experts * -(-call.capacity // tn) > fm.MAX_GRID_Y:
            return f"{call.experts} experts x capacity {call.capacity} exceed one launch's grid (provider cute)"
        return _kernels_available(family.arch)
    _, tiles, _ = family.select(call.tokens, call.top_k, call.experts, h, i, sch.name, _DTYPES[call.dtype],
                                info.name)
    if _max_tiles(call.tokens * call.top_k, call.experts, tiles["tokens_per_tile"]) > fm.MAX_GRID_Y:
        return f"{call.tokens} tokens x top-{call.top_k} exceed one launch's grid (provider cute)"
    return _kernels_available(family.arch)


def _family(device: torch.device) -> Family:
    from ...device import probe

    family, why = family_for(probe(device))
    if family is None:  # unavailable_reason said otherwise: a changed environment
        raise RuntimeError(f"provider cute: {why}")
    return family


def _masked_tiles(family: Family, num_experts: int, capacity: int) -> dict:
    """Tiles of a masked call: sized for ``capacity`` rows per expert (the only host-known bound)."""
    return family.module.select_tiles(num_experts * capacity, num_experts)


def batch_invariant() -> bool:
    """``W4A16_MOE_BATCH_INVARIANT=1``: deterministic calls never split K, so a route's result does not
    depend on the batch it came in (what lets expert parallelism reproduce one GPU bit for bit), at the
    cost of small-batch speed. Default: split-K allowed (still bit-identical run to run)."""
    return settings.get().batch_invariant


def _max_tiles(num_routes: int, num_experts: int, tn: int) -> int:
    return -(-num_routes // tn) + min(num_experts, num_routes)


def _packed(family: Family, weights, which: str, cfg, dtype: torch.dtype):
    qm = weights.w13 if which == "w13" else weights.w2
    interleave = which == "w13" and weights.gated
    return weights.packed_for(family.layout_key(which, cfg, dtype),
                              lambda w: family.pack(qm, cfg, dtype, interleave))


def _kernel(family: Family, cfg):
    return _kernel_cached(family.module, family.arch, cfg)


@functools.lru_cache(maxsize=None)
def _kernel_cached(module, arch: str, cfg):
    from ...loader import get_kernel

    return get_kernel(module.spec_for(cfg), arch)


@functools.lru_cache(maxsize=None)
def _gpu_name_idx(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _gpu_name(device: torch.device) -> str:
    return _gpu_name_idx(device.index if device.index is not None else torch.cuda.current_device())


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def _launch(family, cfg, packed, act, out, plan, topk_weights, num_experts, n, k, num_routes, top_k, max_tiles,
            splits):
    dev = act.device
    if splits > 1:
        cols = family.rows_per_cta(cfg)
        tiles = (n // cols) * max_tiles
        ws = torch.empty(tiles * splits * cfg.tokens_per_tile * cols, dtype=torch.float32, device=dev)
        counters = plan.zeroed  # zeroed by the route preparation; the kernel re-arms what it used
        assert counters is not None and counters.numel() >= tiles
    else:
        ws = counters = plan.route_start  # never read when num_splits == 1
    _run_kernel(family, cfg, (packed.data, act, out, plan.sorted_routes, plan.route_start, plan.block_start,
                              topk_weights, ws, counters),
                (num_experts, n, k, num_routes, top_k, max_tiles, splits))


def _run_kernel(family, cfg, tensors: tuple, scalars: tuple) -> None:
    """Launch ``cfg``'s kernel with the family launch ABI (nine tensors, seven ints): through the stable-ABI
    torch op (torch's current stream) when the op library is available, else through ctypes."""
    launcher = _launcher_cached(family.module, family.arch, cfg)
    if launcher is not None:
        launcher(*tensors, *scalars)
    else:
        _kernel(family, cfg)(*(t.data_ptr() for t in tensors), *scalars, _stream())


@functools.lru_cache(maxsize=None)
def _launcher_cached(module, arch: str, cfg):
    """``torch.ops.w4a16_moe_C.grouped_gemm`` bound to the kernel of ``cfg``
    (:func:`w4a16_moe.loader.torch_op.gemm_launcher`: about half the host cost of a ctypes call), or None
    when the op library is unavailable."""
    from ...loader.torch_op import gemm_launcher

    return gemm_launcher(_kernel_cached(module, arch, cfg))


def _check_capture(family: Family, weights, cfgs, dtype) -> None:
    """Refuse a first use (kernel module load or weight packing) inside CUDA-graph capture."""
    if not torch.cuda.is_current_stream_capturing():
        return
    from ...formats.weights import layout_cache
    from ...loader import _KERNELS

    cold = [c.name() for c in cfgs
            if not getattr(_KERNELS.get((family.module.spec_for(c), family.arch)), "loaded", False)]
    layouts = layout_cache(weights.w13.codes)
    unpacked = [w for c, w in zip(cfgs, ("w13", "w2"))
                if family.layout_key(w, c, dtype) not in layouts]
    if cold or unpacked:
        raise RuntimeError(
            "fused_moe (provider cute): first use inside CUDA-graph capture (kernels not loaded yet: "
            f"{cold or 'none'}; weights not packed yet: {unpacked or 'none'}); call "
            "w4a16_moe.warmup(weights, ...) for the token counts you will capture before capturing"
        )


def _gate_up(x, weights, ids, topk_weights, *, expert_offset: int, activation: str, finalize: str):
    """Route prep + gate/up GEMM: ``(h [T*k, I], plan, down config, packed w2, max_tiles)``."""
    from ..routing.prepare import prepare_routes

    tokens, top_k = ids.shape
    dt = _DTYPES[x.dtype]
    e, h, i = weights.num_experts, weights.hidden_size, weights.intermediate_size
    r = tokens * top_k
    family, tiles, splits = _family(x.device).select(tokens, top_k, e, h, i, weights.scheme.name, dt,
                                                     _gpu_name(x.device))
    fm = family.module
    up, down = fm.gemm_configs(weights.scheme, dt, activation, weights.gated, finalize, tiles)
    _check_capture(family, weights, (up, down), x.dtype)
    p13 = _packed(family, weights, "w13", up, x.dtype)
    p2 = _packed(family, weights, "w2", down, x.dtype)
    max_tiles = _max_tiles(r, e, up.tokens_per_tile)
    n13 = weights.w13.n
    if finalize == "deterministic" and batch_invariant():
        # no split-K: each route's result is then independent of the batch it came in (same kernel math
        # for every tile shape), which is what lets expert parallelism reproduce one GPU bit for bit.
        # Otherwise split-K partials are summed in fixed split order: still bit-identical run to run.
        splits = 1
    split_up = fm.num_splits(n13, h, up, r, e) if splits is None else min(splits, h // up.k_tile)
    split_down = fm.num_splits(h, i, down, r, e) if splits is None else min(splits, i // down.k_tile)
    # split-K tile counters: zeroed by the route preparation (both GEMMs re-arm what they use)
    counters = max(_counter_tiles(family, up, n13, max_tiles, split_up),
                   _counter_tiles(family, down, h, max_tiles, split_down))
    plan = prepare_routes(ids, e, expert_offset, up.tokens_per_tile, zeroed=counters)
    hbuf = torch.empty(r, i, dtype=x.dtype, device=x.device)
    _launch(family, up, p13, x, hbuf, plan, topk_weights, e, n13, h, r, top_k, max_tiles, split_up)
    return family, hbuf, plan, down, p2, max_tiles, split_down


def _counter_tiles(family: Family, cfg, n: int, max_tiles: int, splits: int) -> int:
    return (n // family.rows_per_cta(cfg)) * max_tiles if splits > 1 else 0


def _decode_family(x, weights, tokens: int, top_k: int) -> Optional[Family]:
    """The decode kernels' :class:`Family` when this routed call runs on them (:mod:`.decode_family`),
    else None. Only next to the SM90 family (they read its packed layout)."""
    from .decode import family as dec

    base = _family(x.device)
    if base.name != "sm90" or dec.mode() == "0":
        return None
    if dec.FORCE_KNOBS:  # the tuner timing the decode kernels
        bound = 1 << 30
    elif fam.FORCE:  # the tuner timing a grouped-GEMM tile shape
        return None
    else:
        bound = fam.decode_bound(_gpu_name(x.device), weights.num_experts, weights.hidden_size,
                                 weights.intermediate_size, weights.scheme.name, _DTYPES[x.dtype], top_k)
    if not dec.use_decode(tokens, top_k, bound):
        return None
    return Family("decode", dec, base.arch)


def _decode_configs(dec, weights, dtype: torch.dtype, activation: str, tokens: int, top_k: int, gpu: str) -> tuple:
    """(gate_up, down) decode configs of a call: the tuner's forced knobs, else the tuned table's for this
    token count and layer shape, else the defaults."""
    if dec.FORCE_KNOBS:
        knobs = dec.forced_knobs()
    else:
        knobs = dec.knob_items(fam.decode_knobs(tokens, gpu, weights.num_experts, weights.hidden_size,
                                                weights.intermediate_size, weights.scheme.name, _DTYPES[dtype], top_k))
    return dec.configs(weights.scheme, _DTYPES[dtype], activation, knobs)


def _decode_moe(family: Family, x, weights, topk_weights, ids, *, activation: str, expert_offset: int, out) -> None:
    """Route-major decode path (:mod:`.decode_gemv`): gate/up kernel into ``h [T*k, I]`` (by route),
    then the down kernel combining each token's routes in fixed order straight into ``out``."""
    dec = family.module
    tokens, top_k = ids.shape
    e, h, i = weights.num_experts, weights.hidden_size, weights.intermediate_size
    r = tokens * top_k
    if ids.dtype != torch.int32:
        # the kernels read int32 ids; clamping keeps every out-of-range id out of [offset, offset + E)
        ids = ids.clamp(-1, 2**31 - 1).to(torch.int32)
    up, down = _decode_configs(dec, weights, x.dtype, activation, tokens, top_k, _gpu_name(x.device))
    _check_capture(family, weights, (up, down), x.dtype)
    p13 = _packed(family, weights, "w13", up, x.dtype)
    p2 = _packed(family, weights, "w2", down, x.dtype)
    hbuf = torch.empty(r, i, dtype=x.dtype, device=x.device)
    for cfg, packed, src, dst, n, k in ((up, p13, x, hbuf, weights.w13.n, h), (down, p2, hbuf, out, h, i)):
        # (decode ABI: ids in the three routing slots, topk_weights / ids as the unused split-K scratch)
        _run_kernel(family, cfg, (packed.data, src, dst, ids, ids, ids, topk_weights, topk_weights, ids),
                    (e, n, k, r, top_k, expert_offset, dec.num_parts(cfg, k)))


def cute_fused_moe(x, weights, topk_weights, topk_ids, *, call, out) -> None:
    """Run one validated ``fused_moe`` call (see the module docstring) into ``out``."""
    from ..routing.finalize import launch_finalize

    tokens, top_k = topk_ids.shape
    if tokens == 0:
        return
    e, h, i = weights.num_experts, weights.hidden_size, weights.intermediate_size
    r = tokens * top_k
    ids = topk_ids.contiguous()
    tw = topk_weights.contiguous()
    dfam = _decode_family(x, weights, tokens, top_k)
    if dfam is not None:
        # both finalize modes: the decode path's fixed-order FP32 combine is deterministic and needs no pass
        _decode_moe(dfam, x, weights, tw, ids, activation=call.activation.name, expert_offset=call.expert_offset,
                    out=out)
        return
    family, hbuf, plan, down, p2, max_tiles, splits = _gate_up(
        x, weights, ids, tw, expert_offset=call.expert_offset, activation=call.activation.name,
        finalize=call.finalize)
    if call.finalize == "deterministic":
        y = torch.empty(r, h, dtype=x.dtype, device=x.device)
        _launch(family, down, p2, hbuf, y, plan, tw, e, h, i, r, top_k, max_tiles, splits)
        launch_finalize(y, tw, out, topk_ids=ids, num_experts=e, expert_offset=call.expert_offset)
    else:
        acc = torch.zeros(tokens, h, dtype=torch.float32, device=x.device)
        _launch(family, down, p2, hbuf, acc, plan, tw, e, h, i, r, top_k, max_tiles, splits)
        out.copy_(acc)


def cute_fused_moe_masked(x, weights, masked_m, *, activation: str, out) -> None:
    """Masked (DeepEP low-latency) MoE into ``out``; arguments already validated.

    ``x [E, cap, H]`` contiguous, ``masked_m [E]`` int32 on the GPU, ``out`` like ``x``:
    ``out[e, r] = mlp_e(x[e, r])`` (unweighted) for ``r < clamp(masked_m[e], 0, cap)``, zeros elsewhere.
    The same two grouped GEMMs as the routed path with ``top_k = 1`` and the flat rows ``e*cap + r``
    as routes (the down GEMM's ``y`` epilogue writes them in place); no finalize pass.
    """
    from ..routing.prepare import prepare_masked_routes

    e, cap, h = x.shape
    if e == 0 or cap == 0:
        return
    i = weights.intermediate_size
    dt = _DTYPES[x.dtype]
    family = _family(x.device)
    fm = family.module
    up, down = fm.gemm_configs(weights.scheme, dt, activation, weights.gated, "deterministic",
                               _masked_tiles(family, e, cap))
    _check_capture(family, weights, (up, down), x.dtype)
    p13 = _packed(family, weights, "w13", up, x.dtype)
    p2 = _packed(family, weights, "w2", down, x.dtype)
    tn = up.tokens_per_tile
    r = e * cap
    max_tiles = e * -(-cap // tn)
    n13 = weights.w13.n
    inv = batch_invariant()
    split_up = 1 if inv else fm.num_splits(n13, h, up, r, e)
    split_down = 1 if inv else fm.num_splits(h, i, down, r, e)
    counters = max(_counter_tiles(family, up, n13, max_tiles, split_up),
                   _counter_tiles(family, down, h, max_tiles, split_down))
    plan = prepare_masked_routes(masked_m.contiguous(), cap, tn, out, zeroed=counters)
    hbuf = torch.empty(r, i, dtype=x.dtype, device=x.device)
    dummy_w = plan.route_start  # read only by the atomic epilogue
    _launch(family, up, p13, x.view(r, h), hbuf, plan, dummy_w, e, n13, h, r, 1, max_tiles, split_up)
    _launch(family, down, p2, hbuf, out.view(r, h), plan, dummy_w, e, h, i, r, 1, max_tiles, split_down)


def cute_expert_routes(x, weights, local_ids, *, activation: str):
    """Per-route expert outputs ``(y [T, k, H] in x's dtype, valid [T, k])`` (local ids, -1 = none):
    the first half of the deterministic path, bit-identical to what :func:`cute_fused_moe` computes for
    the same shapes; entries of invalid routes are unspecified."""
    tokens, top_k = local_ids.shape
    e, h, i = weights.num_experts, weights.hidden_size, weights.intermediate_size
    valid = (local_ids >= 0) & (local_ids < e)
    y = torch.empty(tokens, top_k, h, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return y, valid
    r = tokens * top_k
    ids = local_ids.contiguous()
    dummy_w = torch.empty(r, dtype=torch.float32, device=x.device)  # read only by the atomic epilogue
    family, hbuf, plan, down, p2, max_tiles, splits = _gate_up(
        x.contiguous(), weights, ids, dummy_w, expert_offset=0, activation=activation, finalize="deterministic")
    _launch(family, down, p2, hbuf, y.view(r, h), plan, dummy_w, e, h, i, r, top_k, max_tiles, splits)
    return y, valid


def cute_warmup(weights, dtype: torch.dtype, activation: str, max_tokens: int, top_k: int,
                finalizes=("deterministic", "fused")) -> list:
    """Pack ``weights`` and load every kernel that a call of 1..``max_tokens`` tokens can select
    (the decode kernels when small calls use them, the rule's buckets and the tuned table's entries for this
    layer; see :func:`sm90_family.choose`)."""
    from ...activations import get_activation

    dt = _DTYPES[dtype]
    act = get_activation(activation)
    e, h, i = weights.num_experts, weights.hidden_size, weights.intermediate_size
    gpu = _gpu_name(weights.device)
    base = _family(weights.device)
    tuned = base.tuned_token_counts(gpu, e, h, i, weights.scheme.name, dt, top_k)
    grid = sorted({*range(1, min(max_tokens, 256) + 1), *(2**j for j in range(31) if 2**j <= max_tokens), max_tokens,
                   *(t for t in tuned if t <= max_tokens)})
    buckets = []
    for t in grid:
        family, tiles, _ = base.select(t, top_k, e, h, i, weights.scheme.name, dt, gpu)
        if (family.name, tiles) not in [(f.name, tl) for f, tl in buckets]:
            buckets.append((family, tiles))
    names = []
    if base.name == "sm90":
        from .decode import family as dec

        bound = fam.decode_bound(gpu, e, h, i, weights.scheme.name, dt, top_k)
        dfam = Family("decode", dec, base.arch)
        cfgs = {c for t in grid if dec.mode() != "0" and dec.use_decode(t, top_k, bound)
                for c in _decode_configs(dec, weights, dtype, act.name, t, top_k, gpu)}
        for cfg in sorted(cfgs, key=lambda c: c.name()):
            _packed(dfam, weights, "w13" if cfg.mode == "gate_up" else "w2", cfg, dtype)
            _kernel(dfam, cfg).ensure_loaded()
            names.append(cfg.name())
    for family, tiles in buckets:
        for fin in finalizes:
            up, down = family.module.gemm_configs(weights.scheme, dt, act.name, weights.gated, fin, tiles)
            _packed(family, weights, "w13", up, dtype)
            _packed(family, weights, "w2", down, dtype)
            for cfg in (up, down):
                _kernel(family, cfg).ensure_loaded()
                names.append(cfg.name())
    return names

"""Host functions of the CuTe route preparation / finalize, with the Triton functions' signatures and outputs.

:func:`prepare_routes_cute`, :func:`prepare_masked_routes_cute` and :func:`launch_finalize_cute` take the
arguments of ``prepare_routes``, ``prepare_masked_routes`` and ``launch_finalize`` (Triton routing /
finalize modules) and return the same :class:`RoutePlan` (same tensors, same invariants; the order of the
routes inside an expert is arbitrary in both). They launch prebuilt kernels of family ``w4a16_routing``
(:mod:`.family`) through the loader: the stable-ABI torch op when available, else ctypes. Never synchronize;
CUDA-graph capturable once each kernel is loaded.

Launch slots (the family ABI: nine tensors ``(w, act, out, sorted_routes, route_start, block_start,
topk_weights, ws, counters)`` then seven ints ``(num_experts, n, k, num_routes, top_k, max_tiles,
num_splits)``; ``-`` = unused: any CUDA tensor of the device / 0)::

    single    ids, block_info, sorted, zeroed, route_start, block_start, -, -, -
              E, expert_offset, block_m, R, num_zero, num_blocks, -
    hist      ids, -, -, zeroed, -, -, -, hist, -
              E, expert_offset, -, R, num_zero, -, span
    place     ids, block_info, sorted, -, route_start, block_start, -, hist, -
              E, expert_offset, block_m, R, -, num_blocks, span
    masked    masked_m, -, out, sorted, route_start, block_start, -, zeroed, -
              E, H, block_m, cap, num_zero, -, -
    finalize  ids, ybuf, out, valid (uint8), -, -, topk_weights, -, -
              E, H, ld (ybuf's row stride), T, top_k, expert_offset, -
    pad       x, -, out, -, -, -, -, -, -
              -, W (out's row width), C (x's), M (rows), -, -, -

Differences from the Triton path that do not change the contract: ``block_info[:, 3]`` is written (0);
the masked path zeroes ``zeroed`` inside its kernel instead of a memset; local expert counts are limited to
``E_PADS[-1] - 1`` (1023; ValueError beyond, naming the argument).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .... import settings
from . import family
from .config import RoutingConfig

__all__ = ["prepare_routes_cute", "prepare_masked_routes_cute", "launch_finalize_cute", "pad_copy_cute", "SMALL_ROUTES",
           "configs_for", "warm", "pdl_supported", "num_row_blocks"]

#: routes up to which the single-CTA preparation is used; above it the two-kernel path (hist + place). H200,
#: 128-384 experts, top-8 (docs/perf/2026-12-01-row-streaming): one CTA is 1.0-1.4 us faster at 1024 routes,
#: 0.2-0.3 us slower at 2048, and at 4096 takes 9.5-9.9 us against 4.9-5.6. The Triton path keeps its own.
SMALL_ROUTES = 2048
_CHUNK = 1024  # span granularity of the two-kernel path
_MAX_PROGRAMS = 128  # CTAs of the two-kernel path (each place CTA reads every histogram row)


def _route_plan_cls():
    try:  # the module the Triton route preparation is moving to
        from ...routing.prepare import RoutePlan
    except ImportError:
        from ...triton.routing import RoutePlan
    return RoutePlan


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def num_row_blocks(num_routes: int, num_experts: int, block_m: int) -> int:
    """The Triton path's host-side bound on the row blocks (same formula, no triton import)."""
    return min(num_routes, _cdiv(num_routes, block_m) + min(num_experts, num_routes))


def _spans(num_routes: int) -> tuple:
    programs = min(_cdiv(num_routes, _CHUNK), _MAX_PROGRAMS)
    span = _cdiv(_cdiv(num_routes, programs), _CHUNK) * _CHUNK
    return _cdiv(num_routes, span), span


def _int32_workspace(sizes: dict, device) -> tuple:
    """One int32 allocation split into named parts, each starting at a multiple of 4 elements (16 bytes)."""
    offsets, total = {}, 0
    for name, size in sizes.items():
        offsets[name] = total
        total += -(-size // 4) * 4
    ws = torch.empty(max(total, 4), dtype=torch.int32, device=device)
    return ws, {name: ws[offsets[name]: offsets[name] + size] for name, size in sizes.items()}


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple:
    return torch.cuda.get_device_capability(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def pdl_supported(device: torch.device) -> bool:
    """PDL for these kernels: a CUDA device of compute capability 9.0+ and ``W4A16_MOE_PDL`` not ``0``."""
    return device.type == "cuda" and settings.get().pdl and _capability(_index(device))[0] >= 9


def _arch(device: torch.device) -> str:
    from ....loader import arch_of_capability

    return arch_of_capability(*_capability(_index(device)))


@functools.lru_cache(maxsize=None)
def _kernel(cfg: RoutingConfig, arch: str):
    from ....loader import get_kernel

    family.ensure_registered()
    return get_kernel(family.spec_for(cfg), arch)


@functools.lru_cache(maxsize=None)
def _launcher(cfg: RoutingConfig, arch: str):
    from ....loader.torch_op import gemm_launcher

    return gemm_launcher(_kernel(cfg, arch))


def _run(cfg: RoutingConfig, device: torch.device, tensors: tuple, ints: tuple) -> None:
    arch = _arch(device)
    launcher = _launcher(cfg, arch)
    if launcher is not None:
        launcher(*tensors, *ints)
    else:
        _kernel(cfg, arch)(*(t.data_ptr() for t in tensors), *ints, torch.cuda.current_stream(device).cuda_stream)


def _ids_dtype(topk_ids: torch.Tensor, what: str = "topk_ids") -> str:
    if topk_ids.dtype == torch.int32:
        return "int32"
    if topk_ids.dtype == torch.int64:
        return "int64"
    raise TypeError(f"{what}: expected int32 or int64, got {topk_ids.dtype}")


def prepare_routes_cute(topk_ids: torch.Tensor, num_experts: int, expert_offset: int, block_m: int,
                        zeroed: int = 0):
    """Group the routes of ``topk_ids [T, k]`` (int32/int64, contiguous, ``T * k >= 1``) by local expert:
    the contract of the Triton ``prepare_routes`` (1 launch up to :data:`SMALL_ROUTES` routes, else 2)."""
    ids_dt = _ids_dtype(topk_ids)
    if not topk_ids.is_contiguous():
        raise ValueError("topk_ids: must be contiguous")
    num_routes = topk_ids.numel()
    if num_routes < 1:
        raise ValueError("topk_ids: needs at least one route (T * k >= 1)")
    if num_experts < 1:
        raise ValueError(f"num_experts: must be >= 1, got {num_experts}")
    if block_m < 1:
        raise ValueError(f"block_m: must be >= 1, got {block_m}")
    if zeroed < 0:
        raise ValueError(f"zeroed: must be >= 0, got {zeroed}")
    dev = topk_ids.device
    e = num_experts
    num_blocks = num_row_blocks(num_routes, e, block_m)
    pdl = pdl_supported(dev)
    RoutePlan = _route_plan_cls()
    if num_routes <= SMALL_ROUTES:
        ws, part = _int32_workspace({"block_info": 4 * num_blocks, "sorted": num_routes, "zeroed": zeroed,
                                     "route_start": e + 1, "block_start": e + 1}, dev)
        cfg = family.route_config("single", ids_dt, e, pdl)
        _run(cfg, dev, (topk_ids, part["block_info"], part["sorted"], part["zeroed"] if zeroed else ws,
                        part["route_start"], part["block_start"], ws, ws, ws),
             (e, expert_offset, block_m, num_routes, zeroed, num_blocks, 0))
    else:
        programs, span = _spans(num_routes)
        e_pad = family.e_pad_for(e)
        ws, part = _int32_workspace({"block_info": 4 * num_blocks, "sorted": num_routes, "zeroed": zeroed,
                                     "hist": programs * e_pad, "route_start": e + 1, "block_start": e + 1}, dev)
        zbuf = part["zeroed"] if zeroed else ws
        _run(family.route_config("hist", ids_dt, e, pdl), dev,
             (topk_ids, ws, ws, zbuf, ws, ws, ws, part["hist"], ws),
             (e, expert_offset, 0, num_routes, zeroed, 0, span))
        _run(family.route_config("place", ids_dt, e, pdl), dev,
             (topk_ids, part["block_info"], part["sorted"], ws, part["route_start"], part["block_start"], ws,
              part["hist"], ws),
             (e, expert_offset, block_m, num_routes, 0, num_blocks, span))
    block_info = part["block_info"].view(num_blocks, 4)
    return RoutePlan(part["sorted"], part["route_start"], part["block_start"], block_info, num_blocks, block_m,
                     part["zeroed"] if zeroed else None)


def prepare_masked_routes_cute(masked_m: torch.Tensor, cap: int, block_m: int, out: torch.Tensor,
                               zeroed: int = 0):
    """The masked layout's :class:`RoutePlan` and the zeroed dead rows of ``out [E, cap, H]``: the contract
    of the Triton ``prepare_masked_routes`` (one launch; ``zeroed`` is zeroed by that launch)."""
    if masked_m.dtype != torch.int32:
        raise TypeError(f"masked_m: expected int32, got {masked_m.dtype}")
    if not masked_m.is_contiguous():
        raise ValueError("masked_m: must be contiguous")
    e = masked_m.numel()
    if e < 1:
        raise ValueError("masked_m: needs at least one expert")
    if cap < 1:
        raise ValueError(f"cap: must be >= 1, got {cap}")
    if block_m < 1:
        raise ValueError(f"block_m: must be >= 1, got {block_m}")
    if out.dim() != 3 or out.shape[0] != e or out.shape[1] != cap or not out.is_contiguous():
        raise ValueError(f"out: expected a contiguous [E={e}, cap={cap}, H] tensor, got {tuple(out.shape)}")
    if out.element_size() != 2:
        raise TypeError(f"out: expected a 16-bit dtype (bf16 / fp16), got {out.dtype}")
    if zeroed < 0:
        raise ValueError(f"zeroed: must be >= 0, got {zeroed}")
    dev = masked_m.device
    hidden = out.shape[-1]
    ws, part = _int32_workspace({"sorted": e * cap, "route_start": e + 1, "block_start": e + 1,
                                 "zeroed": zeroed}, dev)
    _run(family.masked_config(pdl_supported(dev)), dev,
         (masked_m, ws, out, part["sorted"], part["route_start"], part["block_start"], ws,
          part["zeroed"] if zeroed else ws, ws),
         (e, hidden, block_m, cap, zeroed, 0, 0))
    RoutePlan = _route_plan_cls()
    return RoutePlan(part["sorted"], part["route_start"], part["block_start"], ws[:0].view(0, 4), 0, block_m,
                     part["zeroed"] if zeroed else None)


def launch_finalize_cute(ybuf: torch.Tensor, topk_weights: torch.Tensor, out: torch.Tensor, *,
                         topk_ids: Optional[torch.Tensor] = None, num_experts: int = 0, expert_offset: int = 0,
                         valid: Optional[torch.Tensor] = None) -> None:
    """Combine ``ybuf [T*k, H]`` into ``out [T, H]`` (T >= 1): the contract of the Triton ``launch_finalize``
    (bit-identical results: the same FP32 operations in the same order). ``ybuf`` may be wider than ``out`` (a
    padded plan's row-major ``[T*k, Hp]`` buffer: its first ``H`` columns are read through its row stride)."""
    tokens, hidden = out.shape
    top_k = topk_weights.shape[1]
    dt = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(out.dtype)
    if dt is None:
        raise TypeError(f"out: expected bf16 or fp16, got {out.dtype}")
    if ybuf.dtype != out.dtype:
        raise TypeError(f"ybuf: expected {out.dtype} (out's dtype), got {ybuf.dtype}")
    if topk_weights.dtype != torch.float32:
        raise TypeError(f"topk_weights: expected float32, got {topk_weights.dtype}")
    if tokens < 1 or hidden < 1 or top_k < 1:
        raise ValueError(f"out / topk_weights: need T >= 1, H >= 1, k >= 1, got T={tokens}, H={hidden}, k={top_k}")
    if ybuf.dim() != 2 or ybuf.shape[0] != tokens * top_k or ybuf.shape[1] < hidden or ybuf.stride(1) != 1:
        raise ValueError(f"ybuf: expected a row-major [{tokens * top_k}, >= {hidden}] tensor, got shape "
                         f"{tuple(ybuf.shape)}, strides {tuple(ybuf.stride())}")
    ld = ybuf.stride(0)
    for name, t in (("topk_weights", topk_weights), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    if valid is not None:
        if valid.dtype not in (torch.bool, torch.uint8) or tuple(valid.shape) != (tokens, top_k):
            raise ValueError(f"valid: expected a bool [T={tokens}, k={top_k}] tensor, got {valid.dtype} "
                             f"{tuple(valid.shape)}")
        source, ids, mask = "mask", out, valid.contiguous().view(torch.uint8)
    else:
        if topk_ids is None:
            raise ValueError("topk_ids / valid: one of them must be given")
        source, ids, mask = _ids_dtype(topk_ids), topk_ids.contiguous(), out
    vec = 8 if hidden % 8 == 0 and ld % 8 == 0 and ybuf.data_ptr() % 16 == 0 and out.data_ptr() % 16 == 0 else 1
    dev = out.device
    cfg = family.finalize_config(dt, source, vec, pdl_supported(dev))
    _run(cfg, dev, (ids, ybuf, out, mask, out, out, topk_weights, out, out),
         (num_experts, hidden, ld, tokens, top_k, expert_offset, 0))


def pad_copy_cute(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x [..., C]`` (contiguous, a 16-bit dtype, on a CUDA GPU) as a new zero-padded ``[..., width]`` tensor
    (``width >= C``), in one launch: the contract of :func:`w4a16_moe.kernels.cute.pad_copy.pad_copy`."""
    c = x.shape[-1]
    if x.element_size() != 2:
        raise TypeError(f"x: expected a 16-bit dtype, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError("x: must be contiguous")
    if c < 1 or width < c:
        raise ValueError(f"width: expected >= x's last size {c} >= 1, got {width}")
    y = torch.empty(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
    rows = x.numel() // c
    if rows:
        vec = 8 if c % 8 == 0 and width % 8 == 0 and x.data_ptr() % 16 == 0 and y.data_ptr() % 16 == 0 else 1
        dev = x.device
        _run(family.pad_config(vec, pdl_supported(dev)), dev, (x, y, y, y, y, y, y, y, y),
             (0, width, c, rows, 0, 0, 0))
    return y


def configs_for(num_experts: int, device: torch.device, ids_dtypes=(torch.int32, torch.int64),
                dtypes=(torch.bfloat16, torch.float16), masked: bool = True) -> list:
    """Every config a call with ``num_experts`` local experts on ``device`` may launch (for warmup)."""
    pdl = pdl_supported(device)
    ids = [_ids_dtype(torch.empty(0, dtype=d)) for d in ids_dtypes]
    cfgs = [family.route_config(m, i, num_experts, pdl) for i in ids for m in ("single", "hist", "place")]
    names = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    cfgs += [family.finalize_config(names[d], s, v, pdl) for d in dtypes for s in (*ids, "mask") for v in (8, 1)]
    cfgs += [family.pad_config(v, pdl) for v in (8, 1)]
    if masked:
        cfgs.append(family.masked_config(pdl))
    return cfgs


def warm(num_experts: int, device: torch.device, **kw) -> list:
    """Load (prebuilt / JIT cache / JIT) every kernel of :func:`configs_for` before CUDA-graph capture;
    returns their spec names."""
    arch = _arch(device)
    out = []
    for cfg in configs_for(num_experts, device, **kw):
        k = _kernel(cfg, arch)
        k.ensure_loaded()
        _launcher(cfg, arch)
        out.append(k.name)
    return out

"""Kernel loading shared by JIT and AOT: one artifact type (a self-contained ``.so`` + ``meta.json``), one loader.

``get_kernel(spec, arch)`` returns a callable for the compiled kernel ``spec`` (a :class:`KernelSpec`) on
``arch`` (``"sm_90a"`` / ``"sm_100a"``; ``None`` = the current GPU's), trying in order:

1. a kernel already returned in this process;
2. a prebuilt library shipped in the package (``w4a16_moe/_prebuilt/manifest.json``, see :mod:`.prebuilt`);
3. the JIT cache (:mod:`.jit_cache`);
4. JIT compilation into the cache (needs the CuTe DSL; forbidden by ``W4A16_MOE_DISABLE_JIT=1``).

Each decision is logged at INFO on the ``"w4a16_moe"`` logger (``W4A16_MOE_LOG=info``); :func:`kernel_status`
answers the same question without building or loading anything (for ``doctor`` and provider checks). The
callable is a :class:`~.library.Kernel`: ``kernel(*args)`` launches with Python ints/floats (pointers,
scalars, stream handle; see :mod:`.library` for the argument conventions and :mod:`.shim` for the C ABI);
grouped-GEMM kernels can also launch through the stable-ABI torch op library (:mod:`.torch_op`).

The loader modules import neither ``cutlass`` nor ``torch`` nor CUDA Python (the DSL is imported only to compile).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Optional

from ..archs import arch_of_capability
from ._log import get_logger
from .jit_cache import JitDisabledError, KernelNotAvailableError, cache_dir, jit_disabled
from .library import Kernel, KernelLaunchError, KernelLibrary, KernelLoadError, load_library
from .spec import SUPPORTED_ARCHS, KernelSpec, check_arch, register_family, registered_families

__all__ = [
    "KernelSpec",
    "Kernel",
    "KernelLibrary",
    "KernelLoadError",
    "KernelLaunchError",
    "KernelNotAvailableError",
    "JitDisabledError",
    "SUPPORTED_ARCHS",
    "register_family",
    "registered_families",
    "get_kernel",
    "kernel_status",
    "arch_of_capability",
    "is_loaded",
    "detect_arch",
    "describe",
    "cache_dir",
]

log = get_logger()

_KERNELS: dict = {}
_LOCK = threading.Lock()
_ORIGIN: dict = {}


def detect_arch(device: int = 0) -> str:
    """Arch of CUDA device ``device`` via the driver (``libcuda.so.1``), e.g. ``"sm_90a"``; no torch needed."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError("no CUDA driver (libcuda.so.1) on this machine; pass arch explicitly") from e
    if cu.cuInit(0) != 0:
        raise RuntimeError("cuInit failed: no usable CUDA device; pass arch explicitly")
    dev = ctypes.c_int()
    if cu.cuDeviceGet(ctypes.byref(dev), device) != 0:
        raise RuntimeError(f"CUDA device {device} not found")
    major, minor = ctypes.c_int(), ctypes.c_int()
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cu.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # ..._MINOR
    arch = arch_of_capability(major.value, minor.value)
    if arch not in SUPPORTED_ARCHS:
        raise RuntimeError(f"device {device} is {arch}; the loader builds only {SUPPORTED_ARCHS}")
    return arch


def is_loaded(spec: KernelSpec, arch: str) -> bool:
    """Whether ``spec``'s kernel for ``arch`` is loaded in this process (its first launch needs no module load:
    what CUDA-graph capture requires). Never builds or loads anything."""
    return bool(getattr(_KERNELS.get((spec, arch)), "loaded", False))


def kernel_status(spec: KernelSpec, arch: str) -> tuple:
    """``(source, reason)`` for ``spec`` on ``arch`` without building or loading anything: ``source`` is
    ``"prebuilt"``, ``"jit-cache"``, ``"jit"`` (would be compiled on first use) or None (not available),
    ``reason`` says why (e.g. why no prebuilt kernel matched and why JIT cannot run)."""
    from . import jit_cache, prebuilt, toolchain

    if (spec, arch) in _KERNELS:
        return _ORIGIN.get((spec, arch), "prebuilt"), "already loaded in this process"
    match, why = prebuilt.lookup(spec, arch)
    if match is not None:
        return "prebuilt", f"prebuilt {match.library}"
    try:
        hit = jit_cache.lookup(spec, arch)
    except Exception as e:  # e.g. the family's sources cannot be hashed here
        hit, why = None, f"{why}; JIT cache unusable ({e})"
    if hit is not None:
        return "jit-cache", f"no prebuilt ({why}); JIT cache {hit.library}"
    if jit_disabled():
        return None, f"no prebuilt ({why}), not in the JIT cache, and W4A16_MOE_DISABLE_JIT is set"
    if not toolchain.dsl_importable():
        return None, f"no prebuilt ({why}), not in the JIT cache, and the CuTe DSL (nvidia-cutlass-dsl) is not installed"
    return "jit", f"no prebuilt ({why}); would JIT-compile on first use"


def get_kernel(spec: KernelSpec, arch: Optional[str] = None) -> Kernel:
    """Callable for ``spec`` on ``arch``: prebuilt -> JIT cache -> JIT compile (see module docstring).

    Raises :class:`KernelNotAvailableError` (:class:`JitDisabledError` when JIT is disabled) naming the
    spec and why no prebuilt kernel matched.
    """
    if arch is None:
        arch = detect_arch()
    key = (spec, arch)
    k = _KERNELS.get(key)
    if k is not None:
        return k
    with _LOCK:
        k = _KERNELS.get(key)
        if k is not None:
            return k
        k = _resolve(spec, check_arch(arch))
        _KERNELS[key] = k
        return k


def _resolve(spec: KernelSpec, arch: str) -> Kernel:
    from . import jit_cache, prebuilt

    t0 = time.perf_counter()
    match, why = prebuilt.lookup(spec, arch)
    if match is not None:
        lib = load_library(match.library)
        k = lib.kernel(spec.name)
        _ORIGIN[(spec, arch)] = "prebuilt"
        log.info("kernel %s (%s): prebuilt %s (%.1f ms)", spec.name, arch, match.library, (time.perf_counter() - t0) * 1e3)
        return k
    log.info("kernel %s (%s): no prebuilt (%s)", spec.name, arch, why)
    res = jit_cache.get_or_build(spec, arch, context=f"prebuilt: {why}")
    lib = load_library(res.library)
    k = lib.kernel(spec.name)
    _ORIGIN[(spec, arch)] = "jit-cache" if res.status == "hit" else f"jit-{res.status}"
    if res.status == "hit":
        log.info("kernel %s (%s): JIT cache hit %s (%.1f ms)", spec.name, arch, res.library, (time.perf_counter() - t0) * 1e3)
    else:
        log.info("kernel %s (%s): JIT %s -> %s (%.2f s)", spec.name, arch, res.status, res.library, time.perf_counter() - t0)
    return k


def kernel_origin(spec: KernelSpec, arch: str) -> Optional[str]:
    """Where the kernel returned by :func:`get_kernel` came from in this process (``"prebuilt"``,
    ``"jit-cache"``, ``"jit-built"``, ``"jit-waited"``, ``"jit-rebuilt"``) or None."""
    return _ORIGIN.get((spec, arch))


def describe() -> dict:
    """Loader state for ``python -m w4a16_moe doctor`` (flat, printable values)."""
    from . import identity, jit_cache, prebuilt, toolchain

    d = {
        "cache_dir": f"{cache_dir()} ({jit_cache.cache_dir_source()})",
        "jit": "disabled (W4A16_MOE_DISABLE_JIT)" if jit_disabled() else "enabled",
        "cute_dsl": (f"importable (nvidia-cutlass-dsl {identity.dsl_version()})" if toolchain.dsl_importable() else "not installed (JIT unavailable)"),
        "families": ", ".join(registered_families()),
        "kernels_loaded": len(_KERNELS),
    }
    try:
        s = jit_cache.stats()
        per = ", ".join(f"{a}: {n}" for a, n in s["per_arch"].items())
        d["cache_entries"] = f"{s['entries']} ({s['bytes'] / 2**20:.1f} MiB)" + (f"; {per}" if per else "")
    except OSError as e:
        d["cache_entries"] = f"unreadable ({e})"
    p = prebuilt.summary()
    if p["found"]:
        d["prebuilt"] = (
            f"{p['kernels']} kernels in {p['libraries']} libraries at {p['dir']} ({p.get('subset') or 'unknown'} subset; "
            f"package {p['package_version']}"
            f"{'' if p['matches_installed'] else f', MISMATCH with installed {identity.package_version()}: not used'}; "
            + ", ".join(f"{a}: {n}" for a, n in p["per_arch"].items())
            + ")"
        )
    else:
        d["prebuilt"] = f"none ({p['reason']})"
    for arch, why in (p.get("empty_archs") or {}).items():
        d[f"prebuilt_{arch}"] = f"no kernels in this build: {why}"
    try:
        tk = toolchain.find_cuda_toolkit()
        d["link_toolchain"] = f"cudart_static {tk.runtime_version} at {tk.cudart_static}"
    except Exception as e:
        d["link_toolchain"] = f"unavailable ({e})"
    from . import torch_op

    try:
        d["torch_op"] = torch_op.describe()
    except Exception as e:  # the doctor must always print something useful
        d["torch_op"] = f"error: {type(e).__name__}: {e}"
    return d

"""The stable-ABI torch op library ``w4a16_moe_C`` (``csrc/w4a16_moe_C.cpp``): find it, load it, launch through it.

It defines ``torch.ops.w4a16_moe_C.grouped_gemm(launch_fn, module, w, act, out, sorted_routes, route_start,
block_start, topk_weights, ws, counters, num_experts, n, k, num_routes, top_k, max_tiles, num_splits)``, which
calls a grouped-GEMM kernel's C entry (``P_launch`` of a kernel library, see :mod:`.shim`) on torch's current
CUDA stream of ``act``'s device: about half the host overhead of the ctypes path (toolchain notes: 8.4 vs
15.6 us per call on the H200). Built against torch's stable ABI for torch 2.10, it loads in every
torch >= 2.10 and every Python 3.

Where the library comes from (:func:`find_library`), first match wins:

1. ``$W4A16_MOE_TORCH_OP_LIB`` (a path);
2. the installed package: ``w4a16_moe/lib/libw4a16_moe_C.so`` (the AOT wheel, built by CMake);
3. the JIT cache (``<cache>/torch_op/<key>/libw4a16_moe_C.so``), built there on first use by
   :func:`build_library` when this is a source checkout (``csrc/`` present), a C++ compiler and torch's
   stable-ABI headers are available and ``W4A16_MOE_DISABLE_JIT`` is not set (about 2 s).

Without it everything works through ctypes (:class:`~.library.Kernel`); :func:`gemm_launcher` then returns
None. ``W4A16_MOE_TORCH_OP=0`` disables the op library. Every decision is logged at INFO
(``W4A16_MOE_LOG=info``) and shown by ``python -m w4a16_moe doctor`` (:func:`describe`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Optional

from .. import settings
from ._log import get_logger

__all__ = ["LIB_NAME", "OP_NAMESPACE", "GEMM_ARGS", "find_library", "build_library", "load", "describe",
           "gemm_launcher", "GemmLauncher"]

log = get_logger()

LIB_NAME = "libw4a16_moe_C.so"
OP_NAMESPACE = "w4a16_moe_C"
#: torch's stable ABI of torch 2.10 (what csrc/ is compiled for; CMakeLists.txt uses the same value)
TORCH_TARGET_VERSION = "0x020a000000000000"
#: the C ABI the op expects: (name, kind) of P_launch's arguments after the module pointer
GEMM_ARGS = tuple([(n, "ptr") for n in ("w", "act", "out", "sorted_routes", "route_start", "block_start",
                                        "topk_weights", "ws", "counters")]
                  + [(n, "scalar") for n in ("num_experts", "n", "k", "num_routes", "top_k", "max_tiles",
                                             "num_splits")]
                  + [("stream", "stream")])

_LOCK = threading.Lock()
_STATE: dict = {}  # "loaded": (ok, why, path)


def _package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def _source_file() -> Optional[Path]:
    from .jit_cache import source_checkout_root

    root = source_checkout_root()
    src = root / "csrc" / "w4a16_moe_C.cpp" if root else None
    return src if src is not None and src.is_file() else None


def _torch_dirs() -> tuple:
    import torch

    base = Path(torch.__file__).resolve().parent
    return torch.__version__, base / "include", base / "lib"


def _cache_entry(src: Path) -> Path:
    from .jit_cache import cache_dir

    tv = _torch_dirs()[0]
    cxx = os.environ.get("CXX") or "g++"
    key = hashlib.sha256(b"\0".join([src.read_bytes(), tv.encode(), cxx.encode(), TORCH_TARGET_VERSION.encode()]))
    return cache_dir() / "torch_op" / key.hexdigest()[:16] / LIB_NAME


def find_library() -> tuple:
    """``(path or None, how)``: where the op library is (see the module docstring), without loading or
    building it; ``how`` says which rule matched or why none did."""
    env = settings.get().torch_op_lib
    if env:
        p = Path(env).expanduser()
        return (p, "W4A16_MOE_TORCH_OP_LIB") if p.is_file() else (None, f"W4A16_MOE_TORCH_OP_LIB={env} does not exist")
    p = _package_dir() / "lib" / LIB_NAME
    if p.is_file():
        return p, "installed package"
    src = _source_file()
    if src is None:
        return None, f"not in this installation ({p} missing; build the wheel with W4A16_MOE_AOT_ARCHS to get it)"
    import sys

    if "torch" not in sys.modules:  # the cache key needs torch's version; do not import torch just to look
        return None, "source checkout: looked up (or built) in the JIT cache once torch is imported"
    try:
        cached = _cache_entry(src)
    except ImportError as e:
        return None, f"torch not importable: {e}"
    if cached.is_file():
        return cached, "JIT cache"
    return None, f"not built yet (source checkout: {cached} is built on first use)"


def build_library(out: Optional[Path] = None) -> Path:
    """Compile ``csrc/w4a16_moe_C.cpp`` of this source checkout into ``out`` (default: its JIT-cache entry)
    with the recipe of ``CMakeLists.txt``; returns the path. RuntimeError naming what is missing."""
    src = _source_file()
    if src is None:
        raise RuntimeError("no csrc/w4a16_moe_C.cpp: the op library is built on demand only in a source checkout")
    tv, inc, libdir = _torch_dirs()
    if not (inc / "torch" / "csrc" / "stable" / "library.h").is_file():
        raise RuntimeError(f"torch {tv} has no stable-ABI headers under {inc} (need torch>=2.10)")
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r} not on PATH; set CXX)")
    out = Path(out) if out else _cache_entry(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    cmd = [cxx, "-shared", "-fPIC", "-std=c++17", "-O2", "-fvisibility=hidden", f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}",
           "-isystem", str(inc), str(src), "-o", str(tmp), str(libdir / "libtorch_cpu.so"), "-ldl",
           f"-Wl,-rpath-link,{libdir}", "-Wl,--as-needed", "-Wl,-z,defs", "-s"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"building {LIB_NAME} failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    os.replace(tmp, out)
    log.info("torch op library: built %s from %s (torch %s headers, stable ABI 2.10)", out, src, tv)
    return out


def _disabled() -> bool:
    return not settings.get().torch_op


def load() -> tuple:
    """``(loaded, why)``: load the op library once per process (building it first where allowed, see the
    module docstring) and register a fake implementation for ``torch.compile``."""
    st = _STATE.get("loaded")
    if st is not None:
        return st[0], st[1]
    with _LOCK:
        if "loaded" not in _STATE:
            _STATE["loaded"] = _load_locked()
            ok, why, _ = _STATE["loaded"]
            log.info("torch op library: %s", why if ok else f"not used ({why}); kernels launch through ctypes")
        return _STATE["loaded"][0], _STATE["loaded"][1]


def _load_locked() -> tuple:
    if _disabled():
        return False, "disabled by W4A16_MOE_TORCH_OP=0", None
    try:
        import torch
    except ImportError as e:
        return False, f"torch not importable: {e}", None
    if hasattr(torch.ops, OP_NAMESPACE) and hasattr(getattr(torch.ops, OP_NAMESPACE), "grouped_gemm"):
        return True, "already registered in this process", None
    path, how = find_library()
    if path is None and _source_file() is not None:
        from .jit_cache import jit_disabled

        if jit_disabled():
            return False, f"{how}; not building it: W4A16_MOE_DISABLE_JIT is set", None
        try:
            path, how = build_library(), "built into the JIT cache"
        except Exception as e:
            return False, f"{how}; building it failed: {e}", None
    if path is None:
        return False, how, None
    try:
        torch.ops.load_library(str(path))
    except Exception as e:
        return False, f"loading {path} ({how}) failed: {type(e).__name__}: {e}", path
    try:
        torch.library.register_fake(f"{OP_NAMESPACE}::grouped_gemm")(_fake_grouped_gemm)
    except Exception as e:  # an older torch without register_fake, or registered already: eager use still works
        log.debug("torch op library: no fake implementation registered (%s)", e)
    return True, f"loaded {path} ({how})", path


def _fake_grouped_gemm(*args) -> None:
    return None


def describe() -> str:
    """One line for ``doctor``: loaded from where, or why not (loads a library it finds when torch is
    imported already; never builds one)."""
    import sys

    path, how = find_library()
    if "loaded" not in _STATE and (path is None or "torch" not in sys.modules):
        return f"{path} ({how}), not loaded yet" if path else f"not loaded ({how})"
    ok, why = load()
    return why if ok else f"not used: {why} (kernels launch through ctypes)"


def _abi_mismatch(kernel) -> Optional[str]:
    got = tuple((a["name"], a["kind"]) for a in kernel.abi["args"])
    if got != GEMM_ARGS:
        return f"{kernel.name}: its C ABI {[n for n, _ in got]} is not the grouped-GEMM ABI of the op"
    if any(a.get("ctype") != "int32_t" for a in kernel.abi["args"] if a["kind"] == "scalar"):
        return f"{kernel.name}: its size arguments are not all int32_t"
    return None


class GemmLauncher:
    """Launch one grouped-GEMM :class:`~.library.Kernel` through ``torch.ops.w4a16_moe_C.grouped_gemm``.

    ``launcher(w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters, num_experts,
    n, k, num_routes, top_k, max_tiles, num_splits, stream=None)``: the arguments of ``Kernel.__call__`` for
    this ABI, except that the nine pointers are passed as CUDA **tensors** (the op takes their data
    pointers) and the launch always goes to torch's current stream of ``act``'s device: ``stream`` may be
    omitted (None); if given it must be that stream's handle (ValueError otherwise). The kernel module is
    loaded on the first call (once per process, like the ctypes path). A failed launch raises RuntimeError
    naming the cudaError_t.
    """

    __slots__ = ("kernel", "_op", "_launch", "_module", "_pid")

    def __init__(self, kernel, op):
        self.kernel = kernel
        self._op = op
        self._launch = kernel.launch_address
        self._module = 0
        self._pid = None

    def __call__(self, w, act, out, sorted_routes, route_start, block_start, topk_weights, ws, counters,
                 num_experts, n, k, num_routes, top_k, max_tiles, num_splits, stream=None):
        if self._pid != os.getpid():
            self._module = self.kernel.module_address  # loads the module (per process)
            self._pid = os.getpid()
        if stream is not None:
            import torch

            cur = torch.cuda.current_stream(act.device).cuda_stream
            if int(stream) != cur:
                raise ValueError(f"{self.kernel.name}: stream {stream:#x} is not torch's current stream {cur:#x} of "
                                 f"{act.device}; the op library launches on the current stream (use torch.cuda.stream)")
        self._op(self._launch, self._module, w, act, out, sorted_routes, route_start, block_start, topk_weights, ws,
                 counters, num_experts, n, k, num_routes, top_k, max_tiles, num_splits)

    def __repr__(self) -> str:
        return f"<GemmLauncher {self.kernel.name} via torch.ops.{OP_NAMESPACE}.grouped_gemm>"


def gemm_launcher(kernel) -> Optional[GemmLauncher]:
    """A :class:`GemmLauncher` for ``kernel`` (a grouped-GEMM :class:`~.library.Kernel`), or None when the op
    library is unavailable or the kernel's ABI is not the op's (the reason is logged at INFO): the caller
    then launches through ``kernel(...)`` (ctypes) as before."""
    why = _abi_mismatch(kernel)
    if why is None:
        ok, lwhy = load()
        if ok:
            import torch

            return GemmLauncher(kernel, getattr(torch.ops, OP_NAMESPACE).grouped_gemm.default)
        why = lwhy
    log.info("kernel %s: launched through ctypes (%s)", kernel.name, why)
    return None

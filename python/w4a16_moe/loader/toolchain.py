"""The tools a kernel-library build needs, found on this machine: the CuTe DSL's libraries, CUDA's headers
and ``libcudart_static.a`` (``CUDA_HOME`` / ``nvcc`` / pip's ``nvidia-cuda-runtime``), the C++ compiler
(``$CXX``, default ``g++``), and ``readelf`` / ``nm`` to inspect what was linked.

Nothing here shapes an artifact's code; :mod:`.build` runs the recipe with what this module finds.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ._log import get_logger
from .identity import dsl_roots

__all__ = ["BuildError", "CudaToolkit", "dsl_importable", "find_dsl_lib_dir", "preload_dsl_runtime",
           "find_cuda_toolkit", "find_cxx", "cxx_version", "run_tool", "read_needed", "read_dynamic_symbols"]

log = get_logger()


class BuildError(RuntimeError):
    """Compiling, exporting or linking a kernel library failed."""


def dsl_importable() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def find_dsl_lib_dir() -> Path:
    """Directory holding ``libcute_dsl_runtime.so`` and ``libcuda_dialect_runtime_static.a``.

    Order: ``CUTE_DSL_LIBS`` (as the DSL reads it); the CUDA flavour (``cu12``/``cu13``) whose
    ``_cutlass_ir`` module the DSL already loaded in this process; else the newest ``cu*/lib`` of the
    installed ``nvidia_cutlass_dsl`` package (the DSL also picks the newest when there is no driver).
    """
    env = os.environ.get("CUTE_DSL_LIBS")
    if env:
        for p in env.split(os.pathsep):
            if p.endswith("libcute_dsl_runtime.so") and Path(p).exists():
                return Path(p).parent
    flavor = None
    mod = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    m = re.search(r"\.cu(\d+)\.", getattr(mod, "__file__", "") or "")
    if m:
        flavor = f"cu{m.group(1)}"
    for root in dsl_roots():
        cands = sorted(
            (d for d in root.glob("cu*/lib") if (d / "libcute_dsl_runtime.so").exists()),
            key=lambda d: int(re.sub(r"\D", "", d.parent.name) or 0),
            reverse=True,
        )
        if flavor:
            cands = [d for d in cands if d.parent.name == flavor] or cands
        if cands:
            return cands[0]
        if (root / "lib" / "libcute_dsl_runtime.so").exists():
            return root / "lib"
    raise BuildError("cannot find the CuTe DSL runtime libraries; is nvidia-cutlass-dsl[cu13] installed?")


_PRELOADED: dict = {}


def preload_dsl_runtime() -> Optional[Path]:
    """Load ``libcute_dsl_runtime.so`` with ``RTLD_GLOBAL`` (once per process).

    Needed on GPU-less machines: without it ``export_to_c`` fails with "JIT session error: Symbols not found:
    _cuKernelGetAttribute ...". Harmless where a GPU is present.
    """
    if "rt" in _PRELOADED:
        return _PRELOADED["rt"][0]
    path = find_dsl_lib_dir() / "libcute_dsl_runtime.so"
    handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    _PRELOADED["rt"] = (path, handle)
    log.debug("preloaded %s (RTLD_GLOBAL)", path)
    return path


@dataclass(frozen=True)
class CudaToolkit:
    root: Path
    include_dir: Path
    cudart_static: Path
    runtime_version: int  # CUDART_VERSION, e.g. 13000


def _cudart_version(include_dir: Path) -> int:
    try:
        txt = (include_dir / "cuda_runtime_api.h").read_text(errors="replace")
        m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", txt)
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


def _toolkit_at(root: Path) -> Optional[CudaToolkit]:
    inc_c = [root / "include", root / "targets" / "x86_64-linux" / "include", root / "targets" / "sbsa-linux" / "include"]
    lib_c = [
        root / "lib64",
        root / "lib",
        root / "targets" / "x86_64-linux" / "lib",
        root / "targets" / "sbsa-linux" / "lib",
    ]
    inc = next((d for d in inc_c if (d / "cuda_runtime.h").exists()), None)
    lib = next((d / "libcudart_static.a" for d in lib_c if (d / "libcudart_static.a").exists()), None)
    if inc is None or lib is None:
        return None
    return CudaToolkit(root, inc, lib, _cudart_version(inc))


def find_cuda_toolkit() -> CudaToolkit:
    """Headers + ``libcudart_static.a``: ``CUDA_HOME``/``CUDA_PATH``, then ``nvcc`` on ``PATH``, then
    ``/usr/local/cuda``, then pip packages under the ``nvidia`` namespace (``nvidia-cuda-runtime``...)."""
    roots = []
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots.append(Path("/usr/local/cuda"))
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for a in sorted(Path(base).glob("*/lib/libcudart_static.a"), reverse=True):
            roots.append(a.parent.parent)
    tried = []
    for r in roots:
        tk = _toolkit_at(r)
        if tk:
            return tk
        tried.append(str(r))
    raise BuildError(
        "cannot find CUDA headers + libcudart_static.a (set CUDA_HOME, or install the CUDA toolkit / "
        f"nvidia-cuda-runtime); tried {tried}"
    )


def find_cxx() -> str:
    """The C++ compiler that compiles the shims and links (``$CXX``, default ``g++``)."""
    return os.environ.get("CXX") or "g++"


def cxx_version(compiler: str) -> str:
    """First line of ``compiler --version`` (recorded in ``meta.json``), or ``"unknown"``."""
    try:
        return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except Exception:
        return "unknown"


def run_tool(cmd: Sequence[str], what: str) -> str:
    """Run ``cmd``; its stdout, or :class:`BuildError` naming ``what`` with the command and its output."""
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"{what} failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def read_needed(so_path) -> list:
    """``DT_NEEDED`` entries of an ELF shared object (via ``readelf -d``)."""
    out = run_tool(["readelf", "-d", str(so_path)], "readelf")
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def read_dynamic_symbols(so_path) -> list:
    """Defined dynamic (exported) function/object symbols of a shared object (via ``nm -D``)."""
    out = run_tool(["nm", "-D", "--defined-only", str(so_path)], "nm")
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())

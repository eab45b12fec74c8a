"""Build kernel libraries: compile -> ``export_to_c`` -> shim -> one self-contained ``.so`` (+ ``meta.json``).

This is the one artifact type used by both the JIT cache and the AOT/prebuilt path.

Pipeline
--------
1. :func:`compile_objects` runs each spec's family ``compile_fn(spec, arch)`` (``cute.compile`` with fake
   tensors, ``--gpu-arch sm_90a|sm_100a``) and ``compiled.export_to_c(out_dir, name, function_prefix=name)``,
   giving ``<name>.h`` + ``<name>.o`` (the cubin is embedded in the ``.o``). The generated header is parsed
   into an ABI description and saved, with timings, as a sidecar ``<name>.json``.
2. :func:`link_shared_library` generates a C++ shim per kernel (all in one translation unit that includes
   every ``<name>.h``) and links every ``.o`` + shims + the DSL's ``libcuda_dialect_runtime_static.a`` + CUDA's
   ``libcudart_static.a`` with ``g++ -shared -fPIC ... -ldl -lpthread -lrt`` and a version script that exports
   only the entry points listed below. The result must need only libc-family libraries (checked with
   ``readelf -d``): no libcuda (driver entry points are resolved at run time by the static cudart), no
   libcudart, no ``libcute_dsl_runtime.so``, no DSL or Python at run time.
   The recipe is split so that CMake can run the compiler itself (the wheel build, ``CMakeLists.txt``):
   :func:`prepare_link` writes the shim source + version script, :func:`link_commands` is the compiler
   command line (its flags :data:`SHIM_CXXFLAGS`, :data:`LINK_FLAGS`, :data:`SYSTEM_LIBS` are what CMake
   uses too), :func:`check_library` + :func:`write_meta` check the result and describe it.

Why a shim: the DSL's header defines ``<prefix>_Kernel_Module_Load`` and ``cute_dsl_<prefix>_wrapper`` as
``static inline`` functions, so they are NOT symbols of the ``.o``. In addition the generated
``_Kernel_Module_Load`` (DSL 4.8.1) reads an uninitialised ``device_count`` when ``cudaGetDeviceCount`` fails
and reports errors only with ``printf``; the shim's own load routine follows the same protocol
(``_mlir_<prefix>_cuda_init`` then ``_mlir_<prefix>_cuda_load_to_device`` for every device) but returns
the first ``cudaError_t``. The shim generator checks the header still contains that protocol.

Exported C ABI (per kernel, ``P`` = ``spec.name``)::

    int32_t     P_module_load(P_Kernel_Module_t *m);    // cudaError_t; loads the cubin on every device
    int32_t     P_module_unload(P_Kernel_Module_t *m);  // cudaError_t
    int32_t     P_launch(P_Kernel_Module_t *m, <args of the @cute.jit function>);   // cudaError_t
    const char *P_abi(void);                            // JSON: the "abi" object of meta.json
    // P_Kernel_Module_t is { cudaLibrary_t module; }: one pointer (static_assert in the shim).

plus, once per library::

    const char *w4a16_moe_cuda_error_name(int32_t err);
    const char *w4a16_moe_cuda_error_string(int32_t err);
    const char *w4a16_moe_library_info(void);           // JSON {"abi_version", "arch", "kernels": [names]}

``P_launch`` forwards to the header's ``cute_dsl_P_wrapper``; its arguments map 1:1 to the ``@cute.jit``
function's parameters (DSL 4.8.1, read from generated headers):

==============================================  =========================================================
``@cute.jit`` parameter                          C parameter of ``P_launch``
==============================================  =========================================================
``cute.Pointer`` (compiled from ``make_ptr``)    ``void *name``
``cutlass.Int32`` / ``Int64`` / ``Uint8``...     ``int32_t name`` / ``int64_t`` / ``uint8_t`` (by value)
``cutlass.Boolean``                              ``uint8_t name``
``cutlass.Float32`` / ``Float64``                ``float name`` / ``double name``
``cutlass.Float16`` / ``BFloat16``               ``uint16_t name`` (raw bits; the shim converts to the
                                                 header's ``__half_raw`` / ``__nv_bfloat16``)
``cute.Tensor`` (fake tensor)                    ``P_Tensor_name_t *name`` with ``typedef struct { void *data;
                                                 int32_t dynamic_shapes[S]; int64_t dynamic_strides[D]; }``
                                                 (only DYNAMIC modes, in mode order; arrays absent when 0;
                                                 shape ints are int64_t for 64-bit SymInts, strides int32_t
                                                 with ``use_32bit_stride``)
list/tuple of tensors                            ``P_TensorList_name_t *`` = ``{ P_Tensor_name_t
                                                 elements[N]; int32_t count; }``
tuple of dynamic ints (cute algebra type)        ``int32_t *name`` (array of the dynamic entries)
``stream: cuda.CUstream``                        ``cudaStream_t stream`` (by value; ``CUstream`` handle)
==============================================  =========================================================

Inside, the wrapper packs ``void *args[] = {&scalar_or_ptr..., tensor_struct_ptr..., &stream, &ret}`` and
calls ``_mlir_P__mlir_ciface_<mangled fn name>(args, nargs)``; ``ret`` (``int32_t``) is the launch's
``cudaError_t``. The module argument is not used by the launch itself (the kernel handles live in globals
of the ``.o`` filled by ``P_module_load``), but the load MUST happen first, once per process.

Sidecar ``<name>.json`` (in the object directory)::

    {"spec": {"name", "family", "params"}, "arch", "source_hash", "dsl_version",
     "compile_s", "export_s", "object": "<name>.o", "header": "<name>.h", "abi": {...},
     "cubins": [{"sha256", "size", "sm"}, ...]}     # the device code embedded in the .o (loader/sass.py)

``meta.json`` (beside the library)::

    {"format": "w4a16_moe.kernel_library", "format_version": 1, "abi_version": 1,
     "library": "<file name>", "sha256": "<hex of the .so>", "size": <bytes>,
     "arch": "sm_90a", "dsl_version": "4.8.1", "package_version": "0.1.0",
     "cuda_runtime_version": 13000, "created_utc": "...", "link_s": <float>,
     "needed": ["libc.so.6", ...], "toolchain": {"cxx": "...", "cudart_static": "...",
     "dialect_runtime": "..."},
     "kernels": [{"name", "family", "params", "source_hash", "compile_s", "export_s", "cubins": [...],
                  "abi": {"prefix", "return", "signature", "args": [...], "ciface"}}]}

``abi.args`` items: ``{"name", "kind", "ctype"}`` with kind ``ptr`` | ``scalar`` | ``half`` | ``bfloat16`` |
``stream`` | ``tensor`` (+ ``"fields": [[field, ctype, count], ...]``) | ``tensor_list`` (+ ``"fields"``,
``"count"``) | ``array`` (+ ``"count"``).
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .spec import SUPPORTED_ARCHS, KernelSpec, family_source_hash, get_family

log = logging.getLogger("w4a16_moe")

ABI_VERSION = 1
META_FORMAT = "w4a16_moe.kernel_library"
META_FORMAT_VERSION = 1

#: NEEDED entries a built library may have (glibc family).
ALLOWED_NEEDED = frozenset(
    {
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libgcc_s.so.1",
        "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1",
    }
)


class BuildError(RuntimeError):
    """Compiling, exporting or linking a kernel library failed."""


#: ``--gpu-arch`` values a kernel library can be built for: the loader's archs plus those the AOT build
#: accepts for other families (the portable warp-MMA family targets sm_80 .. sm_120a).
BUILD_ARCHS = tuple(SUPPORTED_ARCHS)


def check_build_arch(arch: str) -> str:
    """``arch`` if kernels can be built for it, else ValueError naming the accepted values."""
    if arch not in BUILD_ARCHS:
        raise ValueError(f"arch {arch!r}: kernel libraries are built for one of {BUILD_ARCHS}")
    return arch


# ------------------------------------------------------------------------------------------------------
# versions and tool discovery
# ------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def package_version() -> str:
    try:
        from .._version import __version__

        return __version__
    except Exception:  # pragma: no cover
        return "unknown"


@functools.lru_cache(maxsize=None)
def dsl_version() -> str:
    """Version of the installed CuTe DSL (``nvidia-cutlass-dsl``), without importing it."""
    for root in _dsl_roots():  # fast path: the dist-info beside the package (importlib.metadata scans sys.path)
        for di in sorted(root.parent.glob("nvidia_cutlass_dsl-*.dist-info")):
            return di.name[len("nvidia_cutlass_dsl-") : -len(".dist-info")]
    for dist in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def dsl_importable() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def _dsl_roots() -> list:
    """Directories of the ``nvidia_cutlass_dsl`` install (a namespace package)."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is None:
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])]


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
    for root in _dsl_roots():
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


def _cxx() -> str:
    return os.environ.get("CXX") or "g++"


def _run(cmd: Sequence[str], what: str) -> str:
    p = subprocess.run(list(cmd), capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"{what} failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}")
    return p.stdout


# ------------------------------------------------------------------------------------------------------
# header parsing
# ------------------------------------------------------------------------------------------------------
_SCALAR_CTYPES = {
    "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "float", "double",
}
_STRUCT_RE = re.compile(r"typedef struct(?: __attribute__\(\(packed\)\))? \{(?P<body>[^{}]*)\} (?P<tname>\w+);")
_FIELD_RE = re.compile(r"^\s*(?P<type>[A-Za-z_][\w ]*?)\s*(?P<ptr>\*?)\s*(?P<name>\w+)(?:\[(?P<n>\d+)\])?;\s*$")


def _parse_structs(header: str) -> dict:
    out = {}
    for m in _STRUCT_RE.finditer(header):
        fields = []
        for line in m.group("body").strip().splitlines():
            line = line.strip()
            if not line:
                continue
            f = _FIELD_RE.match(line)
            if not f:
                raise BuildError(f"unexpected struct field in generated header: {line!r}")
            ctype = f.group("type").strip() + (" *" if f.group("ptr") else "")
            fields.append([f.group("name"), ctype, int(f.group("n") or 1)])
        out[m.group("tname")] = fields
    return out


def parse_header_abi(header: str, prefix: str) -> dict:
    """Parse the ``export_to_c`` header of kernel ``prefix`` into the ABI dict stored in meta.json."""
    P = re.escape(prefix)
    wm = re.search(
        rf"static inline (?P<ret>[\w ]+?) cute_dsl_{P}_wrapper\({P}_Kernel_Module_t \*module(?:, (?P<args>[^)]*))?\)\s*\{{"
        rf"(?P<body>.*?)\n\}}",
        header,
        re.S,
    )
    if not wm:
        raise BuildError(f"generated header for {prefix}: wrapper cute_dsl_{prefix}_wrapper not found")
    cm = re.search(rf"void (?P<ciface>_mlir_{P}__mlir_ciface_\w+)\(void \*\*args, int32_t num_args\);", header)
    structs = _parse_structs(header)
    body = wm.group("body")
    args = []
    for raw in [a.strip() for a in (wm.group("args") or "").split(",") if a.strip()]:
        am = re.match(r"^(?P<type>.*?)\s*(?P<name>\w+)$", raw)
        if not am:
            raise BuildError(f"cannot parse wrapper argument {raw!r}")
        ctype = re.sub(r"\s*\*\s*$", " *", am.group("type").strip())
        name = am.group("name")
        base = ctype.rstrip(" *")
        item = {"name": name, "ctype": ctype}
        if ctype.endswith("*") and base == "void":
            item["kind"] = "ptr"
        elif ctype.endswith("*") and base == f"{prefix}_Tensor_{name}_t":
            item["kind"] = "tensor"
            item["fields"] = structs[base]
        elif ctype.endswith("*") and base == f"{prefix}_TensorList_{name}_t":
            lst = structs[base]
            elem = [f for f in lst if f[0] == "elements"][0]
            item["kind"] = "tensor_list"
            item["count"] = elem[2]
            item["fields"] = structs[elem[1]]
        elif ctype.endswith("*") and base in _SCALAR_CTYPES:
            item["kind"] = "array"
            item["ctype"] = base
            item["count"] = len(re.findall(rf"&{re.escape(name)}\[\d+\]", body))
        elif base == "cudaStream_t":
            item["kind"] = "stream"
        elif base in _SCALAR_CTYPES:
            item["kind"] = "scalar"
        elif base == "__half_raw":
            item["kind"] = "half"
        elif base == "__nv_bfloat16":
            item["kind"] = "bfloat16"
        else:
            raise BuildError(f"kernel {prefix}: unsupported wrapper argument type {ctype!r} ({name})")
        args.append(item)
    ret = wm.group("ret").strip()
    return {
        "prefix": prefix,
        "return": ret,
        "signature": f"int32_t {prefix}_launch({prefix}_Kernel_Module_t *module"
        + "".join(", " + _exported_arg_decl(a) for a in args)
        + ")",
        "args": args,
        "ciface": cm.group("ciface") if cm else None,
    }


def _exported_arg_decl(a: dict) -> str:
    if a["kind"] in ("half", "bfloat16"):
        return f"uint16_t {a['name']}"
    ct = a["ctype"] + (" *" if a["kind"] == "array" else "")
    sep = "" if ct.endswith("*") else " "
    return f"{ct}{sep}{a['name']}"


# ------------------------------------------------------------------------------------------------------
# shim generation
# ------------------------------------------------------------------------------------------------------
_LOAD_PROTOCOL = (
    "initArgs = {&libraryPtr, &ret};",
    "loadArgs = {&libraryPtr, &device_id, &ret};",
    "cudaLibrary_t **libraryPtr;",
    "cudaLibrary_t **library;",
    "int32_t *device_id;",
)


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def generate_shim(header_name: str, header: str, abi: dict) -> str:
    """C++ source exporting ``P_module_load/unload``, ``P_launch``, ``P_abi`` for one kernel."""
    P = abi["prefix"]
    for needle in _LOAD_PROTOCOL + (f"void _mlir_{P}_cuda_init(void **);", f"void _mlir_{P}_cuda_load_to_device(void **);"):
        if needle not in header:
            raise BuildError(
                f"generated header {header_name} no longer matches the module-load protocol this loader "
                f"implements (missing {needle!r}); update loader/build.py for this DSL version"
            )
    params = ", ".join([f"{P}_Kernel_Module_t *module"] + [_exported_arg_decl(a) for a in abi["args"]])
    conv = []
    call_args = ["module"]
    for a in abi["args"]:
        n = a["name"]
        if a["kind"] == "half":
            conv.append(f"    __half_raw {n}_v; {n}_v.x = {n};")
            call_args.append(f"{n}_v")
        elif a["kind"] == "bfloat16":
            conv.append(f"    __nv_bfloat16_raw {n}_r; {n}_r.x = {n}; __nv_bfloat16 {n}_v({n}_r);")
            call_args.append(f"{n}_v")
        else:
            call_args.append(n)
    call = f"cute_dsl_{P}_wrapper({', '.join(call_args)})"
    launch_body = "\n".join(conv) + "\n" + (
        f"    {call};\n    return 0;" if abi["return"] == "void" else f"    return (int32_t){call};"
    )
    abi_json = json.dumps(abi, separators=(",", ":"), sort_keys=True)
    return f"""// Generated by w4a16_moe.loader.build (abi_version {ABI_VERSION}). Do not edit.
#include "{header_name}"
#ifndef W4A16_API
#define W4A16_API extern "C" __attribute__((visibility("default")))
#endif

static_assert(sizeof({P}_Kernel_Module_t) == sizeof(void *), "module struct layout changed");

// Same protocol as the header's {P}_Kernel_Module_Load, but returns the first error instead of printing it
// (and does not read an uninitialised device count when cudaGetDeviceCount fails).
W4A16_API int32_t {P}_module_load({P}_Kernel_Module_t *m) {{
    cudaLibrary_t *libraryPtr = &(m->module);
    cudaError_t ret = cudaSuccess;
    struct {{ cudaLibrary_t **libraryPtr; cudaError_t *ret; }} initArgs = {{&libraryPtr, &ret}};
    _mlir_{P}_cuda_init((void **)(&initArgs));
    if (ret != cudaSuccess) return (int32_t)ret;
    int32_t device_count = 0;
    cudaError_t e = cudaGetDeviceCount(&device_count);
    if (e != cudaSuccess) return (int32_t)e;
    int32_t device_id = 0;
    struct {{ cudaLibrary_t **library; int32_t *device_id; cudaError_t *ret; }} loadArgs = {{&libraryPtr, &device_id, &ret}};
    for (int32_t i = 0; i < device_count; i++) {{
        device_id = i;
        _mlir_{P}_cuda_load_to_device((void **)(&loadArgs));
        if (ret != cudaSuccess) return (int32_t)ret;
    }}
    return 0;
}}

W4A16_API int32_t {P}_module_unload({P}_Kernel_Module_t *m) {{
    return (int32_t)cudaLibraryUnload(m->module);
}}

W4A16_API int32_t {P}_launch({params}) {{
{launch_body}
}}

W4A16_API const char *{P}_abi(void) {{
    return {_c_string(abi_json)};
}}
"""


def _generate_lib_source(arch: str, names: Sequence[str]) -> str:
    info = json.dumps({"abi_version": ABI_VERSION, "arch": arch, "kernels": list(names)}, separators=(",", ":"))
    return f"""// Generated by w4a16_moe.loader.build. Do not edit.
#include <cuda_runtime.h>
#include <stdint.h>
#ifndef W4A16_API
#define W4A16_API extern "C" __attribute__((visibility("default")))
#endif
W4A16_API const char *w4a16_moe_cuda_error_name(int32_t e) {{ return cudaGetErrorName((cudaError_t)e); }}
W4A16_API const char *w4a16_moe_cuda_error_string(int32_t e) {{ return cudaGetErrorString((cudaError_t)e); }}
W4A16_API const char *w4a16_moe_library_info(void) {{ return {_c_string(info)}; }}
"""


LIBRARY_SYMBOLS = ("w4a16_moe_cuda_error_name", "w4a16_moe_cuda_error_string", "w4a16_moe_library_info")
KERNEL_SYMBOL_SUFFIXES = ("_module_load", "_module_unload", "_launch", "_abi")


def exported_symbols(names: Iterable[str]) -> list:
    return list(LIBRARY_SYMBOLS) + [n + s for n in names for s in KERNEL_SYMBOL_SUFFIXES]


# ------------------------------------------------------------------------------------------------------
# compile + export
# ------------------------------------------------------------------------------------------------------
def _reusable(out_dir: Path, spec: KernelSpec, arch: str, src_hash: str) -> Optional[dict]:
    """The sidecar record of an object already compiled into ``out_dir`` from the same spec, arch, kernel
    sources and DSL version (a rebuild with a longer spec list then compiles only the new kernels), else None."""
    side, obj = out_dir / f"{spec.name}.json", out_dir / f"{spec.name}.o"
    if not (side.is_file() and obj.is_file() and (out_dir / f"{spec.name}.h").is_file()):
        return None
    try:
        rec = json.loads(side.read_text())
    except (OSError, ValueError):
        return None
    same = (rec.get("spec") == spec.to_json() and rec.get("arch") == arch and rec.get("source_hash") == src_hash
            and rec.get("dsl_version") == dsl_version() and rec.get("object") == obj.name)
    return rec if same else None


def compile_one(spec: KernelSpec, arch: str, out_dir: Path) -> dict:
    """Compile + export one spec into ``out_dir``; returns (and writes) its sidecar record."""
    check_build_arch(arch)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = get_family(spec.family)
    src_hash = family_source_hash(spec.family)
    compile_fn = info.resolve()
    t_imp = time.perf_counter()
    try:
        import cutlass.cute  # noqa: F401  (timed apart: the first import costs ~1 s per process)
    except ImportError as e:
        raise BuildError(f"cannot compile {spec.name}: the CuTe DSL is not importable ({e}); install w4a16-moe[jit]") from e

    preload_dsl_runtime()
    if time.perf_counter() - t_imp > 0.05:
        log.info("imported the CuTe DSL in %.2f s", time.perf_counter() - t_imp)
    name = spec.name
    reused = _reusable(out_dir, spec, arch, src_hash)
    if reused is not None:
        log.info("reusing %s for %s (same spec, source hash and DSL version)", name, arch)
        return reused
    t0 = time.perf_counter()
    try:
        compiled = compile_fn(spec, arch)
    except Exception as e:
        raise BuildError(f"compiling {name} ({spec!r}) for {arch} failed: {type(e).__name__}: {e}") from e
    t1 = time.perf_counter()
    try:
        compiled.export_to_c(str(out_dir), name, function_prefix=name)
    except Exception as e:
        raise BuildError(f"export_to_c of {name} for {arch} failed: {type(e).__name__}: {e}") from e
    t2 = time.perf_counter()
    header = (out_dir / f"{name}.h").read_text()
    abi = parse_header_abi(header, name)
    from .sass import extract_cubins

    cubins = extract_cubins((out_dir / f"{name}.o").read_bytes())
    if not cubins:
        raise BuildError(f"export_to_c of {name} for {arch}: no cubin embedded in {name}.o")
    rec = {
        "spec": spec.to_json(),
        "arch": arch,
        "source_hash": src_hash,
        "dsl_version": dsl_version(),
        "compile_s": round(t1 - t0, 4),
        "export_s": round(t2 - t1, 4),
        "object": f"{name}.o",
        "header": f"{name}.h",
        "abi": abi,
        # identifies this kernel's device code inside any linked library (see loader/sass.py)
        "cubins": [c.describe() for c in cubins],
    }
    (out_dir / f"{name}.json").write_text(json.dumps(rec, indent=1, sort_keys=True))
    log.info("compiled %s for %s: compile %.3f s, export %.3f s", name, arch, t1 - t0, t2 - t1)
    return rec


def compile_objects(specs: Iterable[KernelSpec], arch: str, out_dir) -> list:
    """Compile and export every spec for ``arch`` into ``out_dir``; returns the ``.o`` paths (in order).

    Writes ``<name>.h``, ``<name>.o`` and the sidecar ``<name>.json`` per spec.
    """
    out_dir = Path(out_dir)
    return [out_dir / compile_one(s, arch, out_dir)["object"] for s in specs]


def _family_ref(family: str) -> tuple:
    info = get_family(family)
    fn = info.compile_fn
    ref = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"
    return family, ref, tuple(info.sources)


def compile_objects_parallel(specs: Sequence[KernelSpec], arch: str, out_dir, workers: Optional[int] = None) -> list:
    """Like :func:`compile_objects`, spread over ``workers`` spawned processes (see :func:`compile_jobs`).
    Returns ``.o`` paths in the order of ``specs``."""
    return compile_jobs([(s, arch, Path(out_dir)) for s in specs], workers)


def compile_jobs(jobs: Sequence, workers: Optional[int] = None, on_done=None, chunk: Optional[int] = None) -> list:
    """Compile ``jobs`` = ``[(spec, arch, out_dir), ...]`` in a pool of ``workers`` spawned processes (each
    imports the DSL once, ~1 s, and then takes chunks of ``chunk`` jobs); ``on_done(n_done, n_total,
    record)`` is called in this process after every finished job (progress display). Families registered
    with a callable must be importable as ``module:qualname`` in the workers. Returns the ``.o`` paths in
    the order of ``jobs``; the first failure raises :class:`BuildError` after the pool is shut down."""
    jobs = [(s, a, Path(d)) for s, a, d in jobs]
    if not jobs:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    out = []
    if workers == 1:
        for i, (s, a, d) in enumerate(jobs):
            rec = compile_one(s, a, d)
            out.append(d / rec["object"])
            if on_done:
                on_done(i + 1, len(jobs), rec)
        return out
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    chunk = chunk or max(1, min(8, len(jobs) // (workers * 4)))
    parts = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
    fams = [_family_ref(f) for f in sorted({s.family for s, _, _ in jobs})]
    lvl = logging.getLogger("w4a16_moe").getEffectiveLevel()
    done = 0
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
        futs = {ex.submit(_compile_worker_jobs, [(s.to_json(), a, str(d)) for s, a, d in p], fams, lvl) for p in parts}
        pending = set(futs)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    raise f.exception()
                for rec in f.result():
                    done += 1
                    if on_done:
                        on_done(done, len(jobs), rec)
    return [d / f"{s.name}.o" for s, _, d in jobs]


def _compile_worker_jobs(jobs: list, families: list, log_level: int) -> list:
    from .spec import register_family

    logging.getLogger("w4a16_moe").setLevel(log_level)
    for fam, ref, srcs in families:
        register_family(fam, ref, sources=srcs, replace=True)
    return [compile_one(KernelSpec.from_json(sj), arch, Path(d)) for sj, arch, d in jobs]


# ------------------------------------------------------------------------------------------------------
# link
# ------------------------------------------------------------------------------------------------------
def read_needed(so_path) -> list:
    """``DT_NEEDED`` entries of an ELF shared object (via ``readelf -d``)."""
    out = _run(["readelf", "-d", str(so_path)], "readelf")
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def read_dynamic_symbols(so_path) -> list:
    """Defined dynamic (exported) function/object symbols of a shared object (via ``nm -D``)."""
    out = _run(["nm", "-D", "--defined-only", str(so_path)], "nm")
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cxx_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except Exception:
        return "unknown"


# One recipe for every kernel library, whoever runs it (this module with g++ for the JIT cache and
# ``python -m w4a16_moe aot --out``; CMake for the wheel, which reads these through aot/cmake_steps.py).
SHIM_CXXFLAGS = ("-O2", "-fPIC", "-fvisibility=hidden")
LINK_FLAGS = ("-static-libgcc", "-Wl,--as-needed", "-Wl,-z,defs", "-Wl,--exclude-libs,ALL")
SYSTEM_LIBS = ("dl", "pthread", "rt")
SHIM_SOURCE = "w4a16_moe_shims.cpp"
VERSION_SCRIPT = "exports.map"


@dataclass
class LinkPlan:
    """Everything needed to link one kernel library from exported objects (see :func:`prepare_link`)."""

    arch: str
    names: list
    objects: list  # Path of every <name>.o, in kernel order
    records: list  # their sidecar records
    shim_source: Path  # generated C++ (all shims + the library-wide entry points), one translation unit
    version_script: Path  # exports exactly exported_symbols(names)
    cuda_include: Path
    dialect_runtime: Path  # libcuda_dialect_runtime_static.a of the DSL
    cudart_static: Path
    cuda_runtime_version: int

    def to_json(self) -> dict:
        return {
            "arch": self.arch, "names": self.names, "objects": [str(o) for o in self.objects],
            "shim_source": str(self.shim_source), "version_script": str(self.version_script),
            "cuda_include": str(self.cuda_include), "dialect_runtime": str(self.dialect_runtime),
            "cudart_static": str(self.cudart_static), "cuda_runtime_version": self.cuda_runtime_version,
            "shim_cxxflags": list(SHIM_CXXFLAGS), "link_flags": list(LINK_FLAGS), "system_libs": list(SYSTEM_LIBS),
        }

    @classmethod
    def from_json(cls, d: dict) -> "LinkPlan":
        objs = [Path(o) for o in d["objects"]]
        return cls(d["arch"], list(d["names"]), objs, [json.loads(o.with_suffix(".json").read_text()) for o in objs],
                   Path(d["shim_source"]), Path(d["version_script"]), Path(d["cuda_include"]),
                   Path(d["dialect_runtime"]), Path(d["cudart_static"]), int(d["cuda_runtime_version"]))


def prepare_link(objs: Sequence, work_dir) -> LinkPlan:
    """Check the exported objects ``objs`` (their ``.h`` and sidecar ``.json`` beside them; one arch,
    distinct names) and write the shim source and the version script into ``work_dir``."""
    objs = [Path(o) for o in objs]
    if not objs:
        raise BuildError("link: no objects (an arch without kernels gets no library)")
    recs = []
    for o in objs:
        side = o.with_suffix(".json")
        if not side.exists() or not o.with_suffix(".h").exists() or not o.exists():
            raise BuildError(f"{o}: missing {o.name}, {side.name} or {o.with_suffix('.h').name} (not built by compile_objects?)")
        recs.append(json.loads(side.read_text()))
    archs = {r["arch"] for r in recs}
    if len(archs) != 1:
        raise BuildError(f"cannot link objects of different archs into one library: {sorted(archs)}")
    arch = archs.pop()
    names = [r["spec"]["name"] for r in recs]
    if len(set(names)) != len(names):
        raise BuildError("duplicate kernel names in one library")
    tk = find_cuda_toolkit()
    dialect = find_dsl_lib_dir() / "libcuda_dialect_runtime_static.a"
    if not dialect.exists():
        raise BuildError(f"missing {dialect}")
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    parts = [_generate_lib_source(arch, names)]
    for o, r in zip(objs, recs):
        header = o.with_suffix(".h")
        parts.append(generate_shim(str(header.resolve()), header.read_text(), r["abi"]))
    src = work / SHIM_SOURCE
    _write_if_changed(src, "\n".join(parts))
    vscript = work / VERSION_SCRIPT
    _write_if_changed(vscript, "{\n  global:\n" + "".join(f"    {x};\n" for x in exported_symbols(names)) + "  local: *;\n};\n")
    return LinkPlan(arch, names, objs, recs, src, vscript, tk.include_dir, dialect, tk.cudart_static, tk.runtime_version)


def _write_if_changed(path: Path, text: str) -> None:
    """Keep the mtime of unchanged generated files (CMake/ninja then relink nothing)."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def link_commands(plan: LinkPlan, out_path, *, strip: bool = True, cxx: Optional[str] = None) -> list:
    """The compiler commands :func:`link_shared_library` runs (shim compile, link): the recipe CMake mirrors."""
    cxx = cxx or _cxx()
    shim_obj = plan.shim_source.with_suffix(".o")
    compile_cmd = [cxx, "-c", *SHIM_CXXFLAGS, f"-I{plan.cuda_include}", str(plan.shim_source), "-o", str(shim_obj)]
    link_cmd = [
        cxx, "-shared", "-fPIC", "-o", str(out_path),
        *map(str, plan.objects), str(shim_obj),
        str(plan.dialect_runtime), str(plan.cudart_static),
        *(f"-l{x}" for x in SYSTEM_LIBS),
        *LINK_FLAGS, f"-Wl,--version-script={plan.version_script}",
    ] + (["-s"] if strip else [])
    return [compile_cmd, link_cmd]


def link_shared_library(objs: Sequence, out_path, *, meta_path=None, strip: bool = True, check: bool = True) -> dict:
    """Link exported kernel objects into one self-contained ``.so`` with g++ and write its ``meta.json``.

    ``objs`` are ``<name>.o`` paths produced by :func:`compile_objects` (their ``<name>.h`` and ``<name>.json``
    must sit beside them). ``meta_path`` defaults to ``meta.json`` in the directory of ``out_path``.
    Returns the meta dict. With ``check``, raises :class:`BuildError` if the library needs anything beyond
    :data:`ALLOWED_NEEDED` or does not export exactly the expected entry points.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    work = out_path.parent / f".{out_path.stem}.link{os.getpid()}"
    tmp_out = out_path.with_name(out_path.name + f".tmp{os.getpid()}")
    cxx = _cxx()
    try:
        plan = prepare_link(objs, work)
        for cmd, what in zip(link_commands(plan, tmp_out, strip=strip, cxx=cxx), ("shim compile", "link")):
            _run(cmd, what)
        link_s = time.perf_counter() - t0
        if check:
            check_library(tmp_out, plan.names, out_path.name)
        os.replace(tmp_out, out_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tmp_out.exists():
            tmp_out.unlink()
    return write_meta(plan, out_path, meta_path=meta_path, link_s=link_s, linker=_cxx_version(cxx))


def check_library(lib_path, names: Sequence[str], label: Optional[str] = None) -> list:
    """Raise :class:`BuildError` unless ``lib_path`` needs only :data:`ALLOWED_NEEDED` and exports exactly
    :func:`exported_symbols` of ``names``; returns its NEEDED list."""
    label = label or Path(lib_path).name
    needed = read_needed(lib_path)
    bad = [n for n in needed if n not in ALLOWED_NEEDED]
    if bad:
        raise BuildError(f"{label} would need non-libc libraries {bad} (NEEDED={needed})")
    syms = set(exported_symbols(names))
    got = set(read_dynamic_symbols(lib_path))
    missing, extra = syms - got, got - syms
    if missing or extra:
        raise BuildError(f"{label}: export mismatch; missing {sorted(missing)}, unexpected {sorted(extra)[:10]}")
    return needed


def write_meta(plan: LinkPlan, lib_path, *, meta_path=None, link_s: float = 0.0, linker: str = "") -> dict:
    """Write ``meta.json`` (see the module docstring) for the library ``lib_path`` linked from ``plan``."""
    lib_path = Path(lib_path)
    recs = plan.records
    meta = {
        "format": META_FORMAT,
        "format_version": META_FORMAT_VERSION,
        "abi_version": ABI_VERSION,
        "library": lib_path.name,
        "sha256": sha256_file(lib_path),
        "size": lib_path.stat().st_size,
        "arch": plan.arch,
        "dsl_version": recs[0].get("dsl_version") or dsl_version(),
        "package_version": package_version(),
        "cuda_runtime_version": plan.cuda_runtime_version,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "link_s": round(link_s, 4),
        "needed": read_needed(lib_path),
        "toolchain": {"cxx": linker, "cudart_static": str(plan.cudart_static), "dialect_runtime": str(plan.dialect_runtime)},
        "kernels": [
            {
                **r["spec"],
                "source_hash": r["source_hash"],
                "compile_s": r["compile_s"],
                "export_s": r["export_s"],
                "abi": r["abi"],
                "cubins": r.get("cubins", []),
            }
            for r in recs
        ],
    }
    mp_ = Path(meta_path) if meta_path else lib_path.parent / "meta.json"
    tmp_meta = mp_.with_name(mp_.name + f".tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp_meta, mp_)
    log.info("linked %s: %d kernel(s), %.1f KiB, %.3f s", lib_path.name, len(plan.names), meta["size"] / 1024, link_s)
    return meta


def build_library(specs: Sequence[KernelSpec], arch: str, out_path, *, work_dir=None, workers: int = 1, meta_path=None) -> dict:
    """compile (optionally in parallel) + link; the objects/headers stay in ``work_dir`` (default:
    ``<out dir>/obj-<arch>``). Returns the meta dict."""
    out_path = Path(out_path)
    work_dir = Path(work_dir) if work_dir else out_path.parent / f"obj-{arch}"
    objs = compile_objects_parallel(specs, arch, work_dir, workers) if workers > 1 else compile_objects(specs, arch, work_dir)
    return link_shared_library(objs, out_path, meta_path=meta_path)


def main(argv=None) -> int:
    """AOT driver.

    ``python -m w4a16_moe.loader.build --arch sm_90a --specs specs.json --out lib.so [-j N]`` builds one library;
    ``python -m w4a16_moe.loader.build --arch sm_90a,sm_100a --specs specs.json --prebuilt-dir DIR [-j N]``
    builds ``DIR/<arch>/kernels.so`` + ``DIR/<arch>/meta.json`` per arch and writes ``DIR/manifest.json``
    (the layout :mod:`.prebuilt` reads; DIR is normally ``python/w4a16_moe/_prebuilt``).
    ``specs.json``: a list of ``{"family": ..., "params": {...}}``.
    """
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True, help="one arch, or a comma-separated list with --prebuilt-dir")
    ap.add_argument("--specs", required=True)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out")
    g.add_argument("--prebuilt-dir")
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("--keep-objects", action="store_true",
                    help="keep DIR/.obj (with --prebuilt-dir): a later build reuses every object whose spec, arch, "
                         "kernel sources and DSL version are unchanged")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    specs = [KernelSpec.from_json(d) for d in json.loads(Path(a.specs).read_text())]
    archs = [x.strip() for x in a.arch.split(",") if x.strip()]
    if a.out:
        if len(archs) != 1:
            ap.error("--out takes exactly one --arch")
        meta = build_library(specs, archs[0], a.out, workers=a.jobs)
        print(json.dumps({k: meta[k] for k in ("library", "size", "arch", "link_s")}))
        return 0
    from .prebuilt import write_manifest

    d = Path(a.prebuilt_dir)
    metas = []
    for arch in archs:
        lib = d / arch / "kernels.so"
        build_library(specs, arch, lib, work_dir=d / ".obj" / arch, workers=a.jobs, meta_path=d / arch / "meta.json")
        metas.append(d / arch / "meta.json")
    m = write_manifest(d, metas)
    if not a.keep_objects:
        shutil.rmtree(d / ".obj", ignore_errors=True)
    print(json.dumps({"manifest": str(d / "manifest.json"), "kernels": len(m["kernels"]), "archs": archs}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

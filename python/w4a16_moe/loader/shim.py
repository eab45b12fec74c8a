"""The C ABI of a kernel library: read the ``export_to_c`` header of a kernel into an ABI description, and
generate the C++ shim that exports the kernel's entry points (plus the library-wide ones).

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

The ABI description (``"abi"`` of the sidecar ``<name>.json`` and of ``meta.json``, returned by ``P_abi``)::

    {"prefix", "return", "signature", "args": [...], "ciface"}

``abi.args`` items: ``{"name", "kind", "ctype"}`` with kind ``ptr`` | ``scalar`` | ``half`` | ``bfloat16`` |
``stream`` | ``tensor`` (+ ``"fields": [[field, ctype, count], ...]``) | ``tensor_list`` (+ ``"fields"``,
``"count"``) | ``array`` (+ ``"count"``).
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Sequence

from .identity import ABI_VERSION
from .toolchain import BuildError

__all__ = ["parse_header_abi", "generate_shim", "generate_library_source", "version_script_text", "exported_symbols",
           "LIBRARY_SYMBOLS", "KERNEL_SYMBOL_SUFFIXES"]


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
                f"implements (missing {needle!r}); update loader/shim.py for this DSL version"
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
    return f"""// Generated by w4a16_moe.loader.shim (abi_version {ABI_VERSION}). Do not edit.
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


def generate_library_source(arch: str, names: Sequence[str]) -> str:
    """C++ source of the library-wide entry points (CUDA error names and strings, ``w4a16_moe_library_info``)."""
    info = json.dumps({"abi_version": ABI_VERSION, "arch": arch, "kernels": list(names)}, separators=(",", ":"))
    return f"""// Generated by w4a16_moe.loader.shim. Do not edit.
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
    """Every symbol a library of the kernels ``names`` exports (library-wide ones first)."""
    return list(LIBRARY_SYMBOLS) + [n + s for n in names for s in KERNEL_SYMBOL_SUFFIXES]


def version_script_text(names: Iterable[str]) -> str:
    """Linker version script exporting exactly :func:`exported_symbols` of ``names``."""
    return "{\n  global:\n" + "".join(f"    {x};\n" for x in exported_symbols(names)) + "  local: *;\n};\n"

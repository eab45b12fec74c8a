"""Build kernel libraries: compile -> ``export_to_c`` -> shim -> one self-contained ``.so`` (+ ``meta.json``).

This is the one artifact type used by both the JIT cache and the AOT/prebuilt path (``python -m w4a16_moe
aot``, the wheel's ``CMakeLists.txt``). The C ABI the library exports is described in :mod:`.shim`; the
tools it uses are found by :mod:`.toolchain`; many kernels compile in parallel with :mod:`.compile_pool`.

Pipeline
--------
1. :func:`compile_objects` runs each spec's family ``compile_fn(spec, arch)`` (``cute.compile`` with fake
   tensors, ``--gpu-arch sm_90a|sm_100a``) and ``compiled.export_to_c(out_dir, name, function_prefix=name)``,
   giving ``<name>.h`` + ``<name>.o`` (the cubin is embedded in the ``.o``). The generated header is parsed
   into an ABI description (:func:`.shim.parse_header_abi`) and saved, with timings, as a sidecar
   ``<name>.json``.
2. :func:`link_shared_library` generates a C++ shim per kernel (:func:`.shim.generate_shim`, all in one
   translation unit that includes every ``<name>.h``) and links every ``.o`` + shims + the DSL's
   ``libcuda_dialect_runtime_static.a`` + CUDA's ``libcudart_static.a`` with ``g++ -shared -fPIC ... -ldl
   -lpthread -lrt`` and a version script that exports only the entry points of :func:`.shim.exported_symbols`.
   The result must need only libc-family libraries (checked with ``readelf -d``): no libcuda (driver entry
   points are resolved at run time by the static cudart), no libcudart, no ``libcute_dsl_runtime.so``, no DSL
   or Python at run time.
   The recipe is split so that CMake can run the compiler itself (the wheel build, ``CMakeLists.txt``):
   :func:`prepare_link` writes the shim source + version script, :func:`link_commands` is the compiler
   command line (its flags :data:`SHIM_CXXFLAGS`, :data:`LINK_FLAGS`, :data:`SYSTEM_LIBS` are what CMake
   uses too), :func:`check_library` + :func:`write_meta` check the result and describe it.

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
                  "abi": {"prefix", "return", "signature", "args": [...], "ciface"}}]}   # see loader/shim.py
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from ._log import get_logger
from .identity import ABI_VERSION, META_FORMAT, META_FORMAT_VERSION, dsl_version, package_version, sha256_file
from .shim import exported_symbols, generate_library_source, generate_shim, parse_header_abi, version_script_text
from .spec import SUPPORTED_ARCHS, KernelSpec, family_source_hash, get_family
from .toolchain import (BuildError, cxx_version, find_cuda_toolkit, find_cxx, find_dsl_lib_dir,
                        preload_dsl_runtime, read_dynamic_symbols, read_needed, run_tool)

log = get_logger()

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


#: ``--gpu-arch`` values a kernel library can be built for: the loader's archs plus those the AOT build
#: accepts for other families (the portable warp-MMA family targets sm_80 .. sm_120a).
BUILD_ARCHS = tuple(SUPPORTED_ARCHS)


def check_build_arch(arch: str) -> str:
    """``arch`` if kernels can be built for it, else ValueError naming the accepted values."""
    if arch not in BUILD_ARCHS:
        raise ValueError(f"arch {arch!r}: kernel libraries are built for one of {BUILD_ARCHS}")
    return arch


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


# ------------------------------------------------------------------------------------------------------
# link
# ------------------------------------------------------------------------------------------------------
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
    parts = [generate_library_source(arch, names)]
    for o, r in zip(objs, recs):
        header = o.with_suffix(".h")
        parts.append(generate_shim(str(header.resolve()), header.read_text(), r["abi"]))
    src = work / SHIM_SOURCE
    _write_if_changed(src, "\n".join(parts))
    vscript = work / VERSION_SCRIPT
    _write_if_changed(vscript, version_script_text(names))
    return LinkPlan(arch, names, objs, recs, src, vscript, tk.include_dir, dialect, tk.cudart_static, tk.runtime_version)


def _write_if_changed(path: Path, text: str) -> None:
    """Keep the mtime of unchanged generated files (CMake/ninja then relink nothing)."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def link_commands(plan: LinkPlan, out_path, *, strip: bool = True, cxx: Optional[str] = None) -> list:
    """The compiler commands :func:`link_shared_library` runs (shim compile, link): the recipe CMake mirrors."""
    cxx = cxx or find_cxx()
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
    cxx = find_cxx()
    try:
        plan = prepare_link(objs, work)
        for cmd, what in zip(link_commands(plan, tmp_out, strip=strip, cxx=cxx), ("shim compile", "link")):
            run_tool(cmd, what)
        link_s = time.perf_counter() - t0
        if check:
            check_library(tmp_out, plan.names, out_path.name)
        os.replace(tmp_out, out_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tmp_out.exists():
            tmp_out.unlink()
    return write_meta(plan, out_path, meta_path=meta_path, link_s=link_s, linker=cxx_version(cxx))


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


def build_library(specs: Sequence[KernelSpec], arch: str, out_path, *, work_dir=None, meta_path=None) -> dict:
    """compile (in this process) + link; the objects/headers stay in ``work_dir`` (default:
    ``<out dir>/obj-<arch>``). Returns the meta dict. (In parallel: :func:`.compile_pool.compile_objects_parallel`
    then :func:`link_shared_library`.)"""
    out_path = Path(out_path)
    work_dir = Path(work_dir) if work_dir else out_path.parent / f"obj-{arch}"
    return link_shared_library(compile_objects(specs, arch, work_dir), out_path, meta_path=meta_path)

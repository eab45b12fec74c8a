"""What identifies a kernel-library artifact: format and ABI versions, package and DSL versions, checksums,
and the loader files hashed into every kernel's source hash.

The JIT cache (:mod:`.jit_cache`) and the prebuilt lookup (:mod:`.prebuilt`) read only this module to decide
whether an artifact fits; it imports no build code (no compiler discovery, no shim generation, no DSL).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

__all__ = ["ABI_VERSION", "META_FORMAT", "META_FORMAT_VERSION", "ARTIFACT_SOURCES", "artifact_source_files",
           "package_version", "dsl_version", "dsl_roots", "sha256_file"]

#: Version of the C ABI a kernel library exports (:mod:`.shim`); the loader uses only libraries of its own.
ABI_VERSION = 1
#: ``meta.json`` beside every kernel library (:mod:`.build`): its ``format`` and ``format_version``.
META_FORMAT = "w4a16_moe.kernel_library"
META_FORMAT_VERSION = 1

#: Loader modules whose code shapes every artifact (the generated C shim; the compile/export/link recipe),
#: hashed into every family's source hash (:func:`.spec.family_source_hash`) besides the family's own sources.
ARTIFACT_SOURCES = ("shim.py", "build.py")


def artifact_source_files() -> list:
    """Paths of :data:`ARTIFACT_SOURCES`."""
    here = Path(__file__).resolve().parent
    return [here / name for name in ARTIFACT_SOURCES]


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
    for root in dsl_roots():  # fast path: the dist-info beside the package (importlib.metadata scans sys.path)
        for di in sorted(root.parent.glob("nvidia_cutlass_dsl-*.dist-info")):
            return di.name[len("nvidia_cutlass_dsl-") : -len(".dist-info")]
    for dist in ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def dsl_roots() -> list:
    """Directories of the ``nvidia_cutlass_dsl`` install (a namespace package)."""
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    if spec is None:
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])]


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

"""Prebuilt kernel libraries shipped inside the installed package (``w4a16_moe/_prebuilt/``).

Directory (``$W4A16_MOE_PREBUILT_DIR`` overrides it)::

    _prebuilt/manifest.json
    _prebuilt/<arch>/<library>.so     + <arch>/meta.json   (as written by build.link_shared_library)

``manifest.json``::

    {"format": "w4a16_moe.prebuilt_manifest", "format_version": 1,
     "package_version": "0.1.0", "dsl_version": "4.8.1", "abi_version": 1,
     "libraries": [{"file": "sm_90a/kernels.so", "meta": "sm_90a/meta.json", "arch": "sm_90a",
                    "sha256": "...", "size": 123}],
     "kernels":   [{"name": "<spec.name>", "family": "...", "params": {...}, "arch": "sm_90a",
                    "library": "sm_90a/kernels.so", "source_hash": "..."}],
     # written by the AOT build (w4a16_moe.aot.manifest_extra), optional for the loader:
     "subset": "smoke", "linker": "cmake" | "g++",
     "families": {"<family>": {"module", "archs", "sass_expect", "sass_allow_local", "sass_local_budget",
                               "sass_serial_ok", "source_hash"}},   # the SASS check's rules (loader/sass.py)
     "absent_family_modules": {"<module>": "why"},
     "archs": {"sm_90a": {"kernels": 30, "families": {...}}, "sm_100a": {"kernels": 0, "reason": "..."}}}

A kernel matches when ``name`` and ``arch`` are equal, the manifest's ``package_version`` equals the
installed one, its ``abi_version`` equals the loader's, and (when the kernel family's sources can be hashed
here, e.g. in a source checkout) its ``source_hash`` equals the current one. The library's SHA-256 is checked
once per process before first use. Every miss comes with a reason (:func:`lookup`), e.g. "built for sm_90a
only" or "params differ: bn=128 vs 256".
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import settings
from ._log import get_logger
from .identity import ABI_VERSION, dsl_version, package_version, sha256_file
from .spec import KernelSpec

log = get_logger()

MANIFEST_FORMAT = "w4a16_moe.prebuilt_manifest"
MANIFEST_FORMAT_VERSION = 1


def prebuilt_dir() -> Path:
    env = settings.get().prebuilt_dir
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parent.parent / "_prebuilt"


@dataclass
class PrebuiltMatch:
    library: Path
    name: str
    arch: str
    entry: dict


_MANIFESTS: dict = {}
_VERIFIED: dict = {}
_LOCK = threading.Lock()


def load_manifest(directory: Optional[Path] = None) -> tuple:
    """``(manifest | None, reason)``; cached per directory and mtime."""
    d = Path(directory) if directory else prebuilt_dir()
    mp = d / "manifest.json"
    try:
        mtime = mp.stat().st_mtime_ns
    except FileNotFoundError:
        return None, f"no prebuilt manifest at {mp}"
    cached = _MANIFESTS.get(str(mp))
    if cached and cached[0] == mtime:
        return cached[1], cached[2]
    try:
        m = json.loads(mp.read_text())
        if m.get("format") != MANIFEST_FORMAT:
            res = (None, f"{mp} is not a prebuilt manifest (format {m.get('format')!r})")
        elif int(m.get("format_version", 0)) > MANIFEST_FORMAT_VERSION:
            res = (None, f"{mp} has format_version {m.get('format_version')}, this loader reads {MANIFEST_FORMAT_VERSION}")
        else:
            res = (m, "ok")
    except (OSError, ValueError) as e:
        res = (None, f"unreadable manifest {mp}: {e}")
    _MANIFESTS[str(mp)] = (mtime, *res)
    return res


def _diff_params(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    diffs = [f"{k}={a.get(k, '<unset>')!r} vs {b.get(k, '<unset>')!r}" for k in keys if a.get(k, object()) != b.get(k, object())]
    return ", ".join(diffs)


def lookup(spec: KernelSpec, arch: str, directory: Optional[Path] = None) -> tuple:
    """``(PrebuiltMatch | None, reason)``: the prebuilt library holding ``spec`` for ``arch``, or why not."""
    d = Path(directory) if directory else prebuilt_dir()
    m, reason = load_manifest(d)
    if m is None:
        return None, reason
    pv = package_version()
    if m.get("package_version") != pv:
        return None, (
            f"prebuilt manifest {d / 'manifest.json'} is for package version {m.get('package_version')}, installed is "
            f"{pv} (kernels are only used by the version that built them: rebuild them with `python -m w4a16_moe aot` "
            "or install the matching wheel)"
        )
    if int(m.get("abi_version", -1)) != ABI_VERSION:
        return None, f"prebuilt libraries use loader ABI {m.get('abi_version')}, this loader uses {ABI_VERSION}"
    kernels = m.get("kernels", [])
    same = [k for k in kernels if k.get("name") == spec.name]
    hit = next((k for k in same if k.get("arch") == arch), None)
    if hit is None:
        why_arch = (m.get("archs") or {}).get(arch, {}).get("reason")
        if why_arch:
            also = f" ({spec.name} is prebuilt for {sorted({k.get('arch') for k in same})})" if same else ""
            return None, f"the prebuilt build has no kernels for {arch}: {why_arch}{also}"
        if same:
            return None, f"{spec.name} is prebuilt only for {sorted({k.get('arch') for k in same})}, not {arch}"
        fam = [k for k in kernels if k.get("family") == spec.family and k.get("arch") == arch]
        if fam:
            best = min(fam, key=lambda k: len(_diff_params(spec.params_dict, k.get("params", {})).split(", ")))
            return None, (
                f"{spec.name} not prebuilt for {arch}; {len(fam)} {spec.family} kernel(s) are, nearest differs in "
                f"{_diff_params(spec.params_dict, best.get('params', {}))}"
            )
        return None, f"no prebuilt {spec.family} kernels for {arch} ({len(kernels)} prebuilt kernels in total)"
    recorded = hit.get("source_hash")
    if recorded:
        try:
            from .spec import family_source_hash

            current = family_source_hash(spec.family)
        except Exception:
            current = None  # sources not available here (e.g. stripped install): trust the package version
        if current is not None and current != recorded:
            return None, f"prebuilt {spec.name} was built from other sources (source hash {recorded} != {current})"
    lib = d / hit["library"]
    if not lib.is_file():
        return None, f"prebuilt library {lib} listed in the manifest is missing"
    ok, why = _verify_library(d, m, hit["library"])
    if not ok:
        return None, why
    return PrebuiltMatch(lib, spec.name, arch, hit), "ok"


def _verify_library(d: Path, manifest: dict, rel: str) -> tuple:
    key = str((d / rel).resolve())
    with _LOCK:
        if key in _VERIFIED:
            return _VERIFIED[key]
        libinfo = next((l for l in manifest.get("libraries", []) if l.get("file") == rel), None)
        if libinfo is None:
            res = (False, f"library {rel} not listed in the manifest's libraries")
        elif libinfo.get("sha256") and sha256_file(d / rel) != libinfo["sha256"]:
            res = (False, f"prebuilt library {rel} fails its SHA-256 check (corrupt or replaced)")
        else:
            res = (True, "ok")
        _VERIFIED[key] = res
        return res


def write_manifest(directory, meta_paths, extra: Optional[dict] = None) -> dict:
    """Write ``<directory>/manifest.json`` from the ``meta.json`` files of libraries inside ``directory``
    (plus the fields of ``extra``, e.g. the AOT build's per-arch and per-family summary).

    The AOT build (``python -m w4a16_moe aot``) links ``<dir>/<arch>/kernels.so`` per arch, then calls this.
    """
    d = Path(directory).resolve()
    libs, kernels = [], []
    for mp in meta_paths:
        mp = Path(mp).resolve()
        meta = json.loads(mp.read_text())
        lib = mp.parent / meta["library"]
        rel = lib.relative_to(d).as_posix()
        libs.append({"file": rel, "meta": mp.relative_to(d).as_posix(), "arch": meta["arch"], "sha256": meta["sha256"], "size": meta["size"]})
        for k in meta["kernels"]:
            kernels.append(
                {"name": k["name"], "family": k["family"], "params": k["params"], "arch": meta["arch"], "library": rel, "source_hash": k.get("source_hash")}
            )
    manifest = {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_FORMAT_VERSION,
        "package_version": package_version(),
        "dsl_version": dsl_version(),
        "abi_version": ABI_VERSION,
        "libraries": libs,
        "kernels": kernels,
    }
    for k, v in (extra or {}).items():
        if k in manifest:
            raise ValueError(f"write_manifest: extra field {k!r} would replace a core manifest field")
        manifest[k] = v
    tmp = d / f"manifest.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, d / "manifest.json")
    return manifest


def summary(directory: Optional[Path] = None) -> dict:
    d = Path(directory) if directory else prebuilt_dir()
    m, reason = load_manifest(d)
    if m is None:
        return {"dir": str(d), "found": False, "reason": reason}
    return {
        "dir": str(d),
        "found": True,
        "subset": m.get("subset"),
        "empty_archs": {a: v.get("reason", "") for a, v in (m.get("archs") or {}).items() if not v.get("kernels")},
        "package_version": m.get("package_version"),
        "matches_installed": m.get("package_version") == package_version(),
        "dsl_version": m.get("dsl_version"),
        "libraries": len(m.get("libraries", [])),
        "kernels": len(m.get("kernels", [])),
        "per_arch": {a: sum(1 for k in m.get("kernels", []) if k.get("arch") == a) for a in sorted({k.get("arch") for k in m.get("kernels", [])})},
    }

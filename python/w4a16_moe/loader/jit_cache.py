"""Project-local JIT cache of kernel libraries (the same ``.so`` + ``meta.json`` artifact as prebuilt).

Location (:func:`cache_dir`):

1. ``$W4A16_MOE_CACHE_DIR`` if set;
2. ``<checkout>/.cache/w4a16_moe`` when the package runs from a source checkout, i.e. a ``pyproject.toml``
   whose ``[project] name`` is ``w4a16-moe`` sits two levels above the package directory
   (``<checkout>/python/w4a16_moe``);
3. ``~/.cache/w4a16_moe`` (``$XDG_CACHE_HOME/w4a16_moe`` if that is set).

Layout::

    <cache>/v1/<arch>/<spec.name>-<key>/          one entry = one kernel
        <spec.name>.so                            self-contained library (see shim.py for its ABI)
        meta.json                                 build.py's meta + a "cache" object (below)
        obj/<spec.name>.{h,o,json}                exported header/object + sidecar (for inspection)
    <cache>/v1/<arch>/<spec.name>-<key>.lock      fcntl lock file of that entry
    <cache>/v1/<arch>/.tmp-<spec.name>-<key>-*    build in progress (renamed atomically into place)

``key`` = first 16 hex digits of SHA-256 over ``[spec.name, arch, DSL version, family source hash,
loader ABI version]``. ``meta.json["cache"]`` = ``{"key", "spec_name", "arch", "dsl_version", "source_hash",
"abi_version", "build_s"}``.

Concurrency: readers never lock: an entry directory only appears by ``rename`` of a complete build. A
process that misses takes the entry's exclusive ``flock``, re-checks (another process may have finished it
meanwhile: status ``"waited"``), else builds into a temp dir and renames it into place (``"built"``). An
entry that exists but fails validation (missing files, unparsable meta, key mismatch, size or SHA-256 of the
``.so`` different from meta) is moved aside and rebuilt (``"rebuilt"``).

``W4A16_MOE_DISABLE_JIT=1`` forbids compiling: a miss raises :class:`JitDisabledError` naming the spec.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import settings
from ._log import get_logger
from .identity import ABI_VERSION, META_FORMAT, dsl_version, sha256_file
from .spec import KernelSpec, check_arch, family_source_hash

log = get_logger()

LAYOUT_VERSION = "v1"


class KernelNotAvailableError(RuntimeError):
    """No usable artifact for a kernel spec (and none may or can be built)."""

    def __init__(self, spec: KernelSpec, arch: str, reason: str):
        self.spec = spec
        self.arch = arch
        self.reason = reason
        super().__init__(
            f"kernel {spec.name} (family {spec.family}, params {spec.params_dict}) for {arch} is not available: {reason}"
        )


class JitDisabledError(KernelNotAvailableError):
    """A kernel was needed but ``W4A16_MOE_DISABLE_JIT`` forbids compiling it."""


def jit_disabled() -> bool:
    return settings.get().disable_jit


# ------------------------------------------------------------------------------------------------------
# location
# ------------------------------------------------------------------------------------------------------
def _package_dir() -> Path:
    return Path(__file__).resolve().parent.parent


def source_checkout_root() -> Optional[Path]:
    """The checkout root if the package runs from a source checkout of w4a16-moe, else None."""
    root = _package_dir().parent.parent
    pp = root / "pyproject.toml"
    try:
        st = pp.stat()
    except OSError:
        return None
    return root if _is_project_file(str(pp), st.st_mtime_ns, st.st_size) else None


@functools.lru_cache(maxsize=16)
def _is_project_file(path: str, _mtime_ns: int, _size: int) -> bool:
    """Whether the pyproject.toml at ``path`` names the w4a16-moe project (read once per version of the file: every
    plan looks up the autotune store, whose directory depends on it)."""
    pp = Path(path)
    if not pp.is_file():
        return False
    try:
        text = pp.read_text()
        try:
            import tomllib

            name = tomllib.loads(text).get("project", {}).get("name", "")
        except Exception:
            m = re.search(r'(?m)^\s*name\s*=\s*["\']([^"\']+)["\']', text)
            name = m.group(1) if m else ""
    except OSError:
        return False
    return re.sub(r"[-_.]+", "-", name).lower() == "w4a16-moe"


def cache_dir() -> Path:
    env = settings.get().cache_dir
    if env:
        return Path(env).expanduser()
    root = source_checkout_root()
    if root is not None:
        return root / ".cache" / "w4a16_moe"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "w4a16_moe"


def cache_dir_source() -> str:
    if settings.get().cache_dir:
        return "W4A16_MOE_CACHE_DIR"
    return "source checkout" if source_checkout_root() is not None else "user cache"


# ------------------------------------------------------------------------------------------------------
# keys and validation
# ------------------------------------------------------------------------------------------------------
def entry_key(spec: KernelSpec, arch: str) -> str:
    blob = json.dumps([spec.name, arch, dsl_version(), family_source_hash(spec.family), ABI_VERSION])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def entry_dir(spec: KernelSpec, arch: str, root: Optional[Path] = None) -> Path:
    root = Path(root) if root else cache_dir()
    return root / LAYOUT_VERSION / arch / f"{spec.name}-{entry_key(spec, arch)}"


def library_path(entry: Path, spec: KernelSpec) -> Path:
    return entry / f"{spec.name}.so"


def validate_entry(entry: Path, spec: KernelSpec, arch: str, key: Optional[str] = None) -> tuple:
    """``(ok, reason)`` for a cache entry directory."""
    if not entry.is_dir():
        return False, "missing"
    meta_p = entry / "meta.json"
    try:
        meta = json.loads(meta_p.read_text())
    except FileNotFoundError:
        return False, "meta.json missing"
    except (OSError, ValueError) as e:
        return False, f"meta.json unreadable ({e})"
    try:
        if meta.get("format") != META_FORMAT:
            return False, "meta.json has the wrong format"
        c = meta["cache"]
        if c["key"] != (key or entry_key(spec, arch)) or c["spec_name"] != spec.name or meta["arch"] != arch:
            return False, "meta.json key/spec/arch mismatch"
        if spec.name not in [k["name"] for k in meta["kernels"]]:
            return False, "kernel missing from meta.json"
        lib = entry / meta["library"]
        if lib != library_path(entry, spec):
            return False, "unexpected library name"
        st = lib.stat()
        if st.st_size != meta["size"]:
            return False, f"library size {st.st_size} != {meta['size']} recorded"
        if sha256_file(lib) != meta["sha256"]:
            return False, "library checksum mismatch"
    except FileNotFoundError:
        return False, "library file missing"
    except (KeyError, TypeError) as e:
        return False, f"meta.json incomplete ({e})"
    return True, "ok"


# ------------------------------------------------------------------------------------------------------
# get or build
# ------------------------------------------------------------------------------------------------------
@dataclass
class CacheResult:
    library: Path
    meta: dict
    status: str  # "hit" | "waited" | "built" | "rebuilt"
    seconds: float


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing), held for the ``with`` block; waits (and logs
    that it waits) while another process holds it. The JIT cache and the autotune store use it."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = -1

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            log.info("waiting for another process holding %s", self.path.name)
            t0 = time.perf_counter()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            log.info("lock %s acquired after %.2f s", self.path.name, time.perf_counter() - t0)
        return self

    def __exit__(self, *exc):
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


def _discard(entry: Path) -> None:
    trash = entry.with_name(f".trash-{entry.name}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        os.rename(entry, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def lookup(spec: KernelSpec, arch: str, root: Optional[Path] = None) -> Optional[CacheResult]:
    """Return a valid cached entry without building (``None`` on a miss)."""
    t0 = time.perf_counter()
    key = entry_key(spec, arch)
    entry = entry_dir(spec, arch, root)
    ok, _ = validate_entry(entry, spec, arch, key)
    if not ok:
        return None
    meta = json.loads((entry / "meta.json").read_text())
    return CacheResult(library_path(entry, spec), meta, "hit", time.perf_counter() - t0)


def get_or_build(spec: KernelSpec, arch: str, root: Optional[Path] = None, *, context: str = "") -> CacheResult:
    """Return the cache entry of ``(spec, arch)``, building it if needed (see module docstring).

    ``context`` is appended to the :class:`JitDisabledError` message (e.g. why no prebuilt kernel matched).
    """
    check_arch(arch)
    t0 = time.perf_counter()
    key = entry_key(spec, arch)
    entry = entry_dir(spec, arch, root)
    ok, reason = validate_entry(entry, spec, arch, key)
    if ok:
        return CacheResult(library_path(entry, spec), json.loads((entry / "meta.json").read_text()), "hit", time.perf_counter() - t0)
    if jit_disabled():
        raise JitDisabledError(
            spec, arch, f"W4A16_MOE_DISABLE_JIT is set and the JIT cache has no valid entry ({reason} at {entry})" + (f"; {context}" if context else "")
        )
    from .toolchain import dsl_importable

    if not dsl_importable():
        raise KernelNotAvailableError(
            spec, arch, f"not in the JIT cache ({reason} at {entry}) and the CuTe DSL is not installed to compile it "
            "(pip install 'w4a16-moe[jit]')" + (f"; {context}" if context else "")
        )
    entry.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(entry.with_name(entry.name + ".lock")):
        ok, reason = validate_entry(entry, spec, arch, key)
        if ok:
            log.info("JIT cache: %s for %s was built by another process", spec.name, arch)
            return CacheResult(library_path(entry, spec), json.loads((entry / "meta.json").read_text()), "waited", time.perf_counter() - t0)
        status = "built"
        if entry.exists():
            log.warning("JIT cache: discarding invalid entry %s (%s); rebuilding", entry, reason)
            _discard(entry)
            status = "rebuilt"
        for stale in entry.parent.glob(f".tmp-{entry.name}-*"):  # left by a crashed builder (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{entry.name}-", dir=entry.parent))
        try:
            meta = _build_into(tmp, spec, arch, key)
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            os.rename(tmp, entry)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        dt = time.perf_counter() - t0
        log.info("JIT cache: %s %s for %s in %.2f s -> %s", status, spec.name, arch, dt, entry)
        return CacheResult(library_path(entry, spec), meta, status, dt)


def _build_into(tmp: Path, spec: KernelSpec, arch: str, key: str) -> dict:
    from .build import compile_objects, link_shared_library

    t0 = time.perf_counter()
    objs = compile_objects([spec], arch, tmp / "obj")
    meta_p = tmp / "meta.json"
    meta = link_shared_library(objs, tmp / f"{spec.name}.so", meta_path=meta_p)
    meta["cache"] = {
        "key": key,
        "spec_name": spec.name,
        "arch": arch,
        "dsl_version": dsl_version(),
        "source_hash": family_source_hash(spec.family),
        "abi_version": ABI_VERSION,
        "build_s": round(time.perf_counter() - t0, 4),
    }
    meta_p.write_text(json.dumps(meta, indent=1, sort_keys=True))
    with open(meta_p, "rb") as f:
        os.fsync(f.fileno())
    return meta


def stats(root: Optional[Path] = None) -> dict:
    """Entry counts per arch and total size (for ``describe()``)."""
    root = Path(root) if root else cache_dir()
    base = root / LAYOUT_VERSION
    out = {"entries": 0, "bytes": 0, "per_arch": {}}
    if not base.is_dir():
        return out
    for arch_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        n = 0
        for e in arch_dir.iterdir():
            if e.is_dir() and not e.name.startswith("."):
                n += 1
                out["bytes"] += sum(f.stat().st_size for f in e.rglob("*") if f.is_file())
        out["per_arch"][arch_dir.name] = n
        out["entries"] += n
    return out

"""Declarative kernel descriptions (``KernelSpec``) and the kernel-family registry.

A :class:`KernelSpec` names ONE compiled kernel: a *family* (the Python code that generates it, e.g.
``"sm90_w4a16_gemm"``) plus the family's *codegen parameters* (tile sizes, stage counts, flags...).
Problem sizes are NOT parameters: families compile with fake tensors / symbolic sizes, so one compiled
kernel serves every size.

``spec.name`` is the single identity used everywhere:

* the ``function_prefix`` given to ``export_to_c`` (so every C symbol of the kernel starts with it),
* the key of a JIT-cache entry (together with arch, DSL version and source hash),
* the key of a kernel in a prebuilt ``manifest.json``.

Name format::

    <family>__<readable>__h<10 hex>

``readable`` is ``_``-joined ``<key><value>`` items in sorted key order (ints as decimal with ``m`` for a
minus sign, bools as ``t``/``f``, strings with every non-alphanumeric character replaced by ``x``); it is for
humans and may be cut short (names are capped at :data:`MAX_NAME_LEN` characters). The trailing hash is the
first 10 hex digits of SHA-256 over the canonical JSON of ``[family, [[key, type, value], ...]]``, so that
every parameter (including its type: ``True`` differs from ``1``) changes the name even where the readable
part is lossy or truncated. The full parameters are always kept in ``meta.json`` / ``manifest.json``.

Family registry: the CuTe kernel families come from :mod:`w4a16_moe.kernels.cute.registry`; other code
may add one with ``register_family(family, compile_fn, sources=...)``. ``compile_fn(spec, arch)`` must return
the object of ``cute.compile(...)`` compiled for ``arch`` (``"sm_90a"``, ``"sm_100a"``) with fake tensors /
symbolic sizes. It may be given as a ``"package.module:function"`` string, which is imported only when a
kernel of that family is actually compiled: importing the loader never imports ``cutlass``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

from ..archs import ARCHS

__all__ = [
    "KernelSpec",
    "FamilyInfo",
    "MAX_NAME_LEN",
    "SUPPORTED_ARCHS",
    "register_family",
    "get_family",
    "registered_families",
    "family_source_hash",
    "check_arch",
    "config_codec",
]

ParamValue = Union[int, bool, str]

#: Longest ``spec.name``. The DSL builds symbols such as ``_mlir_<name>__mlir_ciface_cutlass_<fn>_<argtypes>``
#: from it, so it is kept well below typical symbol/file-name limits (255 bytes for a file name).
MAX_NAME_LEN = 120

#: Architectures the loader builds for (``--gpu-arch`` values of ``cute.compile``; :mod:`w4a16_moe.archs`).
SUPPORTED_ARCHS = ARCHS

_FAMILY_RE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")  # no "__": that separates name parts
_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_HASH_LEN = 10


def check_arch(arch: str) -> str:
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported arch {arch!r}; expected one of {SUPPORTED_ARCHS}")
    return arch


def _type_tag(v: ParamValue) -> str:
    if isinstance(v, bool):  # before int: bool is an int subclass
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, str):
        return "str"
    raise TypeError(f"kernel parameter values must be int, bool or str, got {type(v).__name__}: {v!r}")


def _readable(v: ParamValue) -> str:
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, int):
        return str(v) if v >= 0 else "m" + str(-v)
    return re.sub(r"[^A-Za-z0-9]", "x", v) or "e"


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """One compiled kernel: ``family`` + codegen ``params``.

    ``params`` may be given as a mapping or an iterable of ``(name, value)`` pairs; it is stored as a tuple
    sorted by name. Values must be ``int``, ``bool`` or ``str``. Equality and hashing are type-aware
    (``KernelSpec("f", {"x": True}) != KernelSpec("f", {"x": 1})``), consistent with :attr:`name`.
    """

    family: str
    params: tuple = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or not _FAMILY_RE.match(self.family):
            raise ValueError(
                f"invalid kernel family {self.family!r}: use lowercase [a-z0-9] words joined by single '_'"
            )
        raw = self.params
        items = list(raw.items()) if isinstance(raw, Mapping) else list(raw)
        norm = []
        seen = set()
        for item in items:
            try:
                k, v = item
            except (TypeError, ValueError):
                raise TypeError(f"params must be (name, value) pairs, got {item!r}") from None
            if not isinstance(k, str) or not _KEY_RE.match(k):
                raise ValueError(f"invalid parameter name {k!r}: use a lowercase identifier")
            if k in seen:
                raise ValueError(f"duplicate parameter {k!r}")
            seen.add(k)
            _type_tag(v)
            norm.append((k, v))
        norm.sort(key=lambda kv: kv[0])
        object.__setattr__(self, "params", tuple(norm))
        object.__setattr__(self, "_canon", self._canonical())
        object.__setattr__(self, "_name", self._make_name())

    # -- construction helpers ---------------------------------------------------------------------------
    @classmethod
    def make(cls, family: str, **params: ParamValue) -> "KernelSpec":
        return cls(family, params)

    def replace(self, **changes: ParamValue) -> "KernelSpec":
        d = dict(self.params)
        d.update(changes)
        return KernelSpec(self.family, d)

    # -- identity ---------------------------------------------------------------------------------------
    def _canonical(self) -> str:
        return json.dumps(
            [self.family, [[k, _type_tag(v), v] for k, v in self.params]], separators=(",", ":")
        )

    def _make_name(self) -> str:
        digest = hashlib.sha256(self._canon.encode()).hexdigest()[:_HASH_LEN]
        readable = "_".join(f"{k.replace('_', '')}{_readable(v)}" for k, v in self.params)
        suffix = f"__h{digest}"
        head = self.family + ("__" + readable if readable else "")
        room = MAX_NAME_LEN - len(suffix)
        if len(head) > room:
            head = head[:room].rstrip("_")
        name = head + suffix
        assert name.isidentifier() and len(name) <= MAX_NAME_LEN, name
        return name

    @property
    def name(self) -> str:
        """Deterministic C identifier encoding family and every parameter (see module docstring)."""
        return self._name  # type: ignore[attr-defined]

    @property
    def canonical(self) -> str:
        """Canonical JSON text of family + typed params (what the name hash covers)."""
        return self._canon  # type: ignore[attr-defined]

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    def to_json(self) -> dict:
        """The JSON form stored in meta.json / manifest.json: ``{"name", "family", "params"}``."""
        return {"name": self.name, "family": self.family, "params": dict(self.params)}

    @classmethod
    def from_json(cls, d: Mapping) -> "KernelSpec":
        spec = cls(d["family"], dict(d["params"]))
        if "name" in d and d["name"] != spec.name:
            raise ValueError(f"spec name mismatch: stored {d['name']!r}, recomputed {spec.name!r}")
        return spec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelSpec) and self._canon == other._canon  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._canon)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params)
        return f"KernelSpec({self.family!r}, {ps})"


# ------------------------------------------------------------------------------------------------------
# family registry
# ------------------------------------------------------------------------------------------------------
CompileFn = Callable[[KernelSpec, str], Any]


@dataclass
class FamilyInfo:
    family: str
    compile_fn: Union[str, CompileFn]
    #: module names (``"pkg.mod"``) or file paths whose contents define the kernel; their hash is part of the
    #: JIT-cache key and is recorded in meta.json. Default: the module that defines ``compile_fn``.
    sources: tuple = ()

    def resolve(self) -> CompileFn:
        fn = self.compile_fn
        if isinstance(fn, str):
            mod_name, _, attr = fn.partition(":")
            if not attr:
                raise ValueError(f"compile_fn string must be 'module:function', got {fn!r}")
            fn = getattr(importlib.import_module(mod_name), attr)
            self.compile_fn = fn
        return fn

    def source_files(self) -> list:
        srcs = list(self.sources)
        if not srcs:
            fn = self.compile_fn
            srcs = [fn.partition(":")[0] if isinstance(fn, str) else fn.__module__]
        files = []
        for s in srcs:
            p = Path(s)
            if p.suffix == ".py" or p.is_file():
                files.append(p.resolve())
                continue
            ms = importlib.util.find_spec(s)
            if ms is None or not ms.origin:
                raise ValueError(f"family {self.family!r}: cannot locate source module {s!r}")
            files.append(Path(ms.origin).resolve())
        return files


_REGISTRY: dict = {}
_REG_LOCK = threading.Lock()
_SOURCE_HASHES: dict = {}

#: The loader's own family (the self-test kernel); the CuTe kernel families come from their registry
#: (:mod:`w4a16_moe.kernels.cute.registry`), read on first use.
_BUILTIN_FAMILIES = {
    "selftest_axpy": ("w4a16_moe.loader.selftest_kernel:compile_selftest_axpy", ()),
}


def _registry_families() -> dict:
    """``{spec family: (compile_fn, sources)}`` of the registered CuTe kernel families."""
    from ..kernels.cute import registry

    return {f.spec_family: (f.compile_fn, tuple(f.sources)) for f in registry.families()}


def config_codec(family: str, make_config: Callable[..., Any]) -> tuple:
    """``(spec_for, config_from_spec)`` of a family whose spec params are exactly the fields of its static
    config dataclass: ``spec_for(cfg)`` (cached) names every codegen parameter, ``config_from_spec(spec)``
    rebuilds the config with ``make_config(**params)`` and rejects another family's spec."""

    @functools.lru_cache(maxsize=None)
    def spec_for(cfg) -> KernelSpec:
        return KernelSpec(family, dataclasses.asdict(cfg))

    def config_from_spec(spec: KernelSpec):
        if spec.family != family:
            raise ValueError(f"spec family {spec.family!r} is not {family!r}")
        return make_config(**dict(spec.params))

    return spec_for, config_from_spec


def register_family(
    family: str,
    compile_fn: Union[str, CompileFn],
    *,
    sources: Iterable = (),
    replace: bool = False,
) -> None:
    """Register ``compile_fn(spec, arch) -> compiled`` for ``family``.

    ``compile_fn`` may be a callable or a lazy ``"module:function"`` string. ``sources`` lists module names or
    ``.py`` paths hashed into the cache key (default: the module of ``compile_fn``); list every module whose
    change alters the generated code.
    """
    if not _FAMILY_RE.match(family):
        raise ValueError(f"invalid family name {family!r}")
    with _REG_LOCK:
        if family in _REGISTRY and not replace:
            old = _REGISTRY[family]
            if old.compile_fn is compile_fn or old.compile_fn == compile_fn:
                return
            raise ValueError(f"kernel family {family!r} is already registered")
        _REGISTRY[family] = FamilyInfo(family, compile_fn, tuple(str(s) for s in sources))
        _SOURCE_HASHES.pop(family, None)


def get_family(family: str) -> FamilyInfo:
    with _REG_LOCK:
        if family in _REGISTRY:
            return _REGISTRY[family]
    known = {**_BUILTIN_FAMILIES, **_registry_families()}
    with _REG_LOCK:
        if family not in _REGISTRY and family in known:
            fn, srcs = known[family]
            _REGISTRY[family] = FamilyInfo(family, fn, srcs)
        try:
            return _REGISTRY[family]
        except KeyError:
            raise KeyError(f"unknown kernel family {family!r}; registered: {sorted(set(_REGISTRY) | set(known))}") from None


def registered_families() -> list:
    known = set(_BUILTIN_FAMILIES) | set(_registry_families())
    with _REG_LOCK:
        return sorted(set(_REGISTRY) | known)


def family_source_hash(family: str) -> str:
    """SHA-256 (hex, 16 digits) over the family's source files plus the loader modules that shape every
    artifact (:data:`.identity.ARTIFACT_SOURCES`: the generated shim, the compile/export/link recipe).

    Computed once per process per family (sources are not expected to change under a running process).
    """
    if family in _SOURCE_HASHES:
        return _SOURCE_HASHES[family]
    from .identity import artifact_source_files

    info = get_family(family)
    files = sorted(set(info.source_files()) | set(artifact_source_files()))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    digest = h.hexdigest()[:16]
    _SOURCE_HASHES[family] = digest
    return digest

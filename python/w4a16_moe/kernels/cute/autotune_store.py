"""The autotuner's persistent results: one JSON file per layer in the project-local cache.

Where: ``jit_cache.cache_dir() / "autotune"`` (:func:`store_dir`), one file per :class:`LayerKey` (GPU name,
layer shape E/H/I, scheme, dtype, top-k, activation, finalize mode, and the ``global_num_experts`` hint of an
expert-parallel layer: a layer tuned with the hint is a different entry), named by a readable prefix and a hash
of the key. A file holds the versions it was measured with (:func:`running_versions`: package, torch,
Triton, the CuTe DSL and every kernel family's source hash); an entry measured with other versions is
ignored (logged at INFO) and replaced by the next tuning.

Rows: one per tuned token count ``T``: the fastest choice (:class:`Choice`: the decode kernels with a knob
set, or a grouped family's candidate tile shape and split-K), the fastest grouped-GEMM choice (what calls
that cannot take the decode path run: expert-parallel halves, batch-invariant mode), and whether every
candidate of ``T`` was measured (``complete``; a time budget may stop the tuner first; the choice is then
the fastest of those measured, the default among them). A call of ``T`` tokens uses the row of the largest
token count of the tuned grid <= ``T`` (like the tuned table), when that count has a row.

Concurrency: writers take an ``flock`` on ``<file>.lock`` for the read-modify-write (:func:`update`) and
replace the file atomically (temp file + ``os.replace``), so readers never lock and never see a partial
file. An unreadable or malformed file is ignored with a warning. Each process reads a layer's file once
(on the first plan of that layer) and keeps it; :func:`update` refreshes its own copy and bumps
:func:`generation`, which the CuTe provider's plan cache keys on. :func:`reload` forgets the copies (to see
another process's results).

This module imports neither torch nor the DSL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["FORMAT", "Choice", "Row", "LayerKey", "store_dir", "running_versions", "read_entry", "update",
           "lookup", "generation", "reload", "bypass", "path_for", "candidate_tiles"]

FORMAT = 1
SUBDIR = "autotune"


@dataclass(frozen=True)
class Choice:
    """One selectable way to run a routed call: ``family`` ``"decode"`` (``candidate``: the knob set, e.g.
    ``"w8u8/w8u4"``; ``""``: the defaults) or a grouped family (``"sm90"``, ``"warp"``; ``candidate``: a tile
    shape's :func:`~.sm90.tuned.candidate_name`, ``splits``: split-K parts, None = the family's rule)."""

    family: str
    candidate: str
    splits: Optional[int] = None

    @property
    def decode(self) -> bool:
        return self.family == "decode"

    def label(self) -> str:
        if self.decode:
            return f"decode {self.candidate or 'default knobs'}"
        return f"{self.family} {self.candidate} split-K {'rule' if self.splits is None else self.splits}"

    @staticmethod
    def from_json(d) -> "Choice":
        if not isinstance(d, dict) or not isinstance(d.get("family"), str) or not isinstance(d.get("candidate"), str):
            raise ValueError(f"expected a choice object with family and candidate, got {d!r}")
        sp = d.get("splits")
        if not (sp is None or isinstance(sp, int) and sp >= 1):
            raise ValueError(f"splits: expected null or a positive int, got {sp!r}")
        return Choice(d["family"], d["candidate"], sp)


@dataclass(frozen=True)
class Row:
    """One tuned token count: ``best`` (fastest overall), ``grouped`` (fastest grouped-GEMM choice, None when
    none was measured), their times in us, and whether every candidate was measured."""

    tokens: int
    best: Choice
    grouped: Optional[Choice]
    us: float = 0.0
    grouped_us: Optional[float] = None
    complete: bool = True

    def to_json(self) -> dict:
        d = asdict(self)
        d["best"] = asdict(self.best)
        d["grouped"] = None if self.grouped is None else asdict(self.grouped)
        return d

    @staticmethod
    def from_json(d) -> "Row":
        if not isinstance(d, dict) or not isinstance(d.get("tokens"), int) or d["tokens"] < 1:
            raise ValueError(f"expected a row object with a positive int tokens, got {d!r}")
        g = d.get("grouped")
        return Row(d["tokens"], Choice.from_json(d.get("best")), None if g is None else Choice.from_json(g),
                   float(d.get("us") or 0.0), None if d.get("grouped_us") is None else float(d["grouped_us"]),
                   bool(d.get("complete", True)))


@dataclass(frozen=True)
class LayerKey:
    """What an entry is keyed by (besides the versions, which are checked, not keyed)."""

    gpu: str
    experts: int
    hidden: int
    intermediate: int
    scheme: str
    dtype: str  # "bf16" | "fp16"
    top_k: int
    activation: str
    finalize: str
    #: the ``global_num_experts`` hint the layer's calls carry (None: every route local; see MoECall)
    global_experts: Optional[int] = None
    #: ``W4A16_MOE_LAYOUTS`` the rows were tuned under (a budget's rows time only its kept layout pairs)
    layouts: str = "all"

    def _ep(self) -> str:
        return "" if self.global_experts is None else f"of{self.global_experts}"

    def text(self) -> str:
        return (f"{self.gpu}|e{self.experts}{self._ep()}_h{self.hidden}_i{self.intermediate}|{self.scheme}|"
                f"{self.dtype}|k{self.top_k}|{self.activation}|{self.finalize}"
                + ("" if self.layouts == "all" else f"|layouts{self.layouts}"))

    def filename(self) -> str:
        gpu = re.sub(r"[^A-Za-z0-9]+", "-", self.gpu).strip("-").lower() or "gpu"
        digest = hashlib.sha256(self.text().encode()).hexdigest()[:16]
        return (f"{gpu}-e{self.experts}{self._ep()}-h{self.hidden}-i{self.intermediate}-{self.scheme}-{self.dtype}-"
                f"k{self.top_k}-{self.activation}-{self.finalize}"
                + ("" if self.layouts == "all" else f"-layouts{self.layouts}") + f"-{digest}.json")


def candidate_tiles(family: str) -> dict:
    """``{candidate name: tile dict}`` of a grouped family (``{}`` for an unknown family)."""
    from .sm90 import family as sm90
    from .sm90.tuned import candidate_name
    from .warp import family as warp

    if family == "sm90":
        return sm90.CANDIDATES_BY_NAME
    if family == "warp":
        return {candidate_name(t): t for t in warp.model_tiles()}
    return {}


def store_dir() -> Path:
    """``jit_cache.cache_dir() / "autotune"`` (follows ``W4A16_MOE_CACHE_DIR``)."""
    from ...loader.jit_cache import cache_dir

    return cache_dir() / SUBDIR


def path_for(key: LayerKey, root: Optional[Path] = None) -> Path:
    return (Path(root) if root is not None else store_dir()) / key.filename()


_VERSIONS: dict = {}


def running_versions() -> dict:
    """The versions an entry must have been measured with (computed once per process)."""
    if not _VERSIONS:
        from ...loader.identity import dsl_version
        from ...loader.spec import family_source_hash
        from . import registry
        from .sm90.tuned import running_versions as tuned_versions

        base = tuned_versions()
        out = {n: base.get(n) for n in ("w4a16_moe", "torch", "cuda", "triton")}
        try:
            out["nvidia-cutlass-dsl"] = dsl_version()
        except Exception:  # pragma: no cover - no DSL metadata
            out["nvidia-cutlass-dsl"] = base.get("nvidia-cutlass-dsl")
        for fam in registry.families():
            try:
                out[f"source:{fam.name}"] = family_source_hash(fam.spec_family)
            except Exception as e:  # pragma: no cover - sources not readable
                out[f"source:{fam.name}"] = f"unavailable ({type(e).__name__})"
        _VERSIONS.update(out)
    return dict(_VERSIONS)


def _log():
    from ...log import logger

    return logger


def read_entry(key: LayerKey, root: Optional[Path] = None, versions: Optional[dict] = None) -> Optional[dict]:
    """The stored entry of ``key`` as ``{"grid": [...], "rows": {T: Row}, ...}``, or None: absent,
    unreadable / malformed (warning), or measured with other versions than ``versions`` (default: the
    running ones; logged at INFO)."""
    p = path_for(key, root)
    try:
        text = p.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        _log().warning("autotune cache %s unreadable (%s): ignored", p, e)
        return None
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format') if isinstance(raw, dict) else None!r}, expected {FORMAT}")
        if raw.get("key") != key.text():
            raise ValueError(f"key {raw.get('key')!r} is not {key.text()!r}")
        rows = {r.tokens: r for r in (Row.from_json(d) for d in raw.get("rows", []))}
        grid = sorted({int(t) for t in raw.get("grid", [])} | set(rows))
    except (ValueError, TypeError, AttributeError) as e:
        _log().warning("autotune cache %s is malformed (%s): ignored", p, e)
        return None
    want = running_versions() if versions is None else versions
    have = raw.get("versions") or {}
    diff = sorted(n for n in set(want) | set(have) if want.get(n) != have.get(n))
    if diff:
        _log().info("autotune cache %s: measured with other versions (%s): ignored", p,
                    ", ".join(f"{n} {have.get(n)} vs running {want.get(n)}" for n in diff))
        return None
    return {"grid": grid, "rows": rows, "device": raw.get("device"), "date": raw.get("date"), "path": str(p)}


def update(key: LayerKey, rows, grid, root: Optional[Path] = None, device: Optional[str] = None) -> Path:
    """Merge ``rows`` (:class:`Row` s; a row replaces the stored row of its token count) and ``grid`` (the
    token counts the tuner covers) into the entry of ``key``, under the entry's lock; an entry of other
    versions is replaced. Returns the file's path; this process sees the result at once."""
    p = path_for(key, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    vers = running_versions()
    from ...loader.jit_cache import FileLock

    with FileLock(p.with_name(p.name + ".lock")):
        old = read_entry(key, root, vers) or {"grid": [], "rows": {}}
        merged = dict(old["rows"])
        merged.update({r.tokens: r for r in rows})
        body = {"format": FORMAT, "key": key.text(), "versions": vers,
                "grid": sorted(set(old["grid"]) | {int(t) for t in grid} | set(merged)),
                "rows": [merged[t].to_json() for t in sorted(merged)],
                "device": device or key.gpu, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        fd, tmp = tempfile.mkstemp(prefix=f".tmp-{p.name}-", dir=p.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(body, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _forget(key, root)
    return p


# ------------------------------------------------------------------------------------------------------
# the process's copies (what planning reads) and the generation the plan cache keys on
# ------------------------------------------------------------------------------------------------------
_MEM: dict = {}
_STATE = {"generation": 0, "bypass": 0}
_lock = threading.Lock()


def generation() -> int:
    """Bumped whenever this process's view of the store changes (the CuTe plan cache keys on it)."""
    return _STATE["generation"]


def _forget(key: Optional[LayerKey] = None, root=None) -> None:
    with _lock:
        if key is None:
            _MEM.clear()
        else:
            _MEM.pop((str(store_dir() if root is None else root), key), None)
        _STATE["generation"] += 1


def reload() -> None:
    """Forget every entry read so far (the next plan of a layer reads its file again)."""
    _forget()


@contextlib.contextmanager
def bypass() -> Iterator[None]:
    """Within the block :func:`lookup` finds nothing (the tuner asking what selection picks without it)."""
    with _lock:
        _STATE["bypass"] += 1
        _STATE["generation"] += 1
    try:
        yield
    finally:
        with _lock:
            _STATE["bypass"] -= 1
            _STATE["generation"] += 1


def lookup(key: LayerKey, tokens: int) -> Optional[tuple]:
    """``(row, path)`` for a call of ``tokens`` tokens on layer ``key``: the row of the largest token count of
    the tuned grid <= ``tokens`` (beyond the grid: its last count), when that count has a row; else None."""
    if _STATE["bypass"]:
        return None
    mk = (str(store_dir()), key)
    ent = _MEM.get(mk, _MISSING)
    if ent is _MISSING:
        ent = read_entry(key)
        with _lock:
            _MEM[mk] = ent
    if not ent:
        return None
    below = [t for t in ent["grid"] if t <= tokens]
    if not below:
        return None
    row = ent["rows"].get(below[-1])
    return None if row is None else (row, ent["path"])


_MISSING = object()

"""Every ``W4A16_MOE_*`` environment variable: typed, documented, and read in this module only.

Code reads a setting as an attribute of the snapshot :func:`get` returns (``settings.get().batch_invariant``);
the snapshot is built once from ``os.environ`` and cached, so a per-call read costs one attribute lookup.
:func:`refresh` re-reads the environment (tests do it after changing a variable; ``tests/conftest.py``
wraps ``monkeypatch`` so that ``setenv`` / ``delenv`` refresh by themselves), and :func:`override` sets
values for the duration of a ``with`` block without touching the environment (the tuner and the tests).

A malformed value raises ``ValueError`` naming the variable, the rule and the value, the first time a
snapshot is built. :func:`markdown_table` renders :data:`SETTINGS` as the table in ``docs/settings.md``
(``python -m w4a16_moe.settings`` prints it; a CPU test checks that the file is current).

Build-time variables (``W4A16_MOE_AOT_*``) are read by the wheel build (``CMakeLists.txt`` passes them on to
``python -m w4a16_moe aot``); they are listed here so that one table documents them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional

__all__ = ["Setting", "SETTINGS", "Settings", "get", "refresh", "override", "markdown_table"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Setting:
    """One environment variable: its attribute on :class:`Settings`, type, default and meaning."""

    env: str
    attr: str
    kind: str  # "bool" | "choice" | "path" | "str" | "int" | "float"
    default: Any
    doc: str
    choices: tuple = ()
    scope: str = "run"  # "run" (library), "build" (wheel / AOT build), "test" (test suite), "bench"

    def parse(self, raw: Optional[str]) -> Any:
        """The typed value of ``raw`` (None or blank: the default)."""
        if raw is None or not raw.strip():
            return self.default
        v = raw.strip()
        if self.kind == "bool":
            if v.lower() in _TRUE:
                return True
            if v.lower() in _FALSE:
                return False
            raise ValueError(f"{self.env}: expected one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}, got {raw!r}")
        if self.kind == "choice":
            if v not in self.choices:
                raise ValueError(f"{self.env}: expected one of {', '.join(self.choices)}, got {raw!r}")
            return v
        if self.kind == "int":
            try:
                n = int(v)
            except ValueError:
                raise ValueError(f"{self.env}: expected an integer, got {raw!r}") from None
            if n < 1:
                raise ValueError(f"{self.env}: expected a positive integer, got {raw!r}")
            return n
        if self.kind == "float":
            try:
                return float(v)
            except ValueError:
                raise ValueError(f"{self.env}: expected a number, got {raw!r}") from None
        return v  # path, str


#: Every variable the package, its build and its tests read. Keep this the only definition.
SETTINGS = (
    Setting("W4A16_MOE_BACKEND", "backend", "choice", "auto",
            "Provider of calls that say `backend=\"auto\"`.", ("auto", "cute", "triton", "reference")),
    Setting("W4A16_MOE_LOG", "log", "choice", "",
            "Level of the `w4a16_moe` logger (`info` logs every provider and kernel decision and each call's "
            "plan).", ("debug", "info", "warning", "error", "DEBUG", "INFO", "WARNING", "ERROR")),
    Setting("W4A16_MOE_CACHE_DIR", "cache_dir", "path", None,
            "JIT cache directory (default `<checkout>/.cache/w4a16_moe` in a source checkout, else "
            "`~/.cache/w4a16_moe`)."),
    Setting("W4A16_MOE_DISABLE_JIT", "disable_jit", "bool", False,
            "Never compile a kernel: a kernel that is neither prebuilt nor cached is an error naming it."),
    Setting("W4A16_MOE_PREBUILT_DIR", "prebuilt_dir", "path", None,
            "Prebuilt kernel libraries to use instead of the installed package's `_prebuilt/`."),
    Setting("W4A16_MOE_CUTE_FAMILY", "cute_family", "str", "auto",
            "Force a CuTe grouped-GEMM family by its registry name (`sm90` needs compute capability 9.x; `warp` runs "
            "the portable mma.sync family on any supported GPU); `auto` takes the first that supports the device."),
    Setting("W4A16_MOE_CUTE_DECODE", "cute_decode", "choice", "auto",
            "Route-major decode kernels for small routed calls: `0` never, `1` for every routed call that fits "
            "one launch (tests), `auto` where the selection picks them.", ("auto", "0", "1")),
    Setting("W4A16_MOE_TILE_LOOP", "tile_loop", "choice", "auto",
            "Warp-MMA grouped GEMMs as tile-loop kernels, launched with grid y about the expected token tiles "
            "(CTAs loop over any tiles past it) instead of the bound of any routing: `auto` where that grid is at "
            "most half the bound (expert-parallel ranks at decode sizes), `1` every warp-MMA call, `0` never.",
            ("auto", "0", "1")),
    Setting("W4A16_MOE_LAYOUTS", "layouts", "choice", "all",
            "Packed weight layouts a layer may hold on the SM90 kernels (each a full copy of its 4-bit weights): "
            "`all` lets every call take its fastest tiles (a layer served at every token count holds 2-4 layouts per "
            "matrix); `2` / `1`: every plan reads one of the two / one (w13, w2) layout pairs the cost model picks "
            "per layer (`kernels/cute/layout_budget.py`; README \"Memory\").", ("all", "2", "1")),
    Setting("W4A16_MOE_BATCH_INVARIANT", "batch_invariant", "bool", False,
            "Deterministic calls never split K and never take the decode kernels, so a route's result does not "
            "depend on its batch (expert parallelism then reproduces one GPU bit for bit)."),
    Setting("W4A16_MOE_EP_OBSERVE", "ep_observe", "bool", True,
            "A layer whose calls pass no `global_num_experts`: its first eager call reads the largest id in "
            "`topk_ids` (one device sync, once per layer) and, when some valid id is not a local expert, plans "
            "every later call with the expert-parallel hint `E * 2^j`, the smallest above the largest id "
            "(`w4a16_moe.ep_observe`: ranks of `E` experts, a power-of-two rank count); `0`: never."),
    Setting("W4A16_MOE_AUTOTUNE", "autotune", "bool", False,
            "Default of `warmup(..., autotune=)`: time the CuTe provider's candidates for the layer on this GPU "
            "(kernels already prebuilt or cached only; bounded in time) and store the fastest per token count in "
            "`<cache dir>/autotune`, which every later plan of that layer uses."),
    Setting("W4A16_MOE_TUNED_TABLE", "tuned_table", "bool", True,
            "Use the shipped tuned table (`kernels/cute/sm90/tuned.json`: tiles and decode bounds measured on a "
            "few layers); `0` selects by the rule and cost model alone (plus the autotuner's stored rows), what "
            "every other layer gets."),
    Setting("W4A16_MOE_ROUTING", "routing", "choice", "auto",
            "Kernels of the CuTe provider's route preparation and deterministic finalize: `cute` (the CuTe routing "
            "family), `triton` (Triton JIT), or `auto`: the CuTe kernels where every one of them is prebuilt for "
            "the device's arch (SM90+) and the layer has at most 1023 local experts (a prebuilt wheel then "
            "compiles no Triton kernel for them at run time), else Triton.", ("auto", "cute", "triton")),
    Setting("W4A16_MOE_PDL", "pdl", "bool", True,
            "Programmatic dependent launch between the kernels of a call (SM90+); `0` turns it off for the "
            "route preparation, the finalize and the warp-MMA GEMMs."),
    Setting("W4A16_MOE_TORCH_OP", "torch_op", "bool", True,
            "Launch kernels through the stable-ABI op library `w4a16_moe_C`; `0` uses ctypes instead."),
    Setting("W4A16_MOE_TORCH_OP_LIB", "torch_op_lib", "path", None,
            "Path of the op library `libw4a16_moe_C.so` (default: the installed package's `lib/`, then a "
            "build in the JIT cache)."),
    Setting("W4A16_MOE_NVDISASM", "nvdisasm", "path", None,
            "The `nvdisasm` used by the SASS check (default: PATH, CUDA_HOME, /usr/local/cuda, the "
            "`nvidia-cuda-nvdisasm` wheel)."),
    Setting("W4A16_MOE_REVISION", "revision", "str", None,
            "Revision recorded in benchmark results (default: `git describe` of the checkout).", scope="bench"),
    Setting("W4A16_MOE_AOT_ARCHS", "aot_archs", "str", None,
            "`;`-separated archs of an AOT wheel build (e.g. `sm_90a;sm_100a`); unset: a pure-Python wheel.",
            scope="build"),
    Setting("W4A16_MOE_AOT_SUBSET", "aot_subset", "choice", "full",
            "Kernel subset of an AOT build.", ("smoke", "full"), scope="build"),
    Setting("W4A16_MOE_AOT_JOBS", "aot_jobs", "int", None,
            "Compile processes of an AOT build (default: every core).", scope="build"),
    Setting("W4A16_MOE_WHEEL_PYTHON", "wheel_python", "path", None,
            "A Python with the built wheel installed: `tests/test_wheel.py` checks that installation.",
            scope="test"),
    Setting("W4A16_MOE_SELFTEST_COMPILE_DELAY", "selftest_compile_delay", "float", 0.0,
            "Seconds the self-test kernel's compile sleeps (the JIT cache's concurrency tests).", scope="test"),
)

_BY_ATTR = {s.attr: s for s in SETTINGS}
Settings = dataclasses.make_dataclass(
    "Settings", [(s.attr, Any) for s in SETTINGS], frozen=True,
    namespace={"__doc__": "A typed snapshot of every ``W4A16_MOE_*`` variable (see :data:`SETTINGS`)."})
Settings.__module__ = __name__

_lock = threading.Lock()
_current: Optional["Settings"] = None
_overrides: dict = {}


def _build() -> "Settings":
    values = {s.attr: s.parse(os.environ.get(s.env)) for s in SETTINGS}
    values.update(_overrides)
    return Settings(**values)


def get() -> "Settings":
    """The current settings (built from the environment on first use after :func:`refresh`, then cached);
    a malformed variable raises here."""
    global _current
    cur = _current
    if cur is None:
        with _lock:
            if _current is None:
                _current = _build()
            cur = _current
    return cur


def refresh() -> None:
    """Forget the snapshot: the next :func:`get` re-reads the environment (after a test changed it)."""
    global _current
    with _lock:
        _current = None


@contextlib.contextmanager
def override(**values: Any) -> Iterator["Settings"]:
    """Within the block, ``get()`` returns these values (attribute names of :class:`Settings`)."""
    global _current
    unknown = sorted(set(values) - set(_BY_ATTR))
    if unknown:
        raise TypeError(f"settings.override: unknown settings {unknown}; known: {sorted(_BY_ATTR)}")
    with _lock:
        saved = dict(_overrides)
        _overrides.update(values)
        _current = None
    try:
        yield get()
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)
            _current = None


def markdown_table() -> str:
    """:data:`SETTINGS` as a markdown table (the body of ``docs/settings.md``)."""
    rows = ["| variable | scope | type | default | meaning |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        choices = tuple(c for c in s.choices if not c.isupper())  # W4A16_MOE_LOG also takes upper case
        kind = "`" + "` \\| `".join(choices) + "`" if s.kind == "choice" else s.kind
        default = "unset" if s.default in (None, "") else f"`{s.default}`".replace("`True`", "`1`").replace(
            "`False`", "`0`")
        rows.append(f"| `{s.env}` | {s.scope} | {kind} | {default} | {s.doc} |")
    return "\n".join(rows) + "\n"


def _main() -> None:  # pragma: no cover - prints the table
    print("# Settings\n")
    print("Every `W4A16_MOE_*` environment variable, generated from `python/w4a16_moe/settings.py` "
          "(`python -m w4a16_moe.settings > docs/settings.md`). Booleans take `1/true/yes/on` or "
          "`0/false/no/off`; a malformed value is an error naming the variable.\n")
    print(markdown_table(), end="")


if __name__ == "__main__":  # pragma: no cover
    _main()

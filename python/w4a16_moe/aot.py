"""``python -m w4a16_moe aot --archs sm_90a[,sm_100a,...] [--subset smoke|full | --specs FILE] --out DIR [-j N]``.

Enumerates the declared kernel variants (the same specs the JIT compiles on first use) of every kernel
family that supports each requested arch, cross-compiles them (no GPU needed) in a pool of ``-j``
processes with a progress display, links one self-contained shared library per arch
(``DIR/<arch>/kernels.so`` + ``meta.json``) and writes ``DIR/manifest.json`` (spec names, archs, package
version, DSL version, source hashes, the families, the SASS each must show, the local memory and the
serialized WGMMA pipelines each accepts). Point ``W4A16_MOE_PREBUILT_DIR`` at DIR, or build the wheel
(``W4A16_MOE_AOT_ARCHS``, see ``CMakeLists.txt``).

Families: the family registry (:mod:`w4a16_moe.kernels.cute.registry`, :data:`FAMILY_MODULES`); each
family's ``DESCRIPTOR`` gives its spec family, archs, ``aot_variants(subset)``, the SASS its kernels must show,
the archs on which local memory is only a warning, its per-kernel local-memory budgets
(:func:`w4a16_moe.loader.sass.budget_rules`) and the kernels whose serialized WGMMA pipeline it accepts
(:func:`w4a16_moe.loader.sass.serial_rules`); the manifest's ``families`` table records these rules, so the
SASS check of a built directory needs only the manifest. ``--families`` may name other modules, which declare
``FAMILY``, ``ARCHS``, ``aot_variants`` and optionally ``SASS_EXPECT`` / ``SASS_ALLOW_LOCAL`` (archs, or True)
/ ``SASS_LOCAL_BUDGET`` / ``SASS_SERIAL_OK`` as module attributes. A family module that is not in this version
is reported and skipped; an arch no family supports gets no library, and the build says so (``--archs`` with no
kernels at all is an error).

Subsets: ``full`` = every variant the providers can select; ``smoke`` = a small subset per family
(SM90: int4_g32 / int4_g128, BF16, SwiGLU, both finalize modes, all tile buckets).

``--specs FILE`` builds exactly the specs listed in FILE (JSON ``[{"family", "params"}, ...]``, e.g. from
``scripts/device_specs.py``) instead of a subset: each for every ``--archs`` arch its family builds.
``--keep-objects`` keeps the exported objects in ``DIR/.obj``: a later build into the same DIR compiles only
the kernels whose spec, arch, sources or DSL version changed.

Other modes: ``--list`` prints the plan without compiling; ``--objects-only`` compiles and prepares the link
(shim source, version script, ``<arch>/link.json``) without linking, for CMake (``aot/cmake_steps.py``).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from .archs import ARCHS
from .kernels.cute.registry import FAMILY_MODULES as REGISTERED_FAMILY_MODULES

__all__ = ["AOT_ARCHS", "FAMILY_MODULES", "SUBSETS", "AotError", "AotFamily", "ArchPlan", "load_families",
           "plan_archs", "plan_specs", "parse_archs", "read_specs", "subset_specs", "main"]

#: archs the AOT build accepts (``--archs``, ``W4A16_MOE_AOT_ARCHS``)
AOT_ARCHS = ARCHS
#: kernel family modules enumerated by default (the family registry)
FAMILY_MODULES = REGISTERED_FAMILY_MODULES
SUBSETS = ("smoke", "full")


class AotError(RuntimeError):
    """The requested AOT build cannot be planned (bad arguments, a broken family module, no kernels)."""


@dataclass
class AotFamily:
    """One kernel family as the AOT build sees it."""

    name: str
    module: str
    archs: tuple
    variants: Callable[[str], list]  # subset -> [KernelSpec]
    sass_expect: Optional[tuple]  # instructions every kernel must contain (loader/sass.py); None = undeclared
    sass_allow_local: tuple = ()  # archs on which the family accepts local memory (LDL/STL): warnings, not errors
    sass_local_budget: tuple = ()  # per-kernel local-memory budget rules (loader/sass.py: budget_rules)
    sass_serial_ok: tuple = ()  # kernels whose serialized WGMMA pipeline is accepted (loader/sass.py: serial_rules)


@dataclass
class ArchPlan:
    """The kernels one arch gets: ``specs`` (all families), per-family counts, and why others are absent."""

    arch: str
    specs: list = field(default_factory=list)
    per_family: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(self.notes)


def load_families(modules: Sequence[str] = FAMILY_MODULES) -> tuple:
    """``([AotFamily], {module: why absent})``. A module that does not exist is absent; one that exists but
    fails to import, lacks ``FAMILY`` / ``ARCHS`` / ``aot_variants`` or declares a malformed local-memory budget
    or serialized-WGMMA rule raises :class:`AotError`."""
    from .loader.sass import budget_rules, serial_rules

    fams, absent = [], {}
    for mod_name in modules:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
                absent[mod_name] = "not in this version of the package"
                continue
            raise AotError(f"kernel family module {mod_name} failed to import: {type(e).__name__}: {e}") from e
        except Exception as e:
            raise AotError(f"kernel family module {mod_name} failed to import: {type(e).__name__}: {e}") from e
        d = getattr(mod, "DESCRIPTOR", None)
        if d is not None:  # a registered family
            attrs = {"FAMILY": d.spec_family, "ARCHS": d.archs, "aot_variants": d.aot_variants,
                     "SASS_EXPECT": d.sass_expect, "SASS_ALLOW_LOCAL": d.sass_allow_local,
                     "SASS_LOCAL_BUDGET": d.sass_local_budget, "SASS_SERIAL_OK": d.sass_serial_ok}
        else:
            attrs = {a: getattr(mod, a, None) for a in ("FAMILY", "ARCHS", "aot_variants", "SASS_EXPECT",
                                                        "SASS_ALLOW_LOCAL", "SASS_LOCAL_BUDGET", "SASS_SERIAL_OK")}
        lacking = [a for a in ("FAMILY", "ARCHS", "aot_variants") if attrs[a] is None]
        if lacking:
            raise AotError(f"kernel family module {mod_name} must define {', '.join(lacking)} for the AOT build")
        exp, allow = attrs["SASS_EXPECT"], attrs["SASS_ALLOW_LOCAL"] or ()
        allow = tuple(attrs["ARCHS"]) if allow is True else tuple(allow)
        try:
            budget = budget_rules(attrs["SASS_LOCAL_BUDGET"])
            serial = serial_rules(attrs["SASS_SERIAL_OK"])
        except ValueError as e:
            raise AotError(f"kernel family module {mod_name}: {e}") from e
        fams.append(AotFamily(attrs["FAMILY"], mod_name, tuple(attrs["ARCHS"]), attrs["aot_variants"],
                              tuple(exp) if exp is not None else None, allow, budget, serial))
    return fams, absent


def parse_archs(text: str) -> list:
    """``"sm_90a,sm_100a"`` or ``"sm_90a;sm_100a"`` -> list; ValueError naming any unknown arch."""
    archs = [a.strip() for a in text.replace(";", ",").split(",") if a.strip()]
    if not archs:
        raise ValueError(f"--archs: no arch given (expected some of {', '.join(AOT_ARCHS)})")
    bad = [a for a in archs if a not in AOT_ARCHS]
    if bad:
        raise ValueError(f"--archs: unknown arch {', '.join(bad)}; the AOT build accepts {', '.join(AOT_ARCHS)}")
    return list(dict.fromkeys(archs))


def plan_archs(archs: Sequence[str], subset: str, modules: Sequence[str] = FAMILY_MODULES) -> tuple:
    """``([ArchPlan per arch], [AotFamily], {module: why absent})`` for ``archs`` and ``subset``."""
    if subset not in SUBSETS:
        raise ValueError(f"--subset: expected one of {SUBSETS}, got {subset!r}")
    fams, absent = load_families(modules)
    plans = []
    for arch in archs:
        p = ArchPlan(arch)
        seen = set()
        for f in fams:
            if arch not in f.archs:
                p.notes.append(f"family {f.name} builds only {', '.join(f.archs)}")
                continue
            specs = list(f.variants(subset))
            if any(s.family != f.name for s in specs):
                raise AotError(f"{f.module}.aot_variants({subset!r}) returned specs of another family")
            new = [s for s in specs if s not in seen]
            seen.update(new)
            p.specs += new
            p.per_family[f.name] = len(new)
        for mod, why in absent.items():
            p.notes.append(f"family module {mod} is {why}")
        plans.append(p)
    return plans, fams, absent


def subset_specs(subset: str, arch: str = "sm_90a") -> list:
    """The specs ``subset`` builds for ``arch`` (all families)."""
    return plan_archs([arch], subset)[0][0].specs


# ------------------------------------------------------------------------------------------------------
# progress
# ------------------------------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on a terminal; a line every ~10 % (or 15 s) in logs."""

    def __init__(self, total: int, stream=None):
        self.total, self.t0 = total, time.perf_counter()
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self._last_pct, self._last_t = -100, 0.0

    def __call__(self, done: int, total: int, rec: dict) -> None:
        now = time.perf_counter()
        el = now - self.t0
        pct = 100 * done // max(1, total)
        if not self.tty and done < total and pct - self._last_pct < 10 and now - self._last_t < 15:
            return
        self._last_pct, self._last_t = pct, now
        eta = el / done * (total - done) if done else 0
        bar = "#" * (pct // 4) + "-" * (25 - pct // 4)
        line = (f"aot: [{bar}] {done}/{total} {_fmt_s(el)} elapsed, ~{_fmt_s(eta)} left "
                f"({rec['arch']} {rec['spec']['name'][:60]})")
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160) + ("\n" if done == total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _fmt_s(s: float) -> str:
    return f"{int(s) // 60}m{int(s) % 60:02d}s"


# ------------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------------
def compile_plans(plans: Sequence[ArchPlan], out: Path, jobs: int, progress: bool = True) -> dict:
    """Compile every spec of every plan into ``out/<arch>/obj``; ``{arch: [.o paths]}``."""
    from .loader.compile_pool import compile_jobs

    jobs_list = [(s, p.arch, out / p.arch / "obj") for p in plans for s in p.specs]
    cb = Progress(len(jobs_list)) if progress else None
    objs = compile_jobs(jobs_list, workers=jobs, on_done=cb)
    res, i = {}, 0
    for p in plans:
        res[p.arch] = objs[i : i + len(p.specs)]
        i += len(p.specs)
    return res


def manifest_extra(plans: Sequence[ArchPlan], fams: Sequence[AotFamily], absent: dict, subset: str,
                   linker: str) -> dict:
    """The AOT-specific fields of ``manifest.json`` (besides what :func:`prebuilt.write_manifest` writes)."""
    from .loader.spec import family_source_hash

    fam_info = {}
    for f in fams:
        try:
            src = family_source_hash(f.name)
        except Exception as e:  # a family the loader has no compile function for cannot be built anyway
            src = f"unavailable ({e})"
        fam_info[f.name] = {"module": f.module, "archs": list(f.archs), "sass_expect": list(f.sass_expect)
                            if f.sass_expect is not None else None, "sass_allow_local": list(f.sass_allow_local),
                            "sass_local_budget": list(f.sass_local_budget),
                            "sass_serial_ok": list(f.sass_serial_ok), "source_hash": src}
    return {
        "subset": subset,
        "linker": linker,
        "families": fam_info,
        "absent_family_modules": dict(absent),
        "archs": {p.arch: ({"kernels": len(p.specs), "families": dict(p.per_family)} if p.specs
                           else {"kernels": 0, "reason": p.reason}) for p in plans},
    }


def _say_plan(plans: Sequence[ArchPlan]) -> None:
    for p in plans:
        if p.specs:
            fams = ", ".join(f"{n} {f}" for f, n in p.per_family.items())
            print(f"aot: {p.arch}: {len(p.specs)} kernels ({fams})", flush=True)
        else:
            print(f"aot: {p.arch}: NO KERNELS, no library will be built for it: {p.reason}", flush=True)


def read_specs(path) -> list:
    """The specs listed in the JSON file ``path`` (``[{"family", "params"[, "name"]}, ...]``), in order, without
    repeats; ValueError naming the file and the entry that breaks the format."""
    from .loader.spec import KernelSpec

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--specs {path}: cannot read a JSON spec list: {e}") from e
    if not isinstance(data, list) or not data:
        raise ValueError(f"--specs {path}: expected a non-empty JSON list of {{\"family\", \"params\"}} objects")
    specs = []
    for i, d in enumerate(data):
        try:
            specs.append(KernelSpec.from_json(d))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"--specs {path}: entry {i} is not a kernel spec ({type(e).__name__}: {e})") from e
    return list(dict.fromkeys(specs))


def plan_specs(archs: Sequence[str], specs: Sequence, modules: Sequence[str] = FAMILY_MODULES) -> tuple:
    """Like :func:`plan_archs` for an explicit spec list: each spec for every arch of ``archs`` its family
    builds (a spec of a family the AOT build does not enumerate, e.g. the loader's self-test, for every arch)."""
    fams, absent = load_families(modules)
    fam_archs = {f.name: f.archs for f in fams}
    plans = []
    for arch in archs:
        p = ArchPlan(arch)
        for s in specs:
            if arch in fam_archs.get(s.family, (arch,)):
                p.specs.append(s)
                p.per_family[s.family] = p.per_family.get(s.family, 0) + 1
        for fam in sorted({s.family for s in specs} - set(p.per_family)):
            p.notes.append(f"family {fam} builds only {', '.join(fam_archs[fam])}")
        plans.append(p)
    return plans, fams, absent


def main(argv: Optional[list] = None) -> int:
    from . import cli

    ap = cli.parser("aot", __doc__)
    ap.add_argument("--archs", default="sm_90a", help=f"comma- or semicolon-separated, of {', '.join(AOT_ARCHS)}")
    ap.add_argument("--subset", default=None, choices=list(SUBSETS), help="kernels to build (default full)")
    ap.add_argument("--specs", metavar="FILE", default=None,
                    help="build exactly the specs in FILE (JSON [{family, params}, ...], e.g. from "
                         "scripts/device_specs.py) instead of a --subset")
    ap.add_argument("--out", help="prebuilt directory to write (manifest.json + <arch>/kernels.so)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="compile processes (default 2)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print the plan (per arch, per family) and exit")
    mode.add_argument("--objects-only", action="store_true",
                      help="compile + prepare the link in --out/<arch>/ (link.json) without linking (for CMake)")
    ap.add_argument("--families", default=None,
                    help=f"comma-separated family modules to enumerate (default: {', '.join(FAMILY_MODULES)})")
    ap.add_argument("--keep-objects", action="store_true",
                    help="keep --out/.obj (exported .o/.h/.json): a later build into the same --out reuses every "
                         "object whose spec, arch, kernel sources and DSL version are unchanged")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    modules = tuple(m.strip() for m in a.families.split(",") if m.strip()) if a.families else FAMILY_MODULES
    if a.specs and a.subset:
        print("aot: error: --specs and --subset exclude each other (--specs builds exactly the listed specs)",
              file=sys.stderr)
        return 2
    subset = "specs" if a.specs else (a.subset or "full")
    try:
        archs = parse_archs(a.archs)
        if a.specs:
            plans, fams, absent = plan_specs(archs, read_specs(a.specs), modules)
        else:
            plans, fams, absent = plan_archs(archs, subset, modules)
    except (ValueError, AotError) as e:
        print(f"aot: error: {e}", file=sys.stderr)
        return 2
    _say_plan(plans)
    if a.list:
        for p in plans:
            for s in p.specs:
                print(f"{p.arch} {s.name}")
        return 0
    if not a.out:
        ap.error("--out is required (except with --list)")
    built = [p for p in plans if p.specs]
    if not built:
        print(f"aot: error: --archs {','.join(archs)} selects no kernels at all: "
              + "; ".join(f"{p.arch}: {p.reason}" for p in plans), file=sys.stderr)
        return 2
    out = Path(a.out)
    from .loader import build

    t0 = time.perf_counter()
    total = sum(len(p.specs) for p in built)
    print(f"aot: compiling {total} kernels for {', '.join(p.arch for p in built)} ({subset}) with {a.jobs} "
          f"workers -> {out}", flush=True)
    work = out if a.objects_only else out / ".obj"
    try:
        objs = compile_plans(built, work, a.jobs, progress=not a.no_progress)
    except build.BuildError as e:
        print(f"aot: error: {e}", file=sys.stderr)
        return 1
    t_compile = time.perf_counter() - t0
    if a.objects_only:
        for p in built:
            lp = build.prepare_link(objs[p.arch], out / p.arch)
            (out / p.arch / "link.json").write_text(json.dumps(lp.to_json(), indent=1))
        print(f"aot: compiled {total} kernels in {t_compile:.0f} s; link inputs in {out}/<arch>/link.json", flush=True)
        return 0
    from .loader.prebuilt import write_manifest

    metas = []
    for p in built:
        meta = build.link_shared_library(objs[p.arch], out / p.arch / "kernels.so", meta_path=out / p.arch / "meta.json")
        metas.append(out / p.arch / "meta.json")
        print(f"aot: {p.arch}: kernels.so {meta['size'] / 2**20:.1f} MiB, {len(p.specs)} kernels", flush=True)
    m = write_manifest(out, metas, extra=manifest_extra(plans, fams, absent, subset, "g++"))
    if not a.keep_objects:
        shutil.rmtree(out / ".obj", ignore_errors=True)
    print(f"aot: done in {time.perf_counter() - t0:.0f} s (compile {t_compile:.0f} s): {len(m['kernels'])} kernels, "
          f"manifest {out / 'manifest.json'}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

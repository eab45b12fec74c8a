"""SASS checks of built kernels, without a GPU: ``python -m w4a16_moe.loader.sass DIR [--json] [--kernels]``.

The CuTe DSL embeds each kernel's cubin (a CUDA ELF image) as plain data in the exported ``.o``; linking
copies it byte for byte into the kernel library. :func:`extract_cubins` finds those images in any file
(object or ``.so``) by their ELF headers (``e_machine`` = EM_CUDA). At compile time :mod:`.build` records
the SHA-256 of each kernel's cubins in its sidecar and in ``meta.json``, so a cubin found in a library maps
back to its kernel.

:func:`check_dir` disassembles every cubin with ``nvdisasm`` and checks per kernel:

* the instructions its family must use (``sass_expect``): ``HGMMA`` for the SM90 WGMMA family,
  ``HMMA`` for warp-MMA families (from the manifest's ``families`` table, else the family registry: :func:`default_expect`);
* no local-memory traffic (``LDL`` / ``STL``: register spills or stack arrays), except:
  - up to the kernel's local-memory budget, if it has one: a warning (one instruction more: a problem). A family
    declares its budgets as rules (``sass_local_budget``: archs, exact kernel params, the most ``LDL`` and
    ``STL`` instructions per kernel, why); a kernel's budget is the first rule for its arch whose params all
    equal the kernel's (:func:`find_budget`). The rules: the manifest's ``families[f].sass_local_budget``,
    else (exported objects, a manifest written before budgets) the family registry (:func:`default_local_budget`);
  - any amount where the family accepts local memory on an arch (manifest ``families[f].sass_allow_local``) or
    ``--allow-local`` names the family: a warning;
* no WGMMA pipeline that ``ptxas`` serialized (:func:`wgmma_serialized`): where a kernel's registers run short,
  ptxas makes every ``HGMMA`` a commit group of its own and waits for it to finish (``WARPGROUP.DEPBAR.LE gsb0, 0x0``)
  before the next instruction, so the warpgroup's decode and its tensor-core work no longer overlap (its
  advisory "wgmma.mma_async instructions are serialized" is not shown by the DSL). Such a kernel is a problem,
  except where a rule of its family accepts it (``sass_serial_ok``: archs, exact kernel params, why; a warning):
  the rules, like the budgets, come from the manifest's ``families[f].sass_serial_ok``, else the registry
  (:func:`default_serial_ok`);
* a kernel built with ``setmaxnreg`` shows ``USETMAXREG``: where ptxas dropped it (advisory C7508) the kernel runs
  every warp on its launch register count; a warning (:func:`check_setmaxnreg`);
* every kernel has its cubin and every cubin belongs to a kernel.

:func:`compare_dirs` (``--compare OTHER``) sets two builds side by side: kernels matched by family, arch and the params
both builds name have the same SASS or not. A change that must leave existing kernels as they were (a refactor of
kernel code, a new codegen field at its default) is checked this way without a GPU.

The report also gives each kernel's register count (:func:`register_counts`, read from the cubins' ``.nv.info``
sections, as ``cuobjdump --dump-resource-usage`` prints it): what decides how many CTAs share an SM.

``DIR`` is a prebuilt directory (``manifest.json`` + ``<arch>/meta.json`` + libraries, e.g. an installed
``w4a16_moe/_prebuilt``) or a directory of exported objects (``<name>.o`` + sidecar ``<name>.json``).

``nvdisasm`` is looked up in ``$W4A16_MOE_NVDISASM``, ``PATH``, the CUDA toolkit, the ``nvidia-cuda-nvdisasm``
wheel (``nvidia/cu13/bin``) and Triton's bundled copy, in that order (:func:`find_nvdisasm`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .. import settings

__all__ = ["Cubin", "SassToolError", "extract_cubins", "find_nvdisasm", "disassemble", "opcode_counts", "check_opcodes",
           "local_memory", "check_local", "budget_rules", "find_budget", "default_local_budget", "wgmma_serialized",
           "serial_rules", "default_serial_ok", "check_serial", "check_setmaxnreg", "check_dir", "compare_dirs", "main"]

EM_CUDA = 190
#: local-memory instructions: no kernel may contain them beyond its budget
FORBIDDEN = ("LDL", "STL")
#: opcodes reported in summaries
REPORTED = ("HGMMA", "HMMA", "UTCHMMA", "UTCQMMA", "LDL", "STL", "USETMAXREG")


def default_expect() -> dict:
    """Instructions a kernel of a family must contain when the manifest does not say (the registered CuTe
    families' ``sass_expect``; families not listed: only the local-memory check)."""
    from ..kernels.cute import registry

    return {"selftest_axpy": (), **{f.spec_family: tuple(f.sass_expect) for f in registry.families()}}


def default_local_budget() -> dict:
    """Local-memory budget rules per family when the manifest does not say (the registered CuTe families'
    ``sass_local_budget``, :func:`budget_rules`; families not listed: none)."""
    from ..kernels.cute import registry

    return {f.spec_family: budget_rules(f.sass_local_budget) for f in registry.families()}


def default_serial_ok() -> dict:
    """Rules per family accepting a serialized WGMMA pipeline when the manifest does not say (the registered CuTe
    families' ``sass_serial_ok``, :func:`serial_rules`; families not listed: none)."""
    from ..kernels.cute import registry

    return {f.spec_family: serial_rules(f.sass_serial_ok) for f in registry.families()}


class SassToolError(RuntimeError):
    """No usable disassembler, or it failed."""


@dataclass(frozen=True)
class Cubin:
    """One CUDA ELF image found inside a file."""

    offset: int
    data: bytes
    sm: int  # SM number from e_flags (90 = sm_90/sm_90a)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def describe(self) -> dict:
        return {"sha256": self.sha256, "size": len(self.data), "sm": self.sm}


def _elf_end(b: bytes, off: int) -> Optional[int]:
    """Length of the 64-bit little-endian CUDA ELF image at ``off`` (None if the header is not one)."""
    if len(b) < off + 64 or b[off + 4] != 2 or b[off + 5] != 1:
        return None
    (machine,) = struct.unpack_from("<H", b, off + 18)
    if machine != EM_CUDA:
        return None
    phoff, shoff = struct.unpack_from("<QQ", b, off + 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", b, off + 0x36)
    if shentsize != 64 or (phnum and phentsize != 56):
        return None
    end = max(64, shoff + shnum * shentsize, phoff + phnum * phentsize)
    if off + end > len(b):
        return None
    for i in range(shnum):  # sections may lie after the tables
        sh = off + shoff + i * shentsize
        sh_type, = struct.unpack_from("<I", b, sh + 4)
        sh_offset, sh_size = struct.unpack_from("<QQ", b, sh + 0x18)
        if sh_type != 8:  # SHT_NOBITS occupies no bytes
            end = max(end, sh_offset + sh_size)
    return end if off + end <= len(b) else None


def extract_cubins(data: bytes) -> list:
    """Every CUDA ELF image embedded in ``data`` (an object file, a shared library, a cubin), in order."""
    out, pos = [], 0
    while True:
        i = data.find(b"\x7fELF", pos)
        if i < 0:
            return out
        end = _elf_end(data, i)
        if end is None:
            pos = i + 4
            continue
        (flags,) = struct.unpack_from("<I", data, i + 0x30)
        out.append(Cubin(i, bytes(data[i : i + end]), (flags >> 8) & 0xFF))
        pos = i + end


#: ``.nv.info`` attribute of a function's register count, and the record format with a payload (every record
#: starts on a 4-byte grid: format, attribute, then a 16-bit value, or for ``SVAL`` a 16-bit payload size and the
#: payload)
EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def register_counts(cubin: bytes) -> list:
    """The register count of each function of one cubin (the ``EIATTR_REGCOUNT`` records of its ``.nv.info``
    sections, in order): what ``cuobjdump --dump-resource-usage`` prints as ``REG``, read without a tool.
    ValueError where the image is not a 64-bit CUDA ELF."""
    if _elf_end(cubin, 0) is None:
        raise ValueError("not a 64-bit little-endian CUDA ELF image")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<I4xQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    str_off = heads[shstrndx][3]

    def name(off: int) -> bytes:
        start = str_off + off
        return cubin[start:cubin.index(b"\0", start)]

    out = []
    for sh_name, _flags, _addr, off, size in heads:
        if not name(sh_name).startswith(b".nv.info"):
            continue
        p, end = off, off + size
        while p + 4 <= end:
            fmt, attr, val = struct.unpack_from("<BBH", cubin, p)
            if fmt == _EIFMT_SVAL:
                if attr == EIATTR_REGCOUNT and val >= 4:
                    # (function symbol, count), or the count alone
                    out.append(struct.unpack_from("<I", cubin, p + 4 + (4 if val >= 8 else 0))[0])
                p += 4 + val
            else:
                if attr == EIATTR_REGCOUNT:
                    out.append(val)
                p += 4
    return out


def find_nvdisasm() -> Path:
    """Path of an ``nvdisasm`` executable (see the module docstring), or :class:`SassToolError`."""
    cands = []
    env = settings.get().nvdisasm
    if env:
        cands.append(Path(env))
    w = shutil.which("nvdisasm")
    if w:
        cands.append(Path(w))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "bin" / "nvdisasm")
    cands.append(Path("/usr/local/cuda/bin/nvdisasm"))
    import importlib.util

    for pkg, rel in (("nvidia", "cu13/bin/nvdisasm"), ("nvidia", "cuda_nvdisasm/bin/nvdisasm"),
                     ("triton", "backends/nvidia/bin/nvdisasm")):
        spec = importlib.util.find_spec(pkg)
        for base in (spec.submodule_search_locations or []) if spec else []:
            cands.append(Path(base) / rel)
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise SassToolError(
        "nvdisasm not found (tried $W4A16_MOE_NVDISASM, PATH, CUDA_HOME, /usr/local/cuda, the nvidia-cuda-nvdisasm "
        "and triton packages); `pip install nvidia-cuda-nvdisasm` provides it"
    )


def disassemble(cubin: bytes, nvdisasm: Optional[Path] = None) -> str:
    """SASS text of one cubin (``nvdisasm``)."""
    tool = nvdisasm or find_nvdisasm()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        p = subprocess.run([str(tool), "-c", "-ndf", f.name], capture_output=True, text=True)  # code only, no dataflow analysis
    if p.returncode != 0:
        raise SassToolError(f"{tool} failed ({p.returncode}): {p.stderr.strip()[:500]}")
    return p.stdout


_INSN_RE = re.compile(r"^\s*(?:/\*[0-9a-f]+\*/\s*)?(?:\{\s*)?(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Za-z0-9_.]+)?\b[^;]*;",
                      re.M)


def opcode_counts(sass: str) -> Counter:
    """Base opcodes (``HGMMA`` of ``HGMMA.64x8x16.F32.BF16``) and how often each occurs."""
    return Counter(m.group(1) for m in _INSN_RE.finditer(sass))


def local_memory(ops: Counter) -> list:
    """One line per local-memory instruction kind present (``LDL`` / ``STL``)."""
    return [f"{ops[x]} {x} instruction(s): local memory (spills or stack arrays)" for x in FORBIDDEN if ops.get(x)]


def budget_rules(rules) -> tuple:
    """A family's local-memory budget (``sass_local_budget``, or its copy in the manifest) checked, in JSON form:
    one dict per rule with ``archs`` (list), ``params`` (kernel params the rule applies to: exact values),
    ``LDL`` and ``STL`` (the most instructions of each one kernel may have, >= 0) and ``why`` (one line);
    ValueError naming the rule and what is wrong."""
    out = []
    for i, r in enumerate(rules or ()):
        what = f"local-memory budget rule {i}"
        rule = _kernel_rule(r, what, ("LDL", "STL"), "the local memory")
        for x in FORBIDDEN:
            if not isinstance(r[x], int) or isinstance(r[x], bool) or r[x] < 0:
                raise ValueError(f"{what}: {x} must be an instruction count >= 0, got {r[x]!r}")
        out.append({**rule, "LDL": r["LDL"], "STL": r["STL"], "why": r["why"]})
    return tuple(out)


def _kernel_rule(r, what: str, extra: tuple, accepted: str) -> dict:
    """``{"archs": [...], "params": {...}}`` of one SASS-check rule (``archs``, ``params``, ``why`` and the keys of
    ``extra``, exactly), or ValueError naming ``what`` and the broken rule."""
    keys = ("archs", "params", *extra, "why")
    if not isinstance(r, dict) or set(r) != set(keys):
        raise ValueError(f"{what}: expected a dict with exactly {', '.join(keys)}; got {r!r}")
    if isinstance(r["archs"], str) or not r["archs"] or not all(isinstance(a, str) for a in r["archs"]):
        raise ValueError(f"{what}: archs must be a non-empty list of arch names, got {r['archs']!r}")
    if not isinstance(r["params"], dict) or not r["params"]:
        raise ValueError(f"{what}: params must be a non-empty dict of kernel params, got {r['params']!r}")
    if not isinstance(r["why"], str) or not r["why"].strip():
        raise ValueError(f"{what}: why must say why {accepted} is accepted")
    return {"archs": list(r["archs"]), "params": dict(r["params"])}


def _same(a, b) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)  # True is not the pingpong count 1


def find_budget(rules: Sequence[dict], arch: str, params: dict) -> Optional[dict]:
    """The first rule of ``rules`` (:func:`budget_rules`, or :func:`serial_rules`) for ``arch`` whose ``params``
    all equal the kernel's ``params`` (None: no rule for the kernel, e.g. no local-memory budget)."""
    for r in rules:
        if arch in r["archs"] and all(k in params and _same(params[k], v) for k, v in r["params"].items()):
            return r
    return None


_HGMMA_RE = re.compile(r"\bHGMMA\.[^;]*;")
_WAIT0_RE = re.compile(r"\bWARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x0\b")


def wgmma_serialized(sass: str) -> Optional[str]:
    """Why the WGMMA pipeline of one kernel's disassembly is serialized, or None. Serialized: more than one
    ``HGMMA``, each one closing its own commit group (``gsb0``) and at least as many waits for zero pending
    groups (``WARPGROUP.DEPBAR.LE gsb0, 0x0``) as ``HGMMA`` s: what ptxas emits when it cannot keep several
    WGMMAs in flight. A kernel whose code commits one ``HGMMA`` per group but waits for one group less (an
    overlapped pipeline of single-WGMMA groups), or several ``HGMMA`` s per group and one wait per tile (a
    serial schedule by design), is not serialized."""
    hg = _HGMMA_RE.findall(sass)
    if len(hg) < 2:
        return None
    closing = sum(1 for x in hg if "gsb0" in x)
    waits = len(_WAIT0_RE.findall(sass))
    if closing < len(hg) or waits < len(hg):
        return None
    return (f"WGMMA pipeline serialized by ptxas: {len(hg)} HGMMA, each its own commit group, {waits} waits for "
            f"zero pending groups")


def serial_rules(rules) -> tuple:
    """A family's rules accepting a serialized WGMMA pipeline (``sass_serial_ok``, or its copy in the manifest)
    checked, in JSON form: one dict per rule with ``archs`` (list), ``params`` (exact kernel params) and ``why``
    (one line); ValueError naming the rule and what is wrong. :func:`find_budget` finds a kernel's rule."""
    return tuple({**_kernel_rule(r, f"serialized-WGMMA rule {i}", (), "the serialized pipeline"), "why": r["why"]}
                 for i, r in enumerate(rules or ()))


def check_serial(why: Optional[str], rule: Optional[dict] = None) -> tuple:
    """``(problems, warnings)`` of one kernel's WGMMA pipeline: ``why`` from :func:`wgmma_serialized` (None: not
    serialized, nothing to say); serialized: a warning where ``rule`` (the kernel's ``sass_serial_ok`` rule)
    accepts it, else a problem."""
    if why is None:
        return [], []
    if rule is None:
        return [why], []
    return [], [f"{why}, accepted ({rule['why']})"]


def check_setmaxnreg(ops: Counter, params: dict) -> list:
    """Warnings of a kernel built with ``setmaxnreg`` (two consumer warpgroups) whose SASS has no ``USETMAXREG``:
    ptxas drops the register split where it cannot tell the register count at its point (advisory C7508, "unable to
    determine register count at entry", which the DSL does not show). Such a kernel runs every warp on its launch
    register count: correct, but not the kernel its spec names (docs/perf/2026-12-05-wide-pp-down)."""
    if params.get("setmaxnreg") and params.get("consumer_wgs", 1) == 2 and not ops.get("USETMAXREG"):
        return ["setmaxnreg requested, but the SASS has no USETMAXREG (ptxas dropped it): every warp runs on the "
                "launch register count"]
    return []


def check_local(ops: Counter, allow_local: bool = False, budget: Optional[dict] = None) -> tuple:
    """``(problems, warnings)`` of one kernel's local memory (:func:`local_memory`): none without it; with it,
    warnings when ``allow_local`` (any amount) or when every count is within ``budget`` (the kernel's rule,
    :func:`find_budget`), else problems (beyond the budget: each count over it, with its bound)."""
    lines = local_memory(ops)
    if not lines:
        return [], []
    if allow_local:
        return [], [f"{x}, accepted for this family and arch" for x in lines]
    if budget is None:
        return lines, []
    bound = f"LDL <= {budget['LDL']}, STL <= {budget['STL']}"
    over = [x for x in FORBIDDEN if ops.get(x, 0) > budget[x]]
    if over:
        return [f"{ops[x]} {x} instruction(s): local memory over the kernel's budget ({bound})" for x in over], []
    used = ", ".join(f"{ops.get(x, 0)} {x}" for x in FORBIDDEN)
    return [], [f"{used}: local memory within the kernel's budget ({bound}: {budget['why']})"]


def check_opcodes(ops: Counter, expect: Optional[Sequence[str]], allow_local: bool = False,
                  budget: Optional[dict] = None) -> list:
    """Problems of one kernel: a missing expected instruction; local-memory instructions, unless
    ``allow_local`` or within ``budget`` (then :func:`check_local` reports them as warnings)."""
    probs = [f"no {x} instruction (its family must use {x})" for x in (expect or ()) if not ops.get(x)]
    return probs + check_local(ops, allow_local, budget)[0]


# ------------------------------------------------------------------------------------------------------
# directory checks
# ------------------------------------------------------------------------------------------------------
def _kernel_sets(d: Path) -> tuple:
    """``(groups, expectations, allowed, budgets, serial)``: groups = [(file holding the cubins, arch, [kernel
    record with 'params' and 'cubins'])], allowed = {(family, arch)} whose local memory is accepted, budgets =
    {family: budget rules}, serial = {family: rules accepting a serialized WGMMA pipeline}."""
    manifest = d / "manifest.json"
    expect, budgets, serial = default_expect(), default_local_budget(), default_serial_ok()
    groups, allowed = [], set()
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        for fam, info in (m.get("families") or {}).items():
            if info.get("sass_expect") is not None:
                expect[fam] = tuple(info["sass_expect"])
            allowed.update((fam, a) for a in info.get("sass_allow_local") or ())
            if "sass_local_budget" in info:  # else (a manifest written before the budgets) the registry's
                budgets[fam] = budget_rules(info["sass_local_budget"])
            if "sass_serial_ok" in info:  # else (a manifest written before these rules) the registry's
                serial[fam] = serial_rules(info["sass_serial_ok"])
        for lib in m.get("libraries", []):
            meta = json.loads((d / lib["meta"]).read_text())
            groups.append((d / lib["file"], meta["arch"], meta["kernels"]))
        return groups, expect, allowed, budgets, serial
    sides = sorted(p for p in d.rglob("*.json") if p.with_suffix(".o").is_file())
    if not sides:
        raise FileNotFoundError(f"{d}: neither a prebuilt directory (manifest.json) nor exported objects (<name>.o + .json)")
    for side in sides:
        rec = json.loads(side.read_text())
        groups.append((side.with_suffix(".o"), rec["arch"], [{**rec["spec"], "cubins": rec.get("cubins", [])}]))
    return groups, expect, allowed, budgets, serial


def _kernel_cubins(groups) -> tuple:
    """``([(kernel record, arch, file, [cubins])], problems)`` of :func:`_kernel_sets`' groups: each kernel's cubins
    found in its file by their recorded fingerprints; a kernel without them, and a cubin of no kernel, are problems."""
    work, problems = [], []
    for path, arch, kernels in groups:
        found = {c.sha256: c for c in extract_cubins(path.read_bytes())}
        claimed = set()
        for k in kernels:
            hashes = [c["sha256"] for c in k.get("cubins", [])]
            if not hashes:
                problems.append(f"{k['name']} ({arch}): no cubin fingerprint recorded (built before cubins were recorded?)")
                continue
            missing = [h for h in hashes if h not in found]
            if missing:
                problems.append(f"{k['name']} ({arch}): cubin {missing[0][:12]} not found in {path}")
                continue
            claimed.update(hashes)
            work.append((k, arch, path, [found[h] for h in hashes]))
        for h in sorted(set(found) - claimed):
            problems.append(f"{path}: cubin {h[:12]} at offset {found[h].offset} belongs to no listed kernel")
    return work, problems


def check_dir(directory, workers: Optional[int] = None, allow_local: Sequence[str] = ()) -> dict:
    """Check every kernel under ``directory`` (see the module docstring). Returns
    ``{"ok", "nvdisasm", "kernels": [{"name", "family", "arch", "file", "opcodes", "registers", "expect",
    "local_budget", "wgmma_serialized", "serial_ok", "problems", "warnings"}], "problems", "warnings"}``
    (``registers``: the most any function of the kernel uses, :func:`register_counts`; ``local_budget``: the
    kernel's budget rule, or None; ``wgmma_serialized``: :func:`wgmma_serialized`'s finding, or None; ``serial_ok``:
    the rule accepting it, or None).
    Families in ``allow_local`` may use local memory (reported as warnings)."""
    d = Path(directory)
    tool = find_nvdisasm()
    groups, expect, allowed, budgets, serial = _kernel_sets(d)
    work, problems = _kernel_cubins(groups)

    def one(item):
        k, arch, path, cubins = item
        ops = Counter()
        found = []
        regs = max((r for c in cubins for r in register_counts(c.data)), default=None)
        for c in cubins:
            text = disassemble(c.data, tool)
            ops.update(opcode_counts(text))
            found.append(wgmma_serialized(text))
        why = next((w for w in found if w), None)
        exp = expect.get(k["family"])
        allow = k["family"] in allow_local or (k["family"], arch) in allowed
        params = k.get("params") or {}
        budget = find_budget(budgets.get(k["family"], ()), arch, params)
        rule = find_budget(serial.get(k["family"], ()), arch, params) if why else None
        sprobs, swarns = check_serial(why, rule)
        probs = check_opcodes(ops, exp, allow, budget) + sprobs
        warns = check_local(ops, allow, budget)[1] + swarns + check_setmaxnreg(ops, params)
        return {"warnings": warns, "name": k["name"], "family": k["family"], "arch": arch, "file": str(path),
                "opcodes": {x: ops.get(x, 0) for x in REPORTED if ops.get(x)}, "instructions": sum(ops.values()),
                "registers": regs,
                "expect": list(exp) if exp is not None else None, "local_budget": budget, "wgmma_serialized": why,
                "serial_ok": rule, "problems": probs}

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as ex:
        results = list(ex.map(one, work))
    warnings = [f"{r['name']} ({r['arch']}): {w}" for r in results for w in r["warnings"]]
    for r in results:
        problems += [f"{r['name']} ({r['arch']}): {p}" for p in r["problems"]]
        if r["instructions"] == 0:
            problems.append(f"{r['name']} ({r['arch']}): no instructions disassembled")
    return {"dir": str(d), "nvdisasm": str(tool), "ok": not problems, "kernels": results, "problems": problems,
            "warnings": warnings}


#: kernel symbols in a disassembly (their names carry the spec's hash, which a new codegen field changes)
_SYMBOL = re.compile(r"\bkernel_cutlass\w*")


def _instructions(text: str) -> str:
    """The instruction lines of a disassembly (address comment, opcode, operands) with every kernel symbol replaced:
    what two builds of the same code under other kernel names share."""
    return "\n".join(_SYMBOL.sub("K", line.split(";")[0].strip()) for line in text.splitlines() if "/*" in line)


def _by_family(d: Path) -> tuple:
    """``({(family, arch): [(record, [cubins])]}, problems)`` of one build (:func:`_kernel_cubins`)."""
    work, problems = _kernel_cubins(_kernel_sets(d)[0])
    out = {}
    for k, arch, _, cubins in work:
        out.setdefault((k["family"], arch), []).append((k, cubins))
    return out, problems


def compare_dirs(a, b, workers: Optional[int] = None) -> dict:
    """Whether the kernels of two builds ``a`` and ``b`` (prebuilt directories or exported objects) have the same
    SASS. Kernels are matched by family, arch and the params that every kernel of that family names in both builds:
    a codegen field one build added (e.g. at its default) is left out of the match, so a change can be checked to
    leave the kernels it does not mean to change instruction for instruction as they were (kernel symbols, which
    carry the spec's hash, are masked). Returns ``{"identical", "different", "only_a", "only_b", "ambiguous",
    "problems"}``: lists of ``a``'s kernel names (``only_b``: ``b``'s); ``ambiguous``: kernels of either build that
    share their match key with another kernel of the same build (they differ only in a field left out)."""
    tool = find_nvdisasm()
    (ka, pa), (kb, pb) = _by_family(Path(a)), _by_family(Path(b))
    res = {"identical": [], "different": [], "only_a": [], "only_b": [], "ambiguous": [], "problems": pa + pb}
    pairs = []
    for fa in sorted(set(ka) | set(kb)):
        side_a, side_b = ka.get(fa, []), kb.get(fa, [])
        common = None
        for k, _ in side_a + side_b:
            keys = set((k.get("params") or {}))
            common = keys if common is None else common & keys

        def index(side):
            out = {}
            for k, cubins in side:
                key = json.dumps({p: v for p, v in (k.get("params") or {}).items() if p in common}, sort_keys=True)
                if key in out:
                    res["ambiguous"] += [out[key][0]["name"], k["name"]]
                out[key] = (k, cubins)
            return out

        ia, ib = index(side_a), index(side_b)
        res["only_a"] += [ia[x][0]["name"] for x in ia if x not in ib]
        res["only_b"] += [ib[x][0]["name"] for x in ib if x not in ia]
        pairs += [(ia[x], ib[x]) for x in ia if x in ib]

    def same(pair):
        (k, ca), (_, cb) = pair
        ta = [_instructions(disassemble(c.data, tool)) for c in ca]
        tb = [_instructions(disassemble(c.data, tool)) for c in cb]
        return k["name"], ta == tb and all(ta)

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as ex:
        for name, ok in ex.map(same, pairs):
            res["identical" if ok else "different"].append(name)
    return res


def _print_compare(a, b, workers) -> int:
    rep = compare_dirs(a, b, workers)
    for what in ("different", "ambiguous", "only_a", "only_b", "problems"):
        for x in rep[what]:
            print(f"sass: {what} {x}")
    bad = rep["different"] or rep["ambiguous"] or rep["problems"]
    print(f"sass: {'SAME' if not bad else 'DIFFERENT'}: {len(rep['identical'])} identical, {len(rep['different'])} "
          f"different, {len(rep['ambiguous'])} ambiguous; {len(rep['only_a'])} only in {a}, {len(rep['only_b'])} only "
          f"in {b}")
    return 1 if bad else 0


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m w4a16_moe.loader.sass", description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="prebuilt directory (manifest.json) or directory of exported objects")
    ap.add_argument("--json", action="store_true", help="print the full report as JSON")
    ap.add_argument("-j", "--jobs", type=int, default=None)
    ap.add_argument("--allow-local", default="", help="comma-separated families whose local-memory use is only "
                    "a warning (default: none, local memory fails the check)")
    ap.add_argument("--kernels", action="store_true", help="also one line per kernel: registers, the reported "
                    "opcodes, a serialized WGMMA pipeline")
    ap.add_argument("--compare", metavar="OTHER", help="instead of the checks: whether the kernels of DIR and OTHER "
                    "that match by family, arch and the params both builds name have the same SASS")
    a = ap.parse_args(argv)
    try:
        if a.compare:
            return _print_compare(a.dir, a.compare, a.jobs)
        rep = check_dir(a.dir, a.jobs, tuple(f for f in a.allow_local.split(",") if f))
    except (SassToolError, FileNotFoundError, ValueError) as e:
        print(f"sass: {e}", file=sys.stderr)
        return 2
    if a.json:
        json.dump(rep, sys.stdout, indent=1)
        print()
    else:
        fams = Counter((k["family"], k["arch"]) for k in rep["kernels"])
        for (fam, arch), n in sorted(fams.items()):
            ks = [k for k in rep["kernels"] if (k["family"], k["arch"]) == (fam, arch)]
            tot = Counter()
            for k in ks:
                tot.update(k["opcodes"])
            exp = ks[0]["expect"]
            nb = sum(1 for k in ks if k["local_budget"])
            ns = sum(1 for k in ks if k["wgmma_serialized"])
            regs = [k["registers"] for k in ks if k["registers"] is not None]
            print(f"sass: {arch} {fam}: {n} kernel(s), expect {exp if exp is not None else 'nothing declared'}; "
                  f"totals {dict(tot) or '{}'}" + (f"; registers {min(regs)}-{max(regs)}" if regs else "")
                  + (f"; {nb} with a local-memory budget" if nb else "")
                  + (f"; {ns} with a serialized WGMMA pipeline" if ns else ""))
        if a.kernels:
            for k in sorted(rep["kernels"], key=lambda k: (k["arch"], k["family"], k["name"])):
                print(f"sass: {k['arch']} {k['name']}: registers {k['registers']}, {k['opcodes'] or '{}'}"
                      + (", WGMMA serialized" if k["wgmma_serialized"] else ""))
        for w in rep["warnings"]:
            print(f"sass: warning {w}")
        for p in rep["problems"]:
            print(f"sass: PROBLEM {p}")
        print(f"sass: {'OK' if rep['ok'] else 'FAILED'}: {len(rep['kernels'])} kernel(s) in {rep['dir']} "
              f"(nvdisasm {rep['nvdisasm']})")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The SASS check's local-memory rules on the CPU, without the DSL or ``nvdisasm`` (:mod:`w4a16_moe.loader.sass`):

* the per-kernel local-memory budgets the families declare (``sass_local_budget``): their format, which kernels
  a rule matches, the bounds (within: a warning; one instruction over: a problem);
* :func:`check_dir` over a prebuilt directory (the manifest's rules) and over exported objects (the registry's),
  with canned disassembly: the budgets, ``sass_allow_local`` and ``--allow-local``, the report.

The real kernels are checked by tests/test_aot.py (the smoke build) and tests/test_wheel.py (the installed wheel).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from collections import Counter
from pathlib import Path

import pytest

from w4a16_moe.loader import sass

SM90 = "sm90_w4a16_gemm"
DECODE = "w4a16_decode_gemv"
#: the kernels with a budget (docs/perf/2026-12-04-local-memory): INT4 g32 zero-point ping-pong down GEMMs,
#: NVFP4 16-warp unroll-4 decode gate/up
PP_DOWN = {"mode": "down", "pingpong": 2, "zero_point": True, "group": 32, "k_tile": 128, "b_slots": 2}
NVFP4_UP = {"mode": "gate_up", "fp4": True, "group": 16, "warps": 16, "unroll": 4}
BUDGETS = {SM90: (PP_DOWN, 2, 1), DECODE: (NVFP4_UP, 5, 2)}


def _rule(family: str) -> dict:
    (r,) = sass.default_local_budget()[family]
    return r


# ------------------------------------------------------------------------------------------------------
# the declared budgets
# ------------------------------------------------------------------------------------------------------
def test_registered_budgets():
    from w4a16_moe import aot
    from w4a16_moe.kernels.cute import registry

    budgets = sass.default_local_budget()
    assert set(budgets) == {f.spec_family for f in registry.families()}
    for fam, (params, ldl, stl) in BUDGETS.items():
        r = _rule(fam)
        assert (r["archs"], r["params"], r["LDL"], r["STL"]) == (["sm_90a"], params, ldl, stl)
        assert "docs/perf/2026-12-04-local-memory" in r["why"] and "\n" not in r["why"]
    assert all(not rules for fam, rules in budgets.items() if fam not in BUDGETS)  # warp, routing
    # every rule names fields of its family's config and matches kernels of the full subset of its archs
    full = {}
    for f in registry.families():
        fields = {x.name for x in dataclasses.fields(f.config_type())}
        for r in budgets[f.spec_family]:
            assert set(r["params"]) <= fields, (f.name, set(r["params"]) - fields)
            for arch in r["archs"]:
                specs = full.setdefault(arch, aot.subset_specs("full", arch))
                assert any(s.family == f.spec_family and sass.find_budget([r], arch, s.params_dict) for s in specs)


@pytest.mark.parametrize("fam", sorted(BUDGETS))
def test_find_budget_matches_exact_params_and_arch(fam):
    rule = _rule(fam)
    params = {**BUDGETS[fam][0], "dtype": "fp16", "activation": "geglu"}  # other params: any value
    assert sass.find_budget([rule], "sm_90a", params) is rule
    assert sass.find_budget([rule], "sm_100a", params) is None
    for key, value in BUDGETS[fam][0].items():
        other = not value if isinstance(value, bool) else value * 2
        assert sass.find_budget([rule], "sm_90a", {**params, key: other}) is None, key
        assert sass.find_budget([rule], "sm_90a", {k: v for k, v in params.items() if k != key}) is None, key
    # exact: the bool True is not the int 1 (nor the reverse)
    ones = sass.budget_rules([{**rule, "params": {"zero_point": True, "pingpong": 1}}])
    assert sass.find_budget(ones, "sm_90a", {"zero_point": True, "pingpong": 1})
    assert not sass.find_budget(ones, "sm_90a", {"zero_point": 1, "pingpong": 1})
    assert not sass.find_budget(ones, "sm_90a", {"zero_point": True, "pingpong": True})
    # the first matching rule
    wide = {**rule, "params": dict(list(rule["params"].items())[:1]), "LDL": 99}
    assert sass.find_budget(sass.budget_rules([rule, wide]), "sm_90a", params)["LDL"] == rule["LDL"]
    assert sass.find_budget(sass.budget_rules([wide, rule]), "sm_90a", params)["LDL"] == 99


BUDGET = {"archs": ["sm_90a"], "params": {"k_tile": 128}, "LDL": 2, "STL": 1, "why": "measured faster"}


@pytest.mark.parametrize("ops, allow, budget, n_problems, n_warnings, text", [
    ({"HGMMA": 4}, False, None, 0, 0, None),
    ({"HGMMA": 4}, False, BUDGET, 0, 0, None),
    ({"LDL": 1}, False, None, 1, 0, "1 LDL instruction(s): local memory (spills or stack arrays)"),
    ({"LDL": 2, "STL": 1}, False, BUDGET, 0, 1,
     "2 LDL, 1 STL: local memory within the kernel's budget (LDL <= 2, STL <= 1: measured faster)"),
    ({"STL": 1}, False, BUDGET, 0, 1, "0 LDL, 1 STL: local memory within the kernel's budget"),
    ({"LDL": 3, "STL": 1}, False, BUDGET, 1, 0,
     "3 LDL instruction(s): local memory over the kernel's budget (LDL <= 2, STL <= 1)"),
    ({"LDL": 2, "STL": 2}, False, BUDGET, 1, 0, "2 STL instruction(s): local memory over the kernel's budget"),
    ({"LDL": 3, "STL": 2}, False, BUDGET, 2, 0, "over the kernel's budget"),
    ({"LDL": 30, "STL": 20}, True, BUDGET, 0, 2, ", accepted for this family and arch"),
    ({"LDL": 3}, True, None, 0, 1, "3 LDL instruction(s): local memory (spills or stack arrays), accepted for"),
])
def test_check_local_bounds(ops, allow, budget, n_problems, n_warnings, text):
    probs, warns = sass.check_local(Counter(ops), allow, budget)
    assert (len(probs), len(warns)) == (n_problems, n_warnings), (probs, warns)
    if text:
        assert all(text in x for x in probs + warns), (probs, warns)
    # check_opcodes: the expected instructions plus the same local-memory problems
    assert sass.check_opcodes(Counter(ops), ("HGMMA",), allow, budget) == (
        [] if ops.get("HGMMA") else ["no HGMMA instruction (its family must use HGMMA)"]) + probs


@pytest.mark.parametrize("bad, why", [
    ({"archs": ["sm_90a"], "params": {"k_tile": 128}, "LDL": 1, "STL": 1}, "exactly archs, params, LDL, STL, why"),
    ({**BUDGET, "ldl": 1}, "exactly archs, params, LDL, STL, why"),
    ({**BUDGET, "archs": "sm_90a"}, "archs must be a non-empty list"),
    ({**BUDGET, "archs": []}, "archs must be a non-empty list"),
    ({**BUDGET, "params": {}}, "params must be a non-empty dict"),
    ({**BUDGET, "LDL": -1}, "LDL must be an instruction count >= 0"),
    ({**BUDGET, "STL": 1.5}, "STL must be an instruction count >= 0"),
    ({**BUDGET, "STL": True}, "STL must be an instruction count >= 0"),
    ({**BUDGET, "why": " "}, "why must say why"),
])
def test_budget_rules_are_validated(bad, why):
    with pytest.raises(ValueError, match=f"local-memory budget rule 1: .*{re.escape(why)}"):
        sass.budget_rules([BUDGET, bad])
    assert sass.budget_rules([{**BUDGET, "archs": ("sm_90a",)}]) == (BUDGET,)  # JSON form: lists
    assert sass.budget_rules(()) == ()


# ------------------------------------------------------------------------------------------------------
# check_dir with canned disassembly
# ------------------------------------------------------------------------------------------------------
def _kernels() -> list:
    """``(name, family, params, opcodes, outcome)``: ``warn`` (local memory within its budget), ``fail``."""
    sm90_other = {**PP_DOWN, "k_tile": 64, "b_slots": 4}
    return [
        ("pp_down_2_1", SM90, {**PP_DOWN, "dtype": "bf16"}, {"HGMMA": 48, "LDL": 2, "STL": 1}, "warn"),
        ("pp_down_1_1", SM90, {**PP_DOWN, "dtype": "fp16"}, {"HGMMA": 64, "LDL": 1, "STL": 1}, "warn"),
        ("pp_down_3_1", SM90, {**PP_DOWN, "dtype": "bf16", "epilogue": "y"}, {"HGMMA": 48, "LDL": 3, "STL": 1}, "fail"),
        ("pp_down_2_2", SM90, {**PP_DOWN, "dtype": "bf16", "epilogue": "a"}, {"HGMMA": 48, "LDL": 2, "STL": 2}, "fail"),
        ("bk64_spills", SM90, sm90_other, {"HGMMA": 48, "LDL": 1}, "fail"),
        ("bk64_clean", SM90, sm90_other, {"HGMMA": 48}, "ok"),
        ("nvfp4_up_5_2", DECODE, NVFP4_UP, {"HMMA": 32, "LDL": 5, "STL": 2}, "warn"),
        ("nvfp4_up_6_2", DECODE, {**NVFP4_UP, "dtype": "fp16"}, {"HMMA": 32, "LDL": 6, "STL": 2}, "fail"),
        ("nvfp4_u2_spills", DECODE, {**NVFP4_UP, "unroll": 2}, {"HMMA": 32, "STL": 1}, "fail"),
    ]


def _listing(ops: dict) -> str:
    """A canned disassembly with the given opcode counts."""
    return "".join(f"        /*{i * 16:04x}*/                   {op}.X R0, R1 ;\n"
                   for i, op in enumerate(Counter(ops).elements()))


def _fake_tree(monkeypatch):
    """``check_dir`` without nvdisasm: ``write(d, layout, kernels, families=None)`` writes ``kernels`` (``(name,
    family, params, [disassembly of each cubin])``) as exported objects or as a prebuilt directory (``families``: the
    manifest's table, default what the AOT build records); a "library" holds one line ``cubin <name> <i>`` per
    cubin, whose disassembly is the given text."""
    texts = {}

    def extract(data: bytes) -> list:
        return [sass.Cubin(i, line, 90) for i, line in enumerate(data.splitlines()) if line.startswith(b"cubin ")]

    monkeypatch.setattr(sass, "find_nvdisasm", lambda: Path("/fake/nvdisasm"))
    monkeypatch.setattr(sass, "extract_cubins", extract)
    monkeypatch.setattr(sass, "disassemble", lambda data, tool=None: texts[data])
    monkeypatch.setattr(sass, "register_counts", lambda data: [])  # (no ELF images here)

    def write(d: Path, layout: str, kernels: list, families: dict = None) -> Path:
        d.mkdir()
        recs, libs = [], []
        for name, fam, params, cubins in kernels:
            datas = [f"cubin {name} {i}".encode() for i in range(len(cubins))]
            texts.update(zip(datas, cubins))
            libs.append(b"".join(x + b"\n" for x in datas))
            recs.append({"name": name, "family": fam, "params": params,
                         "cubins": [{"sha256": hashlib.sha256(x).hexdigest(), "size": len(x), "sm": 90} for x in datas]})
        if layout == "objects":
            for r, lib in zip(recs, libs):
                (d / f"{r['name']}.o").write_bytes(lib)
                side = {"arch": "sm_90a", "spec": {k: r[k] for k in ("name", "family", "params")}, "cubins": r["cubins"]}
                (d / f"{r['name']}.json").write_text(json.dumps(side))
            return d
        (d / "sm_90a").mkdir()
        (d / "sm_90a" / "kernels.so").write_bytes(b"".join(libs))
        (d / "sm_90a" / "meta.json").write_text(json.dumps({"arch": "sm_90a", "kernels": recs}))
        (d / "manifest.json").write_text(json.dumps({
            "families": _recorded_families() if families is None else families,
            "libraries": [{"file": "sm_90a/kernels.so", "meta": "sm_90a/meta.json"}]}))
        return d

    return write


@pytest.fixture
def fake_sass(monkeypatch):
    """The kernels of :func:`_kernels`, each one cubin whose disassembly is its canned opcodes (:func:`_fake_tree`):
    ``write(d, layout, families=None)``."""
    write = _fake_tree(monkeypatch)
    kernels = [(name, fam, params, [_listing(ops)]) for name, fam, params, ops, _ in _kernels()]
    return lambda d, layout, families=None: write(d, layout, kernels, families)


def _recorded_families() -> dict:
    """The manifest's ``families`` table as the AOT build writes it (``aot.manifest_extra``)."""
    from w4a16_moe import aot

    plans, fams, absent = aot.plan_archs(["sm_90a"], "smoke")
    return json.loads(json.dumps(aot.manifest_extra(plans, fams, absent, "smoke", "g++")["families"]))


def _outcomes(rep: dict) -> dict:
    return {k["name"]: "fail" if k["problems"] else "warn" if k["warnings"] else "ok" for k in rep["kernels"]}


@pytest.mark.parametrize("layout", ["manifest", "objects"])
def test_check_dir_bounds_local_memory_per_kernel(fake_sass, tmp_path, layout):
    """The manifest's rules (a prebuilt directory) or the registry's (exported objects): a kernel within its
    budget passes with a warning, one instruction over fails, local memory without a matching rule fails."""
    rep = sass.check_dir(fake_sass(tmp_path / "d", layout), workers=2)
    assert _outcomes(rep) == {name: want for name, _, _, _, want in _kernels()}
    assert not rep["ok"] and len(rep["problems"]) == 5 and len(rep["warnings"]) == 3
    by = {k["name"]: k for k in rep["kernels"]}
    assert by["pp_down_2_1"]["local_budget"] == _rule(SM90) and by["nvfp4_up_6_2"]["local_budget"] == _rule(DECODE)
    assert by["bk64_spills"]["local_budget"] is None and by["nvfp4_u2_spills"]["local_budget"] is None
    assert by["pp_down_2_1"]["opcodes"] == {"HGMMA": 48, "LDL": 2, "STL": 1}
    assert any(w.startswith("pp_down_2_1 (sm_90a): 2 LDL, 1 STL: local memory within the kernel's budget (LDL <= 2, "
                            "STL <= 1: INT4 g32 zero-point") for w in rep["warnings"])
    assert "pp_down_3_1 (sm_90a): 3 LDL instruction(s): local memory over the kernel's budget (LDL <= 2, STL <= 1)" \
        in rep["problems"]
    assert "nvfp4_up_6_2 (sm_90a): 6 LDL instruction(s): local memory over the kernel's budget (LDL <= 5, STL <= 2)" \
        in rep["problems"]
    assert "bk64_spills (sm_90a): 1 LDL instruction(s): local memory (spills or stack arrays)" in rep["problems"]


def test_check_dir_manifest_rules_win(fake_sass, tmp_path):
    """An installed wheel's check reads only its manifest: the rules recorded there, not the registry's; a
    manifest written before the budgets (no ``sass_local_budget``): the registry's."""
    fams = _recorded_families()
    assert fams[SM90]["sass_local_budget"] == [_rule(SM90)] and fams[DECODE]["sass_local_budget"] == [_rule(DECODE)]
    tight = {**fams, SM90: {**fams[SM90], "sass_local_budget": [{**_rule(SM90), "LDL": 1}]},
             DECODE: {**fams[DECODE], "sass_local_budget": []}}
    got = _outcomes(sass.check_dir(fake_sass(tmp_path / "tight", "manifest", tight)))
    assert [n for n, o in got.items() if o == "warn"] == ["pp_down_1_1"]
    assert got["pp_down_2_1"] == got["nvfp4_up_5_2"] == "fail"
    old = {f: {k: v for k, v in info.items() if k != "sass_local_budget"} for f, info in fams.items()}
    got = _outcomes(sass.check_dir(fake_sass(tmp_path / "old", "manifest", old)))
    assert got == {name: want for name, _, _, _, want in _kernels()}


def test_check_dir_allow_local_still_accepts_any_amount(fake_sass, tmp_path):
    fams = _recorded_families()
    allow = {**fams, SM90: {**fams[SM90], "sass_allow_local": ["sm_90a"]}}
    for rep in (sass.check_dir(fake_sass(tmp_path / "m", "manifest", allow)),
                sass.check_dir(fake_sass(tmp_path / "o", "objects"), allow_local=(SM90,))):
        got = _outcomes(rep)
        assert all(got[n] == "warn" for n, fam, _, ops, _ in _kernels() if fam == SM90 and ops.get("LDL"))
        assert sorted(n for n, o in got.items() if o == "fail") == ["nvfp4_u2_spills", "nvfp4_up_6_2"]
        assert any(w.startswith("bk64_spills (sm_90a): 1 LDL") and w.endswith(", accepted for this family and arch")
                   for w in rep["warnings"])


def test_main_reports_budgets(fake_sass, tmp_path, capsys):
    d = fake_sass(tmp_path / "d", "manifest")
    assert sass.main([str(d)]) == 1
    out = capsys.readouterr().out
    assert "sass: sm_90a sm90_w4a16_gemm: 6 kernel(s), expect ['HGMMA']; totals {'HGMMA': 304, 'LDL': 9, " \
           "'STL': 5}; 4 with a local-memory budget" in out
    assert "sass: sm_90a w4a16_decode_gemv: 3 kernel(s)" in out and "; 2 with a local-memory budget" in out
    assert "sass: warning nvfp4_up_5_2 (sm_90a): 5 LDL, 2 STL: local memory within the kernel's budget (LDL <= 5, " \
           "STL <= 2: NVFP4" in out
    assert "sass: PROBLEM nvfp4_up_6_2 (sm_90a): 6 LDL instruction(s): local memory over the kernel's budget" in out
    assert "sass: FAILED: 9 kernel(s)" in out and "registers" not in out  # (no register counts in fake cubins)
    assert sass.main([str(d), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert {k["name"]: (k["local_budget"] or {}).get("LDL") for k in rep["kernels"]}["nvfp4_up_5_2"] == 5
    assert sass.main([str(d), "--allow-local", f"{SM90},{DECODE}"]) == 0
    assert "sass: OK: 9 kernel(s)" in capsys.readouterr().out
    # a malformed rule in the manifest is an error of the check, not a crash
    fams = _recorded_families()
    bad = fake_sass(tmp_path / "bad", "manifest", {**fams, SM90: {**fams[SM90], "sass_local_budget": [{"LDL": 1}]}})
    assert sass.main([str(bad)]) == 2
    assert "local-memory budget rule 0" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------
# serialized WGMMA pipelines (docs/perf/2026-12-04-wgmma-serial)
# ------------------------------------------------------------------------------------------------------
def _sass(*groups, waits0: int = 1, waits1: int = 0) -> str:
    """Canned SASS: HGMMA groups of the given sizes (the last HGMMA of each closes the group: ``gsb0``), each
    group then ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (``waits1`` of them) or ``0x0`` (``waits0``), in nvdisasm's form."""
    lines, pc = [], 0

    def emit(text):
        nonlocal pc
        lines.append(f"        /*{pc:04x}*/                   {text} ;")
        pc += 16

    emit("WARPGROUP.ARRIVE")
    for n in groups:
        for i in range(n):
            emit(f"HGMMA.64x80x16.F32.BF16 R64, R{124 + 4 * i}, gdesc[UR12], R64" + (", gsb0" if i == n - 1 else ""))
    for _ in range(waits1):
        emit("WARPGROUP.DEPBAR.LE gsb0, 0x1")
    for _ in range(waits0):
        emit("WARPGROUP.DEPBAR.LE gsb0, 0x0")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, serialized", [
    (_sass(1, 1, 1, 1, waits0=4), True),  # what ptxas emits when it serializes: every HGMMA waited to zero
    (_sass(*[1] * 32, waits0=32), True),  # the shipped TN 112 tiles: 32 HGMMA, 32 gsb0, 32 waits
    (_sass(1, 1, 1, 1, waits0=5), True),
    (_sass(4, 4, waits0=1, waits1=1), False),  # the overlap schedule: groups of 4, one wait for the last tile
    (_sass(2, 2, 2, 2, waits0=4), False),  # a wait per group, but groups of 2 HGMMA
    (_sass(1, 1, 1, 1, waits0=1, waits1=3), False),  # single-HGMMA groups still overlapped
    (_sass(1, 1, 1, 1, waits0=3), False),  # one group left in flight
    (_sass(16, waits0=1), False),  # the serial schedule: one group and one wait per tile, by design
    (_sass(1, waits0=1), False),  # a single HGMMA has nothing to overlap
    (_sass(waits0=0), False),
])
def test_wgmma_serialized(text, serialized):
    why = sass.wgmma_serialized(text)
    assert (why is not None) == serialized, why
    if serialized:
        n = text.count("HGMMA")
        assert why.startswith(f"WGMMA pipeline serialized by ptxas: {n} HGMMA, each its own commit group, ")


def test_check_serial():
    rule = {"archs": ["sm_90a"], "params": {"tokens_per_tile": 8}, "why": "timed as built"}
    assert sass.check_serial(None, rule) == ([], []) and sass.check_serial(None) == ([], [])
    assert sass.check_serial("serialized") == (["serialized"], [])
    assert sass.check_serial("serialized", rule) == ([], ["serialized, accepted (timed as built)"])


SERIAL_RULE = {"archs": ["sm_90a"], "params": {"tokens_per_tile": 112}, "why": "timed as built"}


@pytest.mark.parametrize("bad, why", [
    ({"archs": ["sm_90a"], "params": {"k_tile": 128}}, "exactly archs, params, why"),
    ({**SERIAL_RULE, "LDL": 1}, "exactly archs, params, why"),
    ({**SERIAL_RULE, "archs": "sm_90a"}, "archs must be a non-empty list"),
    ({**SERIAL_RULE, "params": {}}, "params must be a non-empty dict"),
    ({**SERIAL_RULE, "why": ""}, "why must say why"),
])
def test_serial_rules_are_validated(bad, why):
    with pytest.raises(ValueError, match=f"serialized-WGMMA rule 1: .*{re.escape(why)}"):
        sass.serial_rules([SERIAL_RULE, bad])
    assert sass.serial_rules([{**SERIAL_RULE, "archs": ("sm_90a",)}]) == (SERIAL_RULE,)
    assert sass.serial_rules(()) == () and sass.serial_rules(None) == ()


def test_registered_serial_rules():
    """Only the WGMMA family declares rules: TN 8 at 4 CTAs per SM, TN 112 and TN 128 over two warpgroups of two
    m64 blocks without setmaxnreg, and TN 64 over four warpgroups at setmaxnreg 40 / 104 (no split of 640 threads'
    registers unserializes it), on sm_90a; each names config fields and matches built kernels (the full subset, the
    candidate tiles), and no rule of two or fewer consumer warpgroups matches a setmaxnreg build."""
    from w4a16_moe import aot
    from w4a16_moe.kernels.cute import registry

    rules = sass.default_serial_ok()
    assert set(rules) == {f.spec_family for f in registry.families()}
    assert all(not r for fam, r in rules.items() if fam != SM90)
    assert [(r["archs"], r["params"]) for r in rules[SM90]] == [
        (["sm_90a"], {"tokens_per_tile": 8, "min_ctas_per_sm": 4}),
        (["sm_90a"], {"tokens_per_tile": 112, "m64_per_block": 4, "consumer_wgs": 2, "setmaxnreg": False}),
        (["sm_90a"], {"tokens_per_tile": 128, "m64_per_block": 4, "consumer_wgs": 2, "setmaxnreg": False}),
        (["sm_90a"], {"tokens_per_tile": 64, "m64_per_block": 8, "consumer_wgs": 4, "setmaxnreg": True,
                      "producer_regs": 40, "consumer_regs": 104})]
    assert all(("docs/perf/2026-12-04-wgmma-serial" in r["why"] or "docs/perf/2026-12-05-four-consumer-wg" in r["why"])
               and "\n" not in r["why"] for r in rules[SM90])
    from w4a16_moe.formats.schemes import get_scheme
    from w4a16_moe.kernels.cute.sm90 import family as sm90

    fam = registry.get("sm90")
    fields = {x.name for x in dataclasses.fields(fam.config_type())}
    # the wheel's kernels and every candidate tile's (the tuner's, which GPU sessions build: scripts/device_specs.py)
    params = [s.params_dict for s in aot.subset_specs("full", "sm_90a") if s.family == SM90]
    params += [fam.spec_for(c).params_dict for t in sm90.CANDIDATES
               for c in fam.configs(get_scheme("int4_g128"), "bf16", "swiglu", True, "deterministic", dict(t))]
    for r in rules[SM90]:
        assert set(r["params"]) <= fields
        assert any(sass.find_budget([r], "sm_90a", p) for p in params), r["params"]
        if r["params"].get("consumer_wgs") != 4:
            assert not sass.find_budget([r], "sm_90a", {**r["params"], "setmaxnreg": True, "min_ctas_per_sm": 1})


@pytest.fixture
def fake_serial(monkeypatch):
    """Four SM90 kernels with canned disassembly (:func:`_fake_tree`): a serialized TN 112 kernel (a rule accepts
    it), a serialized TN 96 kernel (no rule), an overlapped TN 112 setmaxnreg kernel, and a kernel of two cubins of
    which one is serialized: ``write(d, layout, families=None)``."""
    write = _fake_tree(monkeypatch)
    serial, overlapped = _sass(*[1] * 8, waits0=8), _sass(4, 4, waits0=1, waits1=1)
    wide = {"m64_per_block": 4, "consumer_wgs": 2}
    kernels = [("t112", SM90, {"tokens_per_tile": 112, **wide, "setmaxnreg": False}, [serial]),
               ("t96", SM90, {"tokens_per_tile": 96, **wide, "setmaxnreg": False}, [serial]),
               ("t112_mr", SM90, {"tokens_per_tile": 112, **wide, "setmaxnreg": True},
                [overlapped + "        /*fff0*/                   USETMAXREG.TRYALLOC.CTAPOOL R0, 0xd8 ;\n"]),
               ("t96_two", SM90, {"tokens_per_tile": 96, **wide, "setmaxnreg": False}, [overlapped, serial])]
    return lambda d, layout, families=None: write(d, layout, kernels, families)


@pytest.mark.parametrize("layout", ["manifest", "objects"])
def test_check_dir_serialized_wgmma(fake_serial, tmp_path, layout):
    """A serialized pipeline is a problem unless a rule of the manifest (or, for exported objects, the registry)
    accepts the kernel; one serialized cubin of a kernel is enough."""
    rep = sass.check_dir(fake_serial(tmp_path / "d", layout), workers=2)
    assert _outcomes(rep) == {"t112": "warn", "t96": "fail", "t112_mr": "ok", "t96_two": "fail"}
    by = {k["name"]: k for k in rep["kernels"]}
    assert by["t112"]["serial_ok"] == sass.default_serial_ok()[SM90][1] and by["t96"]["serial_ok"] is None
    assert by["t112_mr"]["wgmma_serialized"] is None and by["t112_mr"]["serial_ok"] is None
    why = "WGMMA pipeline serialized by ptxas: 8 HGMMA, each its own commit group, 8 waits for zero pending groups"
    assert by["t96"]["wgmma_serialized"] == by["t96_two"]["wgmma_serialized"] == why
    assert rep["problems"] == [f"t96 (sm_90a): {why}", f"t96_two (sm_90a): {why}"]
    assert len(rep["warnings"]) == 1 and rep["warnings"][0].startswith(f"t112 (sm_90a): {why}, accepted (TN 112 over")


def test_check_dir_serial_rules_from_the_manifest(fake_serial, tmp_path, capsys):
    """The manifest's rules win (none: the TN 112 kernel fails too); a manifest written before the rules (no
    ``sass_serial_ok``) takes the registry's; a malformed rule is an error of the check."""
    fams = _recorded_families()
    assert fams[SM90]["sass_serial_ok"] == [dict(r) for r in sass.default_serial_ok()[SM90]]
    none = {**fams, SM90: {**fams[SM90], "sass_serial_ok": []}}
    got = _outcomes(sass.check_dir(fake_serial(tmp_path / "none", "manifest", none)))
    assert got == {"t112": "fail", "t96": "fail", "t112_mr": "ok", "t96_two": "fail"}
    old = {f: {k: v for k, v in info.items() if k != "sass_serial_ok"} for f, info in fams.items()}
    assert _outcomes(sass.check_dir(fake_serial(tmp_path / "old", "manifest", old)))["t112"] == "warn"
    d = fake_serial(tmp_path / "main", "manifest")
    assert sass.main([str(d)]) == 1
    out = capsys.readouterr().out
    assert "sass: sm_90a sm90_w4a16_gemm: 4 kernel(s), expect ['HGMMA']; totals {'HGMMA': 40, 'USETMAXREG': 1}; " \
           "3 with a serialized WGMMA pipeline" in out
    assert "sass: PROBLEM t96 (sm_90a): WGMMA pipeline serialized by ptxas" in out
    bad = fake_serial(tmp_path / "bad", "manifest", {**fams, SM90: {**fams[SM90], "sass_serial_ok": [{"why": "x"}]}})
    assert sass.main([str(bad)]) == 2
    assert "serialized-WGMMA rule 0" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ register counts
def _cuda_elf(sections: list) -> bytes:
    """A minimal 64-bit little-endian CUDA ELF image with ``sections`` (``(name, bytes)``) after a null section
    and ``.shstrtab``; no program headers."""
    names = [b".shstrtab"] + [n.encode() for n, _ in sections]
    strtab, offs = b"\0", []
    for n in names:
        offs.append(len(strtab))
        strtab += n + b"\0"
    bodies = [strtab] + [b for _, b in sections]
    data, pos, where = b"", 64, []
    for b in bodies:
        where.append(pos)
        data += b + b"\0" * (-len(b) % 8)
        pos += len(b) + (-len(b) % 8)
    shoff = pos
    shdrs = b"\0" * 64  # the null section
    for i, (b, off) in enumerate(zip(bodies, where)):
        sh_type = 3 if i == 0 else 0x70000000  # SHT_STRTAB, then CUDA info sections (SHT_LOPROC)
        shdrs += struct.pack("<IIQQQQIIQQ", offs[i], sh_type, 0, 0, off, len(b), 0, 0, 4, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41]) + b"\0" * 8
    head = ident + struct.pack("<HHIQQQIHHHHHH", 2, sass.EM_CUDA, 1, 0, 0, shoff, 0x5a05a, 64, 0, 0, 64,
                               len(bodies) + 1, 1)
    return head + data + shdrs


def _rec(fmt: int, attr: int, payload: bytes = b"", value: int = 0) -> bytes:
    return struct.pack("<BBH", fmt, attr, len(payload) if fmt == 4 else value) + payload


def test_register_counts_reads_the_nv_info_records():
    info = (_rec(1, 0x36) + _rec(3, 0x04, value=7) + _rec(4, 0x2F, struct.pack("<II", 5, 40))
            + _rec(4, 0x1C, struct.pack("<III", 1, 2, 3)) + _rec(4, 0x2F, struct.pack("<II", 6, 168)))
    per_kernel = _rec(4, 0x2F, struct.pack("<I", 77)) + _rec(3, 0x2F, value=96)
    decoy = _rec(4, 0x2F, struct.pack("<II", 1, 999))  # the same bytes outside an .nv.info section: not read
    img = _cuda_elf([(".nv.info", info), (".text.k", decoy), (".nv.info.k", per_kernel)])
    assert sass.extract_cubins(b"xx" + img + b"yy")[0].data == img
    assert sass.register_counts(img) == [40, 168, 77, 96]
    assert sass.register_counts(_cuda_elf([(".text.k", decoy)])) == []
    with pytest.raises(ValueError, match="not a 64-bit little-endian CUDA ELF"):
        sass.register_counts(b"\x7fELF" + b"\0" * 100)


def test_main_reports_registers(fake_sass, tmp_path, capsys, monkeypatch):
    d = fake_sass(tmp_path / "d", "manifest")
    monkeypatch.setattr(sass, "register_counts", lambda data: [40 + len(data) % 100])
    assert sass.main([str(d), "--kernels"]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if ": registers " in line]
    assert len(rows) == 9 and all(re.search(r": registers \d+, \{", r) for r in rows)
    assert re.search(r"sm90_w4a16_gemm: 6 kernel\(s\), .*; registers \d+-\d+;", out)
    assert sass.main([str(d)]) == 1 and ": registers " not in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------------
# compare_dirs with canned disassembly
# ------------------------------------------------------------------------------------------------------
def test_compare_dirs_matches_kernels_by_the_params_both_builds_name(monkeypatch, tmp_path, capsys):
    """Two builds of the same code compare equal whatever their kernel names (a symbol carries the spec's hash) and a
    field only one build names (a new codegen field); a kernel of another body is different; the rest is unmatched."""
    write = _fake_tree(monkeypatch)
    code = ("        /*0000*/                   HGMMA.64x96x16.F32.BF16 R24, gdesc[UR4], R24 ;\n"
            "        /*0010*/                   CALL.REL.NOINC `(kernel_cutlass_kernel_h1) ;\n")
    p = {"mode": "down", "tokens_per_tile": 96}
    a = write(tmp_path / "a", "manifest", [("a96", SM90, p, [code]),
                                          ("a80", SM90, {**p, "tokens_per_tile": 80}, [code]),
                                          ("a8", SM90, {**p, "tokens_per_tile": 8}, [code])])
    b = write(tmp_path / "b", "objects", [
        ("b96", SM90, {**p, "new": False}, [code.replace("_h1", "_h2")]),
        ("b80", SM90, {**p, "tokens_per_tile": 80, "new": False}, [code.replace("HGMMA", "HMMA")]),
        ("b16", SM90, {**p, "tokens_per_tile": 16, "new": False}, [code])])
    rep = sass.compare_dirs(a, b, workers=2)
    assert (rep["identical"], rep["different"], rep["only_a"], rep["only_b"]) == (["a96"], ["a80"], ["a8"], ["b16"])
    assert not rep["ambiguous"] and not rep["problems"]
    assert sass.main([str(a), "--compare", str(b)]) == 1
    assert "DIFFERENT: 1 identical, 1 different" in capsys.readouterr().out
    same = write(tmp_path / "same", "objects", [("s96", SM90, {**p, "new": False}, [code.replace("_h1", "_h3")])])
    assert sass.main([str(same), "--compare", str(a)]) == 0
    # a field left out of the match that tells two kernels of one build apart
    c = write(tmp_path / "c", "objects", [("c0", SM90, {**p, "new": False}, [code]),
                                         ("c1", SM90, {**p, "new": True}, [code])])
    assert sorted(sass.compare_dirs(a, c)["ambiguous"]) == ["c0", "c1"]
    assert sass.main([str(a), "--compare", str(c)]) == 1


def test_check_dir_warns_where_ptxas_dropped_setmaxnreg(monkeypatch, tmp_path):
    """A kernel built with ``setmaxnreg`` and two consumer warpgroups must show ``USETMAXREG``; where ptxas dropped
    it (candidate 79's down GEMMs, advisory C7508) the check warns and names it. One consumer warpgroup, or no
    ``setmaxnreg``: nothing to say."""
    write = _fake_tree(monkeypatch)
    mr = {"mode": "down", "setmaxnreg": True, "consumer_wgs": 2, "producer_regs": 72, "consumer_regs": 216}
    kernels = [("mr_kept", SM90, mr, [_listing({"HGMMA": 8, "USETMAXREG": 2})]),
               ("mr_dropped", SM90, mr, [_listing({"HGMMA": 8})]),
               ("one_wg", SM90, {**mr, "consumer_wgs": 1}, [_listing({"HGMMA": 8})]),
               ("no_mr", SM90, {**mr, "setmaxnreg": False}, [_listing({"HGMMA": 8})])]
    for layout in ("manifest", "objects"):
        rep = sass.check_dir(write(tmp_path / layout, layout, kernels))
        assert rep["ok"] and _outcomes(rep) == {"mr_kept": "ok", "mr_dropped": "warn", "one_wg": "ok", "no_mr": "ok"}
        assert rep["warnings"] == ["mr_dropped (sm_90a): setmaxnreg requested, but the SASS has no USETMAXREG (ptxas "
                                   "dropped it): every warp runs on the launch register count"]
        by = {k["name"]: k for k in rep["kernels"]}
        assert by["mr_kept"]["opcodes"] == {"HGMMA": 8, "USETMAXREG": 2}
    assert sass.check_setmaxnreg(Counter({"HGMMA": 1}), {"setmaxnreg": True}) == []  # (one consumer warpgroup)

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


@pytest.fixture
def fake_sass(monkeypatch):
    """``check_dir`` without nvdisasm: a "library" holds one line ``cubin <name>`` per kernel, each line a cubin
    whose disassembly is the kernel's canned opcodes."""
    listing = {}

    def extract(data: bytes) -> list:
        return [sass.Cubin(i, line, 90) for i, line in enumerate(data.splitlines()) if line.startswith(b"cubin ")]

    def disassemble(data: bytes, tool=None) -> str:
        return "".join(f"        /*{i * 16:04x}*/                   {op}.X R0, R1 ;\n"
                       for i, op in enumerate(listing[data].elements()))

    monkeypatch.setattr(sass, "find_nvdisasm", lambda: Path("/fake/nvdisasm"))
    monkeypatch.setattr(sass, "extract_cubins", extract)
    monkeypatch.setattr(sass, "disassemble", disassemble)

    def write(d: Path, layout: str, families: dict = None) -> Path:
        """The kernels of :func:`_kernels` as exported objects or as a prebuilt directory (``families``:
        the manifest's table, default what the AOT build records)."""
        recs = []
        for name, fam, params, ops, _ in _kernels():
            data = f"cubin {name}".encode()
            listing[data] = Counter(ops)
            recs.append({"name": name, "family": fam, "params": params,
                         "cubins": [{"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "sm": 90}]})
        d.mkdir()
        if layout == "objects":
            for r in recs:
                (d / f"{r['name']}.o").write_bytes(f"cubin {r['name']}\n".encode())
                spec = {k: r[k] for k in ("name", "family", "params")}
                side = {"arch": "sm_90a", "spec": spec, "cubins": r["cubins"]}
                (d / f"{r['name']}.json").write_text(json.dumps(side))
            return d
        if families is None:
            families = _recorded_families()
        (d / "sm_90a").mkdir()
        (d / "sm_90a" / "kernels.so").write_bytes(b"".join(f"cubin {r['name']}\n".encode() for r in recs))
        (d / "sm_90a" / "meta.json").write_text(json.dumps({"arch": "sm_90a", "kernels": recs}))
        (d / "manifest.json").write_text(json.dumps({
            "families": families, "libraries": [{"file": "sm_90a/kernels.so", "meta": "sm_90a/meta.json"}]}))
        return d

    return write


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
    assert "sass: FAILED: 9 kernel(s)" in out
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

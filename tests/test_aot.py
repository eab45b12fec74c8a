"""The AOT step on the CPU: per-arch, family-aware planning (no compiler needed), and a real smoke build for
sm_90a + sm_100a (cross-compile, link, manifest, prebuilt lookup of every spec, libc-only, SASS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from w4a16_moe import aot

ROOT = Path(__file__).resolve().parents[1]
SM90 = "w4a16_moe.kernels.cute.sm90.family"
WARP = "w4a16_moe.kernels.cute.warp.family"


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _aot(*args, timeout=1500, **env):
    return subprocess.run([sys.executable, "-m", "w4a16_moe", "aot", *args], capture_output=True, text=True,
                          env=_env(**env), timeout=timeout)


# ------------------------------------------------------------------------------------------------------
# planning (enumeration only)
# ------------------------------------------------------------------------------------------------------
def test_archs_are_validated():
    assert aot.parse_archs("sm_90a;sm_100a") == ["sm_90a", "sm_100a"]
    assert aot.parse_archs("sm_80, sm_89,sm_90a,sm_100a,sm_120a,sm_90a") == ["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"]
    for bad in ("sm_75", "sm_90", "", "sm_100"):
        with pytest.raises(ValueError, match="--archs"):
            aot.parse_archs(bad)
    with pytest.raises(ValueError, match="--subset"):
        aot.plan_archs(["sm_90a"], "tiny")


def test_plan_is_per_arch_and_family_aware():
    plans, fams, absent = aot.plan_archs(["sm_90a", "sm_100a", "sm_80"], "smoke")
    by = {p.arch: p for p in plans}
    names = {f.name: f for f in fams}
    assert names["sm90_w4a16_gemm"].archs == ("sm_90a",) and names["sm90_w4a16_gemm"].sass_expect == ("HGMMA",)
    # the SM90 WGMMA family builds sm_90a only: all of its smoke subset, nowhere else
    assert by["sm_90a"].per_family["sm90_w4a16_gemm"] == len(names["sm90_w4a16_gemm"].variants("smoke")) > 0
    assert "sm90_w4a16_gemm" not in by["sm_100a"].per_family and "sm90_w4a16_gemm" not in by["sm_80"].per_family
    for p in plans:
        assert len({s.name for s in p.specs}) == len(p.specs)
        assert sum(p.per_family.values()) == len(p.specs)
    if "warp_w4a16_gemm" in names:  # the portable family, once its module is in the package
        warp = names["warp_w4a16_gemm"]
        assert warp.sass_expect == ("HMMA",)
        for arch in ("sm_90a", "sm_100a", "sm_80"):
            assert by[arch].per_family["warp_w4a16_gemm"] > 0
        assert {s.name for s in by["sm_100a"].specs} <= {s.name for s in by["sm_90a"].specs}
    else:
        assert WARP in absent
        assert not by["sm_100a"].specs and "not in this version" in by["sm_100a"].reason


@pytest.mark.parametrize("arch,cases", [("sm_90a", 500), ("sm_100a", 150), ("sm_80", 150)])
def test_every_plan_of_any_layer_is_in_the_full_subset(arch, cases):
    """A wheel built with the ``full`` subset runs any layer without a JIT compile: the kernels of the plan of
    random layers (experts, sizes incl. padded ones, top-k, token counts, schemes, dtypes, activations, finalize
    modes, expert-parallel hints) on ``arch`` are all among the subset's specs."""
    import random

    import torch

    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.formats.schemes import get_scheme
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.validate import MoECall, check_global_experts

    full = {s.name for s in aot.subset_specs("full", arch)}
    num = int(arch[3:].rstrip("a"))
    info = DeviceInfo("cuda", f"a {arch} GPU", divmod(num, 10))
    rng = random.Random(17 + num)
    schemes = ["int4_g32", "int4_g32_zp", "int4_g64", "int4_g64_zp", "int4_g128", "int4_g128_zp", "int4_channel",
               "nvfp4", "mxfp4"]
    planned, missing = 0, []
    for _ in range(cases):
        e = rng.choice([4, 8, 16, 20, 32, 60, 64, 128, 160, 256, 384, 512])
        call = MoECall(
            tokens=rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 96, 128, 256, 384, 1000, 1024, 2048, 4096, 8192]),
            top_k=min(e, rng.choice([1, 2, 4, 6, 8, 10])), experts=e,
            hidden=rng.choice([1024, 2048, 2880, 3072, 3584, 4096, 5120, 6144, 7168, 8192]),
            intermediate=rng.choice([128, 256, 384, 512, 768, 1024, 1408, 1536, 2048, 2560, 2880, 4096, 6400, 14336]),
            dtype=rng.choice([torch.bfloat16, torch.float16]), device=torch.device("cpu"),
            activation=get_activation(rng.choice(["swiglu", "swiglu", "geglu", "relu2", "silu"])),
            finalize=rng.choice(["deterministic", "fused"]), expert_offset=0, scheme=get_scheme(rng.choice(schemes)).name,
            global_experts=check_global_experts(e * rng.choice([2, 8]) if rng.random() < 0.3 else None, e),
        )
        if provider.unavailable_reason(call, info):  # e.g. H = 2880 with group 128: not a checkpoint's shape
            continue
        plan = provider.plan(call, info)
        planned += 1
        missing += [(call, name) for name in plan.specs if name not in full]
    assert planned > cases // 2
    assert not missing, missing[:3]


def test_arch_without_kernels_is_reported_not_built(tmp_path):
    # only the SM90 family: sm_100a has no kernels
    r = _aot("--archs", "sm_90a,sm_100a", "--subset", "smoke", "--families", SM90, "--list", timeout=300)
    assert r.returncode == 0, r.stderr
    n = len(aot.load_families([SM90])[0][0].variants("smoke"))
    assert f"aot: sm_90a: {n} kernels ({n} sm90_w4a16_gemm)" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("sm_90a sm90_w4a16_gemm__")]) == n
    assert "aot: sm_100a: NO KERNELS, no library will be built for it: family sm90_w4a16_gemm builds only sm_90a" in r.stdout
    r = _aot("--archs", "sm_100a", "--subset", "smoke", "--families", SM90, "--out", str(tmp_path / "o"), timeout=300)
    assert r.returncode == 2 and "selects no kernels at all" in r.stderr
    assert not (tmp_path / "o").exists()
    r = _aot("--archs", "sm_75", "--out", str(tmp_path / "o"), timeout=300)
    assert r.returncode == 2 and "unknown arch sm_75" in r.stderr


def test_family_modules_absent_or_broken(tmp_path, monkeypatch):
    fams, absent = aot.load_families([SM90, "w4a16_moe.kernels.cute.no_such_family"])
    assert [f.name for f in fams] == ["sm90_w4a16_gemm"]
    assert absent == {"w4a16_moe.kernels.cute.no_such_family": "not in this version of the package"}
    (tmp_path / "half_family.py").write_text("FAMILY = 'half'\n")
    (tmp_path / "bad_import_family.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(aot.AotError, match="must define ARCHS, aot_variants"):
        aot.load_families(["half_family"])
    with pytest.raises(aot.AotError, match="bad_import_family failed to import"):
        aot.load_families(["bad_import_family"])
    # a family module's SASS-check rules (SASS_LOCAL_BUDGET, SASS_SERIAL_OK): checked, in the manifest's JSON form
    head = "FAMILY = 'b'\nARCHS = ('sm_90a',)\naot_variants = lambda subset: []\n"
    budget = {"archs": ("sm_90a",), "params": {"k_tile": 128}, "LDL": 1, "STL": 0, "why": "measured faster"}
    serial = {"archs": ("sm_90a",), "params": {"tokens_per_tile": 8}, "why": "timed as built"}
    for attr, rule, bad, err in (
            ("SASS_LOCAL_BUDGET", budget, dict(budget, LDL=-1), "local-memory budget rule 0: LDL must be"),
            ("SASS_SERIAL_OK", serial, dict(serial, why=""), "serialized-WGMMA rule 0: why must say why")):
        mod = attr.lower()
        (tmp_path / f"{mod}_family.py").write_text(head + f"{attr} = ({rule!r},)\n")
        (tmp_path / f"bad_{mod}_family.py").write_text(head + f"{attr} = ({bad!r},)\n")
        (fam,), _ = aot.load_families([f"{mod}_family"])
        assert getattr(fam, mod) == (dict(rule, archs=["sm_90a"]),) and fam.sass_allow_local == ()
        assert all(getattr(fam, other) == () for other in ("sass_local_budget", "sass_serial_ok") if other != mod)
        with pytest.raises(aot.AotError, match=f"bad_{mod}_family: {err}"):
            aot.load_families([f"bad_{mod}_family"])


def test_specs_file_builds_exactly_the_listed_specs(tmp_path):
    from w4a16_moe.loader.selftest_kernel import selftest_spec

    sm90 = aot.load_families([SM90])[0][0].variants("smoke")[:2]
    own = selftest_spec()  # a family the AOT build does not enumerate: built for every arch
    f = tmp_path / "specs.json"
    f.write_text(json.dumps([s.to_json() for s in (*sm90, own, sm90[0])]))
    assert aot.read_specs(f) == [*sm90, own]  # in order, without repeats
    plans, fams, _ = aot.plan_specs(["sm_90a", "sm_100a"], aot.read_specs(f), [SM90])
    by = {p.arch: p for p in plans}
    assert by["sm_90a"].specs == [*sm90, own] and by["sm_90a"].per_family == {"sm90_w4a16_gemm": 2, "selftest_axpy": 1}
    assert by["sm_100a"].specs == [own] and "family sm90_w4a16_gemm builds only sm_90a" in by["sm_100a"].reason
    r = _aot("--archs", "sm_90a,sm_100a", "--specs", str(f), "--families", SM90, "--list", timeout=300)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("sm_")] == (
        [f"sm_90a {s.name}" for s in (*sm90, own)] + [f"sm_100a {own.name}"])
    r = _aot("--specs", str(f), "--subset", "smoke", "--list", timeout=300)
    assert r.returncode == 2 and "--specs and --subset exclude each other" in r.stderr
    for text, why in (("{", "cannot read a JSON spec list"), ("[]", "non-empty JSON list"),
                      ('[{"family": "sm90_w4a16_gemm"}]', "entry 0 is not a kernel spec"),
                      ('[{"family": "Bad Family", "params": {}}]', "entry 0 is not a kernel spec")):
        f.write_text(text)
        with pytest.raises(ValueError, match=why):
            aot.read_specs(f)
    r = _aot("--specs", str(tmp_path / "missing.json"), "--list", timeout=300)
    assert r.returncode == 2 and "--specs" in r.stderr and "missing.json" in r.stderr


def test_manifest_extra_describes_empty_archs():
    plans, fams, absent = aot.plan_archs(["sm_90a", "sm_120a"], "smoke", [SM90])
    extra = aot.manifest_extra(plans, fams, absent, "smoke", "g++")
    n = len(plans[0].specs)
    assert n > 0 and extra["archs"]["sm_90a"] == {"kernels": n, "families": {"sm90_w4a16_gemm": n}}
    assert extra["archs"]["sm_120a"]["kernels"] == 0 and "builds only sm_90a" in extra["archs"]["sm_120a"]["reason"]
    assert extra["families"]["sm90_w4a16_gemm"]["sass_expect"] == ["HGMMA"]
    assert len(extra["families"]["sm90_w4a16_gemm"]["source_hash"]) == 16


def test_manifest_records_local_budgets():
    """The families table carries each family's local-memory budget rules and serialized-WGMMA rules (what an
    installed wheel's SASS check reads), the registry's, in JSON form."""
    from w4a16_moe.loader import sass

    plans, fams, absent = aot.plan_archs(["sm_90a"], "smoke")
    extra = json.loads(json.dumps(aot.manifest_extra(plans, fams, absent, "smoke", "g++")))
    budgets = sass.default_local_budget()
    assert {f: v["sass_local_budget"] for f, v in extra["families"].items()} == {f: list(budgets[f]) for f in
                                                                                  extra["families"]}
    assert [(r["LDL"], r["STL"]) for r in extra["families"]["sm90_w4a16_gemm"]["sass_local_budget"]] == [(2, 1)]
    assert [(r["LDL"], r["STL"]) for r in extra["families"]["w4a16_decode_gemv"]["sass_local_budget"]] == [(5, 2)]
    assert extra["families"]["warp_w4a16_gemm"]["sass_local_budget"] == []
    serial = sass.default_serial_ok()
    assert {f: v["sass_serial_ok"] for f, v in extra["families"].items()} == {f: list(serial[f]) for f in
                                                                               extra["families"]}
    assert len(extra["families"]["sm90_w4a16_gemm"]["sass_serial_ok"]) == 4  # TN 8, 112, 128 and the 640-thread TN 64


# ------------------------------------------------------------------------------------------------------
# a real build (needs the DSL and the CUDA static runtime, no GPU)
# ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke_build(tmp_path_factory):
    pytest.importorskip("cutlass", reason="the CuTe DSL (nvidia-cutlass-dsl) is needed to cross-compile")
    from w4a16_moe.loader.toolchain import BuildError, find_cuda_toolkit

    try:
        find_cuda_toolkit()
    except BuildError as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("aot") / "prebuilt"
    r = _aot("--archs", "sm_90a,sm_100a", "--subset", "smoke", "--out", str(out), "-j", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out, r


def test_smoke_subset_builds_and_resolves(smoke_build):
    out, r = smoke_build
    assert "aot: [#########################]" in r.stderr  # the progress display reached the end
    manifest = json.loads((out / "manifest.json").read_text())
    plans, _, _ = aot.plan_archs(["sm_90a", "sm_100a"], "smoke")
    for p in plans:
        got = sorted(k["name"] for k in manifest["kernels"] if k["arch"] == p.arch)
        assert got == sorted(s.name for s in p.specs), p.arch
        if p.specs:
            assert manifest["archs"][p.arch]["kernels"] == len(p.specs)
            # (sm_90a: 11.1 MiB since the setmaxnreg TN 112 / 128 / 144 model tiles, 14.4 MiB with the warp-MMA
            # kernels' PDL twins, 16.2 MiB with the four-consumer-warpgroup model tiles)
            assert (out / p.arch / "kernels.so").stat().st_size < 20 * 2**20
        else:  # no library for an arch without kernels
            assert not (out / p.arch).exists() and manifest["archs"][p.arch]["kernels"] == 0
    assert manifest["subset"] == "smoke" and manifest["linker"] == "g++"
    assert not (out / ".obj").exists()
    # the loader's prebuilt lookup finds every spec of every arch, with no JIT allowed
    code = textwrap.dedent("""
        import sys
        from w4a16_moe.aot import plan_archs
        from w4a16_moe.loader import kernel_status
        miss = [(p.arch, s.name, kernel_status(s, p.arch)) for p in plan_archs(["sm_90a", "sm_100a"], "smoke")[0]
                for s in p.specs if kernel_status(s, p.arch)[0] != "prebuilt"]
        print(miss[:3]); sys.exit(1 if miss else 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=_env(W4A16_MOE_PREBUILT_DIR=str(out), W4A16_MOE_DISABLE_JIT="1"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    # needs only libc-family libraries at run time
    from w4a16_moe.loader.build import ALLOWED_NEEDED
    from w4a16_moe.loader.toolchain import read_needed

    for lib in manifest["libraries"]:
        needed = read_needed(out / lib["file"])
        assert needed and set(needed) <= ALLOWED_NEEDED, needed


def test_smoke_build_sass(smoke_build):
    from w4a16_moe.loader import sass

    try:
        sass.find_nvdisasm()
    except sass.SassToolError as e:
        pytest.skip(str(e))
    out, _ = smoke_build
    rep = sass.check_dir(out)
    by_fam = {}
    for k in rep["kernels"]:
        by_fam.setdefault(k["family"], []).append(k)
    assert all(k["opcodes"].get("HGMMA") for k in by_fam["sm90_w4a16_gemm"])
    for k in by_fam.get("warp_w4a16_gemm", []):
        assert k["opcodes"].get("HMMA") and not k["opcodes"].get("HGMMA"), k["name"]
    assert len(rep["kernels"]) == len(json.loads((out / "manifest.json").read_text())["kernels"])
    # no local memory (LDL/STL), except within a kernel's declared budget or on archs where a family accepts it,
    # and no serialized WGMMA pipeline, except where a family rule accepts it (then warnings); the manifest records
    # the rules
    assert rep["ok"], rep["problems"][:10]
    fams = json.loads((out / "manifest.json").read_text())["families"]
    allowed = {(f, a) for f, v in fams.items() for a in v["sass_allow_local"]}
    assert all((k["family"], k["arch"]) in allowed or k["local_budget"] or k["serial_ok"]
               for k in rep["kernels"] if k["warnings"])
    assert all(k["serial_ok"] for k in rep["kernels"] if k["wgmma_serialized"])
    # the detector on real kernels: the smoke set has TN 8 tiles at 4 CTAs per SM and the four-warpgroup TN 64 tile
    # (serialized by ptxas, accepted) and overlapped ones (docs/perf/2026-12-04-wgmma-serial,
    # docs/perf/2026-12-05-four-consumer-wg)
    sm90 = by_fam["sm90_w4a16_gemm"]
    serial = [k for k in sm90 if k["wgmma_serialized"]]
    assert serial and all(k["serial_ok"]["params"]["tokens_per_tile"] in (8, 64, 112, 128) for k in serial)
    assert any(not k["wgmma_serialized"] and k["opcodes"]["HGMMA"] > 1 for k in sm90)
    assert fams["sm90_w4a16_gemm"]["sass_local_budget"] == list(sass.default_local_budget()["sm90_w4a16_gemm"])
    assert fams["sm90_w4a16_gemm"]["sass_serial_ok"] == list(sass.default_serial_ok()["sm90_w4a16_gemm"])
    # every kernel's register count (read from its cubins) is within what its launch bounds leave a thread when
    # min_ctas_per_sm CTAs share the 64K registers of an SM (8-register allocation steps, at most 255): the CTAs
    # per SM the tile was designed for fit
    params = {k["name"]: k["params"] for k in json.loads((out / "manifest.json").read_text())["kernels"]}
    assert all(isinstance(k["registers"], int) and 0 < k["registers"] <= 255 for k in rep["kernels"])
    for k in sm90 + by_fam.get("warp_w4a16_gemm", []):
        p = params[k["name"]]
        threads = 128 * (1 + p["consumer_wgs"]) if "consumer_wgs" in p else 32 * p["warps"]
        cap = min(255, 65536 // (max(1, p["min_ctas_per_sm"]) * threads) // 8 * 8)
        assert k["registers"] <= cap, (k["name"], k["registers"], cap)
    assert any(params[k["name"]]["min_ctas_per_sm"] == 4 and k["registers"] <= 64 for k in sm90)

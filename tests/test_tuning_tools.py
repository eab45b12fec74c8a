"""The tuner's decode summary, scripts/merge_tuned.py and scripts/sweep_tiles.py's arguments, on the CPU (no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from w4a16_moe.bench.tune import decode_summary
from w4a16_moe.formats.schemes import get_scheme
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90 import tuned
from w4a16_moe.kernels.cute.warp import family as warp_family

ROOT = os.path.join(os.path.dirname(__file__), "..")
KEY = "GPU|e8_h512_i256|int4_g32|bf16|k8"


def _merge_module():
    spec = importlib.util.spec_from_file_location("merge_tuned", os.path.join(ROOT, "scripts", "merge_tuned.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trial(t, bucket, us):
    return {"tokens": t, "bucket": bucket, "splits": None, "us": us, "nrmse": 0.004}


def test_decode_summary_bound_stops_at_the_first_gemm_win():
    trials = [_trial(1, "d:w8u8/w8u4", 10.0), _trial(1, 9, 20.0),
              _trial(2, "d:w4u8/w4u4", 15.0), _trial(2, "d:w8u8/w8u4", 16.0), _trial(2, 9, 25.0),
              _trial(4, "d:w8u8/w8u4", 40.0), _trial(4, 9, 30.0),
              _trial(8, "d:w8u8/w8u4", 50.0), _trial(8, 9, 60.0)]  # a decode win after a GEMM win: not used
    assert decode_summary(trials, top_k=8) == {"max_routes": 16, "knobs": [[1, "w8u8/w8u4"], [2, "w4u8/w4u4"]]}
    assert decode_summary([_trial(1, 9, 1.0)], top_k=8) is None
    assert decode_summary([_trial(1, "d:w8u8/w8u4", 2.0), _trial(1, 0, 1.0)], top_k=8) == {"max_routes": 0,
                                                                                            "knobs": []}


PROV = {"device": "GPU", "versions": {"torch": "2.11"}, "revision": "abc1234", "date": "2026-12-01"}


def _row(t, cand, splits=None, family="sm90", **extra):
    return {"tokens": t, "family": family, "candidate": cand, "splits": splits, **PROV, **extra}


def test_merge_keeps_other_families_and_replaces_decode():
    m = _merge_module()
    c = [tuned.candidate_name(t) for t in fam.CANDIDATES]
    warp0 = tuned.candidate_name(warp_family.TILES[0][1])
    table = {"entries": {KEY: [_row(1, c[9]), _row(32, warp0, family="warp"), _row(256, c[1])]},
             "decode": {KEY: {"max_routes": 64, "knobs": [[1, "w8u8/w8u4"]], **PROV}}}
    new_prov = dict(PROV, revision="def5678")
    result = {"key": KEY, "rows": [{**_row(1, c[5], 2), "revision": "def5678"}, _row(32, c[2]), _row(2048, c[4])],
              "decode": {"max_routes": 128, "knobs": [[1, "w16u4/w16u2"]]}, "meta": {**new_prov, "command": "tune"}}
    logs = []
    out = m.merge(table, result, log=logs.append)
    got = out["entries"][KEY]
    assert [(r["tokens"], r["family"], r["candidate"], r["splits"]) for r in got] == [
        (1, "sm90", c[5], 2), (32, "warp", warp0, None), (256, "sm90", c[1], None), (2048, "sm90", c[4], None)]
    assert got[0]["revision"] == "def5678" and got[2]["revision"] == "abc1234"  # provenance kept per row
    assert out["decode"][KEY]["max_routes"] == 128 and out["decode"][KEY]["revision"] == "def5678"
    assert out["commands"][KEY] == "tune"
    assert any("kept" in ln for ln in logs)


def test_merge_script_round_trip(tmp_path):
    table = tmp_path / "tuned.json"
    table.write_text(json.dumps({"format": 2, "entries": {}}))
    res = tmp_path / "res.json"
    c9 = tuned.candidate_name(fam.CANDIDATES[9])
    res.write_text(json.dumps({"key": KEY, "rows": [_row(8, c9, 1)], "decode": None}))
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "merge_tuned.py"), str(res), "--table", str(table)],
                   check=True, capture_output=True)
    assert json.loads(table.read_text())["entries"][KEY] == [_row(8, c9, 1)]
    res.write_text(json.dumps({"key": KEY, "rows": [_row(8, "t9_nonsense", 1)], "decode": None}))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "merge_tuned.py"), str(res), "--table",
                        str(table)], capture_output=True, text=True)
    assert r.returncode == 1 and "unknown candidate 't9_nonsense'" in r.stderr
    assert json.loads(table.read_text())["entries"][KEY] == [_row(8, c9, 1)]  # the table is left as it was


@pytest.mark.usefixtures("tuned_rows_current")
def test_tuned_decode_lookups(monkeypatch):
    data = {KEY: {"max_routes": 32, "knobs": [[1, "w16u4/w16u2"], [4, "w4u8/w4u4"]]}}
    monkeypatch.setattr(fam, "_tuned_decode", lambda path=None: data)
    args = ("GPU", 8, 512, 256, "int4_g32", "bf16", 8)
    assert fam.decode_bound(*args) == 32
    assert fam.decode_bound("GPU", 8, 512, 256, "int4_g64", "bf16", 8) is None  # no entry: the rule
    assert fam.decode_knobs(1, *args) == "w16u4/w16u2"
    assert fam.decode_knobs(3, *args) == "w16u4/w16u2"
    assert fam.decode_knobs(4, *args) == "w4u8/w4u4" == fam.decode_knobs(100, *args)
    assert fam.tuned_decode_knob_sets("int4_g32") == ["w16u4/w16u2", "w4u8/w4u4"]
    assert fam.tuned_decode_knob_sets("nvfp4") == []


def test_packaged_table_is_consistent():
    """Every row of the packaged table names an existing candidate / warp tile (checked when the table is
    read) and a parseable knob set."""
    from w4a16_moe.kernels.cute.decode import family as dec

    for key, rows in fam._tuned_table().items():
        assert rows and [r.tokens for r in rows] == sorted(r.tokens for r in rows), key
        for r in rows:
            tiles = fam.CANDIDATES if r.family == "sm90" else [t for _, t in warp_family.TILES]
            assert dict(r.tiles) in [dict(t) for t in tiles], (key, r)
    for key, ent in fam._tuned_decode().items():
        assert ent["max_routes"] >= 0
        for _, kn in ent["knobs"]:
            dec.parse_knobs(kn)


def test_tuner_rows_are_the_benchmarks_then_fresh_draws():
    """The tuner's first routing of a token count is the benchmark's row (same seed, same draw order);
    the others are distinct fresh draws."""
    import torch

    from w4a16_moe.bench.tune import _rows
    from w4a16_moe.bench.workloads import SEED, Workload, make_inputs

    wl = Workload("tiny", "", 16, 4, 32, 16, 2, "int4_g32", (1, 2, 4))
    gen = torch.Generator().manual_seed(SEED)
    bench = {t: make_inputs(wl, t, gen, "cpu") for t in wl.tokens}
    rows = _rows(wl, [2, 4, 3], 3, torch.Generator().manual_seed(SEED), "cpu")
    assert [len(rows[t]) for t in (2, 4, 3)] == [3, 3, 3]
    for t in (2, 4):
        assert all(torch.equal(a, b) for a, b in zip(rows[t][0], bench[t]))
        assert not torch.equal(rows[t][1][2], rows[t][2][2]) or not torch.equal(rows[t][1][0], rows[t][2][0])
    assert rows[3][0][0].shape == (3, 32)  # not a benchmark row: a fresh draw


def test_benchmark_subset_rows_match_the_full_run():
    """``bench --tokens 4`` measures the full benchmark's 4-token row (same draws), not a fresh one."""
    import torch

    from w4a16_moe.bench.workloads import SEED, Workload, benchmark_rows

    wl = Workload("tiny", "", 16, 4, 32, 16, 2, "int4_g32", (1, 2, 4, 8))
    full = benchmark_rows(wl, wl.tokens, torch.Generator().manual_seed(SEED), "cpu")
    sub = benchmark_rows(wl, [8, 3, 2], torch.Generator().manual_seed(SEED), "cpu")
    assert set(sub) == {8, 3, 2}
    for t in (8, 2):
        assert all(torch.equal(a, b) for a, b in zip(sub[t], full[t]))
    assert sub[3][0].shape == (3, 32)


def test_sweep_tiles_parses_expert_parallel_layers():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    from sweep_tiles import parse_layer

    assert parse_layer("128,2048,768,8") == (128, 2048, 768, 8, None)
    assert parse_layer("32,7168,2048,8,256") == (32, 7168, 2048, 8, 256)
    assert parse_layer("32,7168,2048,8,32") == (32, 7168, 2048, 8, None)  # every expert local: no hint
    for bad in ("32,7168,2048", "32,7168,2048,8,16", "a,b,c,d", "0,7168,2048,8"):
        with pytest.raises(SystemExit, match="--layers"):
            parse_layer(bad)


def _explore(tmp_path, tiles, *extra):
    p = tmp_path / "tiles.json"
    p.write_text(json.dumps(tiles))
    out = tmp_path / "specs.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "explore_tiles.py"), "specs", "--tiles", str(p),
                        "--out", str(out), *extra], capture_output=True, text=True,
                       env={**os.environ, "W4A16_MOE_TUNED_TABLE": "0"})
    return r, out


def test_explore_tiles_writes_the_specs_of_the_default_plans_and_of_every_tile(tmp_path):
    wide = dict(tokens_per_tile=192, m64_per_block=2, k_tile=64, stages=4, consumer_wgs=2, mma_kblocks=2, pdl=True)
    deep = dict(tokens_per_tile=24, k_tile=128, m16_per_warp=2, stages=6, warps=4)
    assert wide not in fam.CANDIDATES and deep not in warp_family.model_tiles()
    r, out = _explore(tmp_path, [wide, {"family": "warp", "tiles": deep}],
                      "--layers", "8,4096,14336,2", "--tokens", "64,2048")
    assert r.returncode == 0, r.stderr
    specs = json.loads(out.read_text())
    params = [(s["family"], s["params"]) for s in specs]
    for mode in ("gate_up", "down"):  # both GEMMs of each explored tile
        assert any(f == "sm90_w4a16_gemm" and p["mode"] == mode and p["tokens_per_tile"] == 192
                   and p["m64_per_block"] == 2 and p["consumer_wgs"] == 2 for f, p in params)
        assert any(f == "warp_w4a16_gemm" and p["mode"] == mode and p["tokens_per_tile"] == 24 and p["stages"] == 6
                   for f, p in params)
    # the default plans of the two calls (a warp tile at 64 tokens, an SM90 rule tile at 2048) are there too
    assert len({s["name"] for s in specs}) == len(specs) == 8


def test_device_specs_add_the_kernels_of_extra_tile_files(tmp_path):
    # the wide ping-pong down tiles with a 2-stage ring: no candidates, yet a GPU session that times them needs
    # their kernels
    study = os.path.join(ROOT, "docs", "perf", "2026-12-05-wide-pp-down", "tiles.json")
    pp = [{**t, "down_stages": 2, "down_b_slots": 2} for t in json.loads(open(study).read())]
    assert pp and not any(t in fam.CANDIDATES for t in pp)
    tiles_file = tmp_path / "tiles.json"
    tiles_file.write_text(json.dumps(pp))
    out = tmp_path / "specs.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "device_specs.py"), "--out", str(out),
                        "--tiles", str(tiles_file)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = {s["name"] for s in json.loads(out.read_text())}
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from device_specs import device_specs

    base = {s.name for s in device_specs()}
    for t in pp:
        for scheme in ("int4_g32", "int4_g128"):
            for cfg in fam.gemm_configs(get_scheme(scheme), "bf16", "swiglu", True, "deterministic", t):
                assert fam.spec_for(cfg).name in names
    assert base < names


def test_device_specs_hold_what_tests_launch_and_force():
    """The GPU kit holds every kernel a test module launches directly (its ``needed_specs()``: the occupancy tests'
    plain twins were missing on 2026-12-07, 54 GPU tests failed on JIT-disabled lookups) and what the provider plans
    on an H100 for the forced-family TP-shard tests (the FP16 MXFP4 gpt-oss TP2 shard, missing then too)."""
    import importlib

    import torch

    from w4a16_moe import settings
    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.validate import MoECall

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from device_specs import TEST_MODULES, device_specs

    names = {s.name for s in device_specs()}
    for m in TEST_MODULES:
        assert {s.name for s in importlib.import_module(m).needed_specs()} <= names, m
    h100 = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132)
    real = provider._kernels_available
    provider._kernels_available = lambda arch: None
    try:
        for family in ("sm90", "warp"):
            call = MoECall(80, 4, 2880, 1440, 8, torch.float16, torch.device("cuda"), get_activation("swiglu_oai"),
                           "deterministic", 0, "mxfp4", False, True)
            with settings.override(cute_family=family, cute_decode="0"):
                p = provider.plan(call, h100)
                provider.clear_plans()
            assert p.family == family
            assert {provider.registry.get(family).spec_for(c).name for c in p.configs} <= names
    finally:
        provider._kernels_available = real
        provider.clear_plans()


def _explore_twin(tmp_path, twin, *extra):
    out = tmp_path / "specs.json"
    args = ["--twin", twin] if twin is not None else []
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "explore_tiles.py"), "specs", *args,
                        "--out", str(out), *extra], capture_output=True, text=True,
                       env={**os.environ, "W4A16_MOE_TUNED_TABLE": "0"})
    return r, out


def test_explore_tiles_twin_adds_the_default_plan_with_one_key_changed(tmp_path):
    # 64 tokens: a warp-MMA default (no twin); 2048: an SM90 default, whose twin stages y in FP32
    r, out = _explore_twin(tmp_path, "down_stage16=false", "--layers", "8,4096,14336,2", "--tokens", "64,2048")
    assert r.returncode == 0, r.stderr
    sm90 = [s["params"] for s in json.loads(out.read_text()) if s["family"] == "sm90_w4a16_gemm"]
    downs = [p for p in sm90 if p["mode"] == "down"]
    # one gate/up kernel (the twin shares it), the default's 16-bit-staging down kernel and the twin's FP32 one
    assert len(sm90) == 3 and sorted(p["stage16"] for p in downs) == [False, True]
    assert {k: v for k, v in downs[0].items() if k != "stage16"} == {k: v for k, v in downs[1].items() if k != "stage16"}


@pytest.mark.parametrize("twin, message", [("down_stage16", "--twin: expected KEY=VALUE"),
                                           (None, "give --tiles, --model, --twin or a combination")])
def test_explore_tiles_rejects_a_bad_twin(tmp_path, twin, message):
    r, _ = _explore_twin(tmp_path, twin, "--layers", "8,4096,14336,2")
    assert r.returncode != 0 and message in r.stderr


def test_explore_tiles_model_times_every_model_choice_where_the_model_may_choose_it():
    """``--model`` (the refit's sweeps, docs/perf/2026-12-06-refit16): every choice the cost model chooses among,
    at ``--splits``, except where ``sm90.family.in_model_domain`` keeps the model from choosing it on the layer."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import explore_tiles as et
    from w4a16_moe.activations import get_activation
    from w4a16_moe.kernels.cute.sm90 import family as fam
    from w4a16_moe.validate import MoECall

    names = et.model_names()
    assert len(names) == len(fam.model_candidates()) and {f for f, _ in names} <= {"sm90", "warp"}

    def call(h, i):
        return MoECall(2048, 8, h, i, 128, torch.bfloat16, torch.device("cpu"), get_activation("swiglu"),
                       "deterministic", 0, "int4_g128")

    short, wide = et.row_choices(call(7168, 256), names, 1), et.row_choices(call(4096, 384), names, None)
    assert len(short) == len(names) and {c.splits for c in short} == {1}
    # I = 384: no four-warpgroup tile (a third of the gate/up rows padding), no ping-pong down of 256 resident K
    assert {c.splits for c in wide} == {None} and len(wide) == len(names) - 6
    assert not any("_x8_" in c.candidate or "_pp2" in c.candidate for c in wide)


def test_explore_tiles_rejects_a_tiles_file_without_tile_dicts(tmp_path):
    r, _ = _explore(tmp_path, [{"family": "warp"}], "--layers", "8,4096,14336,2")
    assert r.returncode != 0 and "--tiles" in r.stderr and "entry 0" in r.stderr


def test_sweep_tiles_decode_only_keeps_the_decode_choices_and_the_default():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from sweep_tiles import kept

    from w4a16_moe.kernels.cute.autotune_store import Choice

    dec, dflt = Choice("decode", "w8u8s2/w8u4s2"), Choice("sm90", "t16_x2_k128_s4_w1_serial", None)
    other, split4 = Choice("warp", "t8_k64_m2_s4_w4", None), Choice("sm90", "t16_x2_k128_s4_w1_serial", 4)
    everything = {None, 1, 2, 4, 8}
    assert [kept(c, dflt, everything, True) for c in (dec, dflt, other, split4)] == [True, True, False, False]
    assert [kept(c, dflt, everything, False) for c in (dec, dflt, other, split4)] == [True, True, True, True]
    assert [kept(c, dflt, {None}, False) for c in (dec, dflt, other, split4)] == [True, True, True, False]
    assert kept(dec, None, set(), True) and not kept(other, None, {None}, True)
    # --decode-splits: the decode choices by their forced K split (None: the rule's); the default stays
    rule = Choice("decode", "w16u4c132f/w16u2")
    assert [kept(c, dflt, everything, True, {None, 1}) for c in (dec, rule, dflt)] == [False, True, True]
    assert [kept(c, dec, everything, True, {1}) for c in (dec, rule)] == [True, False]


def test_sweep_tiles_times_the_split_counts_it_is_asked_for():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from sweep_tiles import with_splits

    from w4a16_moe.kernels.cute.autotune_store import Choice

    dec = Choice("decode", "w8u8/w8u4")
    warp = [Choice("warp", "t8_k128_s4_w4_m2", sp) for sp in (None, 1, 2)]
    sm90 = Choice("sm90", "t16_x2_k128_s4_w1_serial", 4)
    out = with_splits([dec, *warp, sm90], [3, 5])
    assert out[:5] == [dec, *warp, sm90]  # the autotuner's choices first, unchanged
    assert out[5:] == [Choice("warp", "t8_k128_s4_w4_m2", 3), Choice("warp", "t8_k128_s4_w4_m2", 5),
                       Choice("sm90", "t16_x2_k128_s4_w1_serial", 3), Choice("sm90", "t16_x2_k128_s4_w1_serial", 5)]
    assert with_splits([dec, *warp], []) == [dec, *warp]
    assert with_splits([dec, *warp], [2]) == [dec, *warp]  # already there


def test_sweep_tiles_refuses_decode_splits_it_cannot_time():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sweep_tiles.py"), "--layers", "8,4096,14336,2",
                        "--decode-splits", "rule,3"], capture_output=True, text=True)
    assert r.returncode != 0 and "--decode-splits" in r.stderr and "[3]" in r.stderr


def test_sweep_tiles_documents_its_flags():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "sweep_tiles.py"), "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--no-hint" in r.stdout and "--decode-only" in r.stdout
    assert "--decode-splits" in r.stdout and "--decode-knobs" in r.stdout


def test_layout_memory_packs_what_the_plans_read(monkeypatch):
    """scripts/layout_memory.py: the layouts of a layer's plans, packed once each, every one a full copy."""
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider

    spec = importlib.util.spec_from_file_location("layout_memory", os.path.join(ROOT, "scripts", "layout_memory.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    provider.clear_plans()
    info = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)

    def counts(max_tokens):  # the token counts of the warmup plans (no tuned row for this layer)
        return sorted({t for t, _ in provider.warmup_plans(info, 8, 512, 256, "int4_g128", torch.bfloat16,
                                                            torch.device("cuda"), "swiglu", 8, max_tokens)})

    # every count to 256, then the selection grid's 16 points per octave through the first at or past max_tokens
    assert counts(300) == [*range(1, 257), 272, 288, 300, 304]
    assert counts(1024)[-4:] == [928, 960, 992, 1024] and len(counts(1024)) == 256 + 16 + 16
    w, canonical = mod.layer_layouts(8, 512, 256, 8, "int4_g128", max_tokens=64, info=info)
    provider.clear_plans()
    held = w.packed_nbytes()
    assert any(":w13:" in k for k in held) and any(":w2:" in k for k in held), held
    for key, nbytes in held.items():  # each a full copy of its matrix's 4-bit codes at least
        assert nbytes >= (w.w13 if ":w13:" in key else w.w2).codes.numel(), (key, nbytes)
    assert canonical == w.nbytes_per_expert()


def test_layout_memory_estimates_fewer_layout_pairs():
    """scripts/layout_memory.py --estimate: the model's best one / two layout pairs cost at least the unrestricted
    picks, two no more than one, and exactly them where the picks read at most two pairs."""
    spec = importlib.util.spec_from_file_location("layout_memory", os.path.join(ROOT, "scripts", "layout_memory.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    est = mod.layout_pair_estimate(128, 4096, 384, 8, "int4_g128", max_tokens=1024)
    (one, gm1, worst1), (two, gm2, worst2) = est["one"], est["two"]
    assert len(one) == 1 and len(two) == 2 and all(len(p) == 2 for p in one + two)
    assert 1.0 <= gm2 <= gm1 and worst2 <= worst1 and gm1 <= worst1
    if est["pairs"] <= 2:
        assert gm2 == worst2 == 1.0


def test_autotune_specs_cover_every_candidate_the_autotuner_times(tmp_path, monkeypatch):
    # with exactly the script's kernels at hand, the autotuner's candidates are those it has with every kernel
    out = tmp_path / "specs.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "autotune_specs.py"), "--layers", "64,2048,1408,6",
                        "--scheme", "int4_g128", "--max-tokens", "16", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = {s["name"] for s in json.loads(out.read_text())}
    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import autotune, provider
    from w4a16_moe.validate import MoECall

    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    info = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
    checked = 0
    for fin in ("deterministic", "fused"):
        for t in autotune.token_grid(16):
            call = MoECall(t, 6, 2048, 1408, 64, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"), fin, 0,
                           "int4_g128")
            every = autotune.candidates(call, info, status=lambda spec, arch: ("prebuilt",))
            kit = autotune.candidates(call, info, status=lambda spec, arch: ("prebuilt" if spec.name in names else "absent",))
            assert kit == every and len(every) > 5
            checked += len(every)
    provider.clear_plans()
    assert checked > 50

"""``bench --layer/--preset`` on the CPU: argument rules, the preset table against the peers tool's, data
generation, the record schema, the markdown writer and the merge tool (on synthetic peers-tool output)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os

import pytest
import torch

from w4a16_moe.bench import merge, records
from w4a16_moe.bench.layers import LayerArgError, build_workload, parse_layer, parse_tokens
from w4a16_moe.bench.presets import DEFAULT_TOKENS, INT4_PRESETS, PRESETS
from w4a16_moe.bench.workloads import SEED, WORKLOADS, Workload, benchmark_rows, floor_us, make_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _peers_dir():
    """``../shared/tools/peers`` beside the checkout (CI), or two levels up (a worktree under wt/)."""
    for up in ("..", os.path.join("..", ".."), "."):
        d = os.path.normpath(os.path.join(ROOT, up, "shared", "tools", "peers"))
        if os.path.isfile(os.path.join(d, "peer_bench.py")):
            return d
    return None


@pytest.fixture(scope="module")
def peer_bench():
    d = _peers_dir()
    if d is None:
        pytest.skip("the peers tool (../shared/tools/peers/peer_bench.py) is not beside this checkout")
    spec = importlib.util.spec_from_file_location("_peer_bench_under_test", os.path.join(d, "peer_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------ argument rules
@pytest.mark.parametrize("kw, words", [
    (dict(layer="8,512,256"), ["--layer", "E,H,I,TOPK[,E_GLOBAL]"]),
    (dict(layer="8,512,x,2"), ["--layer", "I must be an integer"]),
    (dict(layer="0,512,256,2"), ["--layer", "E must be positive"]),
    (dict(layer="8,0,256,2"), ["--layer", "H must be positive"]),
    (dict(layer="8,512,-256,2"), ["--layer", "I must be positive"]),
    (dict(layer="8,512,256,0"), ["--layer", "TOPK must be positive"]),
    (dict(layer="8,512,256,9"), ["--layer", "TOPK (9) must be <= E_GLOBAL (8)"]),
    (dict(layer="8,512,256,2,4"), ["--layer", "E_GLOBAL (4) must be >= E (8)"]),
    (dict(layer="8,500,256,2", group=32), ["--layer", "H (500) must be a multiple of 32"]),
    (dict(layer="8,512,96,2"), ["--layer", "I (96) must be a multiple of 128"]),
    (dict(layer="8,512,256,2", group=48), ["--group", "48", "(32, 64, 128)"]),
    (dict(layer="8,512,256,2", group=32, scheme="int4_g128"), ["--group", "group size of --scheme int4_g128"]),
    (dict(layer="8,512,256,2", scheme="int5"), ["--scheme", "unknown scheme", "nvfp4"]),
    (dict(layer="8,512,256,2", dtype="fp32"), ["--dtype", "bf16", "fp16"]),
    (dict(layer="8,512,256,2", activation="gelu"), ["--activation", "swiglu"]),
    (dict(preset="mixtral"), ["--preset", "unknown preset", "glm45-ep8"]),
    (dict(workload="w3"), ["--workload", "unknown workload"]),
    (dict(), ["exactly one of --workload, --preset or --layer"]),
    (dict(preset="glm45-ep8", layer="8,512,256,2"), ["--preset and --layer"]),
])
def test_layer_argument_errors_name_the_argument_and_rule(kw, words):
    with pytest.raises(LayerArgError) as ei:
        build_workload(**kw)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


@pytest.mark.parametrize("text, words", [("1,x", ["--tokens", "integers"]), ("0,8", ["--tokens", "positive"]),
                                         ("8,8", ["--tokens", "twice"])])
def test_token_errors(text, words):
    with pytest.raises(LayerArgError) as ei:
        parse_tokens(text)
    assert all(w in str(ei.value) for w in words)
    assert parse_tokens("1, 8,64") == [1, 8, 64] and parse_tokens(None) is None


def test_cli_reports_argument_errors(capsys):
    from w4a16_moe.bench.run import main

    for argv, words in ((["--layer", "8,512,256,2,4"], ["--layer", "E_GLOBAL"]),
                        (["--preset", "glm45-ep8", "--providers", "cute,auto"], ["--providers", "w4a16_moe"]),
                        (["--preset", "glm45-ep8", "--providers", "cuda"], ["--providers", "unknown"])):
        with pytest.raises(SystemExit) as ei:
            main(argv)
        assert ei.value.code == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words), err


def test_layer_names_and_ep():
    assert parse_layer("32,7168,2048,8,256") == dict(E=32, H=7168, I=2048, TOPK=8, E_GLOBAL=256)
    assert parse_layer("16,5120,8192,1")["E_GLOBAL"] == 16
    wl, tokens = build_workload(layer="32,7168,2048,8,256")
    assert (wl.name, wl.local_experts, wl.global_experts, wl.scheme, tuple(tokens)) == \
        ("E32-H7168-I2048-k8-of256-g128", 32, 256, "int4_g128", DEFAULT_TOKENS)
    assert build_workload(layer="8,512,256,2", group=32)[0].name == "E8-H512-I256-k2-g32"
    assert build_workload(layer="8,512,256,2", scheme="nvfp4", activation="relu2")[0].name == \
        "E8-H512-I256-k2-nvfp4-relu2"
    assert build_workload(preset="kimi-tp8", group=128)[0].name == "kimi-tp8-g128"
    assert build_workload(preset="glm45-ep8", dtype="fp16")[0].name == "glm45-ep8"


def test_workloads_and_presets_of_w1_w2_are_w1_w2():
    """``--workload`` and the presets of the same name measure W1/W2: same shape, scheme and row order (so the
    same data); the presets' default token counts are the peers tool's."""
    for name in ("kimi-tp8", "deepseek-ep8"):
        w, t = build_workload(workload=name)
        assert w == WORKLOADS[name] and tuple(t) == WORKLOADS[name].tokens
        p, tp = build_workload(preset=name)
        assert p == WORKLOADS[name] and tuple(tp) == DEFAULT_TOKENS
    assert build_workload(workload="kimi-tp8", dtype="fp16")[0].dtype == "fp16"


# ------------------------------------------------------------------------------------------ presets
def test_presets_equal_the_peers_tools(peer_bench):
    """The INT4 presets are the peers tool's; the others (gpt-oss-120b, MXFP4) belong to scripts/peers/."""
    assert list(INT4_PRESETS) == list(peer_bench.PRESETS)
    assert set(PRESETS) - set(INT4_PRESETS) == {"gpt-oss-120b"}
    for name in INT4_PRESETS:
        p = PRESETS[name]
        assert (p.local_experts, p.hidden, p.intermediate, p.top_k, p.global_experts, p.group, p.what) == \
            tuple(peer_bench.PRESETS[name]), name
        assert p.tokens == tuple(peer_bench.DEFAULT_TOKENS)
        wl, _ = build_workload(preset=name)
        cfg = dict(E_local=p.local_experts, H=p.hidden, I=p.intermediate, topk=p.top_k, E_global=p.global_experts,
                   g=p.group, preset=name)
        assert wl.name == peer_bench.layer_name(cfg)  # records and the peers tool's JSON name layers alike
    for layer, group in (("8,512,256,2,16", 128), ("8,512,256,2", 32)):
        cfg = dict(peer_bench.parse_layer(layer), g=group, preset=None)
        assert build_workload(layer=layer, group=group)[0].name == peer_bench.layer_name(cfg)
    assert (peer_bench.BW, peer_bench.FLOPS, peer_bench.LAUNCH_FLOOR_US, peer_bench.NRMSE_GATE) == \
        (4.3e12, 7.9e14, 6.0, records.NRMSE_LIMIT)


def test_gpt_oss_preset_carries_its_scheme_activation_and_biases():
    """``--preset gpt-oss-120b`` is the MXFP4 gpt-oss layer with biases and swiglu_oai, named as
    scripts/peers/mxfp4_bench.py names its 'full' variant; --group / --scheme / --activation override it."""
    wl, tokens = build_workload(preset="gpt-oss-120b")
    assert (wl.name, wl.scheme, wl.activation, wl.bias) == ("gpt-oss-120b", "mxfp4", "swiglu_oai", True)
    assert (wl.local_experts, wl.hidden, wl.intermediate, wl.top_k, wl.global_experts) == (128, 2880, 2880, 4, 128)
    assert tuple(tokens) == (1, 4, 16, 64, 256, 1024, 4096)
    assert build_workload(preset="gpt-oss-120b", activation="swiglu")[0].name == "gpt-oss-120b-swiglu"
    assert build_workload(preset="gpt-oss-120b", group=32)[0].name == "gpt-oss-120b-g32"
    assert build_workload(preset="gpt-oss-120b", scheme="nvfp4")[0].name == "gpt-oss-120b-nvfp4"
    assert build_workload(preset="glm45-ep8")[0].bias is False
    small = dataclasses.replace(wl, local_experts=3, global_experts=3, hidden=64, intermediate=96)
    w = make_weights(small, torch.Generator().manual_seed(SEED), "cpu")
    assert w.w13_bias.shape == (3, 192) and w.w2_bias.shape == (3, 64) and w.w13_bias.dtype == torch.bfloat16
    nob = make_weights(dataclasses.replace(small, bias=False), torch.Generator().manual_seed(SEED), "cpu")
    assert torch.equal(w.w13.codes, nob.w13.codes) and torch.equal(w.w2.scales, nob.w2.scales)  # biases drawn last
    assert nob.w13_bias is None


# ------------------------------------------------------------------------------------------ data generation
def _targets_md_generation(wl, tokens, device="cpu"):
    """The benchmark's data generation as it was before any layer could be given (targets.md): int4 codes and
    BF16 scales per matrix, then per row x, routing scores, routing logits."""
    gen = torch.Generator(device=device).manual_seed(SEED)

    def matrix(e, n, k, g):
        codes = torch.randint(0, 256, (e, n, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
        u = torch.rand(e, n, k // g, generator=gen, device=device)
        return codes, ((0.75 + 0.5 * u) / (4.6 * math.sqrt(k))).to(torch.bfloat16)

    g = int(wl.scheme[len("int4_g"):])
    w13 = matrix(wl.local_experts, 2 * wl.intermediate, wl.hidden, g)
    w2 = matrix(wl.local_experts, wl.hidden, wl.intermediate, g)
    rows = {}
    for t in tokens:
        x = torch.randn(t, wl.hidden, generator=gen, device=device).to(torch.bfloat16)
        scores = torch.rand(t, wl.global_experts, generator=gen, device=device)
        ids = scores.topk(wl.top_k, dim=1).indices.to(torch.int32)
        tw = torch.softmax(torch.randn(t, wl.top_k, generator=gen, device=device), dim=1)
        rows[t] = (x, tw, ids)
    return w13, w2, rows


@pytest.mark.parametrize("layer, group, like", [("24,256,64,4", 32, "kimi-tp8"),
                                               ("4,256,256,4,32", 128, "deepseek-ep8")])
def test_layer_data_is_the_workload_generation(layer, group, like):
    """A small ``--layer`` shaped like W1 (many small experts, g32) or W2 (an EP rank, g128) gets exactly the
    targets.md data generation (same function as W1/W2)."""
    wl, _ = build_workload(layer=layer, group=group)
    wl = Workload(wl.name, "", wl.global_experts, wl.local_experts, wl.hidden, wl.intermediate, wl.top_k, wl.scheme,
                  (1, 3, 16))
    gen = torch.Generator().manual_seed(SEED)
    w = make_weights(wl, gen, "cpu")
    rows = benchmark_rows(wl, wl.tokens, gen, "cpu")
    (c13, s13), (c2, s2), want = _targets_md_generation(wl, wl.tokens)
    assert torch.equal(w.w13.codes, c13) and torch.equal(w.w13.scales, s13)
    assert torch.equal(w.w2.codes, c2) and torch.equal(w.w2.scales, s2)
    for t in wl.tokens:
        assert all(torch.equal(a, b) for a, b in zip(rows[t], want[t])), t
    assert WORKLOADS[like].scheme == wl.scheme
    fl = floor_us(wl, w, 16, rows[16][2])
    ids = rows[16][2].long()
    local = ids[ids < wl.local_experts]
    assert fl["local_routes"] == local.numel() and fl["experts_present"] == torch.unique(local).numel()
    if wl.global_experts > wl.local_experts:
        assert local.numel() < ids.numel()  # routes to other ranks' experts exist and are not counted


def test_fp16_and_other_schemes_draw_the_same_numbers():
    wl = Workload("t", "", 8, 8, 256, 128, 2, "int4_g32", (1, 5))

    g1, g2 = torch.Generator().manual_seed(SEED), torch.Generator().manual_seed(SEED)
    a, b = make_weights(wl, g1, "cpu"), make_weights(dataclasses.replace(wl, dtype="fp16"), g2, "cpu")
    assert torch.equal(a.w13.codes, b.w13.codes) and b.w13.scales.dtype == torch.float16
    assert torch.allclose(a.w13.scales.float(), b.w13.scales.float(), rtol=1e-2)
    xa, xb = benchmark_rows(wl, [5], g1, "cpu")[5][0], benchmark_rows(dataclasses.replace(wl, dtype="fp16"), [5], g2,
                                                                       "cpu")[5][0]
    assert xb.dtype == torch.float16 and torch.allclose(xa.float(), xb.float(), rtol=1e-2, atol=1e-2)
    rms = a.dequantize()[0].pow(2).mean().sqrt().item()
    for sch, act in (("int4_g64_zp", "swiglu"), ("int4_channel", "swiglu"), ("nvfp4", "geglu"), ("mxfp4", "relu2")):
        w = make_weights(dataclasses.replace(wl, scheme=sch, activation=act), torch.Generator().manual_seed(SEED),
                         "cpu")
        w13 = w.dequantize()[0]
        assert w13.shape[1] == (256 if act != "relu2" else 128)
        assert 0.6 < w13.pow(2).mean().sqrt().item() / rms < 1.6, sch


# ------------------------------------------------------------------------------------------ records
def _rec(tokens, impl, us, **kw):
    r = {"layer": "glm45-ep8", "tokens": tokens, "impl": impl, "median_us": us, "floor_eff_us": 50.0,
         "nrmse": 0.005, "device": "NVIDIA H200", "revision": "abc", "dtype": "bf16", "source": "peer_bench"}
    r.update(kw)
    return r


def test_bench_record_schema():
    from w4a16_moe.bench.run import _record

    wl, _ = build_workload(preset="glm45-ep8")
    meta = {"device": "NVIDIA H200", "revision": "abc", "date": "2026-12-01T08:00:00+00:00", "versions": {"torch": "x"}}
    fl = {"floor_us": 40.0, "floor_eff_us": 40.0, "experts_present": 3, "local_routes": 4}
    for prov, impl in (("cute", "w4a16_moe"), ("auto", "w4a16_moe"), ("cute-fused", "w4a16_moe_fused"),
                       ("triton", "w4a16_moe_triton"), ("dense-bf16", "dense_bf16")):
        r = _record(wl, meta, 8, prov, fl, 55.0, [54.0, 55.0, 56.0], 0.005, None)
        assert list(r)[:8] == list(records.REQUIRED)
        assert (r["layer"], r["impl"], r["provider"], r["dtype"], r["scheme"]) == ("glm45-ep8", impl, prov, "bf16",
                                                                                  "int4_g128")
        records.check_records([r])
    bad = _record(wl, meta, 8, "cute", fl, None, [], None, "RuntimeError: x")
    assert bad["median_us"] is None and bad["error"] and records.check_records([bad])
    for field, val, words in (("impl", "marlin", "impl"), ("tokens", 0, "tokens"), ("median_us", -1.0, "median_us"),
                              ("floor_eff_us", None, "floor_eff_us")):
        r = dict(_rec(1, "humming", 10.0))
        r[field] = val
        with pytest.raises(ValueError, match=words):
            records.check_records([r])
    r = _rec(1, "humming", 10.0)
    del r["revision"]
    with pytest.raises(ValueError, match=r"records\[0\]: missing field\(s\) revision"):
        records.check_records([r])


def test_markdown_table():
    recs = [_rec(1, "w4a16_moe", 45.0), _rec(1, "humming", 50.0), _rec(1, "vllm_marlin", 60.0, marks="+"),
            _rec(1, "dense_bf16", 90.0), _rec(8, "w4a16_moe", 120.0), _rec(8, "humming", 100.0, marks="*"),
            _rec(8, "vllm_marlin", None, nrmse=0.3), _rec(8, "w4a16_moe_fused", 99.0, source="w4a16_moe bench")]
    md = records.markdown(recs, title="t")
    lines = md.splitlines()
    hdr = next(line for line in lines if line.startswith("| tokens | floor_eff"))
    assert hdr.split(" | ")[2:] == ["w4a16_moe us (x floor_eff)", "w4a16_moe_fused us (x floor_eff)",
                                    "humming us (x floor_eff)", "vllm_marlin us (x floor_eff)",
                                    "dense_bf16 us (x floor_eff)", "w4a16_moe / best peer",
                                    "w4a16_moe_fused / best peer |"]
    row1 = next(line for line in lines if line.startswith("| 1 | 50.0 |"))
    assert "45.0 (0.90x)" in row1 and "60.0+ (1.20x)" in row1 and "0.90 humming" in row1
    row8 = next(line for line in lines if line.startswith("| 8 | 50.0 |"))
    assert "FAIL" in row8 and "1.20* humming" in row8 and "0.99*\u2020 humming" in row8
    assert "`*`" in md and "`\u2020`" in md and "NRMSE" in md
    no_peer = records.markdown([_rec(1, "w4a16_moe", 45.0), _rec(1, "dense_bf16", 90.0)])
    assert "/ best peer" not in no_peer


def test_plot_without_matplotlib_says_so(tmp_path):
    msgs = []
    ok = records.write_plot([_rec(1, "w4a16_moe", 45.0)], str(tmp_path / "p.png"), log=msgs.append)
    if ok:
        assert (tmp_path / "p.png").stat().st_size > 0
    else:
        assert "matplotlib" in msgs[0] and not (tmp_path / "p.png").exists()


# ------------------------------------------------------------------------------------------ merge
def _synthetic_peer_json():
    """What peer_bench.py's JSON writer produces for a two-row run (the fields the merge tool reads)."""
    def imp(us, nr=0.005, **kw):
        d = {"nrmse": nr, "nrmse_pass": float(nr) < 0.02, "samples_us": [us, us + 1, us - 1] if us else [],
             "median_us": us, "x_floor_eff": us / 50.0 if us else None}
        d.update(kw)
        return {k: v for k, v in d.items() if v is not None}

    return {
        "tool": "peer_bench",
        "layer": {"E_local": 20, "E_global": 160, "H": 5120, "I": 1536, "topk": 8, "g": 128, "preset": "glm45-ep8",
                  "what": "GLM-4.5", "name": "glm45-ep8", "dtype": "bfloat16"},
        "args": {"tokens": [1, 8, 64], "impls": list(records.IMPLS),
                 "argv": ["peer_bench.py", "--preset", "glm45-ep8"]},
        "env": {"torch": "2.11.0", "triton": "3.6.0", "tool": "1.0", "gpu": "NVIDIA H200", "cuda": "13.0",
                "staged": {"revision": "0266000", "dirty_files": 2, "date": "2026-12-01T07:00Z"}},
        "impls": {"w4a16_moe": {"version": "0.5", "marks": ""}, "w4a16_moe_fused": {"marks": ""},
                  "humming": {"humming": "0.1.19", "marks": "*"}, "dense_bf16": {"marks": ""}},
        "skipped": {"vllm_marlin": "load/setup failed: ImportError: no _moe_C"},
        "warnings": ["humming without _moe_C"],
        "rows": [
            {"tokens": 1, "n_hit": 1, "n_local_routes": 1, "floor_us": 4.0, "floor_eff_us": 6.0, "bound": "mem",
             "impls": {"w4a16_moe": imp(20.0, provider="cute"), "w4a16_moe_fused": imp(19.0, provider="cute"),
                       "humming": imp(25.0), "dense_bf16": imp(60.0)}},
            {"tokens": 8, "n_hit": 2, "n_local_routes": 2, "floor_us": 30.0, "floor_eff_us": 30.0, "bound": "mem",
             "impls": {"w4a16_moe": imp(40.0, provider="triton", partial=True), "w4a16_moe_fused": imp(None, "nan"),
                       "humming": imp(50.0), "dense_bf16": imp(None, error="RuntimeError: oom")}},
        ],
        "not_measured": [64], "stopped": "deadline 500 s", "resume_hint": "--resume-from 64",
    }


def test_merge_peer_json(tmp_path):
    p = tmp_path / "glm45-ep8.json"
    p.write_text(json.dumps(_synthetic_peer_json()))
    recs, notes = merge.load(str(p), "2026-12-01")
    records.check_records(recs)
    by = {(r["tokens"], r["impl"]): r for r in recs}
    assert len(recs) == 8 and all(r["layer"] == "glm45-ep8" and r["dtype"] == "bf16" for r in recs)
    r = by[(1, "w4a16_moe")]
    assert (r["median_us"], r["floor_eff_us"], r["nrmse"], r["device"], r["revision"], r["scheme"], r["marks"]) == \
        (20.0, 6.0, 0.005, "NVIDIA H200", "0266000+dirty", "int4_g128", "")
    assert by[(1, "humming")]["marks"] == "*" and by[(1, "humming")]["versions"]["humming"] == "0.1.19"
    assert by[(8, "w4a16_moe")]["marks"] == "^~" and by[(8, "w4a16_moe")]["provider"] == "triton"
    f8 = by[(8, "w4a16_moe_fused")]
    assert f8["median_us"] is None and f8["nrmse"] is None and "non-finite" in f8["error"]
    assert by[(8, "dense_bf16")]["error"] == "RuntimeError: oom"
    texts = [t for _, t in notes]
    assert any("skipped `vllm_marlin`" in t for t in texts) and any("--resume-from 64" in t for t in texts)

    # the project's records for the same layer: a later file replaces the same (tokens, impl), adds the rest
    ours = [_rec(8, "w4a16_moe", 35.0, source="w4a16_moe bench", date="2026-12-02T01:00:00+00:00"),
            _rec(8, "w4a16_moe_triton", 70.0, source="w4a16_moe bench", date="2026-12-02T01:00:00+00:00")]
    q = tmp_path / "ours.json"
    records.write_json(ours, str(q))
    assert merge.main([str(tmp_path / "docs"), str(p), str(q), "--date", "2026-12-01"]) == 0
    out = tmp_path / "docs" / "2026-12-01"
    got = json.loads((out / "glm45-ep8.json").read_text())
    records.check_records(got)
    assert [r["tokens"] for r in got] == sorted(r["tokens"] for r in got)
    gb = {(r["tokens"], r["impl"]): r for r in got}
    assert gb[(8, "w4a16_moe")]["median_us"] == 35.0 and (8, "w4a16_moe_triton") in gb and len(got) == 9
    md = (out / "glm45-ep8.md").read_text()
    assert "| 1 | 6.0 |" in md and "0.80* humming" in md and "skipped `vllm_marlin`" in md
    assert "0.70*\u2020 humming" in md  # ours from another source against humming from the peers tool


def test_merge_real_peer_bench_output(peer_bench, tmp_path):
    """The peers tool's own run() and JSON writer on a tiny CPU layer (dense_bf16, a stand-in timer)."""
    cfg = dict(E_local=4, E_global=16, H=256, I=128, topk=4, g=128, preset=None, what="cpu")
    a = peer_bench.Args()
    a.tokens, a.impls, a.samples, a.rep, a.deadline, a.resume_from = [1, 5], ["dense_bf16"], 3, 1, 0, None
    a.seed, a.no_time, a.w4a16_backend, a.torch_dtype, a.argv = SEED, False, "auto", torch.bfloat16, ["peer_bench.py"]
    ticks = iter(range(100))
    path = str(tmp_path / "peer.json")
    peer_bench.run(cfg, a, device="cpu", timer=lambda fn, rep: (fn(), 10.0 + next(ticks))[1], out_json=path)
    recs, _ = merge.load(path)
    records.check_records(recs)
    assert [(r["layer"], r["tokens"], r["impl"]) for r in recs] == [("E4-H256-I128-k4-of16-g128", 1, "dense_bf16"),
                                                                     ("E4-H256-I128-k4-of16-g128", 5, "dense_bf16")]
    assert [r["median_us"] for r in recs] == [11.0, 14.0] and all(r["nrmse"] < 0.02 for r in recs)
    assert merge.write_outputs(recs, str(tmp_path / "o"), date="2026-12-01", log=lambda m: None)[:2] == [
        str(tmp_path / "o" / "2026-12-01" / "E4-H256-I128-k4-of16-g128.json"),
        str(tmp_path / "o" / "2026-12-01" / "E4-H256-I128-k4-of16-g128.md")]


def test_merge_reads_older_bench_json(tmp_path):
    old = {"meta": {"workload": "kimi-tp8", "device": "NVIDIA H200", "revision": "15a6e92", "date": "2026-11-30"},
           "records": [{"workload": "kimi-tp8", "tokens": 1, "provider": "cute", "median_us": 12.3, "samples_us": [],
                        "floor_us": 5.8, "floor_eff_us": 6.0, "nrmse": 0.005}]}
    p = tmp_path / "w1.json"
    p.write_text(json.dumps(old))
    recs, _ = merge.load(str(p))
    assert (recs[0]["layer"], recs[0]["impl"], recs[0]["revision"]) == ("kimi-tp8", "w4a16_moe", "15a6e92")


# ------------------------------------------------------------------------------------------ the whole run
@pytest.mark.parametrize("activation", ["swiglu", "relu2"])
def test_run_bench_off_the_gpu(tmp_path, activation):
    """``run_bench`` on the CPU with a stand-in timer: dense_bf16 passes the NRMSE check and is timed in
    alternating order, GPU providers are reported as errors; the records, markdown and JSON writers agree."""
    from w4a16_moe.bench.run import run_bench, write_markdown

    wl, _ = build_workload(layer="4,256,128,2,8", group=32, activation=activation)
    ticks = iter(range(1000))
    res = run_bench(wl, ["cute", "dense-bf16"], [3, 16], device="cpu", log=lambda m: None,
                    timer=lambda fn: (fn(), 10.0 + next(ticks))[1])
    recs = records.check_records(res["records"])
    assert [(r["tokens"], r["impl"]) for r in recs] == [(3, "w4a16_moe"), (3, "dense_bf16"), (16, "w4a16_moe"),
                                                         (16, "dense_bf16")]
    dense = [r for r in recs if r["impl"] == "dense_bf16"]
    assert all(r["nrmse"] < 0.02 and len(r["samples_us"]) == 3 and r["device"] == "cpu" for r in dense)
    assert [r["median_us"] for r in dense] == [11.0, 14.0]
    assert all(r["median_us"] is None and "CUDA" in r["error"] for r in recs if r["impl"] == "w4a16_moe")
    records.write_json(recs, str(tmp_path / "r.json"))
    assert json.loads((tmp_path / "r.json").read_text()) == recs
    write_markdown(res, str(tmp_path / "r.md"))
    md = (tmp_path / "r.md").read_text()
    assert "| 16 |" in md and "ERR" in md and "command:" in md


def test_list_presets_prints_what_the_peers_tool_prints(peer_bench, capsys):
    from w4a16_moe.bench.run import main

    assert peer_bench.main(["--list-presets"]) == 0
    theirs = capsys.readouterr().out
    assert main(["--list-presets"]) == 0
    ours = capsys.readouterr().out.splitlines()
    n = len(INT4_PRESETS)
    assert "\n".join(ours[:n]) + "\n" == theirs  # the peers tool's presets, as it prints them
    assert ours[n:] == ["gpt-oss-120b         --layer 128,2880,2880,4 --scheme mxfp4 --activation swiglu_oai +biases"
                        "   gpt-oss-120b MoE layer, whole (MXFP4, per-expert biases, swiglu_oai)"]


# ------------------------------------------------------------------------------------------ standing
def _standing_rec(layer, tokens, impl, us, run_device="NVIDIA H200", dtype="bf16", revision="abc1234"):
    return {"layer": layer, "tokens": tokens, "impl": impl, "median_us": us, "floor_eff_us": 6.0, "nrmse": 0.004,
            "device": run_device, "revision": revision, "dtype": dtype}


@pytest.mark.parametrize("device", ["H200", "H100"])
def test_standing_takes_each_row_from_the_latest_run_on_the_device(tmp_path, device, capsys):
    from w4a16_moe.bench import standing

    old, new = tmp_path / "2026-12-04", tmp_path / "2026-12-04b"
    old.mkdir(), new.mkdir()
    (old / "w1.json").write_text(json.dumps([
        _standing_rec("w1", 1, "w4a16_moe", 12.0), _standing_rec("w1", 1, "humming", 10.0),       # behind, replaced below
        _standing_rec("w1", 8, "w4a16_moe", 50.0), _standing_rec("w1", 8, "humming", 60.0), _standing_rec("w1", 8, "vllm_marlin", 40.0),
        _standing_rec("w1", 1, "w4a16_moe", 9.0, dtype="fp16"), _standing_rec("w1", 1, "humming", 10.0, dtype="fp16"),
        _standing_rec("w1", 64, "w4a16_moe", 90.0, run_device="NVIDIA H100 80GB HBM3"),
        _standing_rec("w1", 64, "humming", 100.0, run_device="NVIDIA H100 80GB HBM3"),
        _standing_rec("w1", 16, "w4a16_moe", 20.0),                                        # no peer: not a row
    ]))
    (new / "w1.json").write_text(json.dumps([
        _standing_rec("w1", 1, "w4a16_moe", 8.0, revision="def5678"), _standing_rec("w1", 1, "humming", 10.0),
        _standing_rec("w1", 8, "w4a16_moe", None), _standing_rec("w1", 8, "humming", 55.0),       # failed row: keeps the old run's
    ]))
    (new / "notes.md").write_text("not a record file")
    rows = standing.latest_rows(str(tmp_path), device)
    got = {(r["dtype"], r["tokens"]): (r["run"], r["peer"], round(r["ratio"], 3)) for r in rows}
    if device == "H100":
        assert got == {("bf16", 64): ("2026-12-04", "humming", 0.9)}
        return
    assert got == {("bf16", 1): ("2026-12-04b", "humming", 0.8), ("bf16", 8): ("2026-12-04", "vllm_marlin", 1.25),
                   ("fp16", 1): ("2026-12-04", "humming", 0.9)}
    summary = {(s["layer"], s["dtype"]): s for s in standing.summarize(rows)}
    bf16 = summary[("w1", "bf16")]
    assert (bf16["rows"], bf16["ahead"], [r["tokens"] for r in bf16["behind"]]) == (2, 1, [8])
    assert bf16["runs"] == ["2026-12-04", "2026-12-04b"] and bf16["best"] == pytest.approx(0.8)
    assert standing.latest_rows(str(tmp_path), device, peers=["humming"])[1]["peer"] == "humming"
    assert standing.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "8 tokens 1.250 (2026-12-04)" in out and "2 of 3 rows ahead" in out


def test_standing_refuses_a_missing_directory(tmp_path):
    from w4a16_moe.bench import standing

    with pytest.raises(SystemExit):
        standing.main([str(tmp_path / "nope")])


def test_standing_floor_takes_the_targets_by_bound(tmp_path, capsys):
    from w4a16_moe.bench import standing

    old, new = tmp_path / "2026-12-04", tmp_path / "2026-12-04b"
    old.mkdir(), new.mkdir()

    def rec(t, us, floor, bound, device="NVIDIA H200", impl="w4a16_moe"):
        r = _standing_rec("w1", t, impl, us, run_device=device)
        r.update(floor_eff_us=floor, bound=bound)
        return r

    (old / "w1.json").write_text(json.dumps([
        rec(1, 20.0, 10.0, "mem"),                        # 2.0 > 1.5: replaced by the newer run below
        rec(8, 14.0, 10.0, "mem"),                        # 1.4 <= 1.5
        rec(2048, 140.0, 100.0, "flop"),                  # 1.4 > 1.35
        rec(4096, 130.0, 100.0, None),                    # no bound: memory-bound, 1.3 <= 1.5
        rec(64, 30.0, 10.0, "mem", impl="humming"),       # a peer: not the project's row
        rec(16, 30.0, 10.0, "mem", device="NVIDIA H100 80GB HBM3"),
    ]))
    (new / "w1.json").write_text(json.dumps([rec(1, 12.0, 10.0, "mem")]))
    rows = standing.floor_rows(str(tmp_path), "H200")
    got = {r["tokens"]: (r["run"], r["target"], round(r["ratio"], 2)) for r in rows}
    assert got == {1: ("2026-12-04b", 1.5, 1.2), 8: ("2026-12-04", 1.5, 1.4), 2048: ("2026-12-04", 1.35, 1.4),
                   4096: ("2026-12-04", 1.5, 1.3)}
    (s,) = standing.summarize_floor(rows)
    assert (s["rows"], s["met"], [r["tokens"] for r in s["misses"]]) == (4, 3, [2048])
    assert standing.main([str(tmp_path), "--floor"]) == 0
    out = capsys.readouterr().out
    assert "2048 tokens 1.40 (flop)" in out and "3 of 4 rows within the floor target" in out
    assert [r["tokens"] for r in standing.floor_rows(str(tmp_path), "H100")] == [16]

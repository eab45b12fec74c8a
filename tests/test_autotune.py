"""The autotuner and its store: persistence (keys, versions, concurrent writers, corrupted files), the
selection order of the CuTe plan (overrides, then a stored row, then the tuned table, then the rule), the
budget logic with a fake clock, candidate enumeration, and that warmup refuses to tune inside capture.
The GPU test tunes one small layer for real."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp

import pytest
import torch

from conftest import nrmse, random_routing, random_weights
from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import autotune, autotune_store as store, choice_plan, overrides, provider
from w4a16_moe.kernels.cute.autotune_store import Choice, LayerKey, Row
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90.tuned import candidate_name
from w4a16_moe.validate import MoECall

_REAL_STORE_DIR = store.store_dir
H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)
W1 = dict(experts=384, hidden=7168, intermediate=256, scheme="int4_g32", top_k=8)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    # results in a temp dir (the JIT cache stays where it is: the GPU test compiles nothing twice)
    monkeypatch.setattr(store, "store_dir", lambda: tmp_path / "autotune")
    monkeypatch.delenv("W4A16_MOE_CUTE_DECODE", raising=False)
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("W4A16_MOE_CUTE_FAMILY", raising=False)
    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    store.reload()
    provider.clear_plans()
    yield
    store.reload()
    provider.clear_plans()


def _key(finalize="deterministic", gpu="NVIDIA H200", dtype="bf16", **kw):
    L = dict(W1, **kw)
    return LayerKey(gpu, L["experts"], L["hidden"], L["intermediate"], L["scheme"], dtype, L["top_k"], "swiglu",
                    finalize)


def _call(tokens, finalize="deterministic", routes_only=False, dtype=torch.bfloat16, **kw):
    L = dict(W1, **kw)
    return MoECall(tokens, L["top_k"], L["hidden"], L["intermediate"], L["experts"], dtype, torch.device("cuda"),
                   get_activation("swiglu"), finalize, 0, L["scheme"], routes_only)


T8 = candidate_name(fam.CANDIDATES[0])
T128 = candidate_name(fam.CANDIDATES[4])


# ------------------------------------------------------------------------------------------------------
# persistence
# ------------------------------------------------------------------------------------------------------
def test_key_text_and_file_name():
    k = _key()
    assert k.text() == "NVIDIA H200|e384_h7168_i256|int4_g32|bf16|k8|swiglu|deterministic"
    assert k.filename().startswith("nvidia-h200-e384-h7168-i256-int4_g32-bf16-k8-swiglu-deterministic-")
    assert len({_key().filename(), _key("fused").filename(), _key(gpu="NVIDIA H100").filename(),
                _key(dtype="fp16").filename(), _key(top_k=6).filename()}) == 5
    from w4a16_moe.loader import jit_cache

    assert _REAL_STORE_DIR() == jit_cache.cache_dir() / "autotune"


def test_round_trip_and_merge(tmp_path):
    k = _key()
    r1 = Row(1, Choice("decode", "w8u8/w8u4"), Choice("sm90", T8, 4), 10.0, 12.0, True)
    r2 = Row(64, Choice("sm90", T128, None), Choice("sm90", T128, None), 50.0, 50.0, False)
    p = store.update(k, [r1], [1, 2, 4], root=tmp_path)
    store.update(k, [r2], [64], root=tmp_path)
    ent = store.read_entry(k, root=tmp_path)
    assert ent["grid"] == [1, 2, 4, 64] and ent["rows"] == {1: r1, 64: r2}
    raw = json.loads(p.read_text())
    assert raw["key"] == k.text() and raw["versions"] == store.running_versions()
    assert {"w4a16_moe", "torch", "nvidia-cutlass-dsl", "source:sm90", "source:decode", "source:warp"} <= set(
        raw["versions"])
    assert not list(tmp_path.glob(".tmp-*"))  # the temp file was renamed into place


def test_other_versions_are_ignored(tmp_path, caplog):
    k = _key()
    store.update(k, [Row(1, Choice("sm90", T8, 1), Choice("sm90", T8, 1))], [1], root=tmp_path)
    other = dict(store.running_versions(), **{"source:sm90": "0000000000000000"})
    with caplog.at_level(logging.INFO, logger="w4a16_moe"):
        assert store.read_entry(k, root=tmp_path, versions=other) is None
    assert any("other versions" in m and "source:sm90" in m for m in caplog.messages)
    p = store.path_for(k, tmp_path)
    raw = json.loads(p.read_text())
    raw["versions"]["torch"] = "0.0"
    p.write_text(json.dumps(raw))
    assert store.read_entry(k, root=tmp_path) is None
    # the next tuning replaces the stale entry instead of merging with it
    store.update(k, [Row(2, Choice("sm90", T8, 2), None)], [2], root=tmp_path)
    assert set(store.read_entry(k, root=tmp_path)["rows"]) == {2}


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": 99}), json.dumps([1, 2]),
                                  json.dumps({"format": 1, "key": "other"})])
def test_corrupted_file_is_ignored_with_a_warning(tmp_path, caplog, text):
    k = _key()
    p = store.path_for(k, tmp_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    with caplog.at_level(logging.WARNING, logger="w4a16_moe"):
        assert store.read_entry(k, root=tmp_path) is None
    assert any("malformed" in m for m in caplog.messages)
    store.update(k, [Row(1, Choice("sm90", T8, 1), None)], [1], root=tmp_path)  # and is replaced
    assert set(store.read_entry(k, root=tmp_path)["rows"]) == {1}


def test_bad_row_is_ignored_with_a_warning(tmp_path, caplog):
    k = _key()
    store.update(k, [Row(1, Choice("sm90", T8, 1), None)], [1], root=tmp_path)
    p = store.path_for(k, tmp_path)
    raw = json.loads(p.read_text())
    raw["rows"][0]["best"]["splits"] = "two"
    p.write_text(json.dumps(raw))
    with caplog.at_level(logging.WARNING, logger="w4a16_moe"):
        assert store.read_entry(k, root=tmp_path) is None
    assert any("splits" in m for m in caplog.messages)


def _writer(root, tokens):
    from w4a16_moe.kernels.cute import autotune_store as st

    k = _key()
    for t in tokens:
        st.update(k, [Row(t, Choice("sm90", T8, t % 8 + 1), None, float(t))], [t], root=root)
        ent = st.read_entry(k, root=root)  # readers never see a partial file
        assert ent is not None and t in ent["rows"]


def test_concurrent_writers_lose_nothing(tmp_path):
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(tmp_path, range(w + 1, 41, 4))) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ent = store.read_entry(_key(), root=tmp_path)
    assert sorted(ent["rows"]) == list(range(1, 41)) and ent["grid"] == list(range(1, 41))
    assert all(ent["rows"][t].us == float(t) for t in range(1, 41))


def test_lookup_follows_the_grid(tmp_path):
    k = _key()
    store.update(k, [Row(1, Choice("sm90", T8, 1), None), Row(16, Choice("sm90", T128, 2), None)], [1, 2, 16, 64])
    assert store.lookup(k, 1)[0].tokens == 1
    assert store.lookup(k, 2) is None  # a grid point the budget did not reach: no row
    assert store.lookup(k, 40)[0].tokens == 16
    assert store.lookup(k, 64) is None and store.lookup(k, 9000) is None
    with store.bypass():
        assert store.lookup(k, 16) is None


# ------------------------------------------------------------------------------------------------------
# selection order
# ------------------------------------------------------------------------------------------------------
def test_plan_uses_the_stored_row_and_says_so():
    call = _call(2048)
    tuned = provider.plan(call, H200)  # W1 has tuned-table rows
    assert "autotuned" not in tuned.note
    store.update(_key(), [Row(1024, Choice("sm90", T128, 2), Choice("sm90", T128, 2), 99.0, 99.0)], [1024, 4096])
    p = provider.plan(call, H200)  # no clear_plans: the plan cache sees the new generation
    assert p is not tuned and dict(p.tiles) == fam.CANDIDATES[4] and p.splits == (2, 2)
    assert "autotuned row T=1024" in p.note and "autotuned" in p.describe()
    # the overrides still come first
    with overrides.forced(0, 1):
        f = provider.plan(call, H200)
        assert dict(f.tiles) == fam.CANDIDATES[0] and "autotuned" not in f.note
    # past the tuned grid point without a row: the tuned table again
    q = provider.plan(_call(4096), H200)
    assert "autotuned" not in q.note
    # another finalize mode / dtype / GPU has its own entry
    assert "autotuned" not in provider.plan(_call(2048, "fused"), H200).note
    assert "autotuned" not in provider.plan(_call(2048, dtype=torch.float16), H200).note


def test_stored_decode_row():
    store.update(_key(), [Row(4, Choice("decode", "w4u8/w4u4"), Choice("sm90", T8, 4), 20.0, 25.0)], [4, 8])
    p = provider.plan(_call(4), H200)
    assert p.decode and p.family == "decode" and "autotuned" in p.note
    assert p.configs[0].warps == 4 and p.configs[0].unroll == 8
    # expert-parallel halves never decode: the row's grouped choice
    g = provider.plan(_call(4, routes_only=True), H200)
    assert not g.decode and dict(g.tiles) == fam.CANDIDATES[0] and g.splits == (4, 4)
    from w4a16_moe import settings

    with settings.override(cute_decode="0"):
        assert not provider.plan(_call(4), H200).decode
    with settings.override(batch_invariant=True):
        b = provider.plan(_call(4), H200)
        assert not b.decode and b.splits == (1, 1)


def test_row_the_device_cannot_run_falls_back():
    store.update(_key(), [Row(1, Choice("sm90", "t999_nonsense", 1), None)], [1])
    assert "autotuned" not in provider.plan(_call(1), H200).note
    from w4a16_moe import settings

    provider.clear_plans()
    store.update(_key(), [Row(1, Choice("warp", candidate_name(autotune_warp_tiles()[0]), 2), None)], [1])
    assert provider.plan(_call(1), H200).family == "warp"
    with settings.override(cute_family="sm90"):  # forced family: a warp row is not taken
        assert provider.plan(_call(1), H200).family != "warp"


def autotune_warp_tiles():
    from w4a16_moe.kernels.cute.warp import family as warp

    return [t for _, t in warp.TILES]


# ------------------------------------------------------------------------------------------------------
# budget and candidates
# ------------------------------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_budget_shares_and_stops():
    clock = FakeClock()
    b = autotune.Budget(12.0, clock)
    assert b.share(4) == pytest.approx(3.0)
    clock.now = 6.0
    assert b.left() == pytest.approx(6.0) and b.share(2) == pytest.approx(9.0) and not b.expired()
    clock.now = 12.0
    assert b.expired() and b.left() == 0.0
    with pytest.raises(ValueError, match="budget"):
        autotune.Budget(0, clock)


def test_select_rows_with_a_fake_timer():
    clock = FakeClock()
    dflt = Choice("sm90", T8, None)
    cands = [Choice("decode", ""), Choice("sm90", T8, 1), Choice("sm90", T8, 2), dflt, Choice("sm90", T128, 4)]
    timed = []

    def measure(t, c):
        clock.now += 1.0  # each candidate costs one second
        timed.append((t, c))
        if c == Choice("sm90", T8, 2):
            return None  # failed its NRMSE check
        return {dflt: 10.0, Choice("decode", ""): 5.0 if t == 1 else 50.0}.get(c, 20.0)

    rows = autotune.select_rows([1, 2, 4, 8, 16], lambda t: (dflt, cands), measure, autotune.Budget(12.5, clock))
    # T=1 gets 2.5 s -> default + 2 more (started before its deadline), stops: 3 s used
    assert [c for t, c in timed if t == 1] == [dflt, cands[0], cands[1]]
    assert rows[0] == Row(1, cands[0], dflt, 5.0, 10.0, False)  # decode fastest, default the best grouped
    firsts = {}
    for t, c in timed:
        firsts.setdefault(t, c)
    assert all(c == dflt for c in firsts.values())  # every token count measures its default first
    assert {r.tokens for r in rows} <= {1, 2, 4, 8, 16} and all(r.best == dflt for r in rows[1:])
    # the budget ran out: tuning stopped, what was measured is kept, the rest left to the defaults
    assert clock.now <= 12.5 + 5
    assert rows[-1].tokens < 16 or not rows[-1].complete
    # a generous budget measures every candidate
    clock.now, timed[:] = 0.0, []
    rows = autotune.select_rows([1, 2], lambda t: (dflt, cands), measure, autotune.Budget(100, clock))
    assert all(r.complete for r in rows) and len(timed) == 2 * len(cands)
    assert rows[1].best == dflt and rows[1].grouped == dflt


def test_token_grid():
    assert autotune.token_grid(8192) == list(autotune.GRID)
    assert autotune.token_grid(100) == [1, 2, 4, 8, 16, 32, 64]


def test_candidates_only_what_the_loader_has():
    call = _call(4)
    every = autotune.candidates(call, H200, status=lambda spec, arch: ("prebuilt", ""))
    fams = {c.family for c in every}
    assert fams == {"decode", "sm90", "warp"}
    from w4a16_moe.kernels.cute.decode.family import default_knob_sets

    assert all(Choice("decode", kn) in every for kn in default_knob_sets(False))  # W1: INT4 g32, 16-bit scales
    g128 = autotune.candidates(_call(4, scheme="int4_g128"), H200, status=lambda spec, arch: ("prebuilt", ""))
    assert all(Choice("decode", kn) in g128 for kn in default_knob_sets(True)) and Choice("decode", "") not in g128
    assert len(every) == len(set(every))
    # one per distinct plan: split-K choices that give the same plan are timed once
    plans = [choice_plan.plan_of_choice(call, H200, c) for c in every]
    assert len({(p.family, p.configs, p.splits) for p in plans}) == len(plans)
    assert autotune.candidates(call, H200, status=lambda spec, arch: ("jit", "")) == []
    assert autotune.candidates(call, H200, allow_jit=True, status=lambda s, a: ("jit", ""))
    only_cached = autotune.candidates(call, H200, status=lambda s, a: (
        "jit-cache" if s.family != "warp_w4a16_gemm" else None, ""))
    assert {c.family for c in only_cached} == {"decode", "sm90"}
    # decode candidates only at small route counts
    assert not any(c.decode for c in autotune.candidates(_call(512), H200, status=lambda s, a: ("prebuilt", "")))


def test_decode_candidates_include_the_k_splits():
    call = _call(1, scheme="nvfp4")  # FP4 weights: the 16-bit-scale knob sets, KNOBS the plain one
    every = autotune.candidates(call, H200, status=lambda spec, arch: ("prebuilt", ""))
    dec = [c for c in every if c.decode]
    # the rule's split (2/1 here) and the forced ones 1, 2, 4, 8
    splits = {choice_plan.plan_of_choice(call, H200, c).splits for c in dec}
    assert {(2, 1), (1, 1), (2, 2), (4, 4), (8, 8)} <= splits
    assert Choice("decode", "w8u8s4/w8u4s4") in every and Choice("decode", "w8u8s2/w8u4s2") in every
    # a forced split equal to the rule's (1/1 at two tokens) is the rule's plan: timed once
    two = autotune.candidates(_call(2, scheme="nvfp4"), H200, status=lambda spec, arch: ("prebuilt", ""))
    assert choice_plan.plan_of_choice(_call(2, scheme="nvfp4"), H200, Choice("decode", "")).splits == (1, 1)
    assert Choice("decode", "") in two and Choice("decode", "w8u8s1/w8u4s1") not in two
    assert autotune.with_decode_split("w8u4/w8u2p0", 4) == "w8u4s4/w8u2s4p0"
    assert autotune.with_decode_split("w16u2", None) == "w16u2"
    assert autotune.with_decode_split("", 2) == "w8u8s2/w8u4s2"
    # a stored decode choice with a split round-trips through the knob text
    from w4a16_moe.kernels.cute.decode import family as dec_family

    assert autotune._knob_text(dec_family.knob_items("w4u8c5s2/w4u4c3s3p0")) == "w4u8c5s2/w4u4c3s3p0"


@pytest.mark.parametrize("tokens", [1, 4, 64, 2048])
def test_default_choice_reproduces_the_plan(tokens):
    for layer in (W1, dict(experts=8, hidden=2048, intermediate=1024, scheme="int4_g128", top_k=2)):
        call = _call(tokens, **layer)
        c = autotune._default_choice(call, H200)
        want, got = provider.plan(call, H200), choice_plan.plan_of_choice(call, H200, c)
        assert (got.family, got.configs, got.splits) == (want.family, want.configs, want.splits), (layer, tokens)


@pytest.mark.parametrize("tokens", [8, 16, 64])
def test_default_choice_of_a_tile_loop_plan(tokens):
    """On an expert-parallel rank at decode sizes the selection takes the warp-MMA tile-loop kernels
    (``W4A16_MOE_TILE_LOOP=auto``); the default choice names the candidate tile (the loop is the plan's, not the
    tile's), so the tuner, the sweeps and the explorer time it and mark it as the default."""
    call = MoECall(tokens, 8, 7168, 2048, 32, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                   "deterministic", 0, "int4_g128", global_experts=256)
    want = provider.plan(call, H200)
    assert want.family == "warp" and all(c.tile_loop for c in want.configs), want.configs
    assert want.grid_tiles > 0 and "tile_loop" not in dict(want.tiles)  # the loop is the plan's, not the tile's
    c = autotune._default_choice(call, H200)
    assert c.candidate in store.candidate_tiles("warp"), c
    got = choice_plan.plan_of_choice(call, H200, c)
    assert (got.family, got.configs, got.splits) == (want.family, want.configs, want.splits)


# ------------------------------------------------------------------------------------------------------
# warmup
# ------------------------------------------------------------------------------------------------------
def test_warmup_refuses_to_tune_inside_capture(monkeypatch):
    import w4a16_moe

    w = random_weights("int4_g128", 4, 256, 256)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="cannot autotune inside CUDA-graph capture"):
        w4a16_moe.warmup(w, autotune=True, top_k=2, max_tokens=4)
    monkeypatch.setenv("W4A16_MOE_AUTOTUNE", "1")  # the setting is the default
    with pytest.raises(RuntimeError, match="cannot autotune inside CUDA-graph capture"):
        w4a16_moe.warmup(w, top_k=2, max_tokens=4)


def test_warmup_checks_the_budget():
    import w4a16_moe

    w = random_weights("int4_g128", 4, 256, 256)
    with pytest.raises(ValueError, match="autotune_budget_s"):
        w4a16_moe.warmup(w, autotune=True, autotune_budget_s=0, top_k=2, max_tokens=4)


@pytest.mark.gpu
def test_autotune_one_small_layer_on_the_gpu():
    import w4a16_moe
    from w4a16_moe.device import probe

    w = random_weights("int4_g128", 8, 1024, 512, dtype=torch.bfloat16, device="cuda", seed=3)
    w4a16_moe.warmup(w, dtype=torch.bfloat16, top_k=2, max_tokens=64, finalize="deterministic", autotune=True,
                     autotune_budget_s=10)
    key = LayerKey(probe(w.device).name, 8, 1024, 512, "int4_g128", "bf16", 2, "swiglu", "deterministic")
    ent = store.read_entry(key)
    assert ent is not None and 1 in ent["rows"]
    for t in (1, 16):
        call = MoECall(t, 2, 1024, 512, 8, torch.bfloat16, w.device, get_activation("swiglu"), "deterministic", 0,
                       "int4_g128")
        if t not in ent["rows"]:
            continue
        p = provider.plan(call, probe(w.device))
        assert "autotuned" in p.note, p.describe()
        x = torch.randn(t, 1024, device="cuda", dtype=torch.bfloat16)
        tw, ids = random_routing(t, 2, 8, seed=t, device="cuda")
        out = w4a16_moe.fused_moe(x, w, tw, ids, backend="cute")
        assert nrmse(out, w4a16_moe.reference_moe(x, w, tw, ids)) < 0.02


@pytest.mark.usefixtures("tuned_rows_current")
def test_plan_notes_say_where_a_choice_came_from():
    assert provider.plan(_call(2048), H200).note == "tuned row T=2048"  # W1: the tuned table
    assert "tuned bound 128 routes" in provider.plan(_call(4), H200).note
    other = dict(experts=8, hidden=2048, intermediate=1024, scheme="int4_g128", top_k=2)
    assert provider.plan(_call(2048, **other), H200).note.startswith("cost model: ~")
    assert "cost model: re-read 1.00x" in provider.plan(_call(1, **other), H200).note
    assert provider.plan(_call(4, **other), H200).note.startswith("cost model: ~")  # re-read 1.46x: grouped GEMMs


def test_autotune_layer_end_to_end_with_fakes(monkeypatch):
    """The whole tuner off the GPU: fake device, kernels that write the reference (one candidate wrong, one
    wrong only after its timing replays), fake timings; rows are stored, the plans use them, and a second run
    measures nothing."""
    import w4a16_moe.device as device
    from w4a16_moe.reference import reference_moe

    w = random_weights("int4_g128", 8, 256, 256, dtype=torch.bfloat16)
    monkeypatch.setattr(device, "probe", lambda dev: H200)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    import w4a16_moe.loader as loader

    monkeypatch.setattr(loader, "kernel_status", lambda spec, arch: ("prebuilt", "fake"))
    fast = Choice("sm90", candidate_name(fam.TILES[3][1]), 2)
    seen, refs = [], {}

    def fake_run(x, weights, tw, ids, *, call, out, plan):
        seen.append(plan)
        key = (x.data_ptr(), tuple(x.shape))  # (the tuner frees one token count's inputs before the next's, so a
        if key not in refs:                    # later count's x can reuse the storage of an earlier one)
            refs.clear()
            refs[key] = reference_moe(x, weights, tw, ids)
        out.copy_(refs[key])
        if not plan.decode and dict(plan.tiles) == fam.CANDIDATES[1]:
            out.mul_(2)  # a wrong candidate: fails the NRMSE check

    sneaky = []  # the fastest plan of all, right alone, wrong when its calls run back to back

    def fake_time(fn, poison=None):
        p = seen[-1]
        if poison is not None:
            poison()  # the tuner poisons the output before one more replay and checks it after
            if p.configs == choice_plan.plan_of_choice(_small(1), H200, fast).configs and p.splits == (4, 4):
                sneaky.append(p)
                return 5.0  # (its replay "leaves NaN": not run)
            fn()
        if p.decode:
            return 30.0
        return 10.0 if choice_plan.plan_of_choice(_small(1), H200, fast).configs == p.configs and p.splits == (2, 2) \
            else 20.0

    def _small(t, fin="deterministic"):
        return MoECall(t, 2, 256, 256, 8, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"), fin, 0,
                       "int4_g128")

    monkeypatch.setattr(provider, "cute_fused_moe", fake_run)
    monkeypatch.setattr(autotune, "_time_us", fake_time)
    res = autotune.autotune_layer(w, torch.bfloat16, "swiglu", 2, 4, ("deterministic",), budget_s=60)
    assert set(res) == {"deterministic"}
    ent = store.read_entry(_key(experts=8, hidden=256, intermediate=256, scheme="int4_g128", top_k=2))
    assert sorted(ent["rows"]) == [1, 2, 4] and all(r.complete for r in ent["rows"].values())
    assert len(sneaky) >= 3  # timed at every token count, and skipped: the rows keep the fast plan
    for t, r in ent["rows"].items():  # the fast plan won (under whichever split-K argument gives it first)
        assert r.best == r.grouped and r.us == 10.0, r
        pb, pf = choice_plan.plan_of_choice(_small(t), H200, r.best), choice_plan.plan_of_choice(_small(t), H200, fast)
        assert (pb.configs, pb.splits) == (pf.configs, pf.splits), r
    assert not any(not p.decode and dict(p.tiles) == fam.CANDIDATES[1] for p in [
        choice_plan.plan_of_choice(_small(1), H200, r.best) for r in ent["rows"].values()])
    p = provider.plan(_small(3), H200)
    assert "autotuned row T=2" in p.note and dict(p.tiles) == fam.TILES[3][1] and p.splits == (2, 2)
    seen.clear()
    assert autotune.autotune_layer(w, torch.bfloat16, "swiglu", 2, 4, ("deterministic",), budget_s=60) == {}
    assert seen == []  # everything already tuned: nothing measured


def test_tuning_budget_leaves_the_reserve():
    from w4a16_moe.kernels.cute.autotune import WARMUP_RESERVE_S, tuning_budget

    assert tuning_budget(60.0, 2.0) == pytest.approx(60.0 - 2.0 - WARMUP_RESERVE_S)
    assert tuning_budget(60.0, 0.0) + WARMUP_RESERVE_S <= 60.0
    assert tuning_budget(4.0, 1.0) == pytest.approx(1.0)  # smaller than the reserve: a quarter of it


@pytest.mark.parametrize("intermediate,k64", [(256, False), (192, True)])
def test_candidates_take_the_warp_k64_twins_where_they_pad_less(intermediate, k64):
    """The warp TN 8 / 16 candidates at K tile 64 on a layer the K tile of 128 pads (``I = 192``), else at 128:
    one warp layout per layer, as the cost model chooses (sm90.family.k_tile_ok)."""
    from w4a16_moe.kernels.cute.warp import family as warp

    call = _call(64, intermediate=intermediate)
    warp_names = {c.candidate for c in autotune.candidates(call, H200, status=lambda spec, arch: ("prebuilt", ""))
                  if c.family == "warp"}
    for t in warp.K64_TILES:
        assert (candidate_name(t) in warp_names) is k64
        assert (candidate_name(warp.k128_twin(t)) in warp_names) is not k64


@pytest.mark.gpu
@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
def test_every_tuner_candidate_is_right_in_back_to_back_graph_replays(finalize):
    """Every candidate the tuner may time on the Qwen3-235B TP4 shard at 16 tokens (ping-pong down GEMMs at
    split-K 2 among them, whose unordered ring faulted: docs/perf/2026-12-07-autotune-behind), eager and as
    three calls captured in one CUDA graph, replayed twice, each output NaN-poisoned and checked against the
    FP32 reference: a candidate that is right alone but wrong or faulting back to back fails here."""
    from w4a16_moe.bench.layers import build_workload
    from w4a16_moe.bench.workloads import make_weights
    from w4a16_moe.device import probe
    from w4a16_moe.reference import reference_moe

    provider.clear_plans()
    wl, _ = build_workload(layer="128,4096,384,8", group=128)
    dev = torch.device("cuda")
    weights = make_weights(wl, torch.Generator(device=dev).manual_seed(1), dev)
    info = probe(dev)
    t = 16
    call = MoECall(t, wl.top_k, wl.hidden, wl.intermediate, wl.local_experts, wl.torch_dtype, dev,
                   get_activation("swiglu"), finalize, 0, weights.scheme.name)
    x, tw, ids = autotune._inputs(weights, t, wl.top_k, wl.torch_dtype, seed=1016)
    ref = reference_moe(x, weights, tw, ids).float()
    cands = autotune.candidates(call, info)
    assert len(cands) >= 20, "the GPU kit lacks the tuner's candidate kernels (scripts/device_specs.py)"
    bad = []
    for c in cands:
        p = choice_plan.plan_of_choice(call, info, c)
        if p is None:
            continue
        o = torch.full_like(x, float("nan"))
        provider.cute_fused_moe(x, weights, tw, ids, call=call, out=o, plan=p)
        torch.cuda.synchronize()
        errs = [autotune._nrmse(o, ref)]
        outs = [torch.full_like(x, float("nan")) for _ in range(3)]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            provider.cute_fused_moe(x, weights, tw, ids, call=call, out=outs[0], plan=p)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for o2 in outs:
                provider.cute_fused_moe(x, weights, tw, ids, call=call, out=o2, plan=p)
        for _ in range(2):
            for o2 in outs:
                o2.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            errs += [autotune._nrmse(o2, ref) for o2 in outs]
        del graph
        worst = max(errs)  # (infinite where NaN was left in an output)
        if not worst < autotune.MAX_NRMSE:
            bad.append((c.label(), worst))
    assert not bad, bad

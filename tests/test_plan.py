"""Plans on the CPU: the CuTe provider's plan of a grid of calls equals what the code of ed90ab0 chose
(tiles, family, split-K, decode or not, kernel configs), recorded in ``tests/data/plan_choices_ed90ab0.json``
from ``choose_with_family`` / ``use_decode`` / ``decode_bound`` / ``num_splits`` before the plan existed,
wherever a tuned-table row or the decode rule decides (rows added to the table since, ``ADDED``, select their
own tiles); calls no tuned row covers follow the current rule (the cost model for INT4, see ``sm90.family``);
split-K counts follow the current split rule (re-fitted after ed90ab0: ``tiles.split_k``) wherever a tuned row
does not fix them; and the tuned table converted to candidate names selects the same tile dicts as the
index-based one."""

from __future__ import annotations

import json
import os

import pytest
import torch

from w4a16_moe.activations import get_activation
from w4a16_moe.device import DeviceInfo
from w4a16_moe.kernels.cute import overrides, provider
from w4a16_moe.kernels.cute.sm90 import family as fam
from w4a16_moe.kernels.cute.sm90 import tuned
from w4a16_moe.validate import MaskedCall, MoECall

DATA = os.path.join(os.path.dirname(__file__), "data")
REC = json.load(open(os.path.join(DATA, "plan_choices_ed90ab0.json")))
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _kernels_anywhere(monkeypatch):
    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    monkeypatch.delenv("W4A16_MOE_CUTE_DECODE", raising=False)
    monkeypatch.delenv("W4A16_MOE_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("W4A16_MOE_CUTE_FAMILY", raising=False)
    provider.clear_plans()


def _info(layer):
    return DeviceInfo("cuda", REC["layers"][layer]["gpu"], (9, 0), 132)


def _routed(layer, tokens, finalize):
    L = REC["layers"][layer]
    return MoECall(tokens, L["k"], L["h"], L["i"], L["e"], DT[L["dt"]], torch.device("cuda"),
                   get_activation("swiglu"), finalize, 0, L["scheme"])


ROUTED = [r for r in REC["rows"] if "tokens" in r]
MASKED = [r for r in REC["rows"] if "masked_capacity" in r]


def _split_rule(p, r):
    """The current split-K rule's ``(up, down)`` parts for recorded call ``r`` with plan ``p``'s configs."""
    from w4a16_moe.kernels.cute import registry

    L = REC["layers"][r["layer"]]
    f = registry.get(p.family)
    up, down = p.configs
    rr = r["tokens"] * L["k"]
    n13 = 2 * L["i"]  # swiglu: gated
    return (f.num_splits(n13, L["h"], up, rr, L["e"], 132, L["k"]), f.num_splits(L["h"], L["i"], down, rr, L["e"], 132, L["k"]))


def _rule_plan_ok(p, r, finalize):
    """A grouped plan no tuned row decided: the current rule's family and tiles (the cost model for INT4), that
    family's split-K rule."""
    L = REC["layers"][r["layer"]]
    t = _decided_at(p, r["tokens"])
    want_family, want_tiles, _ = fam.rule_choice(t * L["k"], L["e"], L["k"], None, L["scheme"], L["h"], L["i"], True,
                                                 132)
    return p.family == want_family and dict(p.tiles) == want_tiles and p.splits == _split_rule(p, r)


def _decided_at(p, tokens: int) -> int:
    """The selection-grid count whose decision plan ``p`` of ``tokens`` tokens runs (:func:`.tiles.selection_points`:
    the count itself up to 256 tokens and on the grid, else the point its note names, one of the two around it)."""
    import re

    from w4a16_moe.kernels.cute.tiles import selection_points

    points = selection_points(tokens)
    if len(points) == 1:
        return tokens
    m = re.search(r"decided at T=(\d+) \(selection grid (\d+) / (\d+)\)", p.note)
    assert m and tuple(map(int, m.groups()[1:])) == points and int(m.group(1)) in points, (tokens, p.note)
    return int(m.group(1))


def _untuned(p) -> bool:
    return p.note == "rule" or p.note.startswith("cost model")


def _governing_row(r) -> tuple:
    """``(key, row)``: the tuned-table key of recorded call ``r``'s layer and the row governing its token count
    (largest measured count <= tokens, else the first), row None where the layer has none."""
    L = REC["layers"][r["layer"]]
    key = fam.tuned_key(L["gpu"], L["e"], L["h"], L["i"], L["scheme"], L["dt"], L["k"])
    best = None
    for row in fam._tuned_table().get(key) or ():
        if row.tokens <= r["tokens"] or best is None:
            best = row
    return key, best


def _row_splits(r):
    """The split-K parts the governing tuned row fixes (an int), or None (the split rule decides)."""
    _, best = _governing_row(r)
    return None if best is None else best.splits


#: rows added to the tuned table after ed90ab0, as (key, tokens): the calls they govern select their tiles
#: instead of the recorded ones (the W1 512-token row: docs/perf/2026-12-01-fp4-selection)
ADDED = {(fam.tuned_key("NVIDIA H200", 384, 7168, 256, "int4_g32", "bf16", 8), 512)}


def _added_row(r):
    """The tuned row governing recorded call ``r`` when it is one of :data:`ADDED`, else None."""
    key, best = _governing_row(r)
    return best if best is not None and (key, best.tokens) in ADDED else None


def _decode_expected(r) -> bool:
    """The recorded decode decision where the tuned table bounds the decode path for the layer; elsewhere the
    cost model's (its re-read threshold was calibrated after ed90ab0)."""
    from w4a16_moe.kernels.cute.decode import family as dec

    L = REC["layers"][r["layer"]]
    if fam.decode_bound(L["gpu"], L["e"], L["h"], L["i"], L["scheme"], L["dt"], L["k"]) is not None:
        return r["use_decode"]
    return dec.use_decode(r["tokens"], L["k"], None, L["e"], expert_bytes=3 * L["h"] * L["i"] // 2)


def _decode_configs_expected(r) -> list:
    """The recorded decode kernels where a tuned knob set or the default knobs govern the call; elsewhere the
    kernels of the default knob set of the call's regime and weights (:func:`.decode.family.default_knobs`,
    after ed90ab0)."""
    from w4a16_moe.formats.schemes import get_scheme
    from w4a16_moe.kernels.cute.decode import family as dec

    L = REC["layers"][r["layer"]]
    if fam.decode_knobs(r["tokens"], L["gpu"], L["e"], L["h"], L["i"], L["scheme"], L["dt"], L["k"]) is not None:
        return r["decode_configs"]
    sch = get_scheme(L["scheme"])
    kn = dec.default_knobs(r["tokens"], L["k"], L["h"], 2 * L["i"], 132, fp32_scales=dec.takes_fp32_scales(sch))
    if kn == "":
        return r["decode_configs"]
    return [c.name() for c in dec.configs(sch, L["dt"], "swiglu", dec.knob_items(kn))]


def _as_current(name: str, layer: str) -> str:
    """A recorded kernel name as the family names that kernel now: the warp gate/up kernels are built with
    ``warp.family.UP_ROW_BLOCKS`` row blocks per CTA (name suffix ``_r1``; ed90ab0's kernels had no streaming), and
    the warp kernels of layers ``warp.family.pdl_launch`` takes are the PDL ones (suffix ``_pdl``); the SM90 down
    kernels of the ``y`` epilogue without bias stage in 16 bits (suffix ``_e16``, docs/perf/2026-12-06-stage16)."""
    import re

    from w4a16_moe.kernels.cute.warp import family as warp
    from w4a16_moe.kernels.cute.warp.config import WarpGemmConfig

    if re.match(r"sm90_down_.*_w\d+_y(?!_bias)", name) and not name.endswith("_e16"):
        name = f"{name}_e16"

    if name.startswith("warp_gate_up_") and warp.UP_ROW_BLOCKS != WarpGemmConfig.row_blocks:  # the unnamed default
        name = f"{name}_r{warp.UP_ROW_BLOCKS}"
    L = REC["layers"][layer]
    if name.startswith("warp_") and warp.pdl_launch(2 * L["i"], L["h"], "_tl" in name):  # launched with PDL since
        name = f"{name}_pdl"
    return name


@pytest.mark.parametrize("finalize", ["deterministic", "fused"])
@pytest.mark.usefixtures("tuned_rows_current")
def test_routed_plans_match_the_recorded_choices(finalize):
    ruled = 0
    for r in ROUTED:
        p = provider.plan(_routed(r["layer"], r["tokens"], finalize), _info(r["layer"]))
        where = (r["layer"], r["tokens"], finalize)
        t = _decided_at(p, r["tokens"])
        if t != r["tokens"]:  # between two points of the selection grid: the kernels of one point's plan
            q = provider.plan(_routed(r["layer"], t, finalize), _info(r["layer"]))
            assert (p.family, p.tiles, p.configs, p.pad) == (q.family, q.tiles, q.configs, q.pad), where
            continue
        assert p.decode == _decode_expected(r), where
        if p.decode:
            assert [c.name() for c in p.configs] == _decode_configs_expected(r), where
            continue
        if _untuned(p):
            assert _rule_plan_ok(p, r, finalize), (where, p.family, dict(p.tiles), p.splits)
            ruled += 1
            continue
        added = _added_row(r)
        if added is not None:
            assert (p.family, dict(p.tiles), p.note) == (added.family, dict(added.tiles),
                                                         f"tuned row T={added.tokens}"), where
            continue
        assert p.family == r["family"] and dict(p.tiles) == r["tiles"], where
        assert [c.name() for c in p.configs] == [_as_current(n, r["layer"]) for n in r[finalize]["configs"]], where
        if _row_splits(r) is not None:
            assert p.splits == (r[finalize]["split_up"], r[finalize]["split_down"]), where
        else:
            assert p.splits == _split_rule(p, r), where
        assert p.arch == "sm_90a"
    assert ruled > 20  # the untuned layers (U, W1 fp16, W1 on an H100) are decided by the rule


def test_routes_only_plans_never_decode():
    for r in ROUTED:
        call = _routed(r["layer"], r["tokens"], "deterministic")
        call = MoECall(**{**call.__dict__, "routes_only": True})
        p = provider.plan(call, _info(r["layer"]))
        assert not p.decode, (r["layer"], r["tokens"])
        t = _decided_at(p, r["tokens"])
        if t != r["tokens"]:  # between two points of the selection grid: the kernels of one point's plan
            q = provider.plan(MoECall(**{**call.__dict__, "tokens": t}), _info(r["layer"]))
            assert (p.family, p.tiles, p.configs) == (q.family, q.tiles, q.configs), (r["layer"], r["tokens"])
            continue
        if _untuned(p):
            assert _rule_plan_ok(p, r, "deterministic"), (r["layer"], r["tokens"])
            continue
        added = _added_row(r)
        if added is not None:
            assert dict(p.tiles) == dict(added.tiles), (r["layer"], r["tokens"])
            continue
        assert dict(p.tiles) == r["tiles"], (r["layer"], r["tokens"])
        assert [c.name() for c in p.configs] == r["deterministic"]["configs"]


@pytest.mark.parametrize("routes_per_expert, family, tn", [
    (1, "warp", 8), (4, "warp", 8), (5, "warp", 16), (12, "warp", 16), (13, "sm90", 32), (24, "sm90", 32),
    (25, "sm90", 48), (48, "sm90", 48), (49, "sm90", 80), (160, "sm90", 80), (161, "sm90", 96), (4096, "sm90", 96)])
def test_the_rule_buckets(routes_per_expert, family, tn):
    e = 64
    got_family, tiles, splits = fam.rule_choice(routes_per_expert * e, e)
    assert (got_family, tiles["tokens_per_tile"], splits) == (family, tn, None)
    from w4a16_moe import settings

    with settings.override(cute_family="sm90"):  # the warp family may not be chosen: SM90 tiles only
        got_family, tiles, _ = fam.rule_choice(routes_per_expert * e, e)
        assert got_family == "sm90" and tiles == fam.select_tiles(routes_per_expert * e, e)


def test_masked_plans_match_the_recorded_choices():
    for r in MASKED:
        L = REC["layers"][r["layer"]]
        call = MaskedCall(L["e"], r["masked_capacity"], L["h"], L["i"], DT[L["dt"]], torch.device("cuda"),
                          get_activation("swiglu"), L["scheme"])
        p = provider.plan(call, _info(r["layer"]))
        assert dict(p.tiles) == fam.select_tiles(L["e"] * r["masked_capacity"], L["e"]), r  # SM90 tiles only
        f = provider.registry.get("sm90")
        rr = L["e"] * r["masked_capacity"]
        up, down = p.configs
        assert p.splits == (f.num_splits(2 * L["i"], L["h"], up, rr, L["e"], 132),
                            f.num_splits(L["h"], L["i"], down, rr, L["e"], 132)), r


def test_plans_are_cached_and_follow_settings_and_overrides():
    call, info = _routed("W1", 2048, "deterministic"), _info("W1")
    assert provider.plan(call, info) is provider.plan(call, info)
    with overrides.forced(0, 1):
        p = provider.plan(call, info)
        assert dict(p.tiles) == fam.CANDIDATES[0] and p.splits[0] == 1
    from w4a16_moe import settings

    with settings.override(batch_invariant=True):
        assert provider.plan(call, info).splits == (1, 1)


def test_sm_count_comes_from_the_device():
    call = _routed("U", 1, "deterministic")
    small = DeviceInfo("cuda", "small GPU", (9, 0), 16)
    big = DeviceInfo("cuda", "small GPU", (9, 0), 132)
    with overrides.forced(0):  # the rule's tiles and splits, no decode
        assert provider.plan(call, small).splits != provider.plan(call, big).splits


def test_converted_tuned_table_selects_the_same_tiles():
    old = json.load(open(os.path.join(DATA, "tuned_rows_ed90ab0.json")))
    table = fam._tuned_table()
    # the keys of ed90ab0, plus the expert-parallel key (e<E>of<E_global>) of the EP8 rows, a copy of them
    ep = {fam.tuned_key("NVIDIA H200", 32, 7168, 2048, "int4_g128", "bf16", 8, 256):
          fam.tuned_key("NVIDIA H200", 32, 7168, 2048, "int4_g128", "bf16", 8)}
    assert set(table) == set(old) | set(ep)
    for key, src in ep.items():
        assert table[key] == table[src] and fam._tuned_decode()[key]["max_routes"] == fam._tuned_decode()[src]["max_routes"]
    for key, rows in old.items():
        new = [r for r in table[key] if (key, r.tokens) not in ADDED]
        assert [r.tokens for r in new] == [r["tokens"] for r in rows], key
        for n, o in zip(new, rows):
            assert (n.family, dict(n.tiles), n.splits) == (o["family"], o["tiles"], o["splits"]), (key, o)


def test_every_tuned_row_records_its_provenance():
    raw = json.load(open(tuned.TUNED_PATH))
    for key, rows in raw["entries"].items():
        for r in rows:
            assert all(r.get(f) for f in ("device", "versions", "revision", "date")), (key, r)
    for key, ent in raw["decode"].items():
        assert all(ent.get(f) for f in ("device", "versions", "revision", "date")), key


def test_unknown_candidate_is_a_clear_error(tmp_path):
    raw = json.load(open(tuned.TUNED_PATH))
    key = next(iter(raw["entries"]))
    raw["entries"][key][0]["candidate"] = "t9_nonsense"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"tuned table: .*row 0 .*unknown candidate 't9_nonsense'"):
        fam._table(str(p))
    raw["format"] = 1
    p.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="format 1, expected 2"):
        fam._table(str(p))


def test_version_mismatch_is_logged(tmp_path, caplog):
    raw = json.load(open(tuned.TUNED_PATH))
    p = tmp_path / "t.json"
    p.write_text(json.dumps(raw))
    import logging

    with caplog.at_level(logging.INFO, logger="w4a16_moe"):
        fam._table(str(p))
    assert any("measured with other versions" in m for m in caplog.messages)


def test_candidate_names_are_stable_and_distinct():
    names = [tuned.candidate_name(t) for t in fam.CANDIDATES]
    assert len(set(names)) == len(names)
    assert tuned.candidate_name(fam.TILES[0][1]) == "t8_x2_k64_s4_w1_o4"
    assert fam.candidate(names[70]) == fam.CANDIDATES[70] == fam.candidate(70)


def _running():
    from w4a16_moe.kernels.cute.autotune_store import running_versions

    return running_versions()


def test_a_row_is_current_only_on_the_kernel_sources_it_was_timed_on():
    run = _running()
    mine = ("source:sm90", run["source:sm90"])
    assert tuned.is_current((mine,), "sm90", run)
    assert tuned.is_current((mine, ("source:warp", run["source:warp"])), "sm90", run)
    assert not tuned.is_current((), "sm90", run)  # no source recorded: rows written before sources were
    assert not tuned.is_current((("source:warp", run["source:warp"]),), "sm90", run)  # not the family it names
    assert not tuned.is_current((("source:sm90", "0" * 16),), "sm90", run)  # other sources
    assert not tuned.is_current((mine, ("source:decode", "0" * 16)), "sm90", run)  # one other source
    assert tuned.source_hashes({"torch": "2.11", "source:warp": "ab", "source:sm90": "cd"}) == (
        ("source:sm90", "cd"), ("source:warp", "ab"))
    assert tuned.source_hashes(None) == ()


def test_the_shipped_rows_are_not_used_on_these_kernels(_kernels_anywhere, caplog):
    """The packaged rows were timed before the tuner recorded kernel sources (and on older kernels): selection
    reads none of them, logs that once per key, and the cost model decides on their layers."""
    import logging

    assert fam._tuned_table() and fam._tuned_decode()  # the rows are there (and checked when read)
    fam._STALE_LOGGED.clear()
    with caplog.at_level(logging.INFO, logger="w4a16_moe"):
        assert fam._selection_rows() == {} and fam._selection_decode() == {}
        fam._selection_rows()
    logged = [m for m in caplog.messages if "not timed on the running kernel sources" in m]
    assert len(logged) == 1 and all(k in logged[0] for k in fam._tuned_table()), logged
    for layer in ("W1", "W2"):
        assert fam.decode_bound(REC["layers"][layer]["gpu"], *(REC["layers"][layer][f] for f in ("e", "h", "i")),
                                REC["layers"][layer]["scheme"], REC["layers"][layer]["dt"], REC["layers"][layer]["k"]) is None
        for t in (32, 512, 2048):
            p = provider.plan(_routed(layer, t, "deterministic"), _info(layer))
            assert p.decode or p.note.startswith("cost model: ~"), (layer, t, p.note)


def test_a_key_with_one_row_from_other_sources_is_left_out_whole(monkeypatch):
    run = _running()
    ok = (("source:sm90", run["source:sm90"]),)
    row = lambda t, src: tuned.TunedRow(t, "sm90", "c", (), None, src)  # noqa: E731
    table = {"A": (row(1, ok), row(64, ok)), "B": (row(1, ok), row(64, (("source:sm90", "0" * 16),))), "C": (row(1, ()),)}
    monkeypatch.setattr(fam, "_tuned_table", lambda path=None: table)
    monkeypatch.setattr(fam, "_tuned_decode", lambda path=None: {"A": {"max_routes": 8, "versions": {"source:decode": run["source:decode"]}},
                                                                 "B": {"max_routes": 8, "versions": {}}})
    rows, decode = fam._current()
    assert list(rows) == ["A"] and list(decode) == ["A"]


def test_the_tuner_records_the_kernel_sources():
    from w4a16_moe.bench import run as bench_run

    got = bench_run._source_hashes()
    assert got and got == {k: v for k, v in _running().items() if k.startswith("source:")}
    assert {"source:sm90", "source:warp", "source:decode"} <= set(got)


@pytest.mark.parametrize("layer, tokens, decode, says", [
    ((128, 4096, 1536), 2, True, "re-read 1.03x, 151 MB streamed"),         # 16 routes of a 9.4 MB expert each
    ((128, 4096, 1536), 4, False, "not decode: 302 MB streamed > 180 MB"),  # re-read 1.10: the bytes bound declines
    ((128, 4096, 1536), 6, False, "not decode: 453 MB streamed > 180 MB"),
    ((128, 2048, 768), 6, False, "not decode: re-read 1.17x > 1.1"),       # 113 MB of 2.4 MB experts
    ((128, 4096, 1536), 24, False, "cost model: ~"),  # 192 routes: past the route bound, no decode note
])
def test_plan_says_why_not_decode(layer, tokens, decode, says):
    """Untuned layers (top-8): the plan names the bytes the decode path would stream, and a grouped plan within
    the decode route bound says why the decode rule declined the call."""
    e, h, i = layer
    call = MoECall(tokens, 8, h, i, e, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                   "deterministic", 0, "int4_g128")
    p = provider.plan(call, DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132))
    assert p.decode == decode and says in p.note, p.note
    if tokens * 8 > 128:
        assert "not decode" not in p.note


def test_plan_says_decode_is_off(monkeypatch):
    monkeypatch.setenv("W4A16_MOE_CUTE_DECODE", "0")
    from w4a16_moe import settings

    settings.refresh()
    try:
        call = MoECall(1, 8, 4096, 1536, 128, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                       "deterministic", 0, "int4_g128")
        p = provider.plan(call, DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132))
        assert not p.decode and p.note.endswith("not decode: W4A16_MOE_CUTE_DECODE=0"), p.note
    finally:
        monkeypatch.delenv("W4A16_MOE_CUTE_DECODE")
        settings.refresh()


@pytest.mark.parametrize("scheme", ["int4_g128", "int4_g32_zp"])
def test_the_cost_model_note_describes_the_choice_the_plan_takes(scheme):
    """The plan's ``cost model: ~X us`` is the prediction of the choice it runs: the model is asked with the call's
    scheme (the four-consumer-warpgroup tiles are left out for INT4 g32 with zero points, so the DeepSeek-V2 shape
    at 1024 tokens takes another tile there than at g128)."""
    call = MoECall(1024, 6, 5120, 1536, 160, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                   "deterministic", 0, scheme)
    p = provider.plan(call, DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132))
    family, tiles, us = fam.model_choice(1024 * 6, 160, 5120, 1536, True, 6, None, 132, scheme)
    assert (p.family, dict(p.tiles)) == (family, tiles), p.describe()
    assert p.note.startswith(f"cost model: ~{us:.0f} us for both GEMMs"), (p.note, us)

"""load_experts on small real checkpoint directories: every format bit for bit against its library's own
decompression (or the published formula), expert / tensor-parallel slicing, gpt-oss, and every error path."""

from __future__ import annotations

import inspect
import json
import os
import pickle

import pytest
import torch

import w4a16_moe as wm
from w4a16_moe.distributed import shard_experts, shard_intermediate
from w4a16_moe.formats.quantize import quantize_matrix

pytest.importorskip("safetensors", reason="load_experts reads safetensors shards: pip install safetensors")

import checkpoint_writers as cw  # noqa: E402

CT = pytest.mark.skipif(not cw.have("compressed_tensors"), reason="needs compressed-tensors (the `test` extra)")
CT_KINDS = ["int4_g32", "int4_g64", "int4_g128", "int4_g128_zp", "int4_channel", "nvfp4", "mxfp4"]
CT_SCHEME = {"int4_g32": "int4_g32", "int4_g64": "int4_g64", "int4_g128": "int4_g128",
             "int4_g128_zp": "int4_g128_zp", "int4_channel": "int4_channel", "nvfp4": "nvfp4", "mxfp4": "mxfp4"}


def _as(dtype: torch.dtype, w: wm.MoEWeights) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = w.dequantize()
    return a.to(dtype), b.to(dtype)


def _bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max().item()}"


def _same(a: wm.MoEWeights, b: wm.MoEWeights) -> None:
    assert a.scheme == b.scheme and a.gated == b.gated
    assert (a.w13_perm is None) == (b.w13_perm is None)
    if a.w13_perm is not None:
        assert torch.equal(a.w13_perm, b.w13_perm), "w13_perm"
    for ma, mb in ((a.w13, b.w13), (a.w2, b.w2)):
        for k, t in ma.tensors().items():
            u = mb.tensors()[k]
            assert (t is None) == (u is None), k
            if t is not None:
                assert torch.equal(t, u), k


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Lazily written checkpoints, one per (format, options) key."""
    made: dict = {}
    root = tmp_path_factory.mktemp("ckpts")

    def get(key: str, **kw):
        if key not in made:
            path = str(root / key)
            writer = {"ct": cw.write_compressed_tensors, "gptq": cw.write_gptq, "awq": cw.write_awq,
                      "modelopt": cw.write_modelopt_nvfp4, "gptoss": cw.write_gptoss}[key.split("-")[0]]
            made[key] = (path, writer(path, **kw))
        return made[key]

    return get


# ------------------------------------------------------------------------------------------------
# every format, bit for bit
# ------------------------------------------------------------------------------------------------

@CT
@pytest.mark.parametrize("kind", CT_KINDS)
def test_compressed_tensors_bit_exact(ckpts, kind):
    path, (w13, w2) = ckpts(f"ct-{kind}", kind=kind)
    w = wm.load_experts(path, cw.PREFIX)
    assert w.scheme.name == CT_SCHEME[kind] and w.num_experts == 4 and w.gated
    got13, got2 = _as(w13.dtype, w)
    if kind != "nvfp4":
        _bits_equal(got13, w13)
        _bits_equal(got2, w2)
        return
    # NVFP4: the kernels compute e2m1 * scale * (1 / global) with 1 / global rounded to FP32 once at load
    # (ModelOpt's convention); compressed-tensors computes e2m1 * (scale / global). The two FP32 values
    # differ by at most an ulp, so the library's BF16 output can differ by one BF16 ulp at rounding ties.
    for got, want in ((got13, w13), (got2, w2)):
        ulp = torch.finfo(torch.bfloat16).eps * want.float().abs()
        assert bool(((got.float() - want.float()).abs() <= ulp).all())
    lib13 = cw.ct_nvfp4_dequantize_fp32(path, 4)
    torch.testing.assert_close(w.dequantize()[0], lib13, rtol=2**-22, atol=0)


@CT
def test_compressed_tensors_text_config_and_w1_w3_w2_names(ckpts):
    path, (w13, w2) = ckpts("ct-textcfg", kind="int4_g32", under_text_config=True, names=("w1", "w3", "w2"))
    w = wm.load_experts(path, cw.PREFIX + ".")
    _bits_equal(_as(w13.dtype, w)[0], w13)
    _bits_equal(_as(w2.dtype, w)[1], w2)


@pytest.mark.parametrize("group,sym,desc_act,fmt", [
    (128, True, False, "gptq"), (32, False, False, "gptq"), (None, True, False, "gptq"),
    (64, True, True, "gptq"), (128, False, True, "gptq_v2"),
])
def test_gptq_bit_exact(ckpts, group, sym, desc_act, fmt):
    key = f"gptq-{group}-{sym}-{desc_act}-{fmt}"
    path, (w13, w2) = ckpts(key, group=group, sym=sym, desc_act=desc_act, checkpoint_format=fmt)
    w = wm.load_experts(path, cw.PREFIX)
    want = ("int4_channel" if group is None else f"int4_g{group}") + ("" if sym else "_zp")
    assert w.scheme.name == want
    got13, got2 = (t.to(w13.dtype).float() for t in w.dequantize())
    if desc_act:  # w2's act order permutes I: compare through the permutation-free layer output
        x = torch.randn(5, 128)
        ref = torch.stack([torch.nn.functional.silu(x @ w13[e, :256].float().t()) * (x @ w13[e, 256:].float().t())
                           @ w2[e].float().t() for e in range(4)])
        out = torch.stack([torch.nn.functional.silu(x @ got13[e, :256].t()) * (x @ got13[e, 256:].t())
                           @ got2[e].t() for e in range(4)])
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        # and bit for bit once the columns of w2 are put back in checkpoint order
        perm = torch.argsort(torch.stack([g for g in _g_idx(path, "down_proj")]).long(), dim=1, stable=True)
        back = torch.empty_like(got2)
        back.scatter_(2, perm[:, None, :].expand_as(got2), got2)
        _bits_equal(back.to(w2.dtype), w2)
        assert not torch.equal(got2.to(w2.dtype), w2)  # the permutation was applied
    else:
        _bits_equal(got13.to(w13.dtype), w13)
        _bits_equal(got2.to(w2.dtype), w2)


def _g_idx(path: str, proj: str):
    from safetensors import safe_open

    idx = json.load(open(os.path.join(path, "model.safetensors.index.json")))["weight_map"]
    for e in range(4):
        name = f"{cw.PREFIX}.{e}.{proj}.g_idx"
        with safe_open(os.path.join(path, idx[name]), "pt") as f:
            yield f.get_tensor(name)


def test_awq_bit_exact(ckpts):
    path, (w13, w2) = ckpts("awq", group=64)
    w = wm.load_experts(path, cw.PREFIX)
    assert w.scheme.name == "int4_g64_zp"
    _bits_equal(_as(w13.dtype, w)[0], w13)
    _bits_equal(_as(w2.dtype, w)[1], w2)


@pytest.mark.skipif(cw.awq_library_utils() is None, reason="AutoAWQ not installed (its pack helpers are checked then)")
def test_awq_against_autoawq_repacking(ckpts):
    """AutoAWQ's own AWQ -> GPTQ (exllama) repacking of the fixture loads through from_gptq identically."""
    from safetensors.torch import load_file

    lib = cw.awq_library_utils()
    path, _ = ckpts("awq", group=64)
    t = {}
    for fn in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        t.update(load_file(os.path.join(path, fn)))
    w = wm.load_experts(path, cw.PREFIX)
    per = {}
    for p in cw.PROJ:
        qs, zs, ss = [], [], []
        for e in range(4):
            b = f"{cw.PREFIX}.{e}.{p}"
            qw, qz = lib.unpack_reorder_pack(t[b + ".qweight"], t[b + ".qzeros"], 4)
            qs.append(qw), zs.append(qz), ss.append(t[b + ".scales"])
        per[p] = (torch.stack(qs), torch.stack(zs), torch.stack(ss))
    g = wm.MoEWeights.from_gptq(
        torch.cat((per["gate_proj"][0], per["up_proj"][0]), 2), torch.cat((per["gate_proj"][2], per["up_proj"][2]), 2),
        per["down_proj"][0], per["down_proj"][2], group_size=64, sym=False,
        w13_qzeros=torch.cat((per["gate_proj"][1], per["up_proj"][1]), 2), w2_qzeros=per["down_proj"][1])
    _same(g, w)


@pytest.mark.parametrize("in_config", [True, False])
def test_modelopt_nvfp4_bit_exact(ckpts, in_config):
    path, (w13, w2) = ckpts(f"modelopt-{in_config}", in_config=in_config)
    w = wm.load_experts(path, cw.PREFIX)
    assert w.scheme.name == "nvfp4"
    got13, got2 = w.dequantize()
    # codes, block scales and weight_scale_2 are stored unchanged (bit for bit); the kernels' dequantization
    # (e2m1 * weight_scale) * weight_scale_2 and ModelOpt's e2m1 * (weight_scale * weight_scale_2) round once
    # each in FP32 and may differ by that one rounding
    torch.testing.assert_close(got13, w13, rtol=2**-23, atol=0)
    torch.testing.assert_close(got2, w2, rtol=2**-23, atol=0)
    assert torch.equal(w.w13.global_scale[:, 0] != w.w13.global_scale[:, -1], torch.ones(4, dtype=torch.bool))


def test_gptoss_bit_exact_against_transformers(ckpts):
    path, t = ckpts("gptoss")
    w = wm.load_experts(path, cw.PREFIX, activation="swiglu_oai")
    assert w.scheme.name == "mxfp4" and w.has_bias
    ref13 = cw.gptoss_dequantize(t[f"{cw.PREFIX}.gate_up_proj_blocks"], t[f"{cw.PREFIX}.gate_up_proj_scales"])
    ref2 = cw.gptoss_dequantize(t[f"{cw.PREFIX}.down_proj_blocks"], t[f"{cw.PREFIX}.down_proj_scales"])
    got13, got2 = w.dequantize()
    _bits_equal(got13, torch.cat((ref13[:, 0::2], ref13[:, 1::2]), 1))
    _bits_equal(got2, ref2)
    b13 = t[f"{cw.PREFIX}.gate_up_proj_bias"]
    _bits_equal(w.w13_bias, torch.cat((b13[:, 0::2], b13[:, 1::2]), 1))
    _bits_equal(w.w2_bias, t[f"{cw.PREFIX}.down_proj_bias"])


def test_gptoss_layer_against_direct_fp32(ckpts):
    """The reference with de-interleaved weights, biases and swiglu_oai equals gpt-oss' own FP32 expert math."""
    path, t = ckpts("gptoss")
    w = wm.load_experts(path, cw.PREFIX, activation="swiglu_oai")
    w13 = cw.gptoss_dequantize(t[f"{cw.PREFIX}.gate_up_proj_blocks"], t[f"{cw.PREFIX}.gate_up_proj_scales"])
    w2 = cw.gptoss_dequantize(t[f"{cw.PREFIX}.down_proj_blocks"], t[f"{cw.PREFIX}.down_proj_scales"])
    b13, b2 = t[f"{cw.PREFIX}.gate_up_proj_bias"].float(), t[f"{cw.PREFIX}.down_proj_bias"].float()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 128, generator=g) * 4  # large enough that the clamps at +-7 bite
    ids = torch.randint(0, 4, (6, 2), generator=g, dtype=torch.int32)
    tw = torch.rand(6, 2, generator=g)
    want = torch.zeros(6, 128)
    for tok in range(6):
        for j in range(2):
            e = int(ids[tok, j])
            gu = x[tok] @ w13[e].t() + b13[e]  # interleaved, as gpt-oss computes it
            gate, up = gu[0::2].clamp(max=7.0), gu[1::2].clamp(-7.0, 7.0)
            h = (up + 1) * (gate * torch.sigmoid(gate * 1.702))
            want[tok] += tw[tok, j] * (h @ w2[e].t() + b2[e])
    got = wm.reference_moe(x, w, tw, ids, activation="swiglu_oai")
    assert (x @ w13[0].t())[0::2].abs().max() > 7  # the clamp is exercised
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    other = wm.reference_moe(x, w, tw, ids, activation="swiglu_oai(alpha=1.5,limit=3.0)")
    assert not torch.allclose(other, got)


def test_dtype_and_device(ckpts):
    path, _ = ckpts("awq", group=64)
    w = wm.load_experts(path, cw.PREFIX, dtype=torch.bfloat16, device="cpu")
    assert w.w13.scales.dtype == torch.bfloat16 and w.device == torch.device("cpu")
    g = wm.load_experts(ckpts("gptoss")[0], cw.PREFIX, activation="swiglu_oai", dtype=torch.float32)
    assert g.w13_bias.dtype == torch.float32 and g.w2_bias.dtype == torch.float32
    with pytest.raises(TypeError, match="dtype: expected"):
        wm.load_experts(path, cw.PREFIX, dtype=torch.int8)


# ------------------------------------------------------------------------------------------------
# experts= and tp= slicing equals cutting the full load
# ------------------------------------------------------------------------------------------------

SLICE_CASES = [
    ("ct-int4_g128_zp", dict(kind="int4_g128_zp")), ("ct-int4_channel", dict(kind="int4_channel")),
    ("ct-nvfp4", dict(kind="nvfp4")), ("ct-mxfp4", dict(kind="mxfp4")),
    ("gptq-64-False-False-gptq", dict(group=64, sym=False, desc_act=False, checkpoint_format="gptq")),
    ("gptq-64-True-True-gptq", dict(group=64, sym=True, desc_act=True, checkpoint_format="gptq")),
    ("gptq-32-False-True-gptq-w13-h128", dict(group=32, sym=False, desc_act=True, act_order_w13=True)),
    ("awq", dict(group=64)), ("modelopt-True", dict(in_config=True)), ("gptoss", {}),
]


@pytest.mark.parametrize("key,kw", SLICE_CASES, ids=[c[0] for c in SLICE_CASES])
def test_experts_and_tp_slices_match_full_load(ckpts, key, kw):
    if key.startswith("ct") and not cw.have("compressed_tensors"):
        pytest.skip("needs compressed-tensors")
    path, _ = ckpts(key, **kw)
    act = "swiglu_oai" if key == "gptoss" else "swiglu"
    full = wm.load_experts(path, cw.PREFIX, activation=act)
    ep = wm.load_experts(path, cw.PREFIX, activation=act, experts=range(2, 4))
    _same(ep, shard_experts(full, 1, 2))
    for rank in range(2):
        tp = wm.load_experts(path, cw.PREFIX, activation=act, tp=(rank, 2))
        _same(tp, shard_intermediate(full, rank, 2))
        both = wm.load_experts(path, cw.PREFIX, activation=act, tp=(rank, 2), experts=range(1, 2))
        _same(both, shard_experts(shard_intermediate(full, rank, 2), 1, 4))
        if full.has_bias:
            s = full.intermediate_size // 2
            rows = torch.cat((torch.arange(rank * s, (rank + 1) * s), torch.arange(rank * s, (rank + 1) * s) + 2 * s))
            assert torch.equal(tp.w13_bias, full.w13_bias[:, rows])
            assert (tp.w2_bias is not None) == (rank == 0)
            assert torch.equal(ep.w13_bias, full.w13_bias[2:4]) and torch.equal(ep.w2_bias, full.w2_bias[2:4])


def test_tp_reads_only_the_slice(ckpts, monkeypatch):
    """With tp=, w2 is read through get_slice with a K range: the full matrix is never materialized."""
    from w4a16_moe.checkpoints import shards

    path, _ = ckpts("awq", group=64)
    seen = []
    orig = shards.ShardReader.get

    def spy(self, name, index=None):
        t = orig(self, name, index)
        seen.append((name, tuple(t.shape)))
        return t

    monkeypatch.setattr(shards.ShardReader, "get", spy)
    wm.load_experts(path, cw.PREFIX, tp=(1, 2), experts=range(0, 1))
    shapes = dict(seen)
    assert shapes[f"{cw.PREFIX}.0.down_proj.qweight"] == (128, 16)  # I/2 rows of [I, H/8]
    assert shapes[f"{cw.PREFIX}.0.gate_proj.qweight"] == (128, 16)  # [H, (I/2)/8]
    assert not any(n.startswith(f"{cw.PREFIX}.1.") for n in shapes)


# ------------------------------------------------------------------------------------------------
# error paths of the loader
# ------------------------------------------------------------------------------------------------

def _edit_config(path: str, fn) -> None:
    p = os.path.join(path, "config.json")
    cfg = json.load(open(p))
    fn(cfg)
    json.dump(cfg, open(p, "w"))


def _rewrite(path: str, fn) -> None:
    """Apply ``fn`` to the {name: tensor} dict of all shards and write it back (same shard split)."""
    from safetensors.torch import load_file

    cfg = json.load(open(os.path.join(path, "config.json")))
    t = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(path, f)))
            os.remove(os.path.join(path, f))
    fn(t)
    cw.write_checkpoint(path, cfg, t)


@CT
def test_asymmetric_without_zero_points_raises(tmp_path):
    path = str(tmp_path / "c")
    cw.write_compressed_tensors(path, "int4_g128_zp", e=2, h=128, i=128)
    _rewrite(path, lambda t: [t.pop(k) for k in [k for k in t if k.endswith("weight_zero_point")]])
    with pytest.raises(wm.CheckpointError, match=r"experts\.0\.down_proj\.weight_zero_point: missing.*asymmetric"):
        wm.load_experts(path, cw.PREFIX)


@CT
def test_inverted_global_scale_raises(tmp_path):
    path = str(tmp_path / "c")
    cw.write_compressed_tensors(path, "nvfp4", e=2, h=128, i=128)

    def invert(t):
        for k in [k for k in t if k.endswith("weight_global_scale")]:
            t[k] = 1.0 / t[k]

    _rewrite(path, invert)
    with pytest.raises(wm.CheckpointError, match=r"weight_global_scale: .*implausible.*inverted"):
        wm.load_experts(path, cw.PREFIX)


def test_modelopt_inverted_global_scale_raises(tmp_path):
    path = str(tmp_path / "m")
    cw.write_modelopt_nvfp4(path, e=2, h=128, i=128)

    def invert(t):
        for k in [k for k in t if k.endswith("weight_scale_2")]:
            t[k] = 1.0 / t[k]

    _rewrite(path, invert)
    with pytest.raises(wm.CheckpointError, match=r"experts\.0\.down_proj\.weight_scale_2: .*implausible for ModelOpt"):
        wm.load_experts(path, cw.PREFIX)


def test_mismatched_expert_counts_raise(tmp_path):
    path = str(tmp_path / "g")
    cw.write_awq(path, e=2, h=128, i=128)
    _edit_config(path, lambda c: c.update(num_local_experts=3))
    with pytest.raises(wm.CheckpointError, match="2 experts, but config.json says 3"):
        wm.load_experts(path, cw.PREFIX)
    path = str(tmp_path / "o")
    cw.write_gptoss(path, e=2, h=64, i=64)
    _edit_config(path, lambda c: c.update(num_local_experts=4))
    with pytest.raises(wm.CheckpointError, match="mismatched expert counts"):
        wm.load_experts(path, cw.PREFIX, activation="swiglu_oai")


def test_missing_shard_and_missing_expert_raise(tmp_path):
    path = str(tmp_path / "g")
    cw.write_awq(path, e=3, h=128, i=128)
    os.remove(os.path.join(path, "model-00002-of-00002.safetensors"))
    with pytest.raises(wm.CheckpointError, match="model-00002-of-00002.safetensors: shard listed .* is missing"):
        wm.load_experts(path, cw.PREFIX)
    path = str(tmp_path / "h")
    cw.write_awq(path, e=3, h=128, i=128)
    _rewrite(path, lambda t: t.pop(f"{cw.PREFIX}.2.up_proj.scales"))
    with pytest.raises(wm.CheckpointError, match=r"experts\.2\.up_proj\.scales: missing"):
        wm.load_experts(path, cw.PREFIX, experts=range(2, 3))
    _edit_config(path, lambda c: c.pop("num_local_experts"))
    _rewrite(path, lambda t: [t.pop(k) for k in [k for k in t if ".1." in k]])
    with pytest.raises(wm.CheckpointError, match=r"experts\.1: expert missing"):
        wm.load_experts(path, cw.PREFIX)


@pytest.mark.parametrize("edit,match", [
    (lambda q: q.update(bits=8), r"quantization_config\.bits: only 4-bit"),
    (lambda q: q.update(group_size=48), r"quantization_config\.group_size: group_size must be one of 32, 64, 128"),
    (lambda q: q.update(checkpoint_format="marlin"), "checkpoint_format"),
    (lambda q: q.update(quant_method="bitsandbytes"), "quant_method: 'bitsandbytes' is not supported"),
])
def test_unsupported_config_raises(tmp_path, edit, match):
    path = str(tmp_path / "g")
    cw.write_gptq(path, e=2, h=128, i=128)
    _edit_config(path, lambda c: edit(c["quantization_config"]))
    with pytest.raises(wm.CheckpointError, match=match):
        wm.load_experts(path, cw.PREFIX)


@CT
def test_unsupported_compressed_tensors_strategy_raises(tmp_path):
    path = str(tmp_path / "c")
    cw.write_compressed_tensors(path, "int4_g32", e=2, h=128, i=128)
    _edit_config(path, lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(strategy="tensor"))
    with pytest.raises(wm.CheckpointError, match=r"weights\.strategy: expected 'group' or 'channel', got 'tensor'"):
        wm.load_experts(path, cw.PREFIX)
    _edit_config(path, lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        strategy="group", group_size=256))
    with pytest.raises(wm.CheckpointError, match="group_size must be one of"):
        wm.load_experts(path, cw.PREFIX)


@pytest.mark.parametrize("group,sym,fmt", [(32, True, "gptq"), (64, False, "gptq"), (128, False, "gptq_v2")])
def test_gptq_act_order_on_hidden_size_loads(ckpts, group, sym, fmt):
    """desc_act over H (gate/up's input) too: the layer keeps w13_perm (argsort of the shared gate/up g_idx)
    and dequantize() returns w13 in checkpoint column order, bit for bit against the library's formula."""
    path, (w13, w2) = ckpts(f"gptq-{group}-{sym}-True-{fmt}-w13", group=group, sym=sym, desc_act=True,
                            act_order_w13=True, h=256, checkpoint_format=fmt)
    w = wm.load_experts(path, cw.PREFIX)
    g13 = torch.stack(list(_g_idx(path, "gate_proj")))
    assert torch.equal(g13, torch.stack(list(_g_idx(path, "up_proj"))))
    assert torch.equal(w.w13_perm, torch.argsort(g13.long(), dim=1, stable=True).int())
    got13, got2 = w.dequantize()
    p2 = torch.argsort(torch.stack(list(_g_idx(path, "down_proj"))).long(), dim=1, stable=True)
    rows = torch.cat((p2, p2 + 256), dim=1)  # w13's rows follow w2's act order over I
    _bits_equal(got13.to(w13.dtype), torch.gather(w13, 1, rows[:, :, None].expand_as(w13)))
    back = torch.empty_like(got2).scatter_(2, p2[:, None, :].expand_as(got2), got2)
    _bits_equal(back.to(w2.dtype), w2)
    # the layer: reference_moe and the op-level gather against the checkpoint-order dense weights
    x = torch.randn(5, 256).half()
    tw, ids = torch.softmax(torch.randn(5, 2), 1), torch.tensor([[0, 3], [1, 2], [3, -1], [2, 0], [1, 1]])
    dense = torch.zeros(5, 256, dtype=torch.float64)
    for t in range(5):
        for j in range(2):
            e = int(ids[t, j])
            if e >= 0:
                h = x[t].double() @ w13[e].double().t()
                a = torch.nn.functional.silu(h[:256]) * h[256:]
                dense[t] += float(tw[t, j]) * (a @ w2[e].double().t())
    ref = wm.reference_moe(x, w, tw, ids)
    torch.testing.assert_close(ref.double(), dense, rtol=2e-3, atol=2e-3)  # library weights rounded to FP16
    got = wm.fused_moe(x, w, tw, ids, backend="reference")
    torch.testing.assert_close(got.float(), ref.half().float(), rtol=2e-3, atol=2e-4)
    # expert and TP slices equal cutting the full load, the permutation included
    ep = wm.load_experts(path, cw.PREFIX, experts=range(2, 4))
    _same(ep, shard_experts(w, 1, 2))
    assert torch.equal(ep.w13_perm, w.w13_perm[2:4])
    for rank in range(2):
        tp = wm.load_experts(path, cw.PREFIX, tp=(rank, 2), experts=range(1, 3))
        _same(tp, shard_intermediate(wm.load_experts(path, cw.PREFIX, experts=range(1, 3)), rank, 2))
        assert torch.equal(tp.w13_perm, w.w13_perm[1:3])


def test_bad_arguments_raise(ckpts, tmp_path):
    path, _ = ckpts("awq", group=64)
    with pytest.raises(TypeError, match="experts: expected a non-empty range"):
        wm.load_experts(path, cw.PREFIX, experts=[0, 1])
    with pytest.raises(ValueError, match="experts: range\\(2, 9\\) is outside the checkpoint's 4 experts"):
        wm.load_experts(path, cw.PREFIX, experts=range(2, 9))
    with pytest.raises(ValueError, match="tp: intermediate shard 32 .* not a multiple of 64"):
        wm.load_experts(path, cw.PREFIX, tp=(0, 8))
    with pytest.raises(TypeError, match="tp: expected a \\(rank, size\\) tuple"):
        wm.load_experts(path, cw.PREFIX, tp=2)
    with pytest.raises(wm.CheckpointError, match="prefix: no tensors named model.layers.9"):
        wm.load_experts(path, "model.layers.9.mlp.experts")
    with pytest.raises(wm.CheckpointError, match="has no config.json"):
        wm.load_experts(str(tmp_path), cw.PREFIX)
    os.makedirs(tmp_path / "plain")
    json.dump({"hidden_size": 8}, open(tmp_path / "plain" / "config.json", "w"))
    with pytest.raises(wm.CheckpointError, match="no quantization_config"):
        wm.load_experts(str(tmp_path / "plain"), cw.PREFIX)


# ------------------------------------------------------------------------------------------------
# in-memory converters, MoEWeights and the activation
# ------------------------------------------------------------------------------------------------

def _small(scheme="int4_g32", e=2, h=64, i=32):
    g = torch.Generator().manual_seed(0)
    return wm.quantize_experts(torch.randn(e, 2 * i, h, generator=g), torch.randn(e, h, i, generator=g), scheme)


def test_converter_signatures_and_docstrings_are_visible():
    for name in ("from_compressed_tensors", "from_compressed_tensors_fp4", "from_trtllm_per_channel",
                 "from_modelopt_nvfp4", "from_mxfp4", "from_gptq", "from_awq"):
        f = getattr(wm.MoEWeights, name)
        params = inspect.signature(f).parameters
        assert "args" not in params and "kwargs" not in params, name
        assert "activation" in params and f.__doc__ and "Args" in f.__doc__, name
    assert "w13_weight_packed" in str(inspect.signature(wm.MoEWeights.from_compressed_tensors))
    assert list(inspect.signature(wm.load_experts).parameters)[:2] == ["path", "prefix"]


def test_repr_is_a_one_line_summary():
    w = _small()
    r = repr(w)
    assert r == "MoEWeights(scheme=int4_g32, E=2, H=64, I=32, gated=True, device=cpu, bias=none)"
    wb = wm.MoEWeights(w.scheme, w.w13, w.w2, True, torch.zeros(2, 64), torch.zeros(2, 64, dtype=torch.bfloat16))
    assert repr(wb).endswith("bias=w13+w2)") and "\n" not in repr(wb)


def test_biases_validated_copied_and_pickled():
    w = _small()
    b13, b2 = torch.randn(2, 64), torch.randn(2, 64).bfloat16()
    wb = wm.MoEWeights(w.scheme, w.w13, w.w2, True, w13_bias=b13, w2_bias=b2)
    assert torch.equal(wb.to("cpu").w13_bias, b13) and torch.equal(wb.to("cpu").w2_bias, b2)
    back = pickle.loads(pickle.dumps(wb))
    assert torch.equal(back.w13_bias, b13) and torch.equal(back.w2_bias, b2) and repr(back) == repr(wb)
    with pytest.raises(ValueError, match=r"w13_bias: expected a float32 or bfloat16 tensor of shape \(2, 64\)"):
        wm.MoEWeights(w.scheme, w.w13, w.w2, True, w13_bias=torch.zeros(2, 32))
    with pytest.raises(ValueError, match="w2_bias: expected a float32 or bfloat16"):
        wm.MoEWeights(w.scheme, w.w13, w.w2, True, w2_bias=torch.zeros(2, 64, dtype=torch.float16))
    # the reference adds them
    x = torch.randn(3, 64)
    ids = torch.tensor([[0], [1], [0]], dtype=torch.int32)
    tw = torch.ones(3, 1)
    y0 = wm.reference_moe(x, w, tw, ids)
    w0 = wm.MoEWeights(w.scheme, w.w13, w.w2, True, w2_bias=b2)
    torch.testing.assert_close(wm.reference_moe(x, w0, tw, ids), y0 + b2.float()[ids[:, 0].long()])


def test_wrong_layout_w13_is_blamed_on_w13():
    g = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(2, 64, 128, generator=g), torch.randn(2, 128, 32, generator=g)  # H=128, I=32
    ok = wm.quantize_experts(w13, w2, "int4_g32")
    bad = quantize_matrix(w13.transpose(1, 2).contiguous(), "int4_g32")  # [E, H, 2I]
    with pytest.raises(ValueError, match=r"^w13: shape looks transposed"):
        wm.MoEWeights(ok.scheme, bad, ok.w2, True)
    with pytest.raises(ValueError, match=r"^w13: .*transposed"):
        wm.quantize_experts(w13.transpose(1, 2), w2, "int4_g32")


def test_quantize_experts_non_contiguous_input():
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(2, 64, 64, generator=g)
    w2 = torch.randn(2, 32, 64, generator=g).transpose(1, 2)  # [E, H=64, I=32], non-contiguous
    a = wm.quantize_experts(w13.transpose(1, 2), w2, "int4_g32")
    b = wm.quantize_experts(w13.transpose(1, 2).contiguous(), w2.contiguous(), "int4_g32")
    _same(a, b)


def test_from_compressed_tensors_refuses_fp4_and_missing_zero_points():
    w = _small("nvfp4")
    with pytest.raises(ValueError, match="FP4 checkpoint .*from_compressed_tensors_fp4"):
        wm.MoEWeights.from_compressed_tensors(w.w13.codes, w.w13.scales, w.w2.codes, w.w2.scales, group_size=16)
    zp = _small("int4_g32_zp").to_compressed_tensors()
    with pytest.raises(ValueError, match="w13_weight_zero_point: required for an asymmetric"):
        wm.MoEWeights.from_compressed_tensors(zp["w13_weight_packed"], zp["w13_weight_scale"], zp["w2_weight_packed"],
                                              zp["w2_weight_scale"], group_size=32, symmetric=False)


def test_nvfp4_global_scale_conventions():
    w = _small("nvfp4")
    mo = w.to_modelopt_nvfp4()
    inverted = {**mo, "w13_weight_scale_2": 1.0 / mo["w13_weight_scale_2"], "w2_weight_scale_2": 1.0 / mo["w2_weight_scale_2"]}
    with pytest.raises(ValueError, match="w13_weight_scale_2: ModelOpt weight_scale_2 .* compressed-tensors"):
        wm.MoEWeights.from_modelopt_nvfp4(**inverted)
    ct = wm.MoEWeights.from_compressed_tensors_fp4(
        mo["w13_weight"], mo["w13_weight_scale"], mo["w2_weight"], mo["w2_weight_scale"],
        w13_weight_global_scale=inverted["w13_weight_scale_2"], w2_weight_global_scale=inverted["w2_weight_scale_2"])
    torch.testing.assert_close(ct.dequantize()[0], w.dequantize()[0], rtol=2**-22, atol=0)
    with pytest.raises(ValueError, match="w13_weight_global_scale: .* looks like a ModelOpt"):
        wm.MoEWeights.from_compressed_tensors_fp4(
            mo["w13_weight"], mo["w13_weight_scale"], mo["w2_weight"], mo["w2_weight_scale"],
            w13_weight_global_scale=mo["w13_weight_scale_2"], w2_weight_global_scale=mo["w2_weight_scale_2"])


def test_from_mxfp4_round_trip():
    w = _small("mxfp4")
    e, n, kb = w.w13.codes.shape
    m = wm.MoEWeights.from_mxfp4(w.w13.codes.reshape(e, n, kb // 16, 16), w.w13.scales, w.w2.codes, w.w2.scales)
    _same(m, w)
    with pytest.raises(TypeError, match="w13_scales: expected dtype torch.uint8"):
        wm.MoEWeights.from_mxfp4(w.w13.codes, w.w13.scales.float(), w.w2.codes, w.w2.scales)


def test_swiglu_oai_activation_strings():
    a = wm.get_activation("swiglu_oai")
    assert a.gated and a.alpha == 1.702 and a.limit == 7.0 and a.name == "swiglu_oai"
    assert wm.get_activation("swiglu_oai(alpha=1.702,limit=7.0)") is a
    b = wm.get_activation("swiglu_oai(limit=10)")
    assert b.name == "swiglu_oai(alpha=1.702,limit=10.0)" and wm.get_activation(b.name) == b
    with pytest.raises(ValueError, match="limit must be a finite positive number"):
        wm.get_activation("swiglu_oai(limit=-1)")
    with pytest.raises(ValueError, match="expected parameters alpha"):
        wm.get_activation("swiglu_oai(beta=1)")
    h = torch.tensor([[9.0, -1.0, 9.0, -9.0]])
    from w4a16_moe.activations import apply_activation

    g = torch.tensor([7.0, -1.0])
    want = g * torch.sigmoid(1.702 * g) * (torch.tensor([7.0, -7.0]) + 1)
    torch.testing.assert_close(apply_activation(h, "swiglu_oai")[0], want)


@CT
def test_non_gated_layer_reads_up_and_down(tmp_path):
    path = str(tmp_path / "c")
    w13, w2 = cw.write_compressed_tensors(path, "int4_g64", e=2, h=128, i=128)
    _rewrite(path, lambda t: [t.pop(k) for k in [k for k in t if ".gate_proj." in k]])
    w = wm.load_experts(path, cw.PREFIX, activation="relu2")
    assert not w.gated and w.w13.n == 128
    _bits_equal(_as(w13.dtype, w)[0], w13[:, 128:])
    _bits_equal(_as(w2.dtype, w)[1], w2)

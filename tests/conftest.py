"""Shared pytest setup: the ``gpu`` marker, and small weight/routing builders used across tests."""

from __future__ import annotations

import os
import sys

import pytest
import torch

try:  # running from a source checkout without installing
    import w4a16_moe  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def monkeypatch(monkeypatch):
    """pytest's ``monkeypatch``, whose ``setenv`` / ``delenv`` (and its undo) also refresh
    :mod:`w4a16_moe.settings`, so a test that changes a ``W4A16_MOE_*`` variable is seen by the package."""
    from w4a16_moe import settings

    setenv, delenv = monkeypatch.setenv, monkeypatch.delenv

    def _setenv(name, value, prepend=None):
        setenv(name, value, prepend)
        settings.refresh()

    def _delenv(name, raising=True):
        delenv(name, raising)
        settings.refresh()

    monkeypatch.setenv, monkeypatch.delenv = _setenv, _delenv
    yield monkeypatch
    monkeypatch.undo()
    settings.refresh()


@pytest.fixture
def _kernels_anywhere(monkeypatch):
    """CuTe plans on any machine: every kernel counts as available, the selection settings at their defaults,
    the plan cache empty before and after."""
    from w4a16_moe.kernels.cute import provider

    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    for v in ("W4A16_MOE_CUTE_DECODE", "W4A16_MOE_BATCH_INVARIANT", "W4A16_MOE_CUTE_FAMILY"):
        monkeypatch.delenv(v, raising=False)
    provider.clear_plans()
    yield
    provider.clear_plans()


@pytest.fixture
def tuned_rows_current(monkeypatch):
    """The shipped tuned table's rows count as timed on the running kernel sources (they were timed on older
    ones and are otherwise not used): for the tests of what a tuned row selects. The plan cache is emptied
    before and after."""
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.kernels.cute.sm90 import tuned

    monkeypatch.setattr(tuned, "is_current", lambda sources, fam, running: True)
    provider.clear_plans()
    yield
    provider.clear_plans()


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th of N round-robin shards of the selected tests (1 <= K <= N), so that a "
                          "suite longer than one device call runs over N calls (scripts/gpu.sh: TEST_SHARD=K/N)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    shard = config.getoption("--shard")
    if shard is not None:
        _parse_shard(shard)  # a malformed value stops the run before collection


def _parse_shard(text: str) -> tuple:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise pytest.UsageError(f"--shard: expected K/N with 1 <= K <= N, got {text!r}")
    return int(k), int(n)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip without a CUDA GPU; with ``--shard K/N`` only every N-th selected test from the
    K-th on runs (after ``-m`` / ``-k``), the rest deselected."""
    shard = config.getoption("--shard")
    if shard is not None:
        k, n = _parse_shard(shard)
        keep = items[k - 1::n]
        drop = [it for i, it in enumerate(items) if i % n != k - 1]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def warmup_specs(e, h, i, scheme, top_k, max_tokens, finalizes, calls=()) -> list:
    """The KernelSpecs a GPU test of ``warmup`` on layer ``(e, h, i)`` launches, on an H100 or an H200: those of
    ``warmup``'s plans (BF16, SwiGLU) and of the plans of the further ``calls`` (``MoECall`` s), every kernel counted
    as available (for a test module's ``needed_specs()``)."""
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider, registry

    saved = provider._kernels_available
    provider._kernels_available = lambda arch: None
    out = {}
    try:
        for info in (DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132),
                     DeviceInfo("cuda", "NVIDIA H200", (9, 0), 132)):
            provider.clear_plans()
            plans = [p for _, p in provider.warmup_plans(info, e, h, i, scheme, torch.bfloat16, torch.device("cuda"),
                                                         "swiglu", top_k, max_tokens, finalizes)]
            for p in plans + [provider.plan(c, info) for c in calls]:
                fam = registry.get(p.family)
                out.update({fam.spec_for(c).name: fam.spec_for(c) for c in p.configs})
    finally:
        provider._kernels_available = saved
        provider.clear_plans()
    return list(out.values())


def k_for(scheme: str, base: int = 64) -> int:
    """A reduction size valid for ``scheme`` (a multiple of its group size)."""
    from w4a16_moe import get_scheme

    return max(base, get_scheme(scheme).min_k_multiple())


def random_weights(scheme, e, h, i, *, activation="swiglu", dtype=torch.float16, device="cpu", seed=0):
    """Quantized random experts (std ~ 1/sqrt(K) so activations stay O(1))."""
    import w4a16_moe as wm

    g = torch.Generator(device="cpu").manual_seed(seed)
    n13 = 2 * i if wm.get_activation(activation).gated else i
    w13 = torch.randn(e, n13, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    return wm.quantize_experts(w13.to(dtype), w2.to(dtype), scheme, activation=activation).to(device)


def with_biases(w, *, w13=True, w2=True, dtype=torch.float32, scale=0.5, seed=7):
    """``w`` with random per-expert biases ``w13_bias [E, 2I|I]`` / ``w2_bias [E, H]`` (each optional)."""
    import w4a16_moe as wm

    g = torch.Generator(device="cpu").manual_seed(seed)
    b13 = (torch.randn(w.num_experts, w.w13.n, generator=g) * scale).to(dtype).to(w.device) if w13 else None
    b2 = (torch.randn(w.num_experts, w.hidden_size, generator=g) * scale).to(dtype).to(w.device) if w2 else None
    return wm.MoEWeights(w.scheme, w.w13, w.w2, w.gated, b13, b2)


def random_routing(t, k, num_global, *, seed=0, device="cpu", dtype=torch.int32):
    """Distinct top-k ids per token (uniform over ``num_global`` experts) and softmax weights."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(t, num_global, generator=g)
    ids = scores.topk(k, dim=1).indices.to(dtype)
    w = torch.softmax(torch.randn(t, k, generator=g), dim=1)
    return w.to(device), ids.to(device)


def nrmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else num


def run_cute_moe(w, t, k, *, dtype=torch.bfloat16, activation="swiglu", finalize="deterministic", offset=0,
                 num_global=None, seed=1, ids=None, tol=0.02, check_path=None, x_scale=1.0):
    """One ``fused_moe(..., backend="cute")`` call on fresh random inputs (``t`` tokens, ``x ~ N(0, x_scale^2)``,
    top-``k`` over ``num_global`` experts, default ``w.num_experts + offset``) into an output poisoned with NaN,
    checked against ``reference_moe``: no NaN left and NRMSE < ``tol``. ``check_path(x, tw, ids)`` asserts which
    kernels the call takes before it runs. Returns ``(x, tw, ids, out)``."""
    import w4a16_moe as wm

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(t, w.hidden_size, generator=g) * x_scale).to(dtype).cuda()
    tw, rid = random_routing(t, k, num_global or w.num_experts + offset, seed=seed, device="cuda")
    ids = rid if ids is None else ids
    if check_path is not None:
        check_path(x, tw, ids)
    out = torch.full_like(x, float("nan"))
    wm.fused_moe(x, w, tw, ids, activation=activation, finalize=finalize, expert_offset=offset, backend="cute",
                 out=out)
    ref = wm.reference_moe(x, w, tw, ids, activation=activation, expert_offset=offset)
    assert not torch.isnan(out).any()
    assert nrmse(out, ref) < tol, nrmse(out, ref)
    return x, tw, ids, out


def replay_on_fresh_data(graph, w, x, tw, ids, out, *, bitwise: bool, tol: float = 0.02):
    """Write fresh inputs into the captured buffers (two draws over ``w``'s experts), replay ``graph`` with ``out``
    poisoned, and check it against the reference (NRMSE < ``tol``) and (``bitwise``) the eager deterministic call."""
    import w4a16_moe as wm

    t, k = ids.shape
    for seed in (10, 11):
        x.copy_(torch.randn(t, w.hidden_size, device="cuda").to(torch.bfloat16))
        tw2, ids2 = random_routing(t, k, w.num_experts, seed=seed, device="cuda")
        tw.copy_(tw2)
        ids.copy_(ids2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert nrmse(out, wm.reference_moe(x, w, tw, ids)) < tol
        if bitwise:
            assert torch.equal(out, wm.fused_moe(x, w, tw, ids, backend="cute"))


def gptq_act_order_layer(e, h, i, *, group=32, sym=True, activation="swiglu", act_order_w13=True,
                         act_order_w2=True, checkpoint_format="gptq", seed=0):
    """A GPTQ layer with random per-expert act order (``g_idx``), quantized and packed like AutoGPTQ
    (:mod:`checkpoint_writers`) and loaded with ``from_gptq``. Returns a namespace: ``weights``; ``w13``
    ``[E, 2I|I, H]`` / ``w2 [E, H, I]``, the library's dequantization (in the scales' dtype, checkpoint order);
    ``w13_fp32`` / ``w2_fp32``, the same formula in FP32 (exact); ``g13 [E, H]`` / ``g2 [E, I]``, the group
    indices."""
    from types import SimpleNamespace

    import w4a16_moe as wm
    import checkpoint_writers as cw

    gen = torch.Generator().manual_seed(seed)
    v1 = checkpoint_format == "gptq"
    n13 = 2 * i if wm.get_activation(activation).gated else i
    parts = {k: [] for k in ("qw13", "qz13", "s13", "qw2", "qz2", "s2", "g13", "g2", "d13", "d2", "x13", "x2")}
    for _ in range(e):
        for tag, n, k, on in (("13", n13, h, act_order_w13), ("2", h, i, act_order_w2)):
            w = torch.randn(n, k, generator=gen) / k**0.5
            gsz = k if group is None else group
            g_idx = torch.arange(k, dtype=torch.int32) // gsz
            if on:
                g_idx = g_idx[torch.randperm(k, generator=gen)]
            q, scales, zeros = cw.gptq_quantize(w, group, sym, g_idx)
            qweight, qzeros = cw.gptq_pack(q, zeros, v1)
            parts["qw" + tag].append(qweight)
            parts["qz" + tag].append(qzeros)
            parts["s" + tag].append(scales)
            parts["g" + tag].append(g_idx)
            parts["d" + tag].append(cw.gptq_dequantize(qweight, qzeros, scales, g_idx, v1))
            parts["x" + tag].append(cw.gptq_dequantize(qweight, qzeros, scales.float(), g_idx, v1))
    st = {k: torch.stack(v) for k, v in parts.items()}
    w = wm.MoEWeights.from_gptq(st["qw13"], st["s13"], st["qw2"], st["s2"], group_size=group,
                                w13_qzeros=st["qz13"], w2_qzeros=st["qz2"], w13_g_idx=st["g13"], w2_g_idx=st["g2"],
                                sym=sym, checkpoint_format=checkpoint_format, activation=activation)
    return SimpleNamespace(weights=w, w13=st["d13"], w2=st["d2"], w13_fp32=st["x13"], w2_fp32=st["x2"],
                           g13=st["g13"], g2=st["g2"])

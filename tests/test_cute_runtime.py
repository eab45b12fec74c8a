"""The CuTe provider's run-time path must not need the CuTe DSL (a prebuilt wheel runs without it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["cutlass"] = None          # any `import cutlass` now raises ImportError
    sys.modules["cuda.bindings"] = None
    import torch, w4a16_moe as wm
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.kernels.cute.sm90 import family as fam
    from w4a16_moe.validate import check_moe_call
    g = torch.Generator().manual_seed(0)
    w = wm.quantize_experts(torch.randn(4, 512, 256, generator=g).bfloat16(),
                            torch.randn(4, 256, 256, generator=g).bfloat16(), "int4_g32")
    x = torch.randn(3, 256).bfloat16()
    ids = torch.tensor([[0, 1], [2, 3], [1, -1]], dtype=torch.int32)
    call = check_moe_call(x, w, torch.rand(3, 2), ids)
    for cap, name in (((9, 0), "sm90"), ((10, 0), "warp"), ((8, 0), "warp"), ((12, 0), "warp")):
        info = DeviceInfo("cuda", "GPU", cap, 132)
        family, why = provider.family_for(info)
        assert family is not None and family.name == name, (cap, family, why)
        reason = provider.unavailable_reason(call, info)
        assert reason is not None and "not installed" in reason, reason
        fm = sys.modules[type(family).__module__]
        up, down = family.configs(w.scheme, "bf16", "swiglu", True, "deterministic", fm.select_tiles(6, 4))
        assert fm.config_from_spec(family.spec_for(up)) == up
        p = provider._packed(family, w, "w13", up, torch.bfloat16)  # weight packing is torch only
        assert p.data.dtype == torch.uint8
    family, why = provider.family_for(DeviceInfo("cuda", "old", (7, 5), 40))
    assert family is None and "sm_75" in why
    print("ok", fam.FAMILY)
""")


def test_runtime_path_imports_no_cutlass(tmp_path):
    env = dict(os.environ, W4A16_MOE_PREBUILT_DIR=str(tmp_path), W4A16_MOE_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(__file__), "..", "python"),
                                          env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok sm90_w4a16_gemm")


@pytest.mark.usefixtures("tuned_rows_current")
def test_tuned_rows_can_name_the_warp_family(monkeypatch):
    """On SM90 a tuned-table row may hand a layer shape to the warp-MMA family (same arch, same ABI): the
    plan names that family."""
    import torch

    from w4a16_moe.activations import get_activation
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider
    from w4a16_moe.kernels.cute.sm90 import family as fam
    from w4a16_moe.validate import MoECall

    monkeypatch.setattr(provider, "_kernels_available", lambda arch: None)
    provider.clear_plans()
    shape = (8, 384, 7168, 256, "int4_g32", "bf16", "NVIDIA H200")  # top_k, E, H, I, scheme, dtype, GPU

    def plan(tokens, gpu="NVIDIA H200"):
        call = MoECall(tokens, 8, 7168, 256, 384, torch.bfloat16, torch.device("cuda"), get_activation("swiglu"),
                       "deterministic", 0, "int4_g32", routes_only=True)
        return provider.plan(call, DeviceInfo("cuda", gpu, (9, 0), 132))

    p = plan(32)
    assert (p.family, p.arch, dict(p.tiles)["tokens_per_tile"]) == ("warp", "sm_90a", 8)
    assert fam.choose(32, *shape)[0] == fam.select_tiles(32 * 8, 384)  # the SM90-only view falls back to the rule
    # every row of the packaged table: the family it names serves the token counts it covers
    for row in fam._tuned_table()[fam.tuned_key(shape[-1], *shape[1:-1], shape[0])]:
        assert plan(row.tokens).family == row.family, row
    assert plan(2048).family == "sm90"
    other = plan(32, "NVIDIA H100")  # rows are keyed by GPU name: another GPU gets the rule (the cost model)
    assert other.note.startswith("cost model: ~")
    assert other.family == fam.rule_choice(32 * 8, 384, 8, None, "int4_g32", 7168, 256, True, 132)[0]
    # W4A16_MOE_TUNED_TABLE=0: the shipped rows (tiles and the decode bound) are not read; the rule decides
    tuned_512 = plan(512)
    monkeypatch.setenv("W4A16_MOE_TUNED_TABLE", "0")
    assert fam.decode_bound(shape[-1], *shape[1:-1], shape[0]) is None
    for tokens in (32, 256, 512, 2048):
        p = plan(tokens)
        family, tiles, _ = fam.rule_choice(tokens * 8, 384, 8, None, "int4_g32", 7168, 256, True, 132)
        assert p.note.startswith("cost model: ~") and p.family == family and dict(p.tiles) == tiles, p.describe()
    assert plan(512).tiles != tuned_512.tiles  # the shipped row (TN 32, ping-pong down) differs from the model's
    monkeypatch.setenv("W4A16_MOE_TUNED_TABLE", "1")
    assert plan(512).tiles == tuned_512.tiles and fam.decode_bound(shape[-1], *shape[1:-1], shape[0]) == 128


def test_run_kernel_forwards_the_launch_abi(monkeypatch):
    """Both launch routes get the nine tensors and seven ints in ABI order: the torch op gets the tensors,
    ctypes their data pointers followed by the current stream."""
    import torch

    from w4a16_moe.kernels.cute import provider, registry

    family = registry.get("sm90")
    tensors = tuple(torch.zeros(1) for _ in range(9))
    scalars = (1, 2, 3, 4, 5, 6, 7)
    calls = []
    monkeypatch.setattr(provider, "_launcher_cached", lambda *a: lambda *args: calls.append(("op", args)))
    provider._run_kernel(family, "sm_90a", None, tensors, scalars)
    assert calls == [("op", tensors + scalars)]
    monkeypatch.setattr(provider, "_launcher_cached", lambda *a: None)
    monkeypatch.setattr(provider, "_kernel", lambda f, a, c: lambda *args: calls.append(("ctypes", args)))
    monkeypatch.setattr(provider, "_stream", lambda: 99)
    provider._run_kernel(family, "sm_90a", None, tensors, scalars)
    assert calls[1] == ("ctypes", tuple(t.data_ptr() for t in tensors) + scalars + (99,))

"""Expert and tensor parallelism over torch.distributed: gloo + the reference provider on the CPU
(2 and 4 processes started by the test), NCCL + the GPU providers on a machine with two GPUs."""

from __future__ import annotations

import os
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import w4a16_moe as wm
from w4a16_moe.distributed import ep_moe, shard_experts, shard_intermediate, tp_moe

from conftest import nrmse, random_routing, random_weights, with_biases

E, H, I, K = 8, 64, 64, 3


OAI = "swiglu_oai(alpha=1.5,limit=2.0)"


def _setup(world, seed=0, scheme="int4_g32", device="cpu", bias=False, perm=False):
    full = random_weights(scheme, E, H, I, dtype=torch.float16, seed=seed)
    if perm:  # GPTQ act order over H and I: the experts carry a w13_perm
        from conftest import gptq_act_order_layer

        full = gptq_act_order_layer(E, H, I, group=32, seed=seed).weights
    if bias:  # gpt-oss experts: both biases
        full = with_biases(full, scale=1.0)
    data = []
    for r in range(world):
        t = 5 + 3 * r  # ranks hold different token counts
        tw, ids = random_routing(t, K, E + 2, seed=100 + r)  # ids E, E+1 belong to nobody
        ids[0, 0] = -1
        data.append((torch.randn(t, H, generator=torch.Generator().manual_seed(r)).half(), tw, ids))
    return full, data


def _worker(rank, world, init_file, mode, result_file):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        bias = mode.endswith("_bias")
        perm = mode.endswith("_perm")
        mode = mode.removesuffix("_bias").removesuffix("_perm")
        act = OAI if bias else "swiglu"
        full, data = _setup(world, bias=bias, perm=perm)
        x, tw, ids = data[rank]
        out = {}
        if mode == "ep":
            local = shard_experts(full, rank, world)
            kw = dict(backend="reference", activation=act)
            out["det"] = ep_moe(x, local, tw, ids, finalize="deterministic", **kw)
            out["det2"] = ep_moe(x, local, tw, ids, finalize="deterministic", **kw)
            out["fused"] = ep_moe(x, local, tw, ids, finalize="fused", **kw)
        elif mode == "tp":
            xs, tws, idss = data[0]  # TP: every rank sees the same tokens
            shard = shard_intermediate(full, rank, world)
            out["tp"] = tp_moe(xs, shard, tws, idss, backend="reference", activation=act)
        elif mode == "mismatch":
            scheme = "int4_g32" if rank == 0 else "int4_g64"
            local = shard_experts(random_weights(scheme, E, H, I, dtype=torch.float16), rank, world)
            try:
                ep_moe(x, local, tw, ids, backend="reference")
                out["error"] = None
            except ValueError as exc:
                out["error"] = str(exc)
        torch.save(out, f"{result_file}.{rank}")
        dist.destroy_process_group()
    except Exception:
        with open(f"{result_file}.{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise


def _spawn(world, mode):
    with tempfile.TemporaryDirectory() as d:
        init, res = os.path.join(d, "init"), os.path.join(d, "res")
        mp.spawn(_worker, args=(world, init, mode, res), nprocs=world, join=True)
        return [torch.load(f"{res}.{r}") for r in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_ep_matches_single_process_exactly(world):
    results = _spawn(world, "ep")
    full, data = _setup(world)
    for r, (x, tw, ids) in enumerate(data):
        single = wm.fused_moe(x, full, tw, ids, backend="reference")
        assert torch.equal(results[r]["det"], single), f"rank {r}"
        assert torch.equal(results[r]["det2"], results[r]["det"])  # bit-identical run to run
        ref = wm.reference_moe(x, full, tw, ids)
        assert nrmse(results[r]["fused"], ref) < 0.01


def test_tp_matches_reference():
    results = _spawn(2, "tp")
    full, data = _setup(2)
    x, tw, ids = data[0]
    ref = wm.reference_moe(x, full, tw, ids)
    for r in range(2):
        assert nrmse(results[r]["tp"], ref) < 0.01
    assert torch.equal(results[0]["tp"], results[1]["tp"])


def test_ep_and_tp_with_biases_and_swiglu_oai():
    """gpt-oss experts over gloo: EP equals one process bit for bit, TP adds w2_bias once (rank 0's)."""
    full, data = _setup(2, bias=True)
    results = _spawn(2, "ep_bias")
    for r, (x, tw, ids) in enumerate(data):
        single = wm.fused_moe(x, full, tw, ids, activation=OAI, backend="reference")
        assert torch.equal(results[r]["det"], single), f"rank {r}"
        assert nrmse(results[r]["fused"], wm.reference_moe(x, full, tw, ids, activation=OAI)) < 0.01
    results = _spawn(2, "tp_bias")
    x, tw, ids = data[0]
    ref = wm.reference_moe(x, full, tw, ids, activation=OAI)
    for r in range(2):
        assert nrmse(results[r]["tp"], ref) < 0.01


def test_ep_and_tp_with_act_order_over_h():
    """Experts with a w13_perm: the EP halves gather x per route on the expert's rank, and EP equals one process
    bit for bit; the TP shards keep the permutation."""
    full, data = _setup(2, perm=True)
    assert full.w13_perm is not None
    results = _spawn(2, "ep_perm")
    for r, (x, tw, ids) in enumerate(data):
        assert torch.equal(results[r]["det"], wm.fused_moe(x, full, tw, ids, backend="reference")), f"rank {r}"
        assert nrmse(results[r]["fused"], wm.reference_moe(x, full, tw, ids)) < 0.01
    results = _spawn(2, "tp_perm")
    x, tw, ids = data[0]
    for r in range(2):
        assert nrmse(results[r]["tp"], wm.reference_moe(x, full, tw, ids)) < 0.01


def test_ep_weights_differ_across_ranks():
    results = _spawn(2, "mismatch")
    for r in range(2):
        assert results[r]["error"] is not None and "scheme differs across ranks" in results[r]["error"]


def test_shard_checks():
    full = random_weights("int4_g32", 6, 64, 64)
    with pytest.raises(ValueError, match="6 experts are not divisible by the world size 4"):
        shard_experts(full, 0, 4)
    with pytest.raises(ValueError, match="intermediate shard 16 .* is not a multiple of 32"):
        shard_intermediate(full, 0, 4)
    parts = [shard_experts(full, r, 3) for r in range(3)]
    assert torch.equal(torch.cat([p.w13.codes for p in parts]), full.w13.codes)


def test_tp_shards_sum_to_full():
    full = random_weights("int4_g32", 4, 64, 128, seed=3)
    x = torch.randn(4, 64).half()
    tw, ids = random_routing(4, 2, 4)
    parts = [wm.reference_moe(x, shard_intermediate(full, r, 2), tw, ids) for r in range(2)]
    torch.testing.assert_close(parts[0] + parts[1], wm.reference_moe(x, full, tw, ids), rtol=1e-5, atol=1e-5)


def test_requires_initialized_group():
    full = random_weights("int4_g32", 4, 64, 64)
    tw, ids = random_routing(2, 2, 4)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        ep_moe(torch.randn(2, 64).half(), full, tw, ids, backend="reference")


# ------------------------------------------------------------------------------------------------
# two GPUs, NCCL, the GPU providers
# ------------------------------------------------------------------------------------------------
GE, GH, GI = 16, 512, 256  # CuTe needs H, 2I multiples of 256


def _gpu_setup(world):
    full = random_weights("int4_g32", GE, GH, GI, dtype=torch.bfloat16, seed=11)
    data = []
    for r in range(world):
        t = 40 + 29 * r
        tw, ids = random_routing(t, 4, GE + 3, seed=200 + r)
        ids[1, 2] = -1
        data.append((torch.randn(t, GH, generator=torch.Generator().manual_seed(50 + r)).bfloat16(), tw, ids))
    return full, data


def _gpu_worker(rank, world, init_file, backend, result_file):
    try:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
        dev = torch.device("cuda", rank)
        full, data = _gpu_setup(world)
        local = shard_experts(full, rank, world).to(dev)
        x, tw, ids = (t.to(dev) for t in data[rank])
        out = {"det": ep_moe(x, local, tw, ids, backend=backend).cpu(),
               "fused": ep_moe(x, local, tw, ids, backend=backend, finalize="fused").cpu()}
        gloo = dist.new_group(backend="gloo")
        try:
            ep_moe(x, local, tw, ids, backend=backend, group=gloo)
            out["wrong_backend"] = None
        except ValueError as exc:
            out["wrong_backend"] = str(exc)
        torch.save(out, f"{result_file}.{rank}")
        dist.destroy_process_group()
    except Exception:
        with open(f"{result_file}.{rank}.err", "w") as f:
            f.write(traceback.format_exc())
        raise


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("backend", ["cute", "triton"])
def test_ep_nccl_matches_one_gpu(backend, monkeypatch):
    if backend == "cute" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the CuTe kernels need SM90")
    # batch-invariant CuTe mode (no split-K in deterministic calls); the spawned ranks inherit it
    monkeypatch.setenv("W4A16_MOE_BATCH_INVARIANT", "1")
    with tempfile.TemporaryDirectory() as d:
        init, res = os.path.join(d, "init"), os.path.join(d, "res")
        mp.spawn(_gpu_worker, args=(2, init, backend, res), nprocs=2, join=True)
        results = [torch.load(f"{res}.{r}") for r in range(2)]
    full, data = _gpu_setup(2)
    full = full.to("cuda:0")
    for r, (x, tw, ids) in enumerate(data):
        x, tw, ids = x.cuda(), tw.cuda(), ids.cuda()
        single = wm.fused_moe(x, full, tw, ids, backend=backend).cpu()
        ref = wm.reference_moe(x, full, tw, ids).cpu()
        assert nrmse(results[r]["det"], ref) < 0.02 and nrmse(results[r]["fused"], ref) < 0.02
        if backend == "cute":  # batch-invariant deterministic mode: exactly the one-GPU result
            assert torch.equal(results[r]["det"], single), f"rank {r}"
        assert "backend 'gloo' cannot move CUDA tensors" in results[r]["wrong_backend"]


@pytest.mark.parametrize("world", [2, 4])
def test_shards_keep_their_biases(world):
    """shard_experts keeps the experts' bias rows; shard_intermediate keeps w13_bias rows of the slice (gate and
    up) and gives w2_bias to rank 0 only; partial layers sum back to the full one."""
    full = with_biases(random_weights("int4_g32", 4, 64, 128, activation="swiglu", seed=3), scale=1.0)
    x = torch.randn(5, 64).half() * 3
    tw, ids = random_routing(5, 2, 4)
    ids[1, 0] = -1
    for act in ("swiglu", "swiglu_oai"):
        ref = wm.reference_moe(x, full, tw, ids, activation=act)
        if 4 % world == 0:
            n = 4 // world
            parts = [shard_experts(full, r, world) for r in range(world)]
            for r, p in enumerate(parts):
                assert torch.equal(p.w13_bias, full.w13_bias[r * n:(r + 1) * n])
                assert torch.equal(p.w2_bias, full.w2_bias[r * n:(r + 1) * n])
            ep = sum(wm.reference_moe(x, p, tw, ids, activation=act, expert_offset=r * n) for r, p in enumerate(parts))
            torch.testing.assert_close(ep, ref, rtol=1e-5, atol=1e-5)
        s = 128 // world
        shards = [shard_intermediate(full, r, world) for r in range(world)]
        for r, p in enumerate(shards):
            rows = torch.cat((torch.arange(r * s, (r + 1) * s), torch.arange(128 + r * s, 128 + (r + 1) * s)))
            assert torch.equal(p.w13_bias, full.w13_bias[:, rows])
            assert (p.w2_bias is not None) == (r == 0)
        tp = sum(wm.reference_moe(x, p, tw, ids, activation=act) for p in shards)
        torch.testing.assert_close(tp, ref, rtol=1e-4, atol=1e-4)

"""Time the deterministic finalize (kernels/triton/finalize.py) at W1 2048 shapes for several launch configs.

    python finalize_configs.py      (GPU; Triton JIT)

y [16384, 7168] bf16 (8 routes per token), out [2048, 7168]; every config's output is checked bit-exact
against the default config's before timing (triton.testing.do_bench_cudagraph, rep=150).
"""
import torch
import triton
import triton.testing

from w4a16_moe.kernels.triton.finalize import _finalize_kernel

T, K, H, E = 2048, 8, 7168, 384
g = torch.Generator(device="cuda").manual_seed(0)
y = torch.randn(T * K, H, device="cuda", generator=g).to(torch.bfloat16)
tw = torch.softmax(torch.randn(T, K, device="cuda", generator=g), 1)
ids = torch.randint(0, E, (T, K), device="cuda", dtype=torch.int32, generator=g)
ref = None
for bh, nw in ((1024, 4), (1024, 8), (2048, 8), (2048, 4), (512, 4), (512, 2), (4096, 8), (8192, 16)):
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    grid = (T, triton.cdiv(H, bh))
    fn = lambda: _finalize_kernel[grid](y, tw, ids, y, out, H, E, 0, TOPK=K, FROM_MASK=False, BLOCK_H=bh,
                                        num_warps=nw)
    fn()
    torch.cuda.synchronize()
    if ref is None:
        ref = out.clone()
    same = torch.equal(out, ref)
    us = triton.testing.do_bench_cudagraph(fn, rep=150) * 1000
    mb = (y.numel() * 2 + out.numel() * 2) / 1e6
    print(f"BLOCK_H={bh:5d} warps={nw:2d}: {us:6.1f} us  {mb / us:.2f} TB/s  bit-identical={same}", flush=True)

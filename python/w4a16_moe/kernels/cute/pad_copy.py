"""One-launch zero-padded copy ``x [M, C] -> [M, W]`` (``W > C``) for padded CuTe plans (Triton).

``torch.nn.functional.pad`` costs two launches on the GPU (a fill, then a copy); this writes every element
of the padded buffer once: ``x``'s values in columns ``[0, C)``, zeros after. Grid ``(M, cdiv(W, BLOCK))``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["pad_copy"]

_BLOCK = 1024


@triton.jit
def _pad_copy_kernel(x_ptr, y_ptr, C, W, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * C + cols, mask=cols < C, other=0.0)
    tl.store(y_ptr + row * W + cols, v, mask=cols < W)


def pad_copy(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x [..., C]`` (contiguous, on a CUDA GPU) as a new zero-padded ``[..., width]`` tensor."""
    c = x.shape[-1]
    y = torch.empty(*x.shape[:-1], width, dtype=x.dtype, device=x.device)
    rows = x.numel() // c if c else 0
    if rows:
        block = min(_BLOCK, triton.next_power_of_2(width))
        _pad_copy_kernel[(rows, triton.cdiv(width, block))](x, y, c, width, BLOCK=block, num_warps=4)
    return y

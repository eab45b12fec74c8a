"""Self-test kernel family ``selftest_axpy``: ``y[i] = a * x[i] + b`` over ``n`` float32 elements.

Exercises the whole pipeline (compile -> export_to_c -> link -> cache -> dlopen -> launch) with a kernel
small enough to compile in ~0.1 s. Parameters:

* ``threads`` (int, default 128): threads per block.
* ``bias`` (bool, default True): if False, ``b`` is ignored (``y = a * x``).
* ``api`` (str, ``"ptr"`` default or ``"tensor"``): how x / y are passed.

C ABI of the launch entry (``<name>_launch``, see ``loader/library.py``):

* ``api="ptr"``   : ``int32_t <name>_launch(module*, void *x_ptr, void *y_ptr, int32_t n, float a, float b,
  cudaStream_t stream)``
* ``api="tensor"``: ``int32_t <name>_launch(module*, <name>_Tensor_x_t *x, <name>_Tensor_y_t *y, float a,
  float b, cudaStream_t stream)`` with ``typedef struct { void *data; int32_t dynamic_shapes[1]; }``
  (1-D compact tensors: the stride is static 1, so only the dynamic extent is passed).

``W4A16_MOE_SELFTEST_COMPILE_DELAY=<seconds>`` makes each compile sleep first (used by the cache-race test).

Importing this module does not import ``cutlass``; the DSL code is built on first compile.
"""

# NOTE: no `from __future__ import annotations`: the DSL needs evaluated annotations of the nested functions.

import functools
import time

from .. import settings
from .spec import KernelSpec, check_arch

FAMILY = "selftest_axpy"
DEFAULTS = {"threads": 128, "bias": True, "api": "ptr"}


def selftest_spec(**params) -> KernelSpec:
    d = dict(DEFAULTS)
    d.update(params)
    return KernelSpec(FAMILY, d)


@functools.lru_cache(maxsize=None)
def _build(threads: int, bias: bool, api: str):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def axpy_kernel(x: cute.Tensor, y: cute.Tensor, n: cutlass.Int32, a: cutlass.Float32, b: cutlass.Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * threads + tidx
        if i < n:
            if cutlass.const_expr(bias):
                y[i] = a * x[i] + b
            else:
                y[i] = a * x[i]

    if api == "ptr":

        @cute.jit
        def axpy(
            x_ptr: cute.Pointer,
            y_ptr: cute.Pointer,
            n: cutlass.Int32,
            a: cutlass.Float32,
            b: cutlass.Float32,
            stream: cuda.CUstream,
        ):
            x = cute.make_tensor(x_ptr, cute.make_layout(n))
            y = cute.make_tensor(y_ptr, cute.make_layout(n))
            axpy_kernel(x, y, n, a, b).launch(
                grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), stream=stream
            )

        return axpy

    if api == "tensor":

        @cute.jit
        def axpy_t(x: cute.Tensor, y: cute.Tensor, a: cutlass.Float32, b: cutlass.Float32, stream: cuda.CUstream):
            n = cute.size(x, mode=[0])
            axpy_kernel(x, y, n, a, b).launch(
                grid=((n + threads - 1) // threads, 1, 1), block=(threads, 1, 1), stream=stream
            )

        return axpy_t

    raise ValueError(f"selftest_axpy: api must be 'ptr' or 'tensor', got {api!r}")


def compile_selftest_axpy(spec: KernelSpec, arch: str):
    """``compile_fn`` of family ``selftest_axpy``: one compile serves every ``n`` (fake pointers/tensors)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_ptr

    check_arch(arch)
    p = {**DEFAULTS, **spec.params_dict}
    unknown = set(p) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"selftest_axpy: unknown params {sorted(unknown)}")
    threads, bias, api = int(p["threads"]), bool(p["bias"]), str(p["api"])
    if not (32 <= threads <= 1024 and threads % 32 == 0):
        raise ValueError(f"selftest_axpy: threads must be a multiple of 32 in [32, 1024], got {threads}")
    delay = settings.get().selftest_compile_delay
    if delay > 0:  # test hook: widen the window in which concurrent builders race for the cache lock
        time.sleep(delay)
    fn = _build(threads, bias, api)
    opts = f"--gpu-arch {arch}"
    if api == "ptr":
        # Fake pointers: the address given to make_ptr is only a placeholder at compile time; the
        # exported entry takes the real address as a `void *` argument.
        xp = make_ptr(cutlass.Float32, 16, cute.AddressSpace.gmem, assumed_align=16)
        yp = make_ptr(cutlass.Float32, 16, cute.AddressSpace.gmem, assumed_align=16)
        return cute.compile(
            fn, xp, yp, cutlass.Int32(1), cutlass.Float32(1.0), cutlass.Float32(0.0), make_fake_stream(),
            options=opts,
        )
    n = cute.sym_int32(symbol="n")
    xt = make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16)
    yt = make_fake_compact_tensor(cutlass.Float32, (n,), assumed_align=16)
    return cute.compile(fn, xt, yt, cutlass.Float32(1.0), cutlass.Float32(0.0), make_fake_stream(), options=opts)

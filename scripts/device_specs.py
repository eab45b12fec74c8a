"""Write the kernel specs a GPU session needs (for ``python -m w4a16_moe aot --specs``).

    PYTHONPATH=python python scripts/device_specs.py --out .device/specs.json [--decode-knobs w8u4/w8u2,...]
    aot/build.sh .device/prebuilt --archs sm_90a --specs .device/specs.json --keep-objects -j 2

The set: the AOT ``full`` subset of every family (what the provider selects), plus what the GPU tests and
the tuner force beyond it: every ``sm90.family.CANDIDATES`` tile shape for the test schemes (INT4 g32,
NVFP4) and the benchmark schemes (INT4 g32 / g128, BF16, SwiGLU), and the decode kernels' knob sets
(``--decode-knobs``, the tuner's), the FP32-staging twins of the shipped tiles tests/test_stage16.py compares with, the persistent decode grids the decode GPU tests force (their K splits
need no specs of their own), and the gpt-oss kernels (biases, ``swiglu_oai``; grouped and decode) tests/test_cute_gpt_oss.py and
tests/test_triton_provider.py select beyond the ``full`` subset's MXFP4 + BF16 set (:data:`GPT_OSS_TESTS`),
the kernels test modules launch directly (their ``needed_specs()``, :data:`TEST_MODULES`), and those of GPU tests
whose calls the provider plans with a family forced or an expert-parallel hint, planned for an H100 and an H200.
``--tiles FILE ...`` adds the kernels of further SM90 tile dicts (``scripts/explore_tiles.py``'s tile files) for the
test and benchmark schemes (INT4 g32 / g128, BF16, SwiGLU, deterministic finalize: an explored tile's shared memory
may hold its ``y`` epilogue and not the fused one's FP32 staging): tiles an experiment times or forces that are no
candidates. With ``--keep-objects`` the exported objects stay in ``.device/prebuilt/.obj``,
so a rebuild after a kernel change recompiles only the kernels whose spec or sources changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

from w4a16_moe.aot import subset_specs  # noqa: E402
from w4a16_moe.formats.schemes import get_scheme  # noqa: E402
from w4a16_moe.kernels.cute.decode import family as dec  # noqa: E402
from w4a16_moe.kernels.cute.sm90 import family as fam  # noqa: E402


#: gpt-oss kernels the GPU tests select beyond the ``full`` subset: (schemes, dtypes, activations, rule bucket
#: index of ``sm90.family.TILES``); every one with and without biases, both finalize modes
GPT_OSS_TESTS = (
    # tests/test_cute_gpt_oss.py's matrix (33 tokens x top-4 over 8 experts: 17 routes per expert)
    (("mxfp4", "int4_g32", "int4_g128_zp"), ("bf16", "fp16"),
     ("swiglu", "swiglu_oai", "swiglu_oai(alpha=1.5,limit=2.0)"), 2),
    # tests/test_cute_gpt_oss.py::test_gpu_bias_non_gated
    (("int4_g128",), ("bf16",), ("relu2", "silu"), 2),
)

#: the decode kernels with biases tests/test_cute_gpt_oss.py::test_gpu_decode_kernels_with_biases forces:
#: (schemes, dtypes), every activation there, its knob sets (the ``s3`` split needs no spec of its own)
GPT_OSS_DECODE_TESTS = (((("mxfp4", "int4_g128_zp"), ("bf16",)), (("int4_g32",), ("fp16",))),
                        ("swiglu", "swiglu_oai", "swiglu_oai(alpha=1.5,limit=2.0)"), ("w4u8/w4u4", "w4u8c5/w4u4c3"))

#: knob sets the decode GPU tests force (``PERSISTENT``, the bit-identity tests and the K-split tests of
#: tests/test_cute_decode.py; the K-split tests force ``s<N>`` on these same sets, and a split is a launch
#: parameter that adds no spec: ``s3`` below stands for every split)
TEST_DECODE_KNOBS = ("w4u8/w4u4", "w4u8c5/w4u4c3", "w4u8c396/w4u4c528", "w4u8s3/w4u4s3", "w4u8c5s3/w4u4c3s3",
                     "w4u8c396s3/w4u4c528s3")

#: tests/test_stage16.py's (scheme, dtype) cases
STAGE16_TESTS = (("int4_g32", "bf16"), ("int4_g128", "bf16"), ("int4_g128", "fp16"), ("nvfp4", "bf16"))

#: tests/test_cute_decode.py's PREFETCH_FP32_KNOBS (a K split adds no specs)
TEST_PREFETCH_FP32_KNOBS = ("w8u8fx/w8u4x", "w4u8c5fx/w4u4c3x")


def _planned_specs(calls, gpus=("NVIDIA H200",)) -> list:
    """The kernel specs of each ``(settings overrides, MoECall)`` of ``calls`` as the provider plans it on each
    of ``gpus`` (kernel availability not checked)."""
    from w4a16_moe import settings
    from w4a16_moe.device import DeviceInfo
    from w4a16_moe.kernels.cute import provider

    real = provider._kernels_available
    provider._kernels_available = lambda arch: None
    out = []
    try:
        for gpu in gpus:
            info = DeviceInfo("cuda", gpu, (9, 0), 132)
            for overrides, c in calls:
                with settings.override(**overrides):
                    p = provider.plan(c, info)
                    provider.clear_plans()
                out += [provider.registry.get(p.family).spec_for(cfg) for cfg in p.configs]
    finally:
        provider._kernels_available = real
        provider.clear_plans()
    return out


def _gpt_oss_test_plans() -> list:
    """The kernels of the gpt-oss GPU tests' calls whose token counts take the warp-MMA rule buckets (their
    CUDA-graph test warms up 1..64 tokens; the Triton suite's biased auto test runs up to 16 tokens), and of the
    33-token matrices of :data:`GPT_OSS_TESTS`, as the provider plans them on an H200 (kernel availability not
    checked)."""
    import torch

    from w4a16_moe.activations import get_activation, swiglu_oai
    from w4a16_moe.validate import MoECall

    dev = torch.device("cuda")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    calls = []
    for fin in ("deterministic", "fused"):
        for act in ("swiglu_oai", swiglu_oai(alpha=1.5, limit=2.0).name):
            for e, h, i, tokens in ((8, 512, 256, range(1, 65)), (16, 2880, 2880, (1, 8, 64, 512))):
                calls += [MoECall(t, 4, h, i, e, torch.bfloat16, dev, get_activation(act), fin, 0, "mxfp4", False, True)
                          for t in tokens]
        # the 33-token matrices of :data:`GPT_OSS_TESTS` as the selection plans them (with and without biases):
        # the cost model, not only the bucket named there, picks their tiles for INT4 schemes
        for names, dts, acts, _ in GPT_OSS_TESTS:
            for n in names:
                for dt in dts:
                    for act in acts:
                        for bias in (False, True):
                            calls.append(MoECall(33, 4, 512, 256, 8, dtypes[dt], dev, get_activation(act), fin, 0, n,
                                                 False, bias))
    return _planned_specs([({}, c) for c in calls])


#: test modules that launch kernels directly (not through the provider's selection) and list them in
#: ``needed_specs()``: the warp kernels' occupancy tests compare with the same tiles built without it, say
TEST_MODULES = ("test_warp_kernel", "test_selection_grid", "test_release_canonical", "test_layout_budget")

#: the GPUs whose selection the provider-planned test calls below are planned for (a GPU session gets either)
PLAN_GPUS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200")


def _test_module(name: str):
    """A module of tests/ (imported for its tables: what its GPU tests launch or call)."""
    import importlib

    tests = os.path.join(os.path.dirname(__file__), "..", "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module(name)


def _test_module_specs() -> list:
    return [s for m in TEST_MODULES for s in _test_module(m).needed_specs()]


def _provider_test_plans() -> list:
    """The kernels of GPU tests whose calls the provider plans with a family forced or a hint given, as it plans
    them on :data:`PLAN_GPUS` (kernel availability not checked): tests/test_cute_shapes.py's TP shards whose sizes
    are no multiples of 64 (every dtype and path) and tests/test_ep_observe.py's expert-parallel layer."""
    import torch

    from w4a16_moe.activations import get_activation
    from w4a16_moe.validate import MoECall

    shapes, ep = _test_module("test_cute_shapes"), _test_module("test_ep_observe")
    dev = torch.device("cuda")
    calls = []  # (settings overrides, call)
    for h, i, scheme, act, bias in shapes.SHARDS:
        for dt in (torch.bfloat16, torch.float16):
            for path in shapes.PATHS:  # as the test's _set_path forces it
                if bias and path == "decode":
                    continue
                forced = dict(cute_decode="1") if path == "decode" else dict(cute_decode="0", cute_family=path)
                runs = ((2, 4, "deterministic"),) if path == "decode" else ((3, 4, "fused"), (80, 4, "deterministic"))
                calls += [(forced, MoECall(t, k, h, i, 8, dt, dev, get_activation(act), fin, 0, scheme, False, bias))
                          for t, k, fin in runs]
    L = ep.EP_LAYER
    for g in (None, L["global_experts"]):
        calls.append(({}, MoECall(L["tokens"], L["top_k"], L["hidden"], L["intermediate"], L["experts"],
                                  torch.bfloat16, dev, get_activation("swiglu"), "deterministic", 0, "int4_g128",
                                  global_experts=g)))
    return _planned_specs(calls, PLAN_GPUS)


def device_specs(decode_knobs=(), extra_tiles=()) -> list:
    specs = list(subset_specs("full", "sm_90a"))
    if extra_tiles:
        specs += fam.variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16",),
                              activations=("swiglu",), finalizes=("deterministic",), tiles=list(extra_tiles))
    for names, fins in ((("int4_g32", "nvfp4"), ("deterministic", "fused")),
                        (("int4_g32", "int4_g128"), ("deterministic", "fused"))):
        specs += fam.variants(schemes=[get_scheme(n) for n in names], dtypes=("bf16",), activations=("swiglu",),
                              finalizes=fins, tiles=fam.CANDIDATES)
    # tests/test_stage16.py: every rule / model tile with the FP32 staging tile (``down_stage16: False``) beside the
    # default 16-bit one, for its (scheme, dtype) cases (NVFP4 on the rule's tiles only)
    for n, dt in STAGE16_TESTS:
        tiles = [t for _, t in fam.TILES] + ([] if n == "nvfp4" else [t for t in fam.MODEL_TILES
                                                                      if fam.scheme_ok(t, n)])
        specs += fam.variants(schemes=[get_scheme(n)], dtypes=(dt,), activations=("swiglu",),
                              finalizes=("deterministic",),
                              tiles=[{**t, "down_stage16": on} for t in tiles for on in (True, False)])
    for names, dts, acts, bucket in GPT_OSS_TESTS:
        specs += fam.variants(schemes=[get_scheme(n) for n in names], dtypes=dts, activations=acts,
                              tiles=[fam.TILES[bucket][1]], biases=(False, True))
    specs += _gpt_oss_test_plans()
    specs += _test_module_specs() + _provider_test_plans()
    pairs, acts, kn = GPT_OSS_DECODE_TESTS
    for names, dts in pairs:
        specs += dec.variants(schemes=[get_scheme(n) for n in names], dtypes=dts, activations=acts,
                              knobs=[dec.knob_items(k) for k in kn], biases=(True,))
    # the persistent decode grids tests/test_cute_decode.py forces, for every scheme, dtype and activation
    specs += dec.variants(knobs=[dec.knob_items(k) for k in TEST_DECODE_KNOBS])
    # the L2-prefetch / FP32-scale knob sets tests/test_cute_decode.py forces (SwiGLU, every scheme and dtype)
    specs += dec.variants(knobs=[dec.knob_items(k) for k in TEST_PREFETCH_FP32_KNOBS], activations=("swiglu",))
    knobs = [dec.knob_items(k) for k in decode_knobs]
    specs += dec.variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16", "fp16"),
                          activations=("swiglu",), knobs=knobs or ((),))
    out, seen = [], set()
    for s in specs:
        if s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--decode-knobs", default="", help="comma-separated knob sets, e.g. w8u4/w8u2,w16u4/w8u2")
    ap.add_argument("--tiles", nargs="*", default=[], help="tile files (a JSON list of SM90 tile dicts, "
                    "scripts/explore_tiles.py's format) whose kernels the session also needs")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(__file__))
    from explore_tiles import load_tiles

    extra = [t for path in a.tiles for f, t in load_tiles(path) if f == "sm90"]
    specs = device_specs([k for k in a.decode_knobs.split(",") if k], extra)
    with open(a.out, "w") as f:
        json.dump([s.to_json() for s in specs], f)
    by = {}
    for s in specs:
        by[s.family] = by.get(s.family, 0) + 1
    print(f"{len(specs)} specs -> {a.out} ({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

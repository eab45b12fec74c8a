"""``python -m w4a16_moe aot --archs sm_90a[,sm_100a] [--subset smoke|full] --out DIR [-j N]``.

Enumerates the declared kernel variants (the same specs the JIT compiles on first use), cross-compiles
each for each arch (no GPU needed), links one self-contained shared library per arch and writes
``DIR/manifest.json`` (spec names, archs, package version, DSL version, source hashes). Point
``W4A16_MOE_PREBUILT_DIR`` at DIR, or build it into the wheel (``W4A16_MOE_AOT_ARCHS``).

Subsets: ``full`` = every scheme, dtype, activation, finalize mode and tile bucket the CuTe provider can
select; ``smoke`` = int4_g32 / int4_g128, BF16, SwiGLU, both finalize modes, all tile buckets.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from typing import Optional

__all__ = ["subset_specs", "main"]


def subset_specs(subset: str) -> list:
    from .formats.schemes import get_scheme
    from .kernels.cute import sm90_family as fam

    if subset == "full":
        return fam.variants()
    if subset == "smoke":
        return fam.variants(schemes=[get_scheme("int4_g32"), get_scheme("int4_g128")], dtypes=("bf16",),
                            activations=("swiglu",))
    raise ValueError(f"--subset: expected smoke or full, got {subset!r}")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m w4a16_moe aot", description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="sm_90a", help="comma-separated: sm_90a, sm_100a")
    ap.add_argument("--subset", default="full", choices=["smoke", "full"])
    ap.add_argument("--out", required=True, help="prebuilt directory to write (manifest.json + <arch>/kernels.so)")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    from .loader import build

    specs = subset_specs(a.subset)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([s.to_json() for s in specs], f)
    t0 = time.perf_counter()
    print(f"aot: {len(specs)} kernel specs x archs {a.archs} -> {a.out} ({a.jobs} workers)", flush=True)
    rc = build.main(["--arch", a.archs, "--specs", f.name, "--prebuilt-dir", a.out, "-j", str(a.jobs)])
    print(f"aot: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

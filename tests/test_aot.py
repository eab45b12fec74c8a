"""The AOT step on the CPU: cross-compile the smoke subset, link it, and resolve every spec as prebuilt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("cutlass", reason="the CuTe DSL (nvidia-cutlass-dsl) is needed to cross-compile")


def test_smoke_subset_builds_and_resolves(tmp_path):
    from w4a16_moe.aot import subset_specs

    out = tmp_path / "prebuilt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "python"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "w4a16_moe", "aot", "--archs", "sm_90a", "--subset", "smoke",
                        "--out", str(out), "-j", "2"], capture_output=True, text=True, env=env, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    manifest = json.loads((out / "manifest.json").read_text())
    specs = subset_specs("smoke")
    assert len(manifest["kernels"]) == len(specs) == 30
    assert (out / "sm_90a" / "kernels.so").stat().st_size < 10 * 2**20
    # the loader's prebuilt lookup finds every spec, with no JIT allowed
    code = (
        "import sys; from w4a16_moe.aot import subset_specs; from w4a16_moe.loader import prebuilt\n"
        "miss=[s.name for s in subset_specs('smoke') if prebuilt.lookup(s, 'sm_90a')[0] is None]\n"
        "print(len(miss)); sys.exit(1 if miss else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(env, W4A16_MOE_PREBUILT_DIR=str(out), W4A16_MOE_DISABLE_JIT="1"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    # needs only libc-family libraries at run time
    needed = subprocess.run(["readelf", "-d", str(out / "sm_90a" / "kernels.so")], capture_output=True, text=True).stdout
    libs = [line.split("[")[1].split("]")[0] for line in needed.splitlines() if "(NEEDED)" in line]
    assert libs and all(lib.startswith(("libc.so", "ld-linux", "libm.so", "libdl.so", "libpthread.so", "librt.so",
                                        "libgcc_s.so", "libstdc++.so")) for lib in libs), libs

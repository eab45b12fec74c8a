"""The AOT wheel, on the CPU.

* tagging (``aot/wheel_backend.py``): the glibc / libstdc++ symbol versions an ELF library needs, and the
  manylinux retagging of a wheel (WHEEL + RECORD rewritten);
* the stable-ABI torch op library (``csrc/w4a16_moe_C.cpp``) built the way the source checkout builds it,
  loaded into this torch: the op and its schema exist, misuse fails with a clear error, launchers bind;
* CMake without ``W4A16_MOE_AOT_ARCHS``: configures with no compiler (the pure-Python install);
* the installed wheel, when ``.ci/run`` has built one and installed it into a fresh venv without the CuTe
  DSL (``W4A16_MOE_WHEEL_PYTHON`` = that venv's python): manifest, SHA-256s, the op library in torch
  2.13 CPU, the loader's decisions, ``doctor``, a package-version mismatch, and the SASS check.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _backend():
    """``aot/wheel_backend.py``; it builds on scikit-build-core, a wheel extra (``pip install -e ".[wheel]"``)."""
    pytest.importorskip("scikit_build_core", reason="the wheel tagging needs scikit-build-core (the `wheel` extra)")
    spec = importlib.util.spec_from_file_location("w4a16_wheel_backend", ROOT / "aot" / "wheel_backend.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _need(tool: str):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not on PATH")


def _tiny_so(tmp_path, name="libt.so", cxx=False) -> Path:
    """A small shared library with glibc (and optionally libstdc++) symbol-version requirements."""
    src = tmp_path / (name + (".cpp" if cxx else ".c"))
    body = "#include <pthread.h>\n#include <dlfcn.h>\n"
    if cxx:
        body += '#include <string>\nextern "C" int n(const char *s) { return (int)std::string(s).size(); }\n'
    body += ('extern "C" ' if cxx else "") + "void *f(void) { dlopen(\"x\", 0); return (void *)pthread_self(); }\n"
    src.write_text(body)
    out = tmp_path / name
    subprocess.run(["g++" if cxx else "gcc", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


def _readelf_versions(path) -> set:
    out = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"Name: ((?:GLIBC|GLIBCXX|CXXABI|GCC)_[\d.]+)", out))


# ------------------------------------------------------------------------------------------------------
# tagging
# ------------------------------------------------------------------------------------------------------
def test_required_versions_match_readelf(tmp_path):
    _need("gcc")
    _need("readelf")
    wb = _backend()
    for so in (_tiny_so(tmp_path), _tiny_so(tmp_path, "libx.so", cxx=True)):
        got = wb.required_versions(so.read_bytes())
        assert got == _readelf_versions(so) and any(v.startswith("GLIBC_") for v in got)
        minor, report = wb.manylinux_level({so.name: so.read_bytes()})
        glibc = max(tuple(map(int, v[6:].split("."))) for v in got if v.startswith("GLIBC_"))
        assert minor >= glibc[1] and report[so.name]["glibc"] == ".".join(map(str, glibc))
    assert wb.required_versions(b"not an elf") == set()


def test_libstdcxx_requirement_raises_the_level(monkeypatch):
    wb = _backend()
    monkeypatch.setattr(wb, "required_versions", lambda data: {"GLIBC_2.17", "GLIBCXX_3.4.30"})
    assert wb.manylinux_level({"a.so": b""})[0] == 35  # GCC 12's libstdc++: Ubuntu 22.04 is the oldest baseline
    monkeypatch.setattr(wb, "required_versions", lambda data: {"GLIBC_2.34", "GLIBCXX_3.4.26"})
    assert wb.manylinux_level({"a.so": b""})[0] == 34
    monkeypatch.setattr(wb, "required_versions", lambda data: {"GLIBC_2.17", "GLIBCXX_3.4.99"})
    with pytest.raises(RuntimeError, match="GLIBCXX_3.4.99"):
        wb.manylinux_level({"a.so": b""})


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _make_wheel(path: Path, files: dict, tag: str) -> None:
    di = "w4a16_moe-0.1.0.dist-info"
    files = dict(files)
    files[f"{di}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    rows = [[n, _record_hash(b), str(len(b))] for n, b in files.items()] + [[f"{di}/RECORD", "", ""]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    files[f"{di}/RECORD"] = buf.getvalue().encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)


def test_retag_wheel(tmp_path):
    _need("gcc")
    wb = _backend()
    so = _tiny_so(tmp_path)
    whl = tmp_path / "w4a16_moe-0.1.0-py3-none-linux_x86_64.whl"
    _make_wheel(whl, {"w4a16_moe/__init__.py": b"x = 1\n", "w4a16_moe/lib/libt.so": so.read_bytes()},
                "py3-none-linux_x86_64")
    minor = wb.manylinux_level({"libt.so": so.read_bytes()})[0]
    name = wb.retag_wheel(whl)
    assert name == f"w4a16_moe-0.1.0-py3-none-manylinux_2_{minor}_x86_64.whl"
    assert not whl.exists()
    with zipfile.ZipFile(tmp_path / name) as z:
        wheel_meta = z.read("w4a16_moe-0.1.0.dist-info/WHEEL").decode()
        assert f"Tag: py3-none-manylinux_2_{minor}_x86_64" in wheel_meta and "linux_x86_64\n" not in wheel_meta
        rows = {r[0]: r for r in csv.reader(io.StringIO(z.read("w4a16_moe-0.1.0.dist-info/RECORD").decode()))}
        for n in z.namelist():
            if not n.endswith("RECORD"):
                assert rows[n][1] == _record_hash(z.read(n)), n
        assert z.read("w4a16_moe/lib/libt.so") == so.read_bytes()
    pure = tmp_path / "w4a16_moe-0.1.0-py3-none-any.whl"
    _make_wheel(pure, {"w4a16_moe/__init__.py": b""}, "py3-none-any")
    assert wb.retag_wheel(pure) == pure.name and pure.exists()


def test_cmake_without_aot_archs_needs_no_compiler(tmp_path):
    _need("cmake")
    env = {k: v for k, v in os.environ.items() if k != "W4A16_MOE_AOT_ARCHS"}
    env["CXX"] = "/nonexistent/c++"  # proves no compiler is looked up
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "b")], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pure-Python build" in r.stdout


# ------------------------------------------------------------------------------------------------------
# the op library, built from csrc/ the way a source checkout builds it
# ------------------------------------------------------------------------------------------------------
OP_CHECK = textwrap.dedent("""
    import json, os, torch
    from w4a16_moe.loader import torch_op
    ok, why = torch_op.load()
    res = {"ok": ok, "why": why}
    op = torch.ops.w4a16_moe_C.grouped_gemm
    res["schema"] = str(op.default._schema)
    t = torch.zeros(4)
    try:
        op(1, 1, t, t, t, t, t, t, t, t, t, 1, 1, 1, 1, 1, 1, 1)
    except Exception as e:
        res["cpu_error"] = f"{type(e).__name__}: {e}"
    class K:  # a kernel with the grouped-GEMM ABI (the launcher binds without a GPU)
        name = "fake"
        launch_address = 1
        abi = {"args": [{"name": n, "kind": k, "ctype": "int32_t" if k == "scalar" else "void *"}
                        for n, k in torch_op.GEMM_ARGS]}
    res["launcher"] = repr(torch_op.gemm_launcher(K()))
    K.abi = {"args": [{"name": "x", "kind": "ptr", "ctype": "void *"}]}
    res["other_abi"] = repr(torch_op.gemm_launcher(K()))
    print(json.dumps(res))
""")


@pytest.fixture(scope="module")
def op_library(tmp_path_factory):
    _need(os.environ.get("CXX") or "g++")
    from w4a16_moe.loader import torch_op

    return torch_op.build_library(tmp_path_factory.mktemp("op") / torch_op.LIB_NAME)


def test_op_library_loads_in_this_torch(op_library):
    from w4a16_moe.loader.toolchain import read_needed

    assert "libtorch_cpu.so" in read_needed(op_library)
    assert not [n for n in read_needed(op_library) if "cuda" in n or "python" in n]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), W4A16_MOE_TORCH_OP_LIB=str(op_library))
    r = subprocess.run([sys.executable, "-c", OP_CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ok"] and str(op_library) in res["why"]
    assert res["schema"] == (
        "w4a16_moe_C::grouped_gemm(int launch_fn, int module, Tensor w, Tensor act, Tensor(a!) out, "
        "Tensor sorted_routes, Tensor route_start, Tensor block_start, Tensor topk_weights, Tensor(b!) ws, "
        "Tensor(c!) counters, int num_experts, int n, int k, int num_routes, int top_k, int max_tiles, "
        "int num_splits) -> ()")
    assert res["cpu_error"].startswith("NotImplementedError") and "'CPU' backend" in res["cpu_error"]
    assert res["launcher"].startswith("<GemmLauncher fake") and res["other_abi"] == "None"
    # switched off: every kernel launches through ctypes
    r = subprocess.run([sys.executable, "-c", "from w4a16_moe.loader import torch_op; print(torch_op.load())"],
                       capture_output=True, text=True, env=dict(env, W4A16_MOE_TORCH_OP="0"), timeout=300)
    assert "disabled by W4A16_MOE_TORCH_OP=0" in r.stdout, r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------------
# the installed wheel (.ci/run builds it, installs it into a fresh venv and sets W4A16_MOE_WHEEL_PYTHON)
# ------------------------------------------------------------------------------------------------------
INSTALLED_CHECK = textwrap.dedent("""
    import hashlib, importlib.util, json, shutil, sys, tempfile
    from pathlib import Path
    import torch, w4a16_moe
    from w4a16_moe.loader import KernelSpec, kernel_status, prebuilt, torch_op
    pkg = Path(w4a16_moe.__file__).parent
    pb = pkg / "_prebuilt"
    m = json.loads((pb / "manifest.json").read_text())
    res = {"file": w4a16_moe.__file__, "version": w4a16_moe.__version__, "torch": torch.__version__,
           "cutlass": importlib.util.find_spec("cutlass") is not None, "prebuilt_dir": str(prebuilt.prebuilt_dir()),
           "manifest": {k: m.get(k) for k in ("package_version", "dsl_version", "subset", "archs", "families",
                                               "linker", "abi_version")},
           "sha_ok": all(hashlib.sha256((pb / l["file"]).read_bytes()).hexdigest() == l["sha256"]
                         for l in m["libraries"]),
           "libraries": [l["file"] for l in m["libraries"]]}
    ok, why = torch_op.load()
    res["op"] = [ok, why, ok and hasattr(torch.ops.w4a16_moe_C, "grouped_gemm")]
    res["decisions"] = {}
    for arch in sorted({k["arch"] for k in m["kernels"]}):
        for fam in sorted({k["family"] for k in m["kernels"] if k["arch"] == arch}):
            k = next(k for k in m["kernels"] if k["arch"] == arch and k["family"] == fam)
            spec = KernelSpec(k["family"], k["params"])
            other = spec.replace(dtype="fp16" if spec.param("dtype") == "bf16" else "bf16")
            res["decisions"][f"{arch} {fam}"] = [kernel_status(spec, arch), kernel_status(other, arch)]
    tmp = Path(tempfile.mkdtemp())
    shutil.copytree(pb, tmp / "pb")
    mm = json.loads((tmp / "pb" / "manifest.json").read_text())
    mm["package_version"] = "0.0.1"
    (tmp / "pb" / "manifest.json").write_text(json.dumps(mm))
    spec = KernelSpec(m["kernels"][0]["family"], m["kernels"][0]["params"])
    res["mismatch"] = prebuilt.lookup(spec, m["kernels"][0]["arch"], tmp / "pb")[1]
    print(json.dumps(res))
""")


@pytest.fixture(scope="module")
def wheel_python():
    py = os.environ.get("W4A16_MOE_WHEEL_PYTHON")
    if not py:
        pytest.skip("no installed AOT wheel to check: .ci/run builds one and sets W4A16_MOE_WHEEL_PYTHON")
    return py


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("W4A16_MOE_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def test_installed_wheel(wheel_python, tmp_path):
    r = subprocess.run([wheel_python, "-c", INSTALLED_CHECK], capture_output=True, text=True, cwd=tmp_path,
                       env=_clean_env(W4A16_MOE_CACHE_DIR=str(tmp_path / "cache")), timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert "site-packages" in res["file"] and not res["file"].startswith(str(ROOT / "python")), res["file"]
    assert not res["cutlass"], "the wheel venv must not have the CuTe DSL"
    assert res["torch"].startswith("2.13.0")
    man = res["manifest"]
    assert man["package_version"] == res["version"] and man["dsl_version"] == "4.8.1" and man["linker"] == "cmake"
    assert man["subset"] == "smoke" and man["archs"]["sm_90a"]["kernels"] > 0
    assert man["families"]["sm90_w4a16_gemm"]["sass_expect"] == ["HGMMA"]
    assert man["families"]["sm90_w4a16_gemm"]["sass_local_budget"]  # the SASS check's rules travel in the wheel
    assert man["families"]["sm90_w4a16_gemm"]["sass_serial_ok"]
    assert res["sha_ok"] and "sm_90a/kernels.so" in res["libraries"]
    assert res["op"][0] and res["op"][2] and "installed package" in res["op"][1], res["op"]
    for key, (hit, miss) in res["decisions"].items():
        assert hit[0] == "prebuilt", (key, hit)
        assert miss[0] is None and "not installed" in miss[1] and "differs in" in miss[1], (key, miss)
    assert "sm_90a sm90_w4a16_gemm" in res["decisions"]
    assert "package version 0.0.1" in res["mismatch"] and f"installed is {res['version']}" in res["mismatch"]


def test_installed_wheel_doctor(wheel_python, tmp_path):
    r = subprocess.run([wheel_python, "-m", "w4a16_moe", "doctor", "--json", "--arch", "sm_90a"], capture_output=True,
                       text=True, cwd=tmp_path, env=_clean_env(W4A16_MOE_CACHE_DIR=str(tmp_path / "c")), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout)
    k = d["kernels"]
    assert "kernels in" in k["prebuilt"] and "smoke subset" in k["prebuilt"] and "MISMATCH" not in k["prebuilt"]
    assert k["cute_dsl"].startswith("not installed")
    assert k["torch_op"].startswith("loaded") and "installed package" in k["torch_op"]
    look = d["kernel_lookup"]
    assert look["arch"] == "sm_90a"
    assert look["gate_up"]["source"] == "prebuilt" and look["down"]["source"] == "prebuilt", look


def test_installed_wheel_sass(wheel_python, tmp_path):
    r = subprocess.run([wheel_python, "-c", "import w4a16_moe, os; print(os.path.dirname(w4a16_moe.__file__))"],
                       capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=300)
    pb = Path(r.stdout.strip()) / "_prebuilt"
    r = subprocess.run([wheel_python, "-m", "w4a16_moe.loader.sass", str(pb), "--json"], capture_output=True,
                       text=True, cwd=tmp_path, env=_clean_env(), timeout=900)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    rep = json.loads(r.stdout)
    # local memory only within a kernel's declared budget (the manifest's sass_local_budget; a full wheel has 12
    # such kernels for sm_90a, docs/perf/2026-12-04-local-memory) or where a family accepts it on an arch
    # (sass_allow_local); then a warning
    assert rep["ok"], rep["problems"][:10]
    man = json.loads((pb / "manifest.json").read_text())
    allowed = {(f, a) for f, v in man["families"].items() for a in v["sass_allow_local"]}
    # a serialized WGMMA pipeline only where a rule in the manifest accepts it (sass_serial_ok: the tiles timed as
    # built, docs/perf/2026-12-04-wgmma-serial); then a warning too
    assert all(k["local_budget"] or k["serial_ok"] or (k["family"], k["arch"]) in allowed
               for k in rep["kernels"] if k["warnings"])
    assert all(k["serial_ok"] for k in rep["kernels"] if k["wgmma_serialized"])
    fams = {(k["arch"], k["family"]) for k in rep["kernels"]}
    assert ("sm_90a", "sm90_w4a16_gemm") in fams
    from w4a16_moe.kernels.cute import registry

    expect = {f.spec_family: f.sass_expect for f in registry.families()}  # e.g. HGMMA (sm90), HMMA; routing: none
    assert expect["sm90_w4a16_gemm"] and expect["warp_w4a16_gemm"]
    for k in rep["kernels"]:
        for want in expect[k["family"]]:
            assert k["opcodes"].get(want), (k["name"], k["arch"], want, k["opcodes"])

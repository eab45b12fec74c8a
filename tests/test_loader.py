"""Kernel loader: spec naming, cache location, prebuilt lookup, JIT cache (locking, atomic rename, corruption),
compile -> export -> link -> load of the self-test kernel for sm_90a and sm_100a on a CPU-only machine.

Tests that compile need the CuTe DSL and skip cleanly without it; launching needs a GPU (``gpu`` marker).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from w4a16_moe.loader import jit_cache, prebuilt
from w4a16_moe.loader.spec import MAX_NAME_LEN, KernelSpec
from w4a16_moe.loader.selftest_kernel import selftest_spec

ARCHS = ("sm_90a", "sm_100a")
FORBIDDEN_NEEDED = ("libcuda", "libcudart", "libcute_dsl_runtime", "libstdc++", "libtorch", "libpython")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    for var in ("W4A16_MOE_DISABLE_JIT", "W4A16_MOE_PREBUILT_DIR", "W4A16_MOE_SELFTEST_COMPILE_DELAY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("W4A16_MOE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("W4A16_MOE_PREBUILT_DIR", str(tmp_path / "no_prebuilt"))
    yield
    import w4a16_moe.loader as L

    L._KERNELS.clear()
    L._ORIGIN.clear()


def _need_dsl():
    pytest.importorskip("cutlass", reason="CuTe DSL (nvidia-cutlass-dsl) not installed")
    from w4a16_moe.loader.toolchain import BuildError, find_cuda_toolkit

    try:
        find_cuda_toolkit()
    except BuildError as e:
        pytest.skip(str(e))


# ------------------------------------------------------------------------------------------------------
# spec naming
# ------------------------------------------------------------------------------------------------------
BASE = {"bm": 64, "bn": 128, "stages": 4, "swap_ab": False, "act": "swiglu", "group": 32}


def test_name_is_deterministic_golden():
    # Fixed value: the name must not depend on the process, hash seed, platform or param order.
    s = selftest_spec()
    assert s.name == "selftest_axpy__apiptr_biast_threads128__h23d13684fe"
    assert KernelSpec("selftest_axpy", [("threads", 128), ("api", "ptr"), ("bias", True)]).name == s.name
    assert KernelSpec.make("selftest_axpy", bias=True, api="ptr", threads=128) == s


def test_every_param_changes_the_name():
    base = KernelSpec("sm90_w4a16_gemm", BASE)
    assert base.name.startswith("sm90_w4a16_gemm__")
    variants = {
        "bm": 128, "bn": 256, "stages": 3, "swap_ab": True, "act": "silu", "group": 128,
    }
    names = {base.name}
    for k, v in variants.items():
        n = base.replace(**{k: v}).name
        assert n not in names, k
        names.add(n)
    names.add(KernelSpec("sm90_w4a16_gemm", {**BASE, "extra": 1}).name)  # adding a param
    rest = dict(BASE)
    rest.pop("group")
    names.add(KernelSpec("sm90_w4a16_gemm", rest).name)  # removing one
    names.add(KernelSpec("sm100_w4a16_gemm", BASE).name)  # family
    assert len(names) == len(variants) + 4
    # type-aware: True vs 1, "1" vs 1
    a, b, c = (KernelSpec("f", {"x": v}) for v in (True, 1, "1"))
    assert len({a.name, b.name, c.name}) == 3 and len({a, b, c}) == 3
    # lossy readable parts still differ through the hash
    assert KernelSpec("f", {"s": "a-b"}).name != KernelSpec("f", {"s": "a_b"}).name


def test_names_are_valid_identifiers_and_bounded():
    specs = [
        KernelSpec("f"),
        KernelSpec("sm90_w4a16_gemm", BASE),
        KernelSpec("f", {"neg": -5, "s": "weird str/ü!"}),
        KernelSpec("f", {f"param_{i}": "v" * 20 for i in range(30)}),
    ]
    for s in specs:
        assert s.name.isidentifier(), s.name
        assert len(s.name) <= MAX_NAME_LEN
        assert KernelSpec.from_json(json.loads(json.dumps(s.to_json()))) == s
    long = specs[-1]
    assert long.name != KernelSpec("f", {**long.params_dict, "param_29": "w" * 20}).name


@pytest.mark.parametrize(
    "family,params",
    [("Bad", {}), ("a__b", {}), ("f", {"Bad": 1}), ("f", {"x": 1.5}), ("f", {"x": None}), ("f", [("x", 1), ("x", 2)])],
)
def test_invalid_specs_rejected(family, params):
    with pytest.raises((ValueError, TypeError)):
        KernelSpec(family, params)


# ------------------------------------------------------------------------------------------------------
# cache location
# ------------------------------------------------------------------------------------------------------
def _fake_checkout(tmp_path, name):
    root = tmp_path / "checkout"
    pkg = root / "python" / "w4a16_moe"
    pkg.mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    return root, pkg


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("W4A16_MOE_CACHE_DIR", str(tmp_path / "x"))
    assert jit_cache.cache_dir() == tmp_path / "x"
    assert jit_cache.cache_dir_source() == "W4A16_MOE_CACHE_DIR"


def test_cache_dir_source_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("W4A16_MOE_CACHE_DIR")
    root, pkg = _fake_checkout(tmp_path, "w4a16-moe")
    monkeypatch.setattr(jit_cache, "_package_dir", lambda: pkg)
    assert jit_cache.cache_dir() == root / ".cache" / "w4a16_moe"


def test_cache_dir_user_fallback(monkeypatch, tmp_path):
    monkeypatch.delenv("W4A16_MOE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    _, pkg = _fake_checkout(tmp_path, "some-other-project")
    monkeypatch.setattr(jit_cache, "_package_dir", lambda: pkg)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jit_cache.cache_dir() == tmp_path / "home" / ".cache" / "w4a16_moe"
    monkeypatch.setattr(jit_cache, "_package_dir", lambda: tmp_path / "site-packages" / "w4a16_moe")
    assert jit_cache.cache_dir() == tmp_path / "home" / ".cache" / "w4a16_moe"


def test_cache_dir_of_this_checkout(monkeypatch):
    monkeypatch.delenv("W4A16_MOE_CACHE_DIR")
    root = jit_cache.source_checkout_root()
    if root is None:
        pytest.skip("not running from a source checkout")
    assert jit_cache.cache_dir() == root / ".cache" / "w4a16_moe"


def test_loader_import_does_not_import_cutlass():
    code = "import sys, w4a16_moe.loader as L; L.describe(); assert 'cutlass' not in sys.modules, 'cutlass imported'"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------------------
# errors without compiling
# ------------------------------------------------------------------------------------------------------
def test_disable_jit_error_names_the_spec(monkeypatch):
    import w4a16_moe.loader as L

    monkeypatch.setenv("W4A16_MOE_DISABLE_JIT", "1")
    spec = selftest_spec(threads=96)
    with pytest.raises(L.JitDisabledError) as ei:
        L.get_kernel(spec, "sm_90a")
    msg = str(ei.value)
    assert spec.name in msg and "W4A16_MOE_DISABLE_JIT" in msg and "sm_90a" in msg
    assert "no prebuilt manifest" in msg  # why the prebuilt path did not serve it
    assert ei.value.spec == spec
    assert not any((Path(os.environ["W4A16_MOE_CACHE_DIR"])).rglob("*.so"))


def test_missing_dsl_error_names_the_spec(monkeypatch):
    from w4a16_moe.loader import toolchain

    monkeypatch.setattr(toolchain, "dsl_importable", lambda: False)
    spec = selftest_spec(threads=352)
    with pytest.raises(jit_cache.KernelNotAvailableError, match=spec.name) as ei:
        jit_cache.get_or_build(spec, "sm_100a")
    assert "not installed" in str(ei.value) and not isinstance(ei.value, jit_cache.JitDisabledError)


def test_unsupported_arch_rejected():
    import w4a16_moe.loader as L

    with pytest.raises(ValueError):
        L.get_kernel(selftest_spec(), "sm_75")


def test_arch_names_of_capabilities():
    import w4a16_moe.loader as L

    assert [L.arch_of_capability(*c) for c in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))] == [
        "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a"]


def test_kernel_status_explains_without_building(monkeypatch):
    import w4a16_moe.loader as L
    from w4a16_moe.loader import toolchain

    spec = selftest_spec(threads=224)
    src, why = L.kernel_status(spec, "sm_90a")
    assert src == ("jit" if toolchain.dsl_importable() else None) and "no prebuilt manifest" in why
    monkeypatch.setattr(toolchain, "dsl_importable", lambda: False)
    src, why = L.kernel_status(spec, "sm_90a")
    assert src is None and "not installed" in why and "not in the JIT cache" in why
    monkeypatch.setenv("W4A16_MOE_DISABLE_JIT", "1")
    assert "W4A16_MOE_DISABLE_JIT" in L.kernel_status(spec, "sm_90a")[1]
    assert not any(Path(os.environ["W4A16_MOE_CACHE_DIR"]).rglob("*.so"))


def test_prebuilt_mismatch_reasons(tmp_path):
    from w4a16_moe.loader.identity import ABI_VERSION, package_version

    d = tmp_path / "pb"
    d.mkdir()
    spec = selftest_spec()
    assert "no prebuilt manifest" in prebuilt.lookup(spec, "sm_90a", d)[1]

    def write(**over):
        m = {
            "format": prebuilt.MANIFEST_FORMAT, "format_version": 1, "package_version": package_version(),
            "dsl_version": "4.8.1", "abi_version": ABI_VERSION,
            "libraries": [{"file": "sm_90a/k.so", "meta": "sm_90a/meta.json", "arch": "sm_90a", "sha256": "0", "size": 1}],
            "kernels": [{**selftest_spec(threads=256).to_json(), "arch": "sm_90a", "library": "sm_90a/k.so"},
                        {**spec.to_json(), "arch": "sm_100a", "library": "sm_100a/k.so"}],
        }
        m.update(over)
        (d / "manifest.json").write_text(json.dumps(m))
        prebuilt._MANIFESTS.clear()

    write(package_version="0.0.0-other")
    assert "package version 0.0.0-other" in prebuilt.lookup(spec, "sm_90a", d)[1]
    write()
    assert "only for ['sm_100a']" in prebuilt.lookup(spec, "sm_90a", d)[1]
    why = prebuilt.lookup(selftest_spec(threads=512), "sm_90a", d)[1]
    assert "threads=512 vs 256" in why
    write(abi_version=ABI_VERSION + 1)
    assert "loader ABI" in prebuilt.lookup(spec, "sm_90a", d)[1]
    # an arch the AOT build had no kernels for says so
    write(archs={"sm_90a": {"kernels": 1}, "sm_120a": {"kernels": 0, "reason": "family x builds only sm_90a"}})
    assert prebuilt.lookup(spec, "sm_120a", d)[1] == (
        f"the prebuilt build has no kernels for sm_120a: family x builds only sm_90a ({spec.name} is prebuilt for "
        "['sm_100a'])")
    assert prebuilt.summary(d)["empty_archs"] == {"sm_120a": "family x builds only sm_90a"}
    with pytest.raises(ValueError, match="core manifest field"):
        prebuilt.write_manifest(d, [], extra={"kernels": []})


def test_describe_is_flat():
    import w4a16_moe.loader as L

    d = L.describe()
    for key in ("cache_dir", "jit", "cute_dsl", "prebuilt", "cache_entries", "families"):
        assert key in d
    assert all(isinstance(v, (str, int)) for v in d.values())


def test_lookup_modules_import_no_build_code():
    """prebuilt / jit_cache / the loader identify artifacts with loader.identity alone: no compiler discovery,
    shim generation or compile pool is imported until something is built."""
    code = ("import sys, w4a16_moe.loader, w4a16_moe.loader.prebuilt, w4a16_moe.loader.jit_cache; "
            "print([m for m in sys.modules if m.split('.')[-1] in ('build', 'shim', 'toolchain', 'compile_pool')])")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_parse_synthetic_header():
    """Header shapes the self-test kernel does not produce: strided tensors, tensor lists, int arrays, fp16."""
    from w4a16_moe.loader.shim import parse_header_abi

    P = "k"
    hdr = f"""
typedef struct {{
    cudaLibrary_t module;
}} {P}_Kernel_Module_t;
typedef struct {{
    void *data;
    int32_t dynamic_shapes[2];
    int64_t dynamic_strides[1];
}} {P}_Tensor_a_t;
typedef struct {{
    void *data;
    int64_t dynamic_shapes[1];
}} {P}_Tensor_b_t;
typedef struct {{
    {P}_Tensor_b_t elements[3];
    int32_t count;
}} {P}_TensorList_b_t;
void _mlir_{P}__mlir_ciface_cutlass_f(void **args, int32_t num_args);
static inline int32_t cute_dsl_{P}_wrapper({P}_Kernel_Module_t *module, {P}_Tensor_a_t *a, {P}_TensorList_b_t *b, int32_t*shape, __half_raw h, uint8_t flag, cudaStream_t stream) {{
    int32_t ret = 0;
    void *args[9] = {{
        a, &b->elements[0], &b->elements[1], &b->elements[2], &shape[0], &shape[1], &h, &flag, &stream,
        &ret
    }};
    _mlir_{P}__mlir_ciface_cutlass_f(args, 10);
    return ret;
}}
"""
    abi = parse_header_abi(hdr, P)
    kinds = [(a["name"], a["kind"]) for a in abi["args"]]
    assert kinds == [("a", "tensor"), ("b", "tensor_list"), ("shape", "array"), ("h", "half"), ("flag", "scalar"), ("stream", "stream")]
    assert abi["args"][0]["fields"] == [["data", "void *", 1], ["dynamic_shapes", "int32_t", 2], ["dynamic_strides", "int64_t", 1]]
    assert abi["args"][1]["count"] == 3 and abi["args"][1]["fields"][1] == ["dynamic_shapes", "int64_t", 1]
    assert abi["args"][2]["count"] == 2 and abi["args"][2]["ctype"] == "int32_t"
    assert abi["ciface"] == f"_mlir_{P}__mlir_ciface_cutlass_f"
    assert "uint16_t h" in abi["signature"] and "int32_t *shape" in abi["signature"]


# ------------------------------------------------------------------------------------------------------
# compile -> export -> link -> load (needs the DSL, not a GPU)
# ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built_libs(tmp_path_factory):
    """One library per arch holding the ptr and tensor variants of the self-test kernel."""
    _need_dsl()
    from w4a16_moe.loader import build

    out = {}
    root = tmp_path_factory.mktemp("libs")
    specs = [selftest_spec(), selftest_spec(api="tensor", bias=False)]
    for arch in ARCHS:
        t0 = time.perf_counter()
        meta = build.build_library(specs, arch, root / arch / "kernels.so")
        out[arch] = (root / arch / "kernels.so", meta, time.perf_counter() - t0)
    return specs, out


@pytest.mark.parametrize("arch", ARCHS)
def test_library_is_self_contained(built_libs, arch):
    from w4a16_moe.loader import build, identity, shim, toolchain

    specs, libs = built_libs
    so, meta, _ = libs[arch]
    needed = toolchain.read_needed(so)
    assert needed == meta["needed"]
    assert not [n for n in needed if n.startswith(FORBIDDEN_NEEDED)], needed
    assert set(needed) <= build.ALLOWED_NEEDED
    assert toolchain.read_dynamic_symbols(so) == sorted(shim.exported_symbols([s.name for s in specs]))
    assert meta["sha256"] == identity.sha256_file(so) and meta["size"] == so.stat().st_size
    assert meta["arch"] == arch and meta["dsl_version"] == identity.dsl_version()
    assert [k["name"] for k in meta["kernels"]] == [s.name for s in specs]
    assert all(k["source_hash"] and k["abi"]["args"] for k in meta["kernels"])
    # every kernel's cubin is recorded and sits, byte for byte, inside the library
    from w4a16_moe.loader.sass import extract_cubins

    in_lib = {c.sha256: c for c in extract_cubins(so.read_bytes())}
    sm = int(arch[3:].rstrip("a"))
    for k in meta["kernels"]:
        assert k["cubins"] and all(c["sha256"] in in_lib and c["sm"] == sm for c in k["cubins"]), k["name"]
    # the cubin inside targets the requested arch
    obj = so.parent / f"obj-{arch}" / f"{specs[0].name}.o"
    assert arch.encode() in obj.read_bytes() or arch.replace("_", "").encode() in obj.read_bytes()


@pytest.mark.parametrize("arch", ARCHS)
def test_library_dlopens_and_describes_abi(built_libs, arch):
    from w4a16_moe.loader.library import KernelLibrary, KernelLoadError

    specs, libs = built_libs
    lib = KernelLibrary(libs[arch][0])
    assert lib.arch == arch and lib.kernel_names == [s.name for s in specs]
    kp = lib.kernel(specs[0].name)
    assert kp.arg_names == ["x_ptr", "y_ptr", "n", "a", "b", "stream"]
    assert kp.signature == (
        f"int32_t {specs[0].name}_launch({specs[0].name}_Kernel_Module_t *module, void *x_ptr, void *y_ptr, "
        "int32_t n, float a, float b, cudaStream_t stream)"
    )
    assert kp.launch_address and getattr(lib._lib, specs[0].name + "_module_load")  # symbols resolve
    kt = lib.kernel(specs[1].name)
    assert [a["kind"] for a in kt.abi["args"]] == ["tensor", "tensor", "scalar", "scalar", "stream"]
    t = kt.make_tensor("x", 0x1000, shapes=(77,))
    assert t.data == 0x1000 and list(t.dynamic_shapes) == [77]
    with pytest.raises(ValueError):
        kt.make_tensor("x", 0, shapes=(1, 2))
    with pytest.raises(TypeError):
        kp(1, 2, 3)
    if not _has_cuda_driver():
        # No driver here: the module load must fail cleanly with the CUDA error, not crash or spin.
        with pytest.raises(KernelLoadError, match="cudaError"):
            kp(0, 0, 16, 1.0, 0.0, 0)
        assert not kp.loaded


def test_parallel_compile_driver(tmp_path):
    _need_dsl()
    from w4a16_moe.loader import build
    from w4a16_moe.loader.compile_pool import compile_objects_parallel

    specs = [selftest_spec(threads=64), selftest_spec(threads=256, api="tensor")]
    objs = compile_objects_parallel(specs, "sm_90a", tmp_path / "obj", workers=2)
    assert [o.stem for o in objs] == [s.name for s in specs] and all(o.exists() for o in objs)
    meta = build.link_shared_library(objs, tmp_path / "k.so")
    assert meta["library"] == "k.so" and (tmp_path / "meta.json").exists()


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an orphan's exit status may wait for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers are bound to the build with prctl (Linux)")
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_compile_workers_die_with_the_build(sig):
    """A build killed from outside (a CI timeout, ``kill``) leaves no compile worker running on: the pool's
    workers are bound to the process that started them (loader/compile_pool.py)."""
    import signal

    code = (
        "import time\n"
        "from w4a16_moe.loader import compile_pool\n"
        "ex = compile_pool._executor(2)\n"
        "futs = [ex.submit(time.sleep, 300) for _ in range(2)]\n"
        "while len(ex._processes) < 2: time.sleep(0.05)\n"
        "time.sleep(1.0)\n"
        "print(' '.join(str(p) for p in ex._processes), flush=True)\n"
        "time.sleep(300)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "python"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_running(p) for p in pids)
    finally:
        os.kill(proc.pid, getattr(signal, sig))
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"compile workers {left} outlived the build ({sig})"


def test_get_kernel_jit_then_cache(monkeypatch):
    _need_dsl()
    import w4a16_moe.loader as L

    spec = selftest_spec(threads=64, bias=False)
    k = L.get_kernel(spec, "sm_100a")
    assert L.kernel_origin(spec, "sm_100a") == "jit-built"
    assert L.get_kernel(spec, "sm_100a") is k  # memoized in-process
    L._KERNELS.clear()
    t0 = time.perf_counter()
    L.get_kernel(spec, "sm_100a")
    assert L.kernel_origin(spec, "sm_100a") == "jit-cache"
    assert time.perf_counter() - t0 < 0.5
    # with JIT disabled, the cached entry still serves
    monkeypatch.setenv("W4A16_MOE_DISABLE_JIT", "1")
    L._KERNELS.clear()
    L.get_kernel(spec, "sm_100a")
    assert L.kernel_origin(spec, "sm_100a") == "jit-cache"


def test_prebuilt_is_preferred(built_libs, monkeypatch, tmp_path):
    import shutil

    import w4a16_moe.loader as L

    specs, libs = built_libs
    pb = tmp_path / "pb"
    metas = []
    for arch in ARCHS:
        (pb / arch).mkdir(parents=True)
        shutil.copy(libs[arch][0], pb / arch / "kernels.so")
        (pb / arch / "meta.json").write_text(json.dumps(libs[arch][1]))
        metas.append(pb / arch / "meta.json")
    m = prebuilt.write_manifest(pb, metas)
    assert len(m["kernels"]) == 2 * len(specs)
    monkeypatch.setenv("W4A16_MOE_PREBUILT_DIR", str(pb))
    monkeypatch.setenv("W4A16_MOE_DISABLE_JIT", "1")
    for arch in ARCHS:
        k = L.get_kernel(specs[0], arch)
        assert L.kernel_origin(specs[0], arch) == "prebuilt" and k.library.path == (pb / arch / "kernels.so").resolve()
    assert "4 kernels in 2 libraries" in L.describe()["prebuilt"]
    # a corrupted prebuilt library is refused with a reason
    prebuilt._VERIFIED.clear()
    # (replace the file rather than overwrite it: this process has it mapped, and truncating a mapped
    # library makes the next touch of its pages, at exit at the latest, fail with SIGBUS)
    (pb / "sm_90a" / "garbage.so").write_bytes(b"garbage")
    os.replace(pb / "sm_90a" / "garbage.so", pb / "sm_90a" / "kernels.so")
    assert "SHA-256" in prebuilt.lookup(specs[1], "sm_90a")[1]


# ------------------------------------------------------------------------------------------------------
# JIT cache: corruption, locking, atomic rename
# ------------------------------------------------------------------------------------------------------
def _corrupt_truncate(entry, spec):
    p = jit_cache.library_path(entry, spec)
    p.write_bytes(p.read_bytes()[:1000])


def _corrupt_flip(entry, spec):
    p = jit_cache.library_path(entry, spec)
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


def _corrupt_meta_missing(entry, spec):
    (entry / "meta.json").unlink()


def _corrupt_meta_garbage(entry, spec):
    (entry / "meta.json").write_text("{not json")


def _corrupt_lib_missing(entry, spec):
    jit_cache.library_path(entry, spec).unlink()


def test_corrupt_entries_are_rebuilt():
    _need_dsl()
    spec = selftest_spec(threads=32)
    r = jit_cache.get_or_build(spec, "sm_90a")
    assert r.status == "built"
    assert jit_cache.get_or_build(spec, "sm_90a").status == "hit"
    entry = r.library.parent
    for corrupt in (_corrupt_truncate, _corrupt_flip, _corrupt_meta_missing, _corrupt_meta_garbage, _corrupt_lib_missing):
        corrupt(entry, spec)
        ok, why = jit_cache.validate_entry(entry, spec, "sm_90a")
        assert not ok, corrupt.__name__
        r2 = jit_cache.get_or_build(spec, "sm_90a")
        assert r2.status == "rebuilt", (corrupt.__name__, why)
        assert jit_cache.validate_entry(entry, spec, "sm_90a")[0]
    # a half-finished build left by a crashed process is cleaned up by the next builder
    stale = entry.parent / f".tmp-{entry.name}-crashed"
    stale.mkdir()
    _corrupt_meta_missing(entry, spec)
    jit_cache.get_or_build(spec, "sm_90a")
    assert not stale.exists()
    assert not list(entry.parent.glob(".trash-*"))


def _race_worker(cache: str, barrier, q) -> None:
    os.environ["W4A16_MOE_CACHE_DIR"] = cache
    os.environ["W4A16_MOE_SELFTEST_COMPILE_DELAY"] = "1.5"
    try:
        from w4a16_moe import settings

        settings.refresh()  # a forked worker inherits the parent's snapshot
        from w4a16_moe.loader import jit_cache as jc
        from w4a16_moe.loader.selftest_kernel import selftest_spec as ss

        spec = ss(threads=160)
        jc.entry_key(spec, "sm_90a")
        barrier.wait(timeout=300)
        t0 = time.perf_counter()
        r = jc.get_or_build(spec, "sm_90a")
        q.put((r.status, str(r.library), time.perf_counter() - t0))
    except BaseException as e:  # report instead of hanging the parent
        q.put(("error", repr(e), 0.0))


def test_two_processes_race_on_one_entry(tmp_path):
    _need_dsl()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    q = ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(str(tmp_path / "race"), barrier, q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    statuses = sorted(r[0] for r in results)
    assert statuses == ["built", "waited"], results
    assert results[0][1] == results[1][1]
    spec = selftest_spec(threads=160)
    entry = Path(results[0][1]).parent
    assert jit_cache.validate_entry(entry, spec, "sm_90a")[0]
    # exactly one build happened: one entry, no temp dirs left
    siblings = [p.name for p in entry.parent.iterdir()]
    assert sorted(siblings) == sorted([entry.name, entry.name + ".lock"]), siblings


# ------------------------------------------------------------------------------------------------------
# GPU: launch
# ------------------------------------------------------------------------------------------------------
def _has_cuda_driver() -> bool:
    import ctypes

    try:
        return ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    except OSError:
        return False


@pytest.mark.gpu
@pytest.mark.parametrize("api", ["ptr", "tensor"])
def test_selftest_kernel_runs_on_gpu(api):
    import torch

    import w4a16_moe.loader as L

    arch = L.detect_arch()
    spec = selftest_spec(api=api)
    try:
        k = L.get_kernel(spec, arch)
    except L.KernelNotAvailableError as e:
        pytest.skip(f"self-test kernel not available here: {e}")
    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream
    if api == "ptr":
        k(x.data_ptr(), y.data_ptr(), n, 2.5, -1.0, stream)
    else:
        k((x.data_ptr(), (n,)), (y.data_ptr(), (n,)), 2.5, -1.0, stream)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2.5 * x - 1.0)

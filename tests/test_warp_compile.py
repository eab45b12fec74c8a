"""Cross-compile and export the warp-MMA family for every arch it lists (CPU only; needs the CuTe DSL).

Per arch: a few variants (INT4 decode gate_up, zero-point down with FP32 atomics, FP4 down, the TN 24 down) are compiled
with ``cute.compile(--gpu-arch ...)``, exported with ``export_to_c`` and their embedded cubins checked: SASS
for the right arch, ``HMMA`` present, no local memory (``LDL``/``STL``), registers reported. sm_90a and
sm_100a go through the loader's own build step (the family registry, the export and the header parse).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="the CuTe DSL (nvidia-cutlass-dsl) is needed to cross-compile")

from w4a16_moe.formats.schemes import get_scheme  # noqa: E402
from w4a16_moe.kernels.cute.warp import family as fam  # noqa: E402
from w4a16_moe.kernels.cute.warp.config import WarpGemmConfig  # noqa: E402
from w4a16_moe.loader import build, toolchain  # noqa: E402
from w4a16_moe.loader.spec import SUPPORTED_ARCHS  # noqa: E402

sass = pytest.importorskip("w4a16_moe.loader.sass", reason="the loader's SASS helpers are needed")


def _variants() -> list:
    t8, t32 = fam.TILES[0][1], fam.TILES[2][1]
    up, _ = fam.gemm_configs(get_scheme("int4_g32"), "bf16", "swiglu", True, "deterministic", t8)
    _, down_zp = fam.gemm_configs(get_scheme("int4_g128_zp"), "fp16", "relu2", False, "fused", t32)
    _, down_fp4 = fam.gemm_configs(get_scheme("nvfp4"), "bf16", "swiglu", True, "deterministic", t8)
    # the cost model's TN 24 tile (not a bucket) with the y epilogue (route ids loaded before the stores)
    _, down_t24 = fam.gemm_configs(get_scheme("int4_g128"), "bf16", "swiglu", True, "deterministic",
                                   fam.MODEL_TILES[0])
    return [up, down_zp, down_fp4, down_t24]


def _cuobjdump() -> Path | None:
    try:
        d = sass.find_nvdisasm().parent
    except sass.SassToolError:
        return None
    p = d / "cuobjdump"
    return p if p.is_file() else (Path(shutil.which("cuobjdump")) if shutil.which("cuobjdump") else None)


def _registers(cubin: bytes, tmp: Path) -> int | None:
    tool = _cuobjdump()
    if tool is None:
        return None
    f = tmp / "k.cubin"
    f.write_bytes(cubin)
    out = subprocess.run([str(tool), "-res-usage", str(f)], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+)", out)
    return int(m.group(1)) if m else None


def _export(cfg: WarpGemmConfig, arch: str, out: Path) -> Path:
    spec = fam.spec_for(cfg)
    if arch in SUPPORTED_ARCHS:  # the loader's own compile + export + header parse
        rec = build.compile_one(spec, arch, out)
        assert rec["abi"]["args"][-1]["kind"] == "stream"
        assert len(rec["abi"]["args"]) == 17
        return out / rec["object"]
    toolchain.preload_dsl_runtime()
    compiled = fam._compile(spec, arch)
    compiled.export_to_c(str(out), spec.name, function_prefix=spec.name)
    return out / f"{spec.name}.o"


@pytest.mark.parametrize("arch", fam.ARCHS)
def test_compile_export_sass(arch, tmp_path):
    sm = int(re.sub(r"\D", "", arch))
    report = []
    for cfg in _variants():
        obj = _export(cfg, arch, tmp_path)
        cubins = sass.extract_cubins(obj.read_bytes())
        assert len(cubins) == 1, f"{cfg.name()} {arch}: {len(cubins)} cubins"
        cb = cubins[0]
        assert cb.sm == sm, (cfg.name(), arch, cb.sm)
        ops = sass.opcode_counts(sass.disassemble(cb.data))
        assert ops["HMMA"] > 0, f"{cfg.name()} {arch}: no HMMA"
        assert not ops["LDL"] and not ops["STL"], f"{cfg.name()} {arch}: local memory {ops['LDL']} LDL, {ops['STL']} STL"
        report.append(f"{cfg.name()}: HMMA {ops['HMMA']}, regs {_registers(cb.data, tmp_path)}")
    print(f"\n{arch}: " + "; ".join(report))


def test_smem_limit_per_arch():
    from w4a16_moe.kernels.cute.warp.grouped_gemm import WarpW4A16GroupedGemm

    big = WarpGemmConfig(tokens_per_tile=128, k_tile=128, stages=3, m16_per_warp=2, warps=4)  # ~126 KB
    WarpW4A16GroupedGemm(big, "sm_90a")  # 227 KB: fits
    with pytest.raises(ValueError, match="shared memory"):
        WarpW4A16GroupedGemm(big, "sm_89")
    with pytest.raises(ValueError, match="mode"):
        WarpW4A16GroupedGemm(WarpGemmConfig(mode="x"))

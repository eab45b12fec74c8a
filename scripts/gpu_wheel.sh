#!/usr/bin/env bash
# On the GPU machine: install the AOT wheel built on the CPU box and run the GPU tests and the benchmarks
# against the INSTALLED package (not this checkout's python/), with no CuTe DSL and JIT disabled, so every
# CuTe kernel must come from the wheel's prebuilt libraries.
#
#   scripts/gpu_wheel.sh [tests] [bench] [doctor]      (default: doctor tests bench)
#
# The wheel: $WHEEL, else the one .whl in .device/wheel/ (build it here with
#   W4A16_MOE_AOT_ARCHS="sm_90a;sm_100a" W4A16_MOE_AOT_SUBSET=full \
#     pip wheel --no-build-isolation --no-deps -w .device/wheel .
# and carry .device/wheel). It is installed with --no-deps --no-index into $SITE (default /tmp/w4a16_site),
# which goes first on PYTHONPATH: the machine's own python3 keeps its torch (2.11+cu130) and Triton. The
# tests run from a copy of tests/ outside the checkout, so no test can import the checkout's package.
# Results and logs go to $OUT (default ./out): doctor.{txt,json}, gpu_tests.log, bench.log, w1.*, w2.*,
# decisions.log (the tests' INFO log, W4A16_MOE_LOG=info: where every kernel came from), install_check.txt.
# The device tool returns at most 8 files and runs a command at most 10 minutes: run `doctor tests` and
# `bench` as two calls (5 and 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/out}
SITE=${SITE:-/tmp/w4a16_site}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
steps=${*:-doctor tests bench}

if [ -z "${WHEEL:-}" ]; then
  shopt -s nullglob
  wheels=(.device/wheel/w4a16_moe-*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -ne 1 ]; then
    echo "gpu_wheel: expected exactly one wheel in .device/wheel/ (found ${#wheels[@]}); set WHEEL=path" >&2
    exit 2
  fi
  WHEEL=${wheels[0]}
fi
echo "gpu_wheel: installing $WHEEL into $SITE"
rm -rf "$SITE"
"$PY" -m pip install -q --no-deps --no-index --no-compile --no-cache-dir --target "$SITE" "$WHEEL" || exit 3

export SITE PYTHONPATH=$SITE PYTHONUNBUFFERED=1 W4A16_MOE_DISABLE_JIT=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset W4A16_MOE_PREBUILT_DIR W4A16_MOE_TORCH_OP_LIB
WORK=$(mktemp -d /tmp/w4a16_wheel_run.XXXXXX)
cp -r "$REPO/tests" "$WORK/tests"
cd "$WORK" || exit 3

# the package must be the installed one, with its prebuilt manifest and op library, and no DSL beside it
"$PY" - <<'EOF' 2>&1 | tee "$OUT/install_check.txt"
import importlib.util, json, os, sys
import torch, w4a16_moe
from w4a16_moe.loader import prebuilt, torch_op
site = os.environ["SITE"]
print("w4a16_moe", w4a16_moe.__version__, "from", w4a16_moe.__file__)
print("torch", torch.__version__, "python", sys.version.split()[0], "cuda", torch.cuda.is_available())
print("cutlass importable:", importlib.util.find_spec("cutlass") is not None)
print("prebuilt:", json.dumps(prebuilt.summary()))
print("torch op:", torch_op.load())
assert w4a16_moe.__file__.startswith(site), "not the installed package"
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_wheel: install check failed" >&2; exit 3; }

PROVIDERS=${BENCH_PROVIDERS:-cute,cute-fused,triton}
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
for step in $steps; do
  case $step in
    doctor)
      "$PY" -m w4a16_moe doctor > "$OUT/doctor.txt" 2>&1; rc=$((rc | $?))
      "$PY" -m w4a16_moe doctor --json > "$OUT/doctor.json" 2>/dev/null
      cat "$OUT/doctor.txt" ;;
    tests)
      W4A16_MOE_LOG=info timeout "${TEST_TIMEOUT:-400}" "$PY" -m pytest -q -m gpu -p no:cacheprovider tests \
        --log-file="$OUT/decisions.log" --log-file-level=INFO 2>&1 | tee "$OUT/gpu_tests.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    bench)
      for w in "kimi-tp8 w1" "deepseek-ep8 w2"; do
        set -- $w
        timeout "${BENCH_TIMEOUT:-300}" "$PY" -m w4a16_moe bench --workload "$1" --providers "$PROVIDERS" \
          --json "$OUT/$2.json" --markdown "$OUT/$2.md" --plot "$OUT/$2.png" 2>&1 | tee -a "$OUT/bench.log"
        rc=$((rc | ${PIPESTATUS[0]}))
      done ;;
    *) echo "gpu_wheel: unknown step $step"; rc=2 ;;
  esac
done
if [ -f "$OUT/decisions.log" ]; then
  echo "gpu_wheel: kernel sources seen in the tests: $(grep -c ': prebuilt ' "$OUT/decisions.log") prebuilt," \
       "$(grep -c 'no prebuilt' "$OUT/decisions.log") without a prebuilt match"
fi
exit $rc

#!/usr/bin/env bash
# The one command that runs the GPU tests and the benchmarks on the GPU machine (see README, "Development").
#   scripts/gpu.sh [tests] [bench] [bench-cute]   (default: tests bench)
# Logs and results go to $OUT (default ./out): gpu_tests.log, w1.{json,md,png}, w2.{json,md,png}.
# Set W4A16_MOE_REVISION to the git revision being measured (the GPU machine has no git history).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${*:-tests bench}
PROVIDERS=${BENCH_PROVIDERS:-cute,triton,dense-bf16}
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
for step in $steps; do
  case $step in
    tests)
      timeout "${TEST_TIMEOUT:-400}" python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    bench)
      for w in "kimi-tp8 w1" "deepseek-ep8 w2"; do
        set -- $w
        timeout "${BENCH_TIMEOUT:-300}" python -m w4a16_moe bench --workload "$1" --providers "$PROVIDERS" \
          --json "$OUT/$2.json" --markdown "$OUT/$2.md" --plot "$OUT/$2.png" 2>&1 | tee -a "$OUT/bench.log"
        rc=$((rc | ${PIPESTATUS[0]}))
      done ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
done
exit $rc

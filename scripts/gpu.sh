#!/usr/bin/env bash
# The one command that runs the GPU tests and the benchmarks on the GPU machine (see README, "Development").
#   scripts/gpu.sh [build] [tests] [bench] [bench-ep] [tune] [sanitize] [ab]   (default: tests bench)
# tests: pytest -m gpu over tests/ (TEST_SHARD=K/N: the K-th of N round-robin shards, for a suite longer than one
#        call; TEST_TIMEOUT, default 540 s);
# build: compile the kernels there (needs the CuTe DSL, e.g. staged by ../shared/tools/stage-cutlass-dsl into
#        /tmp/site): .device/specs.json if present (scripts/device_specs.py), else the full subset, all cores
#        (the full sm_90a subset, 3456 kernels: 488 s on 16 cores); stops after BUILD_TIMEOUT (540 s) keeping
#        the compiled objects, so that build in the next call on the same (warm) machine resumes;
# sanitize: scripts/sanitize.sh (compute-sanitizer memcheck / initcheck / racecheck over every CuTe path);
# ab: scripts/ab_bench.sh .device/old (W1/W2 of the previous revision in .device/old, alternating with this one).
# Logs and results go to $OUT (default ./out): gpu_tests.log, bench.log, w1.{json,md,png}, w2.{json,md,png},
# ep2.{json,md}, tune_w{1,2}_{small,large}.json. Set W4A16_MOE_REVISION to the git revision being measured (the GPU machine has no git
# history). Kernels: .device/prebuilt (built here by `aot/build.sh .device/prebuilt [--specs .device/specs.json
# --keep-objects]`, see scripts/device_specs.py; carried along) is used when present, with JIT disabled, since
# the GPU machine has no CuTe DSL. A kit too large to carry travels packed: .device/kit.tar.xz (`tar -C
# .device/prebuilt -cf - manifest.json sm_90a | xz -T2 > .device/kit.tar.xz`; the ~5000 kernels of
# .device/specs.json, 56 min to build on this machine's 2 cores, are 350 MB built and 15 MB packed) is unpacked into
# .device/prebuilt when that holds no manifest, so a session needs no DSL staging and no build on the GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -f .device/kit.tar.xz ] && [ ! -f .device/prebuilt/manifest.json ]; then
  mkdir -p .device/prebuilt && python3 -c "import tarfile; tarfile.open('.device/kit.tar.xz').extractall('.device/prebuilt')" \
    && echo "gpu.sh: .device/kit.tar.xz unpacked into .device/prebuilt" || { echo "gpu.sh: unpacking .device/kit.tar.xz failed" >&2; exit 4; }
fi
if [ -f .device/prebuilt/manifest.json ] && [ -z "${W4A16_MOE_PREBUILT_DIR:-}" ]; then
  export W4A16_MOE_PREBUILT_DIR=$PWD/.device/prebuilt W4A16_MOE_DISABLE_JIT=${W4A16_MOE_DISABLE_JIT:-1}
fi
steps=${*:-tests bench}
PROVIDERS=${BENCH_PROVIDERS:-cute,cute-fused,triton}
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
for step in $steps; do
  case $step in
    build)
      specs=(--subset full)
      [ -f .device/specs.json ] && specs=(--specs .device/specs.json)
      timeout "${BUILD_TIMEOUT:-540}" python -m w4a16_moe aot --archs sm_90a "${specs[@]}" --out .device/prebuilt \
        -j "$(nproc)" --keep-objects --no-progress 2>&1 | tail -n 5 | tee "$OUT/build.log"
      brc=${PIPESTATUS[0]}
      [ "$brc" = 124 ] && echo "build: stopped at BUILD_TIMEOUT; run build again on this machine: it resumes" | tee -a "$OUT/build.log"
      rc=$((rc | brc))
      export W4A16_MOE_PREBUILT_DIR=$PWD/.device/prebuilt W4A16_MOE_DISABLE_JIT=${W4A16_MOE_DISABLE_JIT:-1} ;;
    sanitize)
      scripts/sanitize.sh 2>&1 | tee "$OUT/sanitize.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    ab)
      scripts/ab_bench.sh .device/old 2>&1 | tee "$OUT/ab.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    tests)
      shard=()
      [ -n "${TEST_SHARD:-}" ] && shard=(--shard "$TEST_SHARD")
      timeout "${TEST_TIMEOUT:-540}" python -m pytest -q -m gpu -p no:cacheprovider ${shard[@]+"${shard[@]}"} tests 2>&1 \
        | tee "$OUT/gpu_tests.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    bench)
      for w in "kimi-tp8 w1" "deepseek-ep8 w2"; do
        set -- $w
        timeout "${BENCH_TIMEOUT:-300}" python -m w4a16_moe bench --workload "$1" --providers "$PROVIDERS" \
          --json "$OUT/$2.json" --markdown "$OUT/$2.md" --plot "$OUT/$2.png" 2>&1 | tee -a "$OUT/bench.log"
        rc=$((rc | ${PIPESTATUS[0]}))
      done ;;
    tune)
      # decode-sized rows: every candidate tile shape x split-K choice; larger rows: candidates, rule or no split
      for w in "kimi-tp8 w1 1,8,32 256,1024,2048" "deepseek-ep8 w2 2,4,8,16,32,64 128,256,512,1024,2048,4096,8192"; do
        set -- $w
        timeout "${TUNE_TIMEOUT:-400}" python -m w4a16_moe tune --workload "$1" --tokens "$3" \
          --json "$OUT/tune_$2_small.json" 2>&1 | tee -a "$OUT/tune.log"
        rc=$((rc | ${PIPESTATUS[0]}))
        timeout "${TUNE_TIMEOUT:-400}" python -m w4a16_moe tune --workload "$1" --tokens "$4" --splits rule,1 \
          --json "$OUT/tune_$2_large.json" 2>&1 | tee -a "$OUT/tune.log"
        rc=$((rc | ${PIPESTATUS[0]}))
      done ;;
    bench-ep)
      timeout "${BENCH_TIMEOUT:-300}" python -m w4a16_moe bench-ep --tokens 16,256,2048 \
        --json "$OUT/ep2.json" --markdown "$OUT/ep2.md" 2>&1 | tee -a "$OUT/bench.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
done
exit $rc

#!/usr/bin/env bash
# Every tuner candidate of Qwen3-235B TP4 (8 / 16 tokens, both finalize modes) and Llama-4 Scout (8), eager and in back-to-back graph replays, restarting past each candidate that faults and naming it.
# GPU: OUT=$OUT bash docs/perf/2026-12-07-autotune-behind/scan.sh, carry [".device/at2"] (the kernels of every candidate of those layers up to 64 tokens: scripts/autotune_specs.py)
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/at2/pb W4A16_MOE_DISABLE_JIT=1
mkdir -p $OUT; nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
check() {  # layer tokens finalize: restart after each crash past the candidate that crashed
  local layer=$1 t=$2 fin=$3 start=0 n=0 log
  while [ $n -lt 12 ]; do
    log=$OUT/gc_${layer//,/_}_T${t}_${fin}_$n.log
    timeout ${GC_LIMIT:-150} python docs/perf/2026-12-07-autotune-behind/graph_check.py --layer $layer --group 128 \
      --tokens $t --finalize $fin --start $start > $log 2>&1
    rc=$?; last=$(grep -o "#[0-9]*/" $log | tail -1 | tr -d '#/')
    echo "$layer T=$t $fin from $start: rc=$rc, last candidate #${last:-none}: $(grep "#${last}/" $log | tail -1 | cut -c1-160)"
    grep -E "BAD|bad candidates" $log | head -5
    grep -q "bad candidates" $log && break   # ran through (its BAD ones listed above)
    [ -z "$last" ] && break
    start=$((last + 1)); n=$((n + 1))
  done
}
check 128,4096,384,8 8 deterministic
check 128,4096,384,8 8 fused
check 128,4096,384,8 16 deterministic
check 16,5120,8192,1 8 deterministic

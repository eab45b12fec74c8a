#!/usr/bin/env bash
# One call: default selection vs warmup(autotune=True) on the rows behind Humming, our bench (cute only), JIT off.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/h200at/pb W4A16_MOE_DISABLE_JIT=1
S=$(date +%s); mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
run() {  # name preset tokens [extra]
  local n=$1 p=$2 t=$3; shift 3
  W4A16_MOE_CACHE_DIR=/tmp/cache_$n timeout 200 python -m w4a16_moe bench --preset $p --tokens $t --providers cute \
    --samples 3 --json $OUT/$n.json "$@" > $OUT/$n.log 2>&1
  echo "$n rc=$? at $(( $(date +%s) - S )) s"; grep -E "^\|? *[0-9]+ *\|" $OUT/$n.log | head -12; tail -n 3 $OUT/$n.log
}
run kimi_def kimi-tp8 32,128,256
run kimi_at kimi-tp8 32,128,256 --autotune --autotune-budget 60
run scout_def llama4-scout 8,16,64,128
run scout_at llama4-scout 8,16,64,128 --autotune --autotune-budget 60

#!/usr/bin/env bash
# One call: default selection vs warmup(autotune=True) on three more rows behind Humming, our bench (cute only), JIT off.
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/at2/pb W4A16_MOE_DISABLE_JIT=1
S=$(date +%s); mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
run() {  # name preset tokens [extra]
  local n=$1 p=$2 t=$3; shift 3
  W4A16_MOE_CACHE_DIR=/tmp/cache_$n timeout 120 python -m w4a16_moe bench --preset $p --tokens $t --providers cute \
    --samples 3 --json $OUT/$n.json "$@" > $OUT/$n.log 2>&1
  echo "$n rc=$? at $(( $(date +%s) - S )) s"; grep -E "T= " $OUT/$n.log; grep warmup $OUT/$n.log
}
for x in "scout llama4-scout 32" "mav llama4-maverick-tp8 64" "qwen qwen3-235b-tp4 64"; do
  set -- $x
  run ${1}_def $2 $3
  run ${1}_at $2 $3 --autotune --autotune-budget ${BUDGET:-40}
done

#!/usr/bin/env bash
# One H100/H200 call: the layout-budget GPU tests, then every call under W4A16_MOE_LAYOUTS=all / 2 / 1 timed.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 W4A16_MOE_PREBUILT_DIR=$PWD/.device/budget/pb W4A16_MOE_DISABLE_JIT=1
OUT=${OUT:-/tmp/out}/budget; mkdir -p $OUT
T0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 python -m pytest -q -p no:cacheprovider tests/test_layout_budget.py > $OUT/tests.log 2>&1
echo "tests rc=$? at $((SECONDS-T0)) s" | tee -a $OUT/tests.log; tail -n 3 $OUT/tests.log
X="python scripts/layout_budget_time.py time --tokens ${TOKENS:-1,4,16,64,256,1024,4096}"
timeout 150 $X --scheme int4_g32 --layers 384,7168,256,8 160,5120,192,8 60,2048,704,4 --json $OUT/g32.json --budget-s 130 > $OUT/g32.log 2>&1
echo "g32 rc=$? at $((SECONDS-T0)) s" | tee -a $OUT/tests.log
timeout 200 $X --scheme int4_g128 --layers 32,7168,2048,8,256 256,7168,256,8 128,4096,384,8 16,5120,8192,1 128,5120,1024,1 --json $OUT/g128.json --budget-s 180 > $OUT/g128.log 2>&1
echo "g128 rc=$? at $((SECONDS-T0)) s" | tee -a $OUT/tests.log
timeout 60 $X --scheme mxfp4 --layers 128,2880,2880,4 --json $OUT/fp4.json --budget-s 45 > $OUT/fp4.log 2>&1
echo "fp4 rc=$? at $((SECONDS-T0)) s" | tee -a $OUT/tests.log
cd $OUT/.. && tar czf budget.tgz budget && rm -rf budget

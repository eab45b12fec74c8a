#!/usr/bin/env bash
# Run 4 (revision f9dc46d, the table with candidate 70 for W1 2048): the GPU tests after test_warp_kernel.py
# (run 3 stopped there: the warp family's FP16 kernels are not in the carried set), the benchmark of both
# workloads, the per-kernel split of the W1 2048 call with 63 and 70.
set -x
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
export W4A16_MOE_REVISION=$REV
OUT=${OUT:-out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python -m pytest -q -m gpu -p no:cacheprovider tests/test_warp_pack.py tests/test_wheel.py 2>&1 | tail -3
python -m w4a16_moe bench --workload kimi-tp8 --providers cute,cute-fused --json $OUT/w1.json --markdown $OUT/w1.md --plot $OUT/w1.png 2>&1 | grep -v warn
python docs/perf/2026-11-30-pdl-chain/exp/split.py --workload kimi-tp8 --tokens 2048 --buckets 63,70 2>&1 | grep -v warn
python -m w4a16_moe bench --workload deepseek-ep8 --providers cute,cute-fused --json $OUT/w2.json --markdown $OUT/w2.md --plot $OUT/w2.png 2>&1 | grep -v warn

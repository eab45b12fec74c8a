#!/usr/bin/env bash
# Run 5 (the final kernel sources: the epilogue re-derives its tile's routes): the GPU tests (every file but
# test_warp_kernel.py, whose FP16 / non-g32 warp kernels are not in the carried set), the W1 1024 tuner row
# (62 against 71, 2 routings) merged into the table there, then the benchmark of both workloads with it.
set -x
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
export W4A16_MOE_REVISION=$REV
OUT=${OUT:-out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/test_warp_kernel.py 2>&1 | grep -v warn > $OUT/run5_gpu_tests.log
tail -3 $OUT/run5_gpu_tests.log
python -m w4a16_moe tune --workload kimi-tp8 --tokens 1024 --buckets 62,71 --splits rule --routings 2 --json $OUT/run5_tune_1024.json 2>&1 | grep -v warn
python scripts/merge_tuned.py $OUT/run5_tune_1024.json
python -m w4a16_moe bench --workload kimi-tp8 --providers cute,cute-fused --json $OUT/w1.json --markdown $OUT/w1.md --plot $OUT/w1.png 2>&1 | grep -v warn
python -m w4a16_moe bench --workload deepseek-ep8 --providers cute,cute-fused --json $OUT/w2.json --markdown $OUT/w2.md --plot $OUT/w2.png 2>&1 | grep -v warn

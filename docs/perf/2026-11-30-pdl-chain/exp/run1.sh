#!/usr/bin/env bash
# Run 1 on the H200: W1 / W2 prefill rows with the PDL chain (route preparation -> gate/up -> down -> finalize),
# with and without the Triton kernels' PDL, the BK 128 down candidates, then the benchmark of both workloads.
#   REV=<git revision> bash docs/perf/2026-11-30-pdl-chain/exp/run1.sh   (kernels in .device/pbr2)
set -x
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
export W4A16_MOE_REVISION=$REV
OUT=${OUT:-out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python -m w4a16_moe profile --workload kimi-tp8 --tokens 1024,2048 2>&1 | grep -v warn
W4A16_MOE_PDL=0 python -m w4a16_moe profile --workload kimi-tp8 --tokens 1024,2048 2>&1 | grep -v warn
python -m w4a16_moe tune --workload kimi-tp8 --tokens 2048 --buckets 63,70,71 --splits rule --json $OUT/run1_tune_w1.json 2>&1 | grep -v warn
python -m w4a16_moe bench --workload kimi-tp8 --providers cute,cute-fused --json $OUT/w1.json --markdown $OUT/w1.md --plot $OUT/w1.png 2>&1 | grep -v warn
python -m w4a16_moe bench --workload deepseek-ep8 --providers cute,cute-fused --json $OUT/w2.json --markdown $OUT/w2.md --plot $OUT/w2.png 2>&1 | grep -v warn

#!/usr/bin/env bash
# GPU run 10 (sixth session): the GPU suite and the W2 bench on the W2 table of run 9
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cute_provider.py tests/test_ops.py tests/test_benchmark_shapes.py tests/test_loader.py tests/test_cute_runtime.py 2>&1 | tee $OUT/gpu_tests.log | tail -3
W4A16_MOE_REVISION=${REV:-unknown} timeout 200 python -m w4a16_moe bench --workload deepseek-ep8 --providers cute,cute-fused \
  --json $OUT/w2.json --markdown $OUT/w2.md --plot $OUT/w2.png 2>&1 | grep -v -i warn | tee $OUT/bench_w2.log | tail -16

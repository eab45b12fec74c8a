#!/usr/bin/env bash
# GPU run 7 (sixth session): tune W1 2048/1024 over the new candidates, merge, GPU tests, benchmark
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout 150 python -m w4a16_moe tune --workload kimi-tp8 --tokens 2048,1024 --buckets 56,58,59,60,61,62,63,64,65 --splits rule --json $OUT/tune_final.json 2>&1 | grep -v -i warn | tail -3
python scripts/merge_tuned.py $OUT/tune_final.json | tail -3
cp python/w4a16_moe/kernels/cute/tuned_sm90.json $OUT/
timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/test_cute_provider.py tests/test_ops.py tests/test_benchmark_shapes.py tests/test_loader.py tests/test_cute_runtime.py 2>&1 | tee $OUT/gpu_tests.log | tail -4
BENCH_TIMEOUT=200 BENCH_PROVIDERS=cute,cute-fused W4A16_MOE_REVISION=${REV:-unknown} OUT=$OUT scripts/gpu.sh bench > $OUT/bench_full.log 2>&1
grep -E "^\s*(tokens|[0-9])" $OUT/bench_full.log | tail -20; cat $OUT/w1.md $OUT/w2.md 2>/dev/null | head -40

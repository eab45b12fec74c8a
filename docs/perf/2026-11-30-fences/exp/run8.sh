#!/usr/bin/env bash
# GPU run 8 (sixth session, nvidia-h200-x2): the NCCL EP test, the EP2 bench, and the W2 bench files
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_distributed.py 2>&1 | tee $OUT/ep_tests.log | tail -3
BENCH_TIMEOUT=150 W4A16_MOE_REVISION=${REV:-unknown} OUT=$OUT scripts/gpu.sh bench-ep > /dev/null 2>&1; cat $OUT/ep2.md
W4A16_MOE_REVISION=${REV:-unknown} timeout 200 python -m w4a16_moe bench --workload deepseek-ep8 --providers cute,cute-fused \
  --json $OUT/w2.json --markdown $OUT/w2.md --plot $OUT/w2.png 2>&1 | grep -v -i warn | tail -16
rm -f $OUT/bench.log

#!/usr/bin/env bash
# Run 2: the BK 128 down candidates around 70 (and 72-77, trial candidates of this run) at W1 2048 / 1024,
# over 3 / 2 routings (the benchmark's row and fresh draws); per-kernel split of 63 and 70.
set -x
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbr2 W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
export W4A16_MOE_REVISION=$REV
OUT=${OUT:-out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 1000 > $OUT/run2_smi.csv &
SMI=$!
python -m w4a16_moe tune --workload kimi-tp8 --tokens 2048 --buckets 63,70,71,72,73,74,75,76 --splits rule --routings 3 --json $OUT/run2_tune_2048.json 2>&1 | grep -v warn
python -m w4a16_moe tune --workload kimi-tp8 --tokens 1024 --buckets 62,77 --splits rule --routings 2 --json $OUT/run2_tune_1024.json 2>&1 | grep -v warn
python docs/perf/2026-11-30-pdl-chain/exp/split.py --workload kimi-tp8 --tokens 2048 --buckets 63,70,74 2>&1 | grep -v warn
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
kill $SMI

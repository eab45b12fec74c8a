#!/usr/bin/env bash
# A/B of the pingpong=2 unordered rule on the Qwen3-235B TP4 split-K 2 candidate: .device/fixc = the at2 kernels built
# with the rule "2 nk <= S" (the tree as carried), .device/at2 = built with the old "nk < S" (orig_grouped_gemm.py swapped in)
cd "$(dirname "$0")/../../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python W4A16_MOE_DISABLE_JIT=1
G=docs/perf/2026-12-07-autotune-behind/graph_check.py
L="--layer 128,4096,384,8 --group 128"
nvidia-smi --query-gpu=name --format=csv,noheader
run() { local kit=$1 tag=$2 n=$3; shift 3; for i in $(seq $n); do
  W4A16_MOE_PREBUILT_DIR=$PWD/.device/$kit/pb timeout 100 python $G $L "$@" > $OUT/${tag}_$i.log 2>&1
  echo "$tag $i: started=$(grep -c '^T=' $OUT/${tag}_$i.log) ok=$(grep -c ' ok$' $OUT/${tag}_$i.log) bad=$(grep -c 'BAD$' $OUT/${tag}_$i.log) fault=$(grep -c 'launch failure' $OUT/${tag}_$i.log)"; done; }
run fixc fix16 3 --tokens 16 --start 77 --stop 81 --replays 10
run fixc fix8 2 --tokens 8 --start 78 --stop 82 --replays 10
run fixc fixall 1 --tokens 8,16 --replays 2
cp .device/fixc/orig_grouped_gemm.py python/w4a16_moe/kernels/cute/sm90/grouped_gemm.py
run at2 base16 2 --tokens 16 --start 77 --stop 81 --replays 10
run at2 base8 2 --tokens 8 --start 78 --stop 82 --replays 10
W4A16_MOE_PREBUILT_DIR=$PWD/.device/at2/pb timeout 60 compute-sanitizer --tool synccheck python $G $L --tokens 16 --start 78 --stop 79 > $OUT/sync.log 2>&1
tail -5 $OUT/sync.log
W4A16_MOE_PREBUILT_DIR=$PWD/.device/at2/pb timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard --print-limit 10 python $G $L --tokens 16 --start 78 --stop 79 > $OUT/race.log 2>&1
grep -v "^=========     \|^\s*$" $OUT/race.log | head -30

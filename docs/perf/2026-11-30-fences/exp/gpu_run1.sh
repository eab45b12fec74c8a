#!/usr/bin/env bash
# experiment run (not committed)
export PYTHONPATH=$PWD/python W4A16_MOE_PREBUILT_DIR=$PWD/.device/pbv W4A16_MOE_DISABLE_JIT=1 PYTHONUNBUFFERED=1
ids=()
for b in 59 60 61 62 63 64 65 66; do
  for sch in int4_g32 nvfp4; do for sp in 1 3; do ids+=("tests/test_cute_provider.py::test_candidate_tiles_and_split_k[$sch-$sp-$b]"); done; done
  for sp in 1 3; do ids+=("tests/test_cute_provider.py::test_row_block_candidates_long_k[$sp-$b]"); done
done
timeout 240 python -m pytest -q -m gpu -p no:cacheprovider "${ids[@]}" tests/test_cute_provider.py::test_tile_width_variants tests/test_cute_provider.py::test_pdl_candidates_in_cuda_graph 2>&1 | tail -8
timeout 300 python scripts/exp/routing_single.py 4096 --workload kimi-tp8 --tokens 2048,1024 --buckets 56,58,60,61,62,63,64,65,66 --splits rule --json $OUT/tune2.json 2>&1 | grep -v Warn | tail -8
timeout 200 python scripts/exp/routing_single.py 1048576 --workload kimi-tp8 --tokens 2048 --buckets 56,60,63,64 --splits rule --json $OUT/tune3.json 2>&1 | grep -v Warn | tail -4

#!/usr/bin/env bash
# The W1/W2 benchmark of two revisions in one GPU run, alternating them (A B B A per workload), so that both see
# the same machine state: scripts/ab_bench.sh OLD_ROOT [ROUNDS]
#   OLD_ROOT: a tree of the previous revision (its python/) with its prebuilt kernels in OLD_ROOT/prebuilt;
#   the current checkout uses .device/prebuilt. Results: $OUT/ab_<rev>_<case>_<n>.json and the table of
#   scripts/ab_summary.py in $OUT/ab_summary.md (per row: each revision's median of its runs, new / old).
# AB_CASES: other layers than W1/W2, ';'-separated "label=bench arguments" items, e.g.
#   AB_CASES="scout=--preset llama4-scout --tokens 8,64;e64=--layer 64,3584,2560,8 --tokens 16,256"
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
old=$(cd "${1:?usage: scripts/ab_bench.sh OLD_ROOT [ROUNDS]}" && pwd)
rounds=${2:-1}
order=${AB_ORDER:-old new new old}  # per round and workload
export PYTHONUNBUFFERED=1 W4A16_MOE_DISABLE_JIT=1
cases=${AB_CASES:-kimi-tp8=--workload kimi-tp8;deepseek-ep8=--workload deepseek-ep8}
run() {  # rev root prebuilt case n bench-arguments
  local rev=$1 root=$2 pb=$3 wl=$4 n=$5 bargs=$6
  # shellcheck disable=SC2086  # the case's bench arguments are split on purpose
  PYTHONPATH=$root/python W4A16_MOE_PREBUILT_DIR=$pb timeout "${AB_TIMEOUT:-240}" \
    python -m w4a16_moe bench $bargs --providers cute --json "$OUT/ab_${rev}_${wl}_${n}.json" \
    2>&1 | tail -n 30 | sed "s/^/[$rev $wl $n] /"
}
IFS=';' read -ra items <<< "$cases"
for it in "${items[@]}"; do
  wl=${it%%=*}
  for n in $(seq 1 "$rounds"); do
    i=0
    for rev in $order; do
      i=$((i + 1))
      if [ "$rev" = old ]; then run old "$old" "$old/prebuilt" "$wl" "$n$i" "${it#*=}"
      else run new "$PWD" "$PWD/.device/prebuilt" "$wl" "$n$i" "${it#*=}"; fi
    done
  done
done
python3 scripts/ab_summary.py "$OUT" | tee "$OUT/ab_summary.md"

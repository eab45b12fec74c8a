#!/usr/bin/env bash
# gpu_presets.sh: measure preset layers with the peers tool (w4a16_moe, w4a16_moe_fused, Humming, vLLM Marlin,
# dense BF16, all in one process per layer, on the same inputs) in ONE device call, then convert the results
# into the project's records with python -m w4a16_moe.bench.merge.
#
#   bash scripts/gpu_presets.sh LAYER[@T] [LAYER[@T] ...] [-- more peer_bench.py arguments]
#     LAYER is a preset name, or E,H,I,TOPK[,E_GLOBAL]:G for a layer in no preset (group size G)
#     e.g. bash scripts/gpu_presets.sh glm45-ep8
#          bash scripts/gpu_presets.sh qwen3-235b-ep8@512 llama4-scout -- --tokens 1,8,64,512,4096
#          bash scripts/gpu_presets.sh 8,4096,14336,2:128 64,2048,1408,6:32@64
#
# Before (CPU machine, checkout root): build the kernels (aot/build.sh .device/prebuilt --subset full) and stage
# the peers (../shared/tools/peers/stage); run this with stage's carry list (.device/peers/bin,
# .device/peers/moe_C, .device/peers/project) and timeout_s 600. PRESET@T resumes PRESET at token count T
# (peer_bench --resume-from T: the same rows as a full run). Each preset runs through
# .device/peers/bin/device_run.sh (it sets up Humming, vLLM's _moe_C and the project once per machine, and stops
# a sweep cleanly before the call's limit, PEERS_LIMIT_S, default 600 s); a preset is not started when less than
# PRESETS_MIN_S (default 150) seconds are left. Set W4A16_MOE_REVISION to the revision measured.
#
# Results: everything is written under $WORK (default /tmp/gpu_presets): raw/<preset>[-fromT].{json,md,log}
# (peer_bench's own output) and benchmarks/<date>/<preset>.{json,md,png} (the merge tool). At most 8 files come
# back from $OUT, so $OUT gets presets.tar.gz (raw/ and benchmarks/), summary.txt (per preset: rows measured,
# rows left and the PRESET@T to pass next) and, while they fit, the merged <preset>.md tables. On the CPU:
#   tar -xzf presets.tar.gz -C docs benchmarks          (the docs/benchmarks/<date>/ files)
# or, for a preset measured over several calls, merge their raw JSONs there:
#   python -m w4a16_moe.bench.merge docs/benchmarks callA/raw/P.json callB/raw/P-fromT.json
set -uo pipefail
cd "$(dirname "$0")/.."
export PEERS_CALL_START=${PEERS_CALL_START:-$(date +%s)}
LIMIT=${PEERS_LIMIT_S:-600}
MIN_S=${PRESETS_MIN_S:-150}
MARGIN=${PEERS_MARGIN_S:-45}
WORK=${WORK:-/tmp/gpu_presets}
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/out}
presets=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) presets+=("$1") ;;
  esac
  shift
done
extra=("$@")
[ ${#presets[@]} -gt 0 ] || { echo "gpu_presets: name at least one preset (see --help)" >&2; exit 2; }
[ -f .device/peers/bin/device_run.sh ] || {
  echo "gpu_presets: .device/peers/bin/device_run.sh not found: stage the peers (../shared/tools/peers/stage) and carry .device/peers/bin" >&2
  exit 2; }
mkdir -p "$OUT" "$WORK/raw"
summary=$WORK/summary.txt
: > "$summary"
pack() {  # refresh what comes back: called after every preset, so that a stop at the limit keeps the rest
  local js=("$WORK"/raw/*.json)
  if [ -e "${js[0]}" ]; then
    PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} "$PY" -m w4a16_moe.bench.merge "$WORK/benchmarks" "${js[@]}" \
      > "$WORK/merge.log" 2>&1 || echo "gpu_presets: merge failed (see merge.log in the tarball)" >> "$summary"
  fi
  local have=() f
  for f in raw benchmarks summary.txt merge.log; do [ -e "$WORK/$f" ] && have+=("$f"); done
  tar -czf "$OUT/presets.tar.gz.part" -C "$WORK" "${have[@]}" && mv "$OUT/presets.tar.gz.part" "$OUT/presets.tar.gz"
  cp "$summary" "$OUT/summary.txt"
}
rc=0
for spec in "${presets[@]}"; do
  name=${spec%@*}
  case $name in
    *,*:*) args=(--layer "${name%:*}" --group "${name##*:}") ;;
    *,*) echo "$spec: a layer in no preset needs its group size (E,H,I,TOPK[,E_GLOBAL]:G)" | tee -a "$summary"; rc=2; continue ;;
    *) args=(--preset "$name") ;;
  esac
  [ "$spec" != "$name" ] && args+=(--resume-from "${spec#*@}")
  left=$(( LIMIT - ($(date +%s) - PEERS_CALL_START) - MARGIN ))
  if [ "$left" -lt "$MIN_S" ]; then
    echo "$spec: not started (${left} s left before the limit, less than PRESETS_MIN_S=$MIN_S): pass $spec in the next call" | tee -a "$summary"
    continue
  fi
  echo "[gpu_presets] $spec: ${left} s left"
  touch "$WORK/.mark"
  OUT=$WORK/raw PEERS_LIMIT_S=$LIMIT bash .device/peers/bin/device_run.sh "${args[@]}" ${extra[@]+"${extra[@]}"}
  r=$?
  [ "$r" -ne 0 ] && rc=$r
  latest=$(find "$WORK/raw" -name '*.json' -newer "$WORK/.mark" 2>/dev/null | head -n 1)
  "$PY" - "$spec" "$name" "$r" "$latest" >> "$summary" <<'EOF'
import json, sys
spec, name, rc, path = sys.argv[1:5]
try:
    res = json.load(open(path))
except Exception as e:  # noqa: BLE001 - the summary says what went wrong
    print(f"{spec}: exit {rc}, no readable JSON ({type(e).__name__}: {e})")
    sys.exit(0)
rows = [r["tokens"] for r in res.get("rows", [])]
left = res.get("not_measured") or []
line = f"{spec}: exit {rc}, {path.rsplit('/', 1)[-1]}: measured {','.join(map(str, rows)) or 'nothing'}"
if left:
    line += f"; not measured {','.join(map(str, left))} ({res.get('stopped')}): pass {name}@{left[0]} next"
for n, why in (res.get("skipped") or {}).items():
    line += f"; skipped {n}: {why[:160]}"
print(line)
EOF
  pack
done
pack
cat "$summary"
n=2
for md in "$WORK"/benchmarks/*/*.md; do
  [ -e "$md" ] || continue
  [ "$n" -ge 8 ] && { echo "gpu_presets: more tables than files that come back; all are in presets.tar.gz"; break; }
  cp "$md" "$OUT/" && n=$((n + 1))
done
exit $rc

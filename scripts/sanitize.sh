#!/usr/bin/env bash
# compute-sanitizer's memcheck, initcheck and racecheck over scripts/sanitize.py's small calls, one process per
# (tool, path); logs in $OUT/sanitize_<tool>_<path>.log, error counts in $OUT/sanitize.json.
#   scripts/sanitize.sh [tools...]     (default: memcheck initcheck racecheck)
# Kernels: as scripts/gpu.sh (.device/prebuilt when present, JIT disabled).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f .device/prebuilt/manifest.json ] && [ -z "${W4A16_MOE_PREBUILT_DIR:-}" ]; then
  export W4A16_MOE_PREBUILT_DIR=$PWD/.device/prebuilt W4A16_MOE_DISABLE_JIT=${W4A16_MOE_DISABLE_JIT:-1}
fi
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
tools=${*:-memcheck initcheck racecheck}
rc=0
echo "{" > "$OUT/sanitize.json"
first=1
for tool in $tools; do
  for path in decode sm90 warp; do
    log="$OUT/sanitize_${tool}_${path}.log"
    t0=$SECONDS
    timeout "${SANITIZE_TIMEOUT:-240}" "$CS" --tool "$tool" python scripts/sanitize.py --path "$path" >"$log" 2>&1
    st=$?
    # memcheck / initcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H hazards displayed (N errors, ..."
    errs=$(grep -oE "ERROR SUMMARY: [0-9]+|\([0-9]+ errors" "$log" | tail -1 | grep -oE "[0-9]+")
    checks=$(grep -c " ok$" "$log")
    echo "sanitize: $tool $path: exit $st, ${errs:-?} errors, $checks checks ok, $((SECONDS - t0)) s"
    [ "$st" = 0 ] && [ "${errs:-1}" = 0 ] || rc=1
    [ $first = 1 ] || echo "," >> "$OUT/sanitize.json"
    first=0
    printf '  "%s_%s": {"exit": %s, "errors": %s, "checks_ok": %s, "seconds": %s}' "$tool" "$path" "$st" \
      "${errs:-null}" "$checks" "$((SECONDS - t0))" >> "$OUT/sanitize.json"
  done
done
printf '\n}\n' >> "$OUT/sanitize.json"
exit $rc

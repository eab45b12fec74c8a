#!/usr/bin/env bash
# run_mxfp4.sh: the gpt-oss MXFP4 layer, the project beside Humming's MXFP4 MoE, on the GPU machine.
# Run from the ROOT of the checkout after `../shared/tools/peers/stage --no-project` (or plain `stage`) on the CPU
# machine:
#
#   bash scripts/peers/run_mxfp4.sh [TOKENS] [mxfp4_bench.py arguments]
#   e.g. bash scripts/peers/run_mxfp4.sh 1,4,16,64 --variants full --samples 3
#   carry: .device/peers/bin .device/peers/moe_C [.device/peers/project | .device/prebuilt]
#
# TOKENS defaults to 1,4,16,64,256,1024,4096. It installs the staged humming-kernels wheel into $PEERS_SITE
# (/tmp/peers_site), decompresses vLLM's _moe_C into $VLLM_SO_DIR (/tmp/vso) (as shared/tools/peers/device_run.sh
# does), puts the checkout's python/ first on PYTHONPATH with the project's prebuilt kernels when there are any
# (.device/peers/project/prebuilt.tar.xz from `stage`, unpacked into /tmp/w4a16_prebuilt, or a carried
# .device/prebuilt; W4A16_MOE_PREBUILT_DIR, W4A16_MOE_DISABLE_JIT=1), else python/ alone (no CuTe DSL there: the
# project then runs on its Triton provider, rows marked '^'), and runs scripts/peers/mxfp4_bench.py --preset
# gpt-oss-120b with --out $OUT and --deadline from PEERS_LIMIT_S (the call's timeout_s, default 600) minus
# PEERS_MARGIN_S (45). Returns $OUT/<layer>.json (records), $OUT/<layer>.md per variant and $OUT/mxfp4_bench.log.
set -uo pipefail
START=${PEERS_CALL_START:-$(date +%s)}
P=.device/peers
BIN=${PEERS_BIN:-$P/bin}
PY=${PYTHON:-python3}
VSO=${VLLM_SO_DIR:-/tmp/vso}
SITE=${PEERS_SITE:-/tmp/peers_site}
PREB=${PEERS_PREBUILT_ROOT:-/tmp/w4a16_prebuilt}
MOE_SO=_moe_C_stable_libtorch.abi3.so
MOE_SHA=99682a5814b3081de7e4e95cc2c1cf1ba8f6139514ac4c5563dbad16c229a4c0
say() { echo "[run_mxfp4] $*"; }
loud() { printf '%s\n' "$(printf '#%.0s' {1..100})" "# WARNING: $*" "$(printf '#%.0s' {1..100})"; }
sha_of() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }

if [ ! -f scripts/peers/mxfp4_bench.py ]; then
  echo "run_mxfp4: scripts/peers/mxfp4_bench.py not found: run from the checkout root" >&2; exit 2
fi
TOKENS=1,4,16,64,256,1024,4096
case ${1:-} in [0-9]*) TOKENS=$1; shift ;; esac

# ---- vLLM's compiled route ops (Humming's alignment / permutation, as in vLLM)
mkdir -p "$VSO"
if [ "$(sha_of "$VSO/$MOE_SO")" = "$MOE_SHA" ]; then
  say "_moe_C: already in $VSO"
elif [ -f "$P/moe_C/$MOE_SO.xz" ]; then
  xz -T8 -dc "$P/moe_C/$MOE_SO.xz" > "$VSO/$MOE_SO.part" && mv "$VSO/$MOE_SO.part" "$VSO/$MOE_SO"
  if [ "$(sha_of "$VSO/$MOE_SO")" = "$MOE_SHA" ]; then say "_moe_C: decompressed into $VSO"
  else loud "_moe_C in $P/moe_C does not match vLLM 0.33.0's sha256: removed"; rm -f "$VSO/$MOE_SO"; fi
else
  loud "vLLM's _moe_C is not here (carry .device/peers/moe_C): humming's route preparation falls back to torch (rows marked '*', slower than vLLM)"
fi

# ---- Humming
if [ ! -f "$SITE/humming/__init__.py" ]; then
  whl=$(ls "$BIN"/humming_kernels-*.whl 2>/dev/null | head -n 1)
  if [ -n "$whl" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" "$whl" \
      && say "humming: installed $(basename "$whl") into $SITE" || loud "humming: pip install of $whl failed"
  else
    loud "no humming-kernels wheel in $BIN (carry .device/peers/bin from stage): humming will be skipped"
  fi
fi
[ -f "$BIN/humming_moe.py" ] || loud "$BIN/humming_moe.py missing (carry .device/peers/bin): humming will be skipped"

# ---- the project: the checkout's python/ (+ prebuilt kernels when staged or carried)
if [ -f "$P/project/prebuilt.tar.xz" ]; then
  stamp="$PREB/.staged_$(sha_of "$P/project/prebuilt.tar.xz")"
  if [ ! -f "$stamp" ]; then
    rm -rf "$PREB" && mkdir -p "$PREB"
    xz -T8 -dc "$P/project/prebuilt.tar.xz" | tar -x -C "$PREB" && touch "$stamp" \
      || loud "w4a16_moe: unpacking $P/project/prebuilt.tar.xz failed"
  fi
  export W4A16_MOE_PREBUILT_DIR=${W4A16_MOE_PREBUILT_DIR:-$PREB/prebuilt}
  export W4A16_MOE_DISABLE_JIT=${W4A16_MOE_DISABLE_JIT:-1}
  say "w4a16_moe: python/ with the staged prebuilt kernels ($W4A16_MOE_PREBUILT_DIR)"
elif [ -f .device/prebuilt/manifest.json ]; then
  export W4A16_MOE_PREBUILT_DIR=${W4A16_MOE_PREBUILT_DIR:-$PWD/.device/prebuilt}
  export W4A16_MOE_DISABLE_JIT=${W4A16_MOE_DISABLE_JIT:-1}
  say "w4a16_moe: python/ with the carried .device/prebuilt"
else
  loud "w4a16_moe: python/ WITHOUT prebuilt kernels: no CuTe DSL here, so the project runs on its Triton provider (rows marked '^')"
fi
export PYTHONPATH=$PWD/python:$SITE${PYTHONPATH:+:$PYTHONPATH}
export PEERS_EXPECT_W4A16=$PWD/python PEERS_BIN=$BIN VLLM_SO_DIR=$VSO PYTHONUNBUFFERED=1
export HUMMING_CACHE_DIR=${HUMMING_CACHE_DIR:-/tmp/humming/cache} HUMMING_TMP_DIR=${HUMMING_TMP_DIR:-/tmp/humming/tmp}
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- arguments: outputs into $OUT, deadline from the call's limit
args=("$@")
has() { local a; for a in ${args[@]+"${args[@]}"}; do case $a in "$1"|"$1"=*) return 0 ;; esac; done; return 1; }
has --preset || has --layer || args=(--preset gpt-oss-120b ${args[@]+"${args[@]}"})
has --tokens || args+=(--tokens "$TOKENS")
OUTDIR=${OUT:-/tmp/mxfp4_out}
mkdir -p "$OUTDIR"
has --out || args+=(--out "$OUTDIR")
if ! has --deadline && ! has --cpu-smoke && ! has --help && ! has -h; then
  left=$(( ${PEERS_LIMIT_S:-600} - ($(date +%s) - START) - ${PEERS_MARGIN_S:-45} ))
  [ "$left" -lt 30 ] && left=30
  args+=(--deadline "$left")
fi
LOG=$OUTDIR/mxfp4_bench.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader \
  2>/dev/null | sed 's/^/[run_mxfp4] gpu: /'
say "PYTHONPATH=$PYTHONPATH"
say "$PY scripts/peers/mxfp4_bench.py ${args[*]-}"
"$PY" scripts/peers/mxfp4_bench.py "${args[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
say "mxfp4_bench.py exit $rc after $(( $(date +%s) - START )) s; outputs in $OUTDIR"
ls -la "$OUTDIR" | sed 's/^/[run_mxfp4] out: /'
exit "$rc"

#!/usr/bin/env bash
# Cross-compile the CuTe kernels into a prebuilt directory:
#   aot/build.sh DIR [--archs sm_90a,...] [--subset smoke|full | --specs FILE] [--keep-objects] [-j N]
# (every option of python -m w4a16_moe aot; see python/w4a16_moe/aot.py)
set -euo pipefail
out=${1:?usage: aot/build.sh DIR [extra args for python -m w4a16_moe aot]}
shift
cd "$(dirname "$0")/.."
PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} exec python -m w4a16_moe aot --out "$out" "$@"

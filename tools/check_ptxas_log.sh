#!/usr/bin/env bash
# Usage: bash tools/check_ptxas_log.sh BUILD_LOG
# Fails (exit 3) when ptxas serialized wgmma instructions (C7515, "wgmma.mma_async instructions
# are serialized ...") in any kernel the logged build compiled. Such a kernel runs 10-25 % slow,
# and on 2026-12-01 it took the other paths of the same kernel with it (docs/gemm.md, item 12).
# Only the objects that build compiled are covered: CI builds from a clean clone, so it sees all.
set -uo pipefail
log=${1:?usage: check_ptxas_log.sh BUILD_LOG}
if grep -q "C7515" "$log"; then
  echo "ptxas serialized wgmma instructions (C7515) in:" >&2
  grep -o "in the function '[^']*'" "$log" | sort -u | head -n 5 >&2
  exit 3
fi

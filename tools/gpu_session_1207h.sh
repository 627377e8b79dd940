#!/usr/bin/env bash
# (Ran once at dc310fd; the interleaved order was reverted after it, e3a8546: CCFUSE_KGROUPED_ORDER is gone.)
# One device call on one GPU (2026-12-07, third session): the K-grouped GEMM's interleaved tile
# order (EXPERIMENT, CCFUSE_KGROUPED_ORDER=interleave: the waves alternate between the two halves
# of the tiles). (1) the K-grouped and validation tests (interleave_* cases: whole waves and a
# tail, both forms, ping-pong); (2) the bf16 form with --ab-env on DeepSeek-, Qwen3- and
# Mixtral-like cases, uniform and Zipf; (3) the accumulating form the same way (the A/B variant
# checked too). Logs in one tarball, the table last.   bash tools/gpu_session_1207h.sh [PART ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2 3} "
if [[ $parts == *" 1 "* ]]; then
  kgrouped_tests
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 120 ]; then
  wgrad_bench wgrad_interleave 150 --ab-env CCFUSE_KGROUPED_ORDER=interleave \
    --only "dsv3-up-T4096|dsv3-down-T4096|dsv3-up-T16384|qwen3-up-T4096|qwen3-down-T16384|mixtral-up-T4096"
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 120 ]; then
  wgrad_bench wgrad_accum_interleave 170 --accumulate --ab-env CCFUSE_KGROUPED_ORDER=interleave \
    --only "dsv3-up-T4096|dsv3-down-T4096|qwen3-up-T4096|qwen3-down-T16384"
fi
finish gpu_session_1207h

#!/usr/bin/env bash
# (Ran once at 51e1662; the tma5 variant of part 2 was reverted after it: --ab-accum no longer takes it.)
# One device call on one GPU (2026-12-07, third session, second call): (1) the K-grouped tests and
# the validation tests (choose_config's new ping-pong rule: a group's 128x256 tiles on at most half
# the SMs); (2) the accumulating form, TMA reduce-adds with a ring of 2 slots a warpgroup (default)
# against 5 slots and one stage less (--ab-accum tma5, checked like the default), same rounds;
# (3) the accumulating form on the narrow register tile (--ab-tile 128) on Qwen3-like dW2 (48
# wide tiles a group) and DeepSeek-like dW2; (4) the bf16 form with the rule's choice against the
# wide tile (--ab-tile 256) on the Qwen3-like cases (dW2 now ping-pong by the rule, dW1 not).
# Logs in one tarball, the table last.   bash tools/gpu_session_1207f.sh [PART ...] (default 1 2 3 4)
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2 3 4} "
if [[ $parts == *" 1 "* ]]; then
  kgrouped_tests
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 150 ]; then
  wgrad_bench wgrad_accum_tma5 170 --accumulate --ab-accum tma5 \
    --only "${ACCUM_ONLY:-qwen3-up-T4096|qwen3-down-T4096|qwen3-up-T16384|mixtral-up-T4096|dsv3-up-T4096|dsv3-down-T4096}"
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 120 ]; then
  wgrad_bench wgrad_accum_tile128 100 --accumulate --ab-tile 128 --only "qwen3-down|dsv3-down-T4096"
fi
if [[ $parts == *" 4 "* ]] && [ "$(left)" -gt 80 ]; then
  wgrad_bench wgrad_rule 100 --ab-tile 256 --only "qwen3"
fi
finish gpu_session_1207f

#!/usr/bin/env bash
# One device call on one GPU (written 2026-12-07, fifth session; binaries of 92d98ff or later):
# (1) 92d98ff's check: compute-sanitizer initcheck on the register-store MoE cases (must report 0:
#     the send-list kernel no longer loads dropped entries' unwritten ranks; TMA-stored GEMM outputs
#     are not counted as written by initcheck, hence register stores) and the GpuMoeFfn tests
#     (four new prep_one_* cases take the opt-in one-CTA preparation);
# (2) the MoE layer's fixed cost at decode sizes by parts, with the one-CTA preparation
#     (CCFUSE_MOE_PREP_ONE=1) and without (the graph check's ~50 us a call at
#     T = 1 on a layer of 3 MB of weights): ccfuse_moe_ffn_bench --model small (and qwen3 at 64
#     tokens) with each CCFUSE_MOE_DIAG stop; t_layer0 with l0stopbegin / l0stoprank / l0stoplist
#     / l0pre is the preparation up to that step, t_layer1 with l1gemm the row map and the GEMM;
# (3) two Teams in one process (torch_ops.MoeFfn(group=), new 2026-12-07): tools/
#     torch_team_groups_check.py at W = 1 (the MoE FFN on a second group's Team equal to the same
#     layer on init()'s, bit for bit, forward and backward, TP ops between them), and its
#     --inject-fault (must exit 1).
# Logs in one tarball, the table last.
#   bash tools/gpu_session_1208a.sh [PART ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 3 2} "
if [[ $parts == *" 1 "* ]]; then
  CCFUSE_WATCHDOG_MS=120000 timeout 90 compute-sanitizer --tool initcheck --check-api-memory-access no \
    --print-limit 20 --report-api-errors no --error-exitcode 9 $B/ccfuse_gpu_tests \
    --gtest_filter='*GpuMoeFfn.*/regstore_*' > "$O/logs/initcheck.log" 2>&1
  table+=("initcheck regstore MoE cases: rc=$? $(grep -E 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$O/logs/initcheck.log" | tr '\n' ' ')")
  while read -r l; do table+=("  $l"); done < <(grep -E '^=========     at ' "$O/logs/initcheck.log" | sort | uniq -c | head -4 | cut -c1-200)
  timeout 200 $B/ccfuse_gpu_tests --gtest_filter='*GpuMoeFfn*' > "$O/logs/moe_tests.log" 2>&1
  table+=("GpuMoeFfn tests: rc=$? $(tests_line "$O/logs/moe_tests.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^\[  FAILED  \]|Failure$' "$O/logs/moe_tests.log" | head -6 | cut -c1-200)
fi
if [[ $parts == *" 2 "* ]] && [ "$(left)" -gt 90 ]; then
  # prep1: the one-CTA preparation for <= 2048 entries (CCFUSE_MOE_PREP_ONE=1: MoeFfnConfig::prep_one,
  # opt-in, new 2026-12-07); prep0: the two chunk kernels (the default), the A/B.
  # l0stoprank stops after the ranking kernel (prep0) or after the one kernel (prep1).
  for prep in 1 0; do
    for diag in none l0stopbegin l0stoprank l0stoplist l0pre l1gemm l1presum; do
      for mt in "small:1 64" "qwen3:64"; do
        [ "$(left)" -gt 25 ] || continue  # what is left of the call: the table still comes back
        CCFUSE_MOE_PREP_ONE=$prep CCFUSE_MOE_DIAG=$([ $diag = none ] || echo $diag) timeout 60 \
          $B/ccfuse_moe_ffn_bench --model ${mt%%:*} --tokens ${mt#*:} --routing uniform --iters 20 --warmup 5 \
          --json "$O/logs/floor_prep$prep.jsonl" >> "$O/logs/floor.log" 2>&1
      done
    done
  done
  table+=("decode floor by parts (ms; the stops' results are wrong on purpose), prep1 then prep0:")
  while read -r l; do table+=("  $l"); done < <(python3 tools/moe_records.py "$O/logs/floor_prep1.jsonl" \
    "$O/logs/floor_prep0.jsonl")
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 60 ]; then
  for v in "" --inject-fault; do
    name=team_groups${v:+_fault}
    json=""; [ -z "$v" ] && json="--json $O/logs/$name.jsonl"
    timeout 120 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_team_groups_check.py \
      --ccfuse-lib $B/libccfuse_c.so $json $v > "$O/logs/$name.log" 2>&1
    table+=("$name: rc=$? $(grep -E '^torch_team_groups_check:' "$O/logs/$name.log")")
    while read -r l; do table+=("  $l"); done < <(grep -E '^rank |Error' "$O/logs/$name.log" | cut -c1-200 | head -6)
  done
fi
finish gpu_session_1208a

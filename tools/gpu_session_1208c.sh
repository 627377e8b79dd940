#!/usr/bin/env bash
# One device call on one GPU (written 2026-12-07, seventh session; binaries of f9ffebd or later in
# .carry/bin, 9aab36b's MoE bench in .carry/old): layer 1's row map now comes with layer 0's rows
# (set_row_of, epoch-tagged; no memset and no scatter kernel in layer 1).
#   part 1: the MoE FFN's forward and backward GPU tests at W = 1 and in the one-GPU world at
#           W = 2 (fresh random inputs, 20 calls alternating with a decoy routing: a stale
#           entry taken for the call's own would fail them). Prediction: all pass.
#   part 2: the A/B at decode sizes, old (9aab36b) and new binaries interleaved, the whole
#           layer and the l1gemm stop: small T = 1 and 64, Qwen3-like T = 64 and 4096.
#           Prediction: the small layer -2 to -4 us of ~44 (two dependent steps), t_layer1 the
#           same; Qwen3 T = 4096 level (+-1 %: 16-byte map entries, 4 bytes before).
#   part 3: MoeLayer under CUDA graphs at W = 1 (tools/torch_moe_graph_check.py): replays equal
#           to eager calls (the epoch advances on the device in each replay).
#   part 4: racecheck, synccheck, memcheck on the one-CTA and chunked preparations' cases and
#           the pre-sum cases (the plan of the 1208b script it replaces). Prediction: 0 errors each.
#   bash tools/gpu_session_1208c.sh [PART ...]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_session_lib.sh
parts=" ${*:-1 2 3} "
if [[ $parts == *" 1 "* ]]; then
  f='*GpuMoeFfn*:*GpuMoeFfnBackward*'
  timeout 200 $B/ccfuse_gpu_tests --gtest_filter="$f" > "$O/logs/moe_tests_w1.log" 2>&1
  table+=("MoE FFN tests W=1: rc=$? $(tests_line "$O/logs/moe_tests_w1.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^\[  FAILED  \]|Failure$' "$O/logs/moe_tests_w1.log" | head -6 | cut -c1-200)
  [ "$(left)" -gt 200 ] && {
    CCFUSE_TEST_ONE_GPU_RANKS=2 CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER timeout 240 \
      $B/ccfuse_gpu_tests --gtest_filter="$f" > "$O/logs/moe_tests_w2.log" 2>&1
    table+=("MoE FFN tests one-GPU W=2: rc=$? $(tests_line "$O/logs/moe_tests_w2.log")")
    while read -r l; do table+=("  $l"); done < <(grep -E '^\[  FAILED  \]|Failure$' "$O/logs/moe_tests_w2.log" | head -6 | cut -c1-200)
  }
fi
if [[ $parts == *" 2 "* ]]; then
  [ -e .carry/old/ccfuse_moe_ffn_bench.gz ] && gunzip -f .carry/old/ccfuse_moe_ffn_bench.gz
  for rep in 1 2; do
    for bin in new old; do
      exe=$B/ccfuse_moe_ffn_bench; [ $bin = old ] && exe=.carry/old/ccfuse_moe_ffn_bench
      for diag in none l1gemm; do
        for mt in "small:1 64" "qwen3:64 4096"; do
          [ "$(left)" -gt 40 ] || continue
          CCFUSE_MOE_DIAG=$([ $diag = none ] || echo $diag) timeout 60 $exe --model ${mt%%:*} --tokens ${mt#*:} \
            --routing uniform --iters 30 --warmup 5 --json "$O/logs/ab_$bin.jsonl" >> "$O/logs/ab.log" 2>&1
        done
      done
    done
  done
  table+=("row map A/B (ms), new (f9ffebd+) then old (9aab36b), two rounds each:")
  while read -r l; do table+=("  $l"); done < <(python3 tools/moe_records.py "$O/logs/ab_new.jsonl" "$O/logs/ab_old.jsonl")
fi
if [[ $parts == *" 3 "* ]] && [ "$(left)" -gt 70 ]; then
  timeout 120 python3 -m torch.distributed.run --nproc-per-node 1 tools/torch_moe_graph_check.py \
    --ccfuse-lib $B/libccfuse_c.so --json "$O/logs/moe_graph.jsonl" > "$O/logs/moe_graph.log" 2>&1
  table+=("MoeLayer under CUDA graphs W=1: rc=$? $(grep -E '^torch_moe_graph_check:' "$O/logs/moe_graph.log")")
  while read -r l; do table+=("  $l"); done < <(grep -E '^rank 0 |Error' "$O/logs/moe_graph.log" | cut -c1-200 | head -6)
fi
if [[ $parts == *" 4 "* ]]; then
  filter='*GpuMoeFfn.*/prep_one_*:*GpuMoeFfn.*/regstore_*:*GpuMoeFfn.*/presum_*'
  for tool in racecheck synccheck memcheck; do
    [ "$(left)" -gt 60 ] || { table+=("$tool: not run (time)"); continue; }
    CCFUSE_WATCHDOG_MS=120000 timeout 170 compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 \
      --error-exitcode 9 $B/ccfuse_gpu_tests --gtest_filter="$filter" > "$O/logs/$tool.log" 2>&1
    table+=("$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) ' "$O/logs/$tool.log" | tr '\n' ' ')")
    while read -r l; do table+=("  $l"); done < <(grep -E '^=========     at |^\[  FAILED  \]' "$O/logs/$tool.log" | sort | uniq -c | head -4 | cut -c1-200)
  done
fi
finish gpu_session_1208c

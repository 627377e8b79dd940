#!/usr/bin/env bash
# Runs on the GPU machine through the device tool, from binaries staged by tools/stage_gpu.sh:
#   GPU tests, communication microbenchmarks, the TP benchmarks, and the single-GPU GEMM engine
#   against cuBLASLt; logs and JSON go to $OUT.
# Usage (device tool, carry [".carry"]):  bash tools/gpu_run.sh [tests_only] [one_gpu_world] [tests] [comm] [tp] [gemm] [grouped] [probe] [hooks] [router] [moe] [moe_fused] [moe_ab] [tp_ab] [tp_w1] [trace] [gemm_tma] [gemm_streamk] [gemm_n192] [grouped_regs] [grouped_ab] [moe_diag] [gemm_n96] [gemm_raster] [gemm_smallk] [gemm_ncu] [gemm_pingpong] [gemm_steady] [gemm_n64] [gemm_bin_ab] [gemm_env_sweep] [gemm_budget] [gemm_fixed] [gemm_ncu_full] [gemm_pairn] [gemm_n160] [gemm_n160_more] [moe_ncu] [moe_ncu_send] [moe_ncu_prep] [grouped_ncu] [torch_mm] [sanitize]
#   (default: tests comm tp; gemm and grouped run when named: ~2-4 minutes each on one H200;
#   moe, the serial PyTorch MoE-layer baseline, needs >= 2 GPUs and only torch, not the binaries;
#   moe_fused, the fused MoE FFN (ccfuse_moe_ffn_bench) on the same cases, merged with moe's
#   records when both are named in one call)
set -uo pipefail
cd "$(dirname "$0")/.."
# NOTE: NVLink multicast stays off everywhere (it can take the shared GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/ccfuse-out}
mkdir -p "$OUT"
BIN=${CCFUSE_BIN:-.carry/bin}  # CCFUSE_BIN: another staged build
# The stage scripts gzip the binaries (the device tool carries at most 64 MiB): unpack them here.
for d in .carry/bin .carry/bin-*; do
  for gz in "$d"/*.gz; do [ -e "$gz" ] && gunzip -f "$gz" && chmod +x "${gz%.gz}"; done
done
# A variant's folder may name its own commit (BIN/COMMIT: a branch built beside the default one).
commit_file=.carry/commit; [ -f "$BIN/COMMIT" ] && commit_file=$BIN/COMMIT
export CCFUSE_COMMIT=$(tr -d '\n' < "$commit_file" 2>/dev/null || echo unknown)
what=${*:-tests comm tp}

# Run against the NCCL the binaries were built with (2.28.9: PyTorch's wheel), and its cuBLAS.
pylib() { python3 -c "import importlib, os; m = importlib.import_module('$1'); print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null; }
export LD_LIBRARY_PATH="$(pylib nvidia.nccl):$(pylib nvidia.cublas):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

{
  date -u; nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
  nvidia-smi topo -m
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; echo "commit=$CCFUSE_COMMIT"
  ldd $BIN/ccfuse | grep -E "nccl|cublas|not found"
} 2>&1 | tee "$OUT/env.log"

status=0
summary=()
# gemm_ab NAME VAR ON "M N K"...: each shape with the engine's choice and with VAR=ON (an A/B
# override of ccfuse bench, src/tool/gpu_gemm_bench.cu), both against cuBLASLt, into
# $OUT/NAME.jsonl, NAME.log and NAME_summary.log.
gemm_ab() {
  local name=$1 var=$2 on=$3 shape v
  shift 3
  : > "$OUT/$name.jsonl"; : > "$OUT/$name.log"
  for shape in "$@"; do
    set -- $shape
    for v in "" "$on"; do
      env "$var=$v" timeout 60 $BIN/ccfuse bench --op gemm --m $1 --n $2 --k $3 --dtype bf16 --iters 10 \
        --json "$OUT/$name.jsonl" < /dev/null >> "$OUT/$name.log" 2>&1 || status=1
    done
  done
  python3 tools/summarize_gemm.py --table --all "$OUT/$name.jsonl" 2>&1 | tee "$OUT/${name}_summary.log"
}
if [[ " $what " == *" tests_only "* ]]; then
  # The GPU tests matching CCFUSE_TEST_FILTER alone, 120 s at most: a first check of new cases
  # before a call spends minutes on benches that use them.
  timeout ${CCFUSE_TEST_TIMEOUT:-120} $BIN/ccfuse_gpu_tests --gtest_filter="${CCFUSE_TEST_FILTER:-*}" 2>&1 | tee "$OUT/gpu_tests_only.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("gpu tests (${CCFUSE_TEST_FILTER:-*}): rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/gpu_tests_only.log" | tr '\n' ' ')")
fi
if [[ " $what " == *" one_gpu_world "* ]]; then
  # The multi-rank GPU tests with W ranks on GPU 0 (comm/team.h mode d: a green context each,
  # 1/W of the SMs), for each W in CCFUSE_ONE_GPU_RANKS (default 2): the TP and MoE kernels'
  # protocols at W >= 2 where only one GPU is lent. Correctness only (no NVLink, 1/W of the SMs).
  # CUDA_DEVICE_MAX_CONNECTIONS: W ranks' streams must not share hardware queues.
  # CUDA_MODULE_LOADING=EAGER: a kernel's first launch under lazy loading waits for the device's
  # running kernels, among them a peer's that waits for this rank (docs/foundation.md).
  for w in ${CCFUSE_ONE_GPU_RANKS:-2}; do
    CCFUSE_TEST_ONE_GPU_RANKS=$w CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32} CUDA_MODULE_LOADING=EAGER timeout ${CCFUSE_TEST_TIMEOUT:-300} \
      $BIN/ccfuse_gpu_tests --gtest_filter="${CCFUSE_TEST_FILTER:-*GpuTeam*:*FusedAgGemm*:*FusedGemmReduce*:*GpuMoeFfn*}" \
      --gtest_output=json:"$OUT/one_gpu_world_w$w.json" 2>&1 | tee "$OUT/one_gpu_world_w$w.log"
    rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
    summary+=("one-GPU world W=$w: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/one_gpu_world_w$w.log" | tr '\n' ' ')")
  done
fi
if [[ " $what " == *" tests "* ]]; then
  # The router/layout sweep has its own section (router): it is long.
  # CCFUSE_TEST_EXCLUDE: more negative patterns (e.g. "*_direct*" when an experiment's first check failed).
  timeout 500 $BIN/ccfuse_gpu_tests --gtest_filter="-*Router*:*Layout*${CCFUSE_TEST_EXCLUDE:+:$CCFUSE_TEST_EXCLUDE}" \
    --gtest_output=json:"$OUT/gpu_tests.json" 2>&1 | tee "$OUT/gpu_tests.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("gpu tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/gpu_tests.log" | tr '\n' ' ')")
  for op in ag_gemm gemm_rs gemm_ar; do
    for dt in bf16 fp32; do
      # K = 784: each gemm_rs/gemm_ar rank's K/W = 392 is a multiple of 8 (TMA row alignment).
      timeout 120 $BIN/ccfuse check --op $op --m 1000 --n 520 --k 784 --dtype $dt 2>&1 | tee -a "$OUT/gpu_check.log" | tail -n 1
      rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
    done
  done
  summary+=("gpu check: $(grep -c '^PASS' "$OUT/gpu_check.log") PASS, $(grep -c '^FAIL' "$OUT/gpu_check.log") FAIL")
fi
if [[ " $what " == *" comm "* ]]; then
  timeout 300 $BIN/ccfuse_comm_bench --json "$OUT/comm_microbench.jsonl" 2>&1 | tee "$OUT/comm_microbench.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("comm bench: rc=$rc")
fi
if [[ " $what " == *" tp "* ]]; then
  : > "$OUT/tp_baselines.log"
  # DESIGN §5 TP=2 rows. --k is the GLOBAL reduction length: gemm_rs/gemm_ar give each rank
  # K/W, so K = 28672 reproduces DESIGN's per-rank GEMM with K = 14336 (Llama-3-70B MLP).
  for spec in "ag_gemm 8192 14336 8192" "ag_gemm 16384 14336 8192" "ag_gemm 4096 7168 4096" "ag_gemm 8192 3072 4096" \
              "ag_gemm 1024 14336 8192" \
              "gemm_rs 8192 8192 28672" "gemm_rs 16384 8192 28672" "gemm_rs 4096 4096 14336" "gemm_rs 8192 4096 6144" \
              "gemm_rs 1024 8192 28672" \
              "gemm_ar 8192 8192 28672" "gemm_ar 4096 4096 14336" "gemm_ar 1024 8192 28672"; do
    set -- $spec
    [[ -n "${CCFUSE_TP_ONLY:-}" && " $CCFUSE_TP_ONLY " != *" $1 "* ]] && continue  # these ops only (A/B of a build)
    timeout 60 $BIN/ccfuse bench --op $1 --m $2 --n $3 --k $4 --dtype bf16 --json "$OUT/tp_baselines.jsonl" \
      2>&1 | tee -a "$OUT/tp_baselines.log"
    rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  done
  # The peer baseline in the same run: PyTorch async-TP on the same shapes (ag_gemm, gemm_rs).
  peer_shapes=()
  for spec in "ag_gemm 8192 14336 8192" "ag_gemm 16384 14336 8192" "ag_gemm 4096 7168 4096" "ag_gemm 8192 3072 4096" \
              "ag_gemm 1024 14336 8192" \
              "gemm_rs 8192 8192 28672" "gemm_rs 16384 8192 28672" "gemm_rs 4096 4096 14336" "gemm_rs 8192 4096 6144" \
              "gemm_rs 1024 8192 28672"; do
    set -- $spec; peer_shapes+=(--shape "$1,$2,$3,$4")
  done
  ngpu=$(nvidia-smi -L | wc -l)
  [[ -n "${CCFUSE_TP_ONLY:-}" || -n "${CCFUSE_TP_NO_PEER:-}" ]] && peer_shapes=()  # A/B runs: no peer baseline
  if [[ ${#peer_shapes[@]} -gt 0 ]]; then
    # With our C ABI library, ccfuse's op also runs in the peer's process, in its rounds.
    ccfuse_lib=(); [ -f "$BIN/libccfuse_c.so" ] && ccfuse_lib=(--ccfuse-lib "$BIN/libccfuse_c.so")
    # A 1 ms lead spin: 100 us does not cover async-TP's host path (measured 2026-11-30 23:10:
    # its times fell 10-35 % with 400 us, ours and torch.mm's did not; tools/torch_async_tp_bench.py).
    timeout 300 python3 -m torch.distributed.run --nproc-per-node "$ngpu" tools/torch_async_tp_bench.py \
      --json "$OUT/tp_peer.jsonl" "${peer_shapes[@]}" "${ccfuse_lib[@]}" --lead-us 1000 > "$OUT/tp_peer.log" 2>&1 \
      || { status=1; tail -n 5 "$OUT/tp_peer.log"; }
  fi
  [ -s "$OUT/tp_peer.jsonl" ] && python3 tools/merge_tp_peer.py "$OUT/tp_baselines.jsonl" "$OUT/tp_peer.jsonl" \
    | tee "$OUT/tp_table.log"
  summary+=("tp bench: see tp_baselines.log and tp_table.log")
fi
if [[ " $what " == *" gemm "* ]]; then
  # The GEMM engine on GPU 0: a few checks (partial tiles, both B layouts, fp16), then every
  # Llama-3 TP GEMM shape of bench/shapes/tp_gemm_shapes.txt (tools/make_tp_gemm_shapes.py)
  # against the best cuBLASLt algorithm, then an SM-budget sweep (n_c = 8, 16, 32 SMs left for
  # communication) and the kn layout on two large shapes. One bench call takes about 1-3 s.
  : > "$OUT/gemm_check.log"; : > "$OUT/gemm.log"; : > "$OUT/gemm.jsonl"
  for spec in "1000 520 776 bf16 nk" "1000 520 776 bf16 kn" "1000 520 776 fp16 nk" "257 384 64 bf16 kn" \
              "4096 4096 4096 bf16 nk" "8192 14336 8192 bf16 nk"; do
    set -- $spec
    timeout 120 $BIN/ccfuse check --op gemm --m $1 --n $2 --k $3 --dtype $4 --b-layout $5 2>&1 \
      | tee -a "$OUT/gemm_check.log" | tail -n 1
    rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  done
  summary+=("gemm check: $(grep -c '^PASS' "$OUT/gemm_check.log") PASS, $(grep -c '^FAIL' "$OUT/gemm_check.log") FAIL")
  gemm_bench() {  # m n k [more options]
    local m=$1 n=$2 k=$3; shift 3
    timeout 60 $BIN/ccfuse bench --op gemm --m $m --n $n --k $k --dtype bf16 --iters 10 "$@" \
      --json "$OUT/gemm.jsonl" < /dev/null >> "$OUT/gemm.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || { status=1; echo "gemm bench $m $n $k $*: rc=$rc" | tee -a "$OUT/gemm.log"; }
  }
  t0=$SECONDS
  while read -r m n k _; do
    [[ -z "$m" || "$m" == \#* ]] && continue
    gemm_bench $m $n $k
  done < bench/shapes/tp_gemm_shapes.txt
  for shape in "8192 14336 8192" "8192 8192 14336"; do  # Llama-3-70B gate_up TP=4, down TP=2
    for sms in 124 116 100; do gemm_bench $shape --sms $sms; done
    gemm_bench $shape --b-layout kn
  done
  echo "gemm section: $((SECONDS - t0)) s of benches" | tee -a "$OUT/gemm.log"
  python3 tools/summarize_gemm.py --table "$OUT/gemm.jsonl" 2>&1 | tee "$OUT/gemm_summary.log"
  summary+=("gemm bench: $(wc -l < "$OUT/gemm.jsonl") records; $(grep -m1 '^geomean' "$OUT/gemm_summary.log")")
fi
if [[ " $what " == *" grouped "* ]]; then
  # MoE expert GEMMs on GPU 0 (docs/grouped-bench.md): a few checks (partial tiles, empty experts,
  # kn, fp16, one large case past the full-check bound), then the DESIGN §5 MoE shapes at EP=2 as
  # one GPU sees them (tools/moe_grouped.py: 37 cases, up/gate and down, uniform and zipf, plus
  # empty_some) against cuBLAS's grouped GEMM, then torch._grouped_mm on the same cases, merged.
  # CCFUSE_GROUPED_ONLY filters the cases by name; CCFUSE_GROUPED_TORCH=0 leaves torch out.
  : > "$OUT/grouped_check.log"; : > "$OUT/grouped.log"; : > "$OUT/grouped.jsonl"; : > "$OUT/grouped_torch.jsonl"
  for spec in "8 300 2 520 776 uniform nk bf16" "8 300 2 520 776 zipf kn bf16" "8 300 2 520 776 empty_some nk bf16" \
              "4 257 3 384 64 one_hot kn bf16" "16 500 4 1536 2048 zipf nk fp16" "4 8192 2 28672 4096 zipf nk bf16"; do
    set -- $spec
    timeout 120 $BIN/ccfuse check --op grouped_gemm --experts $1 --tokens $2 --topk $3 --n $4 --k $5 --routing $6 \
      --b-layout $7 --dtype $8 2>&1 | tee -a "$OUT/grouped_check.log" | tail -n 1
    rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  done
  summary+=("grouped check: $(grep -c '^PASS' "$OUT/grouped_check.log") PASS, $(grep -c '^FAIL' "$OUT/grouped_check.log") FAIL")
  t0=$SECONDS
  while read -r args; do
    timeout 120 $BIN/ccfuse bench --op grouped_gemm $args --dtype bf16 --iters 10 --json "$OUT/grouped.jsonl" \
      < /dev/null >> "$OUT/grouped.log" 2>&1
    rc=$?; [ $rc = 0 ] || { status=1; echo "grouped bench $args: rc=$rc" | tee -a "$OUT/grouped.log"; }
  done < <(python3 tools/moe_grouped.py --only "${CCFUSE_GROUPED_ONLY:-}")
  echo "grouped section: $((SECONDS - t0)) s of ccfuse benches" | tee -a "$OUT/grouped.log"
  if [ "${CCFUSE_GROUPED_TORCH:-1}" = 0 ]; then  # ccfuse alone (an A/B of two builds: tools/w1_copy_ab.sh)
    summary+=("grouped bench: $(wc -l < "$OUT/grouped.jsonl") ccfuse records (no torch: CCFUSE_GROUPED_TORCH=0)")
  else
  t0=$SECONDS
  # With the C ABI present, ccfuse runs again in torch's process, interleaved with torch (same clocks).
  grouped_lib=(); [ -f "$BIN/libccfuse_c.so" ] && grouped_lib=(--ccfuse-lib "$BIN/libccfuse_c.so")
  timeout 400 python3 tools/torch_grouped_bench.py --json "$OUT/grouped_torch.jsonl" --iters 20 \
    --only "${CCFUSE_GROUPED_ONLY:-}" "${grouped_lib[@]}" \
    > "$OUT/grouped_torch.log" 2>&1 || { status=1; tail -n 5 "$OUT/grouped_torch.log"; }
  echo "grouped section: $((SECONDS - t0)) s of torch benches" | tee -a "$OUT/grouped.log"
  if [ ${#grouped_lib[@]} -gt 0 ]; then
    # The interleaved run's output check must fail on a corrupted output (exit 3).
    timeout 60 python3 tools/torch_grouped_bench.py --json "$OUT/grouped_torch_fault.jsonl" --iters 2 \
      --only qwen3-down-T4096 "${grouped_lib[@]}" --inject-fault > "$OUT/grouped_torch_fault.log" 2>&1
    rc=$?; [ $rc = 3 ] || status=1
    summary+=("grouped: interleaved output check with an injected fault: rc=$rc (want 3)")
  fi
  python3 tools/merge_peer.py "$OUT/grouped.jsonl" "$OUT/grouped_torch.jsonl" --out "$OUT/grouped_merged.jsonl" \
    --table > "$OUT/grouped_summary.log" 2>&1 || status=1
  summary+=("grouped bench: $(wc -l < "$OUT/grouped.jsonl") ccfuse + $(wc -l < "$OUT/grouped_torch.jsonl") torch records; $(grep -m1 '^geomean' "$OUT/grouped_summary.log")")
  grep -q '^same-clock' "$OUT/grouped_summary.log" && summary+=("grouped: $(grep -m1 '^same-clock' "$OUT/grouped_summary.log")")
  fi
fi
if [[ " $what " == *" torch_mm "* ]]; then
  # ccfuse.torch_ops.mm (the C ABI's ccfuse_gemm, workspace from torch's allocator) on one GPU
  # (tools/torch_mm_check.py): fp64 check, two streams, a CUDA-graph replay, timed interleaved
  # with torch.mm; then the same check on a corrupted output must fail (exit 3).
  : > "$OUT/torch_mm.jsonl"
  timeout 300 python3 tools/torch_mm_check.py --ccfuse-lib "$BIN/libccfuse_c.so" --json "$OUT/torch_mm.jsonl" \
    2>&1 | tee "$OUT/torch_mm.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  timeout 60 python3 tools/torch_mm_check.py --ccfuse-lib "$BIN/libccfuse_c.so" --json "$OUT/torch_mm_fault.jsonl" \
    --only wide_8192x8192x4096_kn --iters 2 --inject-fault > "$OUT/torch_mm_fault.log" 2>&1
  rc_fault=$?; [ $rc_fault = 3 ] || status=1
  summary+=("torch_ops.mm: rc=$rc, $(grep -c '"check": "PASS"' "$OUT/torch_mm.jsonl") PASS, $(grep -c '"check": "FAIL"' "$OUT/torch_mm.jsonl") FAIL; injected fault rc=$rc_fault (want 3)")
fi
if [[ " $what " == *" grouped_ab "* ]]; then
  # A/B of a grouped-GEMM variant against the engine's config in the same interleaved rounds
  # (src/tool/gpu_grouped_bench.cu: CCFUSE_GROUPED_AB_PINGPONG=1 by default, or
  # CCFUSE_GROUPED_AB="CCFUSE_GROUPED_AB_GROUP_M=16"), on the MoE cases of tools/moe_grouped.py
  # (CCFUSE_GROUPED_ONLY filters them by name); the summary's last lines give the speed ratios.
  : > "$OUT/grouped_ab.jsonl"; : > "$OUT/grouped_ab.log"
  ab_env=${CCFUSE_GROUPED_AB:-CCFUSE_GROUPED_AB_PINGPONG=1}
  while read -r args; do
    env $ab_env timeout 120 $BIN/ccfuse bench --op grouped_gemm $args --dtype bf16 --iters 10 \
      --json "$OUT/grouped_ab.jsonl" < /dev/null >> "$OUT/grouped_ab.log" 2>&1 || status=1
  done < <(python3 tools/moe_grouped.py --only "${CCFUSE_GROUPED_ONLY:-}")
  python3 tools/merge_peer.py "$OUT/grouped_ab.jsonl" "$OUT/grouped_torch.jsonl" --table \
    > "$OUT/grouped_ab_summary.log" 2>&1 || status=1
  summary+=("grouped A/B ($ab_env): $(grep -m1 '^variant speed ratio' "$OUT/grouped_ab_summary.log")")
fi
if [[ " $what " == *" probe "* ]]; then
  # Design probes for the fused ag_gemm (docs/tp-fusion.md): copy engine + stream write-value
  # flags into a peer, and co-scheduling of a publisher kernel with a persistent GEMM.
  timeout 120 $BIN/ccfuse_ag_transport_probe --json "$OUT/ag_transport_probe.jsonl" 2>&1 | tee "$OUT/ag_transport_probe.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("ag transport probe: rc=$rc (table in ag_transport_probe.log)")
fi
if [[ " $what " == *" gemm_budget "* ]]; then
  # SM budgets with the engine's own config for each budget (ccfuse bench --sms: choose_config
  # for that many SMs), on the hooks bench's shapes, full chip first; the summary's "SM budget"
  # table compares each with the full-chip figure scaled by the SM share.
  : > "$OUT/gemm_budget.jsonl"; : > "$OUT/gemm_budget.log"
  for spec in "8192 14336 8192 nk" "8192 14336 8192 kn" "8192 8192 14336 nk" "4096 7168 4096 nk" "16384 8192 14336 nk"; do
    set -- $spec
    for sms in 0 124 116 100; do
      opt=(); [ $sms = 0 ] || opt=(--sms $sms)
      timeout 60 $BIN/ccfuse bench --op gemm --m $1 --n $2 --k $3 --b-layout $4 --dtype bf16 --iters 10 "${opt[@]}" \
        --json "$OUT/gemm_budget.jsonl" < /dev/null >> "$OUT/gemm_budget.log" 2>&1 || status=1
    done
  done
  python3 tools/summarize_gemm.py --table "$OUT/gemm_budget.jsonl" 2>&1 | tee "$OUT/gemm_budget_summary.log"
  summary+=("gemm budget: gemm_budget_summary.log")
fi
if [[ " $what " == *" hooks "* ]]; then
  # GEMM hooks: ready predicate (all signals set) and SM budgets against the plain kernel.
  timeout 200 $BIN/ccfuse_gemm_hooks_bench --iters 20 --json "$OUT/gemm_hooks.jsonl" 2>&1 | tee "$OUT/gemm_hooks.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("gemm hooks bench: rc=$rc")
fi
if [[ " $what " == *" grouped_regs "* ]]; then
  # A/B: the grouped GEMM with every tile stored from registers (CCFUSE_GROUPED_TMA_STORE=0, the
  # rule before 2026-11-30; the default stores whole tiles through TMA) on the same 37 MoE cases,
  # merged with the torch records of the grouped section (run "grouped" first in the same call).
  # The files keep their first name (grouped_tma*: the 2026-11-30 run had TMA as the variant).
  : > "$OUT/grouped_tma.jsonl"; : > "$OUT/grouped_tma.log"
  while read -r args; do
    CCFUSE_GROUPED_TMA_STORE=0 timeout 120 $BIN/ccfuse bench --op grouped_gemm $args --dtype bf16 --iters 10 \
      --json "$OUT/grouped_tma.jsonl" < /dev/null >> "$OUT/grouped_tma.log" 2>&1 || status=1
  done < <(python3 tools/moe_grouped.py --only "${CCFUSE_GROUPED_ONLY:-}")
  if [ -s "$OUT/grouped_torch.jsonl" ]; then
    python3 tools/merge_peer.py "$OUT/grouped_tma.jsonl" "$OUT/grouped_torch.jsonl" --out "$OUT/grouped_tma_merged.jsonl" \
      --table > "$OUT/grouped_tma_summary.log" 2>&1 || status=1
    summary+=("grouped register epilogue: $(grep -m1 '^geomean' "$OUT/grouped_tma_summary.log")")
  else
    summary+=("grouped register epilogue: $(wc -l < "$OUT/grouped_tma.jsonl") records (no torch records: run grouped first)")
  fi
fi
if [[ " $what " == *" router "* ]]; then
  # MoE router + layout on GPU 0 (docs/moe-router-gpu.md): the GPU tests against the CPU reference,
  # then route_gpu + make_layout_gpu (16384 tokens x 256 experts, top-8, softmax; dropless and
  # capacity 1.25) against the PyTorch equivalent (tools/torch_router_bench.py). Target: >= 3x.
  timeout 400 $BIN/ccfuse_gpu_tests --gtest_filter='*Router*:*Layout*' --gtest_output=json:"$OUT/router_tests.json" \
    2>&1 | tee "$OUT/router_tests.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("router tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/router_tests.log" | tr '\n' ' ')")
  summary+=("router tests: $(grep -c '^\[ case \]' "$OUT/router_tests.log") cases, $(grep '^\[ case \]' "$OUT/router_tests.log" | grep -vc 'near-ties 0 ') with near-ties")
  : > "$OUT/router.jsonl"; : > "$OUT/router_torch.jsonl"
  timeout 120 $BIN/ccfuse_router_bench --iters 50 --json "$OUT/router.jsonl" 2>&1 | tee "$OUT/router_bench.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  timeout 300 python3 tools/torch_router_bench.py --iters 50 --json "$OUT/router_torch.jsonl" 2>&1 \
    | tee "$OUT/router_torch.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  router_line=$(python3 - "$OUT/router.jsonl" "$OUT/router_torch.jsonl" <<'PY'
import json, sys
ours = {r["capacity_factor"]: r for r in map(json.loads, open(sys.argv[1]))}
torch = {r["capacity_factor"]: r for r in map(json.loads, open(sys.argv[2]))}
parts, ok = [], True
for cf in sorted(ours):
    o, t = ours[cf], torch.get(cf)
    if t is None:
        parts.append("cf=%g: %.4f ms (no torch record)" % (cf, o["t_ccfuse_ms"])); ok = False; continue
    s, s2 = t["t_torch_ms"] / o["t_ccfuse_ms"], t["t_torch_nosync_ms"] / o["t_ccfuse_ms"]
    ok &= s >= 3
    parts.append("cf=%g: ccfuse %.4f ms, torch %.4f ms -> %.1fx (%.1fx vs torch without bincount's sync); dropped %d vs %d"
                 % (cf, o["t_ccfuse_ms"], t["t_torch_ms"], s, s2, o["dropped"], t["dropped"]))
print("router bench: " + "; ".join(parts) + ("  [target >= 3x: MET]" if ok else "  [target >= 3x: NOT MET]"))
PY
)
  echo "$router_line" | tee -a "$OUT/router_bench.log"
  summary+=("$router_line")
fi
if [[ " $what " == *" moe "* ]]; then
  # The serial MoE-layer baseline at EP = number of GPUs (issue 5, DESIGN §5): a Megatron-style
  # PyTorch + NCCL layer (tools/torch_moe_layer_bench.py) on Mixtral-8x7B, Qwen3-30B-A3B and
  # DeepSeek-V3-like shapes, 4096/8192/16384 tokens per GPU, uniform and zipf routing, all-to-all
  # and all-gather dispatch: whole layer, expert GEMMs and communication alone, fp64 check.
  : > "$OUT/moe_serial.jsonl"
  ngpu=$(nvidia-smi -L | wc -l)
  # CCFUSE_MOE_DISPATCH: the serial dispatch modes to time (default both; the fused op is
  # all-to-all only, so "alltoall" saves device time when only the comparison is wanted).
  # CCFUSE_MOE_INPROC=1: ccfuse's fused FFN also runs in the same process and rounds (C ABI,
  # --ccfuse-lib): t_ccfuse_inproc_ms beside t_serial_paired_ms, checked against fp64.
  inproc=(); [[ -n "${CCFUSE_MOE_INPROC:-}" && -f "$BIN/libccfuse_c.so" ]] && inproc=(--ccfuse-lib "$BIN/libccfuse_c.so")
  timeout ${CCFUSE_MOE_TIMEOUT:-500} python3 -m torch.distributed.run --nproc-per-node "$ngpu" tools/torch_moe_layer_bench.py \
    --json "$OUT/moe_serial.jsonl" --model mixtral qwen3 deepseek --tokens 4096 8192 16384 \
    --routing uniform zipf --dispatch ${CCFUSE_MOE_DISPATCH:-alltoall allgather} --iters ${CCFUSE_MOE_ITERS:-20} \
    --warmup 5 "${inproc[@]}" 2>&1 | tee "$OUT/moe_serial.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("moe serial: rc=$rc, $(wc -l < "$OUT/moe_serial.jsonl") records, $(grep -c '"check": "PASS"' "$OUT/moe_serial.jsonl") PASS, $(grep -c '"check": "FAIL"' "$OUT/moe_serial.jsonl") FAIL (moe_serial.log)")
fi
if [[ " $what " == *" moe_fused "* ]]; then
  # The fused expert-parallel MoE FFN (ccfuse::moe::MoeFfn, bench/moe_ffn_bench.cu) at EP = number
  # of GPUs on the serial baseline's cases (Mixtral, Qwen3, DeepSeek-V3-like; 4096/8192/16384 tokens
  # per GPU; uniform and zipf routing): whole layer, each layer alone, our grouped GEMMs without
  # communication, fp64 spot check. Merged with the moe section's records (tools/merge_moe.py).
  # CCFUSE_MOE_COMBINE=perslot | presum overrides layer 1's combine (default: presum for topk <= 32).
  : > "$OUT/moe_fused.jsonl"
  timeout ${CCFUSE_MOE_TIMEOUT:-400} $BIN/ccfuse_moe_ffn_bench --json "$OUT/moe_fused.jsonl" --iters 10 --warmup 3 2>&1 \
    | tee "$OUT/moe_fused.log"
  rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
  summary+=("moe fused: rc=$rc, $(wc -l < "$OUT/moe_fused.jsonl") records, $(grep -c '"check": "PASS"' "$OUT/moe_fused.jsonl") PASS, $(grep -c '"check": "FAIL"' "$OUT/moe_fused.jsonl") FAIL (moe_fused.log)")
  if [ -f "$OUT/moe_serial.jsonl" ]; then
    python3 tools/merge_moe.py "$OUT/moe_fused.jsonl" "$OUT/moe_serial.jsonl" --out "$OUT/moe_merged.jsonl" \
      | tee "$OUT/moe_table.log"
    summary+=("moe fused vs serial: $(grep -m1 '^geomean' "$OUT/moe_table.log"); $(grep -m1 '^fused/limit' "$OUT/moe_table.log") (moe_table.log)")
  fi
fi
if [[ " $what " == *" moe_diag "* ]]; then
  # Where the MoE FFN's time goes beyond its grouped GEMMs (diagnostic: the results are wrong on
  # purpose, CCFUSE_MOE_DIAG; docs/perf-notes.md): T = 4096 uniform, each model, the default and
  # l0pre (layer 0's preparation kernels alone; l0stopbegin, l0stoprank, l0stoplist: its first
  # steps alone, the entry barrier, the ranking and the send-list kernels), nowait (no per-tile
  # waits), nosend (no dispatch),
  # l0plain / l0sw / l0ready (layer 0's GEMM, no dispatch or waits, with a plain grouped schedule
  # and epilogue / with its idle send warps / with its ready schedule),
  # l1gemm (layer 1 without the pre-sum and combine kernels), l1presum (without the combine kernel),
  # l0sendonly (layer 0's kernel without tiles: its send warps' dispatch alone), l0nolocal (the
  # send warps skip the rows this rank owns: the local copy's cost).
  # One line per (variant, model).
  : > "$OUT/moe_diag.jsonl"; : > "$OUT/moe_diag.log"
  for diag in ${CCFUSE_MOE_DIAGS:-none l0pre nowait nosend l1gemm}; do
    # CCFUSE_MOE_DIAG_TOKENS (default 4096) and CCFUSE_MOE_DIAG_MODELS (default: all three).
    CCFUSE_MOE_DIAG=$([ $diag = none ] || echo $diag) timeout 200 $BIN/ccfuse_moe_ffn_bench \
      --tokens ${CCFUSE_MOE_DIAG_TOKENS:-4096} --routing uniform ${CCFUSE_MOE_DIAG_MODELS:+--model $CCFUSE_MOE_DIAG_MODELS} \
      --json "$OUT/moe_diag.jsonl" --iters 10 --warmup 3 >> "$OUT/moe_diag.log" 2>&1 || status=1
  done
  python3 tools/moe_records.py "$OUT/moe_diag.jsonl" > "$OUT/moe_diag_summary.log"
  cat "$OUT/moe_diag_summary.log"
  summary+=("moe diag: moe_diag_summary.log")
fi
if [[ " $what " == *" moe_ab "* ]]; then
  # A/B of the MoE FFN's variants (docs/perf-notes.md): the tuner's default, the per-slot combine,
  # the interleaved and the owner-major send order everywhere, each merged with the serial baseline of the same call
  # (run "moe" first in the same call, e.g. `gpu_run.sh moe moe_ab`).
  # default = the MoE tuner's choice per case (moe_tuner.h); the others force one setting.
  # allgather: layer 0's all-gather dispatch, the tuner's other choices (measured 2026-11-30:
  # slower than all-to-all on every case; opt-in). regstore: the layers' grouped GEMMs store from
  # registers (MoeFfnConfig::tma_store = false, the rule before 2026-11-30). presumbeside: layer 1's
  # pre-sum in side CTAs beside the GEMM (MoeFfnConfig::presum_ctas = -1, the tuner's estimate;
  # measured slower 2026-11-30) instead of after it. expertorder: layer 0's tiles expert by expert
  # (MoeFfnConfig::local_first = 0). striped: layer 0's striped dispatch (MoeFfnConfig::
  # striped_dispatch) with the tuner's other choices; stripedinter: striped, interleaved sends,
  # expert-order tiles (rows sent in the order every receiver's tiles take them).
  # CCFUSE_MOE_AB_VARIANTS: a subset (e.g. "default regstore").
  for variant in ${CCFUSE_MOE_AB_VARIANTS:-default regstore perslot interleave owner}; do
    combine=""; order=""; mode=""; tma=""
    [[ $variant == *perslot* ]] && combine=perslot
    [[ $variant == regstore ]] && tma=0
    presum=""; [[ $variant == presumbeside ]] && presum=-1
    [[ $variant == *interleave* ]] && order=interleave
    [[ $variant == owner ]] && order=owner
    [[ $variant == allgather ]] && mode=allgather
    [[ $variant == gather ]] && mode=gather  # all-gather, layer 0 reading its rows in place (MoeFfnConfig::gather_rows)
    l0order=""; [[ $variant == expertorder || $variant == stripedinter ]] && l0order=expert
    # gatherlocal: rows read in place with local-first tiles (MoeFfnConfig::local_first = 1).
    [[ $variant == gatherlocal ]] && { mode=gather; l0order=local; }
    striped=""; [[ $variant == striped* ]] && striped=1
    [[ $variant == stripedinter ]] && order=interleave
    # striped8inter / striped16inter: the same with 8 or 16 rows a warp a round (MoeFfnConfig::stripe_rows).
    stripe_rows=""; [[ $variant =~ ^striped([0-9]+)inter$ ]] && { stripe_rows=${BASH_REMATCH[1]}; order=interleave; l0order=expert; }
    # l0paceF: the tuner's choices with layer 0's dispatch paced over F x its GEMM's estimated time.
    pace=""; [[ $variant =~ ^l0pace([0-9.]+)$ ]] && pace=${BASH_REMATCH[1]}
    # l1pp1 / l1pp0: layer 1's GEMM on 128x128 ping-pong tiles / on 128x256 (MoeFfnConfig::l1_pingpong).
    l1pp=""; [[ $variant =~ ^l1pp([01])$ ]] && l1pp=${BASH_REMATCH[1]}
    # CCFUSE_MOE_AB_ARGS: more bench arguments for every variant (e.g. "--model qwen3").
    CCFUSE_MOE_L1_PINGPONG=$l1pp CCFUSE_MOE_DISPATCH_SPREAD_FRACTION=$pace CCFUSE_MOE_STRIPE_ROWS=$stripe_rows CCFUSE_MOE_STRIPED=$striped CCFUSE_MOE_L0_ORDER=$l0order CCFUSE_MOE_COMBINE=$combine CCFUSE_MOE_SEND_ORDER=$order CCFUSE_MOE_DISPATCH_MODE=$mode CCFUSE_MOE_TMA_STORE=$tma CCFUSE_MOE_PRESUM_CTAS=$presum timeout ${CCFUSE_MOE_TIMEOUT:-400} \
      $BIN/ccfuse_moe_ffn_bench --json "$OUT/moe_fused_$variant.jsonl" --iters 10 --warmup 3 ${CCFUSE_MOE_AB_ARGS:-} \
      > "$OUT/moe_fused_$variant.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    if [ -s "$OUT/moe_serial.jsonl" ]; then
      python3 tools/merge_moe.py "$OUT/moe_fused_$variant.jsonl" "$OUT/moe_serial.jsonl" \
        --out "$OUT/moe_merged_$variant.jsonl" > "$OUT/moe_table_$variant.log" 2>&1 || status=1
      summary+=("moe $variant: rc=$rc; $(grep -m1 '^geomean' "$OUT/moe_table_$variant.log"); $(grep -m1 '^fused/limit' "$OUT/moe_table_$variant.log")")
    else
      python3 tools/moe_records.py "$OUT/moe_fused_$variant.jsonl" > "$OUT/moe_table_$variant.log" 2>&1
      summary+=("moe $variant: rc=$rc (no serial records in this call; moe_table_$variant.log)")
    fi
  done
fi
if [[ " $what " == *" tp_ab "* ]]; then
  # A/B of the fused TP ops against the defaults (the tp section): in 2-CTA clusters
  # (CCFUSE_TP_CLUSTER=2, every op), and ag_gemm over the copy engine (CCFUSE_AG_TRANSPORT), each
  # with its own serial baselines in the same rounds; then a correctness check of each variant.
  # pdl: the GEMMs launched with programmatic dependent launch (the default since 2026-11-30 20:33, 004b4f0; nopdl: without)
  # after their entry barrier (CCFUSE_TP_PDL=1, every op; CCFUSE_TP_PDL=0 for nopdl).
  # bn192: ag_gemm with 192-column tiles (CCFUSE_AG_BLOCK_N=192; opt-in, measured 0.97-1.04x the
  # 256 tile's time 2026-11-30). bn256: the default, explicitly.
  # rsreg: gemm_rs and gemm_ar storing their tiles from registers (CCFUSE_RS_TMA_STORE=0, v1; the
  # TMA-store epilogue is the default since 2026-11-30 evening). rsldadd: TMA stores, but the own
  # band's peer partials loaded by every consumer thread (CCFUSE_RS_TMA_ADDENDS=0) instead of by TMA.
  # rsdirect (EXPERIMENT, written 2026-11-30): gemm_rs/gemm_ar peer tiles stored by TMA straight into
  # the owner's receive buffer (CCFUSE_RS_DIRECT=1).
  # ag: ag_gemm's default alone; agpeersonly: without filling its own gather slot
  # (CCFUSE_AG_RETURN_GATHERED=0); agspreadN: the push paced over N us (agspread0: one burst);
  # agfracF: over F x one band's predicted GEMM time (the default's rule, another fraction).
  # agce / agcepo: ag_gemm over the copy engine without the peer baseline, with / without the own
  # gather-slot copy (GPU time, 2026-11-30 20:40: traced faster than the send warps at W = 2).
  # agsw: ag_gemm over the send warps on every shape (the tuner takes the copy engine on dense ones).
  # CCFUSE_BENCH_STEADY_MS=N (any variant, any tp run): each part also back to back for N ms
  # (the GPU at its power cap; t_*_steady_ms in the records).
  # rsnopf: gemm_rs / gemm_ar without the addend prefetch (CCFUSE_RS_PREFETCH_ADDENDS=0).
  # rslate: gemm_rs / gemm_ar handing a TMA-stored tile to the send warps after the next mainloop
  # (CCFUSE_RS_EARLY_HANDOVER=0; the default before 2026-11-30 22:45, 12f6127), not 4 k-blocks into it.
  # rsspreadN (EXPERIMENT, written 2026-11-30 21:20): gemm_rs's partials forwarded in 8 slices paced
  # over N us (CCFUSE_RS_FORWARD_SPREAD_US; e.g. "rs rsspread10 rsspread20 rsspread30").
  # base: every op at its defaults (the reference for pdl / cluster2 / gmN in the same call).
  # gmN: every op with group_m N (CCFUSE_TP_GROUP_M; the tuner's is 8, the plain engine's 16 on
  # large shapes).
  # CCFUSE_TP_AB_VARIANTS: a subset (e.g. "pdl"), to spend device time only on what is new.
  for variant in ${CCFUSE_TP_AB_VARIANTS:-pdl cluster2 copy-engine}; do
    check_op=ag_gemm
    case $variant in
      rsreg) vars=(CCFUSE_RS_TMA_STORE=0 "CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;
      rsldadd) vars=(CCFUSE_RS_TMA_ADDENDS=0 "CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;
      rsspread[0-9]*) vars=(CCFUSE_RS_FORWARD_SPREAD_US=${variant#rsspread} "CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;
      rslate) vars=(CCFUSE_RS_EARLY_HANDOVER=0 "CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;
      rsnopf) vars=(CCFUSE_RS_PREFETCH_ADDENDS=0 "CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;
      rsdirect) vars=(CCFUSE_RS_DIRECT=1 "CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;
      rs) vars=("CCFUSE_TP_ONLY=gemm_rs gemm_ar" CCFUSE_TP_NO_PEER=1); check_op=gemm_rs ;;  # the defaults, same call
      ag) vars=(CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;  # the default, same call
      agpeersonly) vars=(CCFUSE_AG_RETURN_GATHERED=0 CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;
      agspread[0-9]*) vars=(CCFUSE_AG_PUSH_SPREAD_US=${variant#agspread} CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;
      agfrac[0-9]*) vars=(CCFUSE_AG_PUSH_SPREAD_FRACTION=${variant#agfrac} CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;
      pdl) vars=(CCFUSE_TP_PDL=1 CCFUSE_TP_NO_PEER=1) ;;
      agce) vars=(CCFUSE_AG_TRANSPORT=copy-engine CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;  # the copy engine, no peer baseline
      agsw) vars=(CCFUSE_AG_TRANSPORT=sm-send-warps CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;  # the send warps everywhere
      agcepo) vars=(CCFUSE_AG_TRANSPORT=copy-engine CCFUSE_AG_RETURN_GATHERED=0 CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;
      nopdl) vars=(CCFUSE_TP_PDL=0 CCFUSE_TP_NO_PEER=1) ;;  # without PDL after the entry barrier (the default before 2026-11-30 20:33)
      base) vars=(CCFUSE_TP_NO_PEER=1) ;;  # every op at its defaults, no peer baseline: the A/B's reference
      gm[0-9]*) vars=(CCFUSE_TP_GROUP_M=${variant#gm} CCFUSE_TP_NO_PEER=1) ;;  # group_m N for every op
      cluster2) vars=(CCFUSE_TP_CLUSTER=2 CCFUSE_TP_NO_PEER=1) ;;
      bn256|bn192) vars=(CCFUSE_AG_BLOCK_N=${variant#bn} CCFUSE_TP_ONLY=ag_gemm CCFUSE_TP_NO_PEER=1) ;;
      *) vars=(CCFUSE_AG_TRANSPORT=copy-engine CCFUSE_TP_ONLY=ag_gemm) ;;
    esac
    env "${vars[@]}" OUT="$OUT/$variant" bash "$0" tp > "$OUT/tp_$variant.log" 2>&1 || status=1
    env "${vars[@]}" timeout 120 $BIN/ccfuse check --op $check_op --m 1024 --n 520 --k 784 --dtype bf16 \
      2>&1 | tee -a "$OUT/tp_ab_check.log" | tail -n 1
    rc=${PIPESTATUS[0]}; [ $rc = 0 ] || status=1
    summary+=("tp variant $variant (${vars[*]}): $OUT/tp_$variant.log")
  done
fi
if [[ " $what " == *" tp_w1 "* ]]; then
  # Where the fused ops' 4-5 % over our own GEMM goes on the large shapes: the same fused kernels
  # at world size 1 (no communication, no peer: entry barrier + banded schedule + epilogue hooks)
  # against the plain engine and cuBLAS on the same per-rank GEMM.
  : > "$OUT/tp_w1.log"
  for spec in "ag_gemm 8192 14336 8192" "ag_gemm 16384 14336 8192" "gemm_rs 8192 8192 14336" "gemm_ar 8192 8192 14336" \
              "ag_gemm 8192 3072 4096" "gemm_rs 8192 4096 3072" "ag_gemm 1024 14336 8192" "ag_gemm 4096 7168 4096" \
              "gemm_ar 4096 4096 7168"; do
    set -- $spec
    timeout 60 $BIN/ccfuse bench --backend gpu --op $1 --m $2 --n $3 --k $4 --world-size 1 --dtype bf16 --json "$OUT/tp_w1.jsonl" \
      >> "$OUT/tp_w1.log" 2>&1 || status=1
  done
  summary+=("tp at W = 1: $(python3 -c "
import json, sys
for l in open('$OUT/tp_w1.jsonl'):
    r = json.loads(l)
    print('%s %dx%dx%d fused/ours %.3f;' % (r['op'], r['m'], r['n'], r['k'], r['t_fused_ms'] / r['t_gemm_ccfuse_ms']), end=' ')
" 2>/dev/null)")
fi
if [[ " $what " == *" gemm_n64 "* ]]; then
  # The 64-column TMA-store tile (CCFUSE_GEMM_TILE_N=64, opt-in, written 2026-12-01) against the
  # engine's choice on the one-wave shapes where cuBLASLt takes 64-, 80- or 96-column tiles, each
  # also back to back at the power cap. Predicted: 1024x768x4096 (split-K 2 of 128x128 now, 79-82 %
  # of cuBLASLt) to ~90 %; the others slower (their 64-column tiles take two waves).
  export CCFUSE_BENCH_STEADY_MS=${CCFUSE_BENCH_STEADY_MS:-200}
  gemm_ab gemm_n64 CCFUSE_GEMM_TILE_N 64 "1024 768 4096" "1024 768 8192" "2048 768 4096" "1024 1536 4096" \
    "1024 1280 8192" "4096 4096 4096"
  summary+=("gemm n64: gemm_n64_summary.log")
fi
if [[ " $what " == *" gemm_bin_ab "* ]]; then
  # Two builds of the GEMM bench on the same shapes, alternating: $BIN (the committed kernels) and
  # .carry/bin-new (CCFUSE_BIN_NEW: an experiment that replaces code instead of adding a switch,
  # e.g. a mainloop that must be the only one in its kernel). Each bench times its build against
  # cuBLASLt interleaved and back to back (CCFUSE_BENCH_STEADY_MS). Rows alternate old, new.
  export CCFUSE_BENCH_STEADY_MS=${CCFUSE_BENCH_STEADY_MS:-100}
  NEW=${CCFUSE_BIN_NEW:-.carry/bin-new}
  : > "$OUT/gemm_bin_ab.jsonl"; : > "$OUT/gemm_bin_ab.log"
  shapes=${CCFUSE_BIN_AB_SHAPES:-"1024,1536,4096 1024,1280,8192 1024,4096,512 1024,4096,1024 1024,768,4096 1024,14336,4096 1024,3584,4096 16384,4096,512 8192,8192,1024 8192,8192,8192 8192,14336,4096 4096,4096,4096"}
  for shape in $shapes; do
    IFS=, read -r m n k <<< "$shape"
    for b in "$BIN" "$NEW"; do
      tag=$CCFUSE_COMMIT; [ "$b" = "$NEW" ] && tag="$CCFUSE_COMMIT+$(tr -d '\n' < "$NEW/commit" 2>/dev/null || echo new)"
      CCFUSE_COMMIT=$tag timeout 60 $b/ccfuse bench --op gemm --m $m --n $n --k $k --dtype bf16 --iters 10 \
        --json "$OUT/gemm_bin_ab.jsonl" < /dev/null >> "$OUT/gemm_bin_ab.log" 2>&1 || status=1
    done
  done
  python3 tools/summarize_gemm.py --table --all "$OUT/gemm_bin_ab.jsonl" 2>&1 | tee "$OUT/gemm_bin_ab_summary.log"
  summary+=("gemm build A/B: gemm_bin_ab_summary.log")
fi
if [[ " $what " == *" gemm_env_sweep "* ]]; then
  # Bench overrides (src/tool/gpu_gemm_bench.cu: CCFUSE_GEMM_GROUP_M, _ORDER, _CLUSTER_N, _TILE_N,
  # _SPLIT_K ...) combined per variant, on the same shapes, each against cuBLASLt interleaved and
  # back to back. CCFUSE_SWEEP_VARIANTS: ';'-separated variants, each ','-separated VAR=VALUE
  # ("-" = the engine's choice); CCFUSE_SWEEP_SHAPES: "m,n,k ...". Rows: shape by shape, variants
  # in the given order (the config column says which).
  export CCFUSE_BENCH_STEADY_MS=${CCFUSE_BENCH_STEADY_MS:-100}
  : > "$OUT/gemm_env_sweep.jsonl"; : > "$OUT/gemm_env_sweep.log"
  IFS=';' read -ra variants <<< "${CCFUSE_SWEEP_VARIANTS:--}"
  for shape in ${CCFUSE_SWEEP_SHAPES:-1024,1536,4096}; do
    IFS=, read -r m n k <<< "$shape"
    for v in "${variants[@]}"; do
      envs=(); [ "$v" = "-" ] || IFS=, read -ra envs <<< "$v"
      echo "== $shape variant: $v" >> "$OUT/gemm_env_sweep.log"
      env "${envs[@]}" timeout 60 $BIN/ccfuse bench --op gemm --m $m --n $n --k $k --dtype bf16 --iters 10 \
        --json "$OUT/gemm_env_sweep.jsonl" < /dev/null >> "$OUT/gemm_env_sweep.log" 2>&1 || status=1
    done
  done
  python3 tools/summarize_gemm.py --table --all "$OUT/gemm_env_sweep.jsonl" 2>&1 | tee "$OUT/gemm_env_sweep_summary.log"
  summary+=("gemm env sweep: gemm_env_sweep_summary.log")
fi
if [[ " $what " == *" gemm_fixed "* ]]; then
  # The fixed cost per launch (2026-12-01): on 1024x4096xK (one wave of 128x256 tiles) ccfuse
  # trails cuBLASLt by a constant 2.3-2.8 us from K = 512 to 3584 (same slope), which is 10-20 % of
  # the one-wave shapes' time. K sweep down to one k-block, then ncu's kernel durations (caches
  # and clocks left alone) of ours and cuBLASLt's on two shapes: whether the 2.5 us is inside the
  # kernel or between kernels.
  export CCFUSE_BENCH_STEADY_MS=${CCFUSE_BENCH_STEADY_MS:-100}
  : > "$OUT/gemm_fixed.jsonl"; : > "$OUT/gemm_fixed.log"
  [ -n "${CCFUSE_FIXED_ONLY:-}" ] || for shape in "1024 4096 64" "1024 4096 128" "1024 4096 256" "1024 4096 512" "1024 4096 1024" "1024 4096 2048" \
               "1024 1536 64" "1024 1536 512" "1024 1536 4096" "1024 768 64" "1024 768 4096" "8192 8192 64"; do
    set -- $shape
    timeout 60 $BIN/ccfuse bench --op gemm --m $1 --n $2 --k $3 --dtype bf16 --iters 20 \
      --json "$OUT/gemm_fixed.jsonl" < /dev/null >> "$OUT/gemm_fixed.log" 2>&1 || status=1
  done
  set --
  python3 tools/summarize_gemm.py --table --all "$OUT/gemm_fixed.jsonl" 2>&1 | tee "$OUT/gemm_fixed_summary.log"
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  echo "ncu: ${NCU:-none}; nsys: $(command -v nsys || echo none)" | tee "$OUT/gemm_fixed_ncu.log"
  if [ -n "$NCU" ]; then
    for v in "4096 512 gemm_kernel" "4096 512 nvjet" "1536 4096 gemm_kernel" "1536 4096 nvjet" "4096 64 gemm_kernel" "4096 64 nvjet"; do
      set -- $v
      # Our kernel runs 1 + warm-up + iters times; cuBLASLt's best one comes after its heuristic's 8.
      skip=40; [ "$3" = gemm_kernel ] && skip=6
      [ -n "${CCFUSE_FIXED_ONLY:-}" ] && [ "$3" != "$CCFUSE_FIXED_ONLY" ] && continue
      echo "==== m=1024 n=$1 k=$2 kernel=$3" >> "$OUT/gemm_fixed_ncu.log"
      CCFUSE_BENCH_STEADY_MS=0 timeout 120 $NCU --clock-control none --cache-control none --kernel-name regex:$3 --launch-skip $skip --launch-count 6 \
        --metrics gpu__time_duration.sum,sm__cycles_active.avg,smsp__cycles_active.avg,gpc__cycles_elapsed.max \
        $BIN/ccfuse bench --op gemm --m 1024 --n $1 --k $2 --dtype bf16 --iters 20 < /dev/null \
        >> "$OUT/gemm_fixed_ncu.log" 2>&1 || status=1
    done
    set --
    grep -E "^====|gpu__time_duration|sm__cycles_active|gpc__cycles|  nvjet|gemm_kernel<" "$OUT/gemm_fixed_ncu.log" \
      | sed -E 's/\(.*//' | head -n 200 > "$OUT/gemm_fixed_ncu_summary.log"
  fi
  summary+=("gemm fixed cost: gemm_fixed_summary.log gemm_fixed_ncu_summary.log")
fi
if [[ " $what " == *" gemm_ncu_full "* ]]; then
  # ncu's full set (one launch each, clocks and caches left alone) on our kernel and cuBLASLt's
  # best one for the same problem: 1024x1536x4096 (both 128x96 tiles in our terms, ours 15 %
  # slower, 2026-12-01) and 1024x4096x512 (ours 128x256 one wave, nvjet 128x128 two waves).
  # Details and raw CSV per kernel; a grep of the comparable lines last.
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  mkdir -p "$OUT/ncu_full"
  # CCFUSE_NCU_CASES: other "n k kernel skip" cases (m = CCFUSE_NCU_M, default 1024);
  # CCFUSE_NCU_SOURCE=1: also the per-SASS-instruction page (stall samples by instruction).
  ncu_m=${CCFUSE_NCU_M:-1024}
  cases=${CCFUSE_NCU_CASES:-"1536 4096 gemm_kernel 6;1536 4096 nvjet 40;4096 512 gemm_kernel 6;4096 512 nvjet 40"}
  IFS=';' read -ra case_list <<< "$cases"
  for v in "${case_list[@]}"; do
    set -- $v
    tag=m${ncu_m}_n$1_k$2_$3${CCFUSE_NCU_TAG:-}
    CCFUSE_BENCH_STEADY_MS=0 timeout 200 $NCU --set full --clock-control none --cache-control none --kernel-name regex:$3 \
      --launch-skip $4 --launch-count 1 -o "$OUT/ncu_full/$tag" \
      $BIN/ccfuse bench --op gemm --m $ncu_m --n $1 --k $2 --dtype bf16 --iters 20 < /dev/null > "$OUT/ncu_full/$tag.run.log" 2>&1 || status=1
    $NCU -i "$OUT/ncu_full/$tag.ncu-rep" --page details > "$OUT/ncu_full/$tag.txt" 2>&1
    $NCU -i "$OUT/ncu_full/$tag.ncu-rep" --page raw --csv > "$OUT/ncu_full/$tag.raw.csv" 2>&1
    [ "${CCFUSE_NCU_SOURCE:-0}" = 1 ] && $NCU -i "$OUT/ncu_full/$tag.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/ncu_full/$tag.sass.csv" 2>&1
    rm -f "$OUT/ncu_full/$tag.ncu-rep"
  done
  set --
  summary+=("gemm ncu full: ncu_full/*.txt")
fi
if [[ " $what " == *" gemm_steady "* ]]; then
  # The engine's choice against the 128x256 TMA-store tile (CCFUSE_GEMM_TMA_STORE=1), each also
  # back to back alone at the power cap (CCFUSE_BENCH_STEADY_MS, default 300 here), against
  # cuBLASLt alike: the shapes where choose_config takes the 192, 224, 160 or 96 tile, and two
  # where it takes 256 (controls). 2026-12-01: at W = 1 the TP kernels' 128x256 tile ran 5-8 %
  # faster at the cap than the plain engine's 128x192 on the same GEMMs.
  export CCFUSE_BENCH_STEADY_MS=${CCFUSE_BENCH_STEADY_MS:-300}
  gemm_ab gemm_steady CCFUSE_GEMM_TMA_STORE 1 \
    "8192 3072 4096" "16384 3072 4096" "8192 14336 4096" "8192 1536 4096" "8192 768 4096" "8192 28672 8192" \
    "8192 8192 4096" "8192 8192 14336" "8192 14336 8192" "16384 14336 8192" "8192 8192 2048" "8192 8192 7168" \
    "8192 7168 8192" "8192 8192 1024" "4096 14336 4096" "4096 3072 4096" "1024 14336 4096" "1024 3584 4096" \
    "1024 14336 8192" "4096 1280 8192" "1024 5120 8192" "1024 1536 4096" "8192 4096 7168" "4096 8192 14336"
  summary+=("gemm steady: gemm_steady_summary.log")
fi
if [[ " $what " == *" gemm_tma "* ]]; then
  # The GEMM's TMA-store epilogue (the default since 2026-11-29) against the engine's choice and
  # cuBLASLt on the small-K and large TP shapes: does it remove the ~5.7 us per tile?
  gemm_ab gemm_tma CCFUSE_GEMM_TMA_STORE 1 "16384 4096 512" "8192 8192 1024" "4096 8192 1024" "8192 8192 3584" \
    "8192 14336 8192" "8192 8192 14336"
  summary+=("gemm tma-store: gemm_tma_summary.log")
fi
if [[ " $what " == *" gemm_streamk "* ]]; then
  # Where stream-K's time goes (docs/perf-notes.md): four few-tile shapes with the engine's choice,
  # stream-K, stream-K without its fixup (CCFUSE_GEMM_KPART_DIAG=1: each part stores its own sum,
  # wrong values, timing only), with counters and barriers but no partials moved (=2), and
  # split-K in 2 and 3 parts on the same tile, against cuBLASLt in the same bench.
  : > "$OUT/gemm_streamk.jsonl"; : > "$OUT/gemm_streamk.log"
  for shape in "1024 768 4096" "1024 1536 4096" "1024 3584 4096" "4096 1280 8192"; do
    set -- $shape
    for v in default sk sk-nofixup sk-nomove split2 split3; do
      vars=(CCFUSE_GEMM_KPART_VARIANT=$v)
      case $v in
        sk) vars+=(CCFUSE_GEMM_STREAM_K=1) ;;
        sk-nofixup) vars+=(CCFUSE_GEMM_STREAM_K=1 CCFUSE_GEMM_KPART_DIAG=1) ;;
        sk-nomove) vars+=(CCFUSE_GEMM_STREAM_K=1 CCFUSE_GEMM_KPART_DIAG=2) ;;
        split2) vars+=(CCFUSE_GEMM_SPLIT_K=2) ;;
        split3) vars+=(CCFUSE_GEMM_SPLIT_K=3) ;;
      esac
      echo "== $shape $v" >> "$OUT/gemm_streamk.log"
      env "${vars[@]}" timeout 60 $BIN/ccfuse bench --op gemm --m $1 --n $2 --k $3 --dtype bf16 --iters 10 \
        --json "$OUT/gemm_streamk.jsonl" < /dev/null >> "$OUT/gemm_streamk.log" 2>&1 || status=1
    done
  done
  python3 - "$OUT/gemm_streamk.jsonl" <<'PY' | tee "$OUT/gemm_streamk_summary.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
variants = ["default", "sk", "sk-nofixup", "sk-nomove", "split2", "split3"]
print("t_ccfuse us (%% of cuBLASLt)  " + "  ".join("%16s" % v for v in variants))
shapes = []
for r in rows:
    if (r["m"], r["n"], r["k"]) not in shapes:
        shapes.append((r["m"], r["n"], r["k"]))
for i, s in enumerate(shapes):
    cells = rows[i * len(variants):(i + 1) * len(variants)]
    print("%-26s " % ("%dx%dx%d" % s) + "  ".join("%7.1f (%5.1f%%)" % (c["t_fused_ms"] * 1e3, c["pct_of_cublas"]) for c in cells))
PY
  summary+=("gemm stream-K diagnosis: gemm_streamk_summary.log")
fi
if [[ " $what " == *" gemm_n96 "* ]]; then
  # The 128x96 TMA-store tile (CCFUSE_GEMM_TILE_N=96, 7 stages, 32-column TMA boxes; opt-in,
  # measured 2026-11-30: faster only on 1024x1280x8192) against the engine's choice and cuBLASLt
  # on the one-wave shapes where cuBLASLt takes 96- or 80-column tiles, and controls.
  gemm_ab gemm_n96 CCFUSE_GEMM_TILE_N 96 "1024 1536 4096" "1024 1280 8192" "1024 768 4096" "4096 1280 8192" \
    "1024 5120 8192" "1024 3584 4096" "4096 4096 4096" "8192 1536 8192"
  summary+=("gemm 128x96 tile A/B: gemm_n96_summary.log")
fi
if [[ " $what " == *" gemm_n160 "* ]]; then
  # The 160- and 224-column tiles (B [N, K]): the engine's pick (160 or 224 on these shapes)
  # against the tile it took before (192, 256) in the same run, then each forced on wide shapes
  # whose tiles fill the waves anyway: their speed per FLOP against the engine's wide tile.
  gemm_ab gemm_n160_vs192 CCFUSE_GEMM_TILE_N 192 "4096 1280 8192" "1024 5120 8192" "1024 2560 8192" \
    "1024 14336 4096" "4096 3584 4096" "1024 14336 8192"
  gemm_ab gemm_n224_vs256 CCFUSE_GEMM_TMA_STORE 1 "1024 3584 4096" "1024 7168 4096" "1024 7168 8192"
  gemm_ab gemm_n160_eff CCFUSE_GEMM_TILE_N 160 "4096 4096 4096" "8192 8192 8192"
  gemm_ab gemm_n224_eff CCFUSE_GEMM_TILE_N 224 "4096 4096 4096" "8192 8192 8192"
  summary+=("gemm 160/224 tiles A/B: gemm_n160_vs192 gemm_n224_vs256 gemm_n160_eff gemm_n224_eff _summary.log")
fi
if [[ " $what " == *" gemm_n160_more "* ]]; then
  # The multi-wave shapes whose choice would switch to 160 or 224 with both priced at 1.0 (their
  # speed per FLOP forced on 4096^3 and 8192^3, 2026-11-30 14:35): the engine's pick against each
  # forced, in the same run (run with 160 priced at 0.95; since then 0.97 picks it on the two
  # shapes where it won, 8192x1280x8192 and 4096x2560x8192).
  gemm_ab gemm_n160_more CCFUSE_GEMM_TILE_N 160 "4096 14336 4096" "4096 7168 4096" "8192 7168 4096" \
    "1024 28672 8192" "4096 2560 8192" "4096 14336 8192" "8192 1280 8192" "4096 7168 8192" "8192 7168 8192"
  gemm_ab gemm_n224_more CCFUSE_GEMM_TILE_N 224 "4096 8192 4096" "4096 8192 14336" "4096 8192 2048" \
    "4096 8192 7168" "4096 8192 1024" "4096 8192 3584"
  summary+=("gemm 160/224 on multi-wave shapes: gemm_n160_more gemm_n224_more _summary.log")
fi
if [[ " $what " == *" gemm_pairn "* ]]; then
  # CTA pairs along N sharing A (CCFUSE_GEMM_CLUSTER_N=2, GemmConfig::cluster_n; docs/gemm.md item 10)
  # against the same tile's pairs along M sharing B, with the 96- and the 128-column TMA-store
  # tiles: the one-wave shapes, and controls where the SMs are full.
  export CCFUSE_GEMM_TILE_N=96
  gemm_ab gemm_pairn96 CCFUSE_GEMM_CLUSTER_N 2 "1024 1536 4096" "1024 1280 8192" "1024 768 4096" "1024 3584 4096" \
    "4096 4096 4096" "1024 5120 8192"
  export CCFUSE_GEMM_TILE_N=128
  gemm_ab gemm_pairn128 CCFUSE_GEMM_CLUSTER_N 2 "1024 1536 4096" "1024 1280 8192" "4096 4096 4096" "16384 4096 512"
  unset CCFUSE_GEMM_TILE_N
  summary+=("gemm pairs along N A/B: gemm_pairn96_summary.log gemm_pairn128_summary.log")
fi
if [[ " $what " == *" gemm_smallk "* ]]; then
  # The 128x128 TMA-store tile (CCFUSE_GEMM_TILE_N=128) against the engine's choice (128x256 or
  # 128x192) on the K <= 1792 sweep shapes, where cuBLASLt takes 128x128 (docs/gemm.md, item 8).
  gemm_ab gemm_smallk CCFUSE_GEMM_TILE_N 128 "1024 4096 512" "4096 4096 512" "8192 4096 512" "16384 4096 512" \
    "1024 4096 1024" "4096 4096 1024" "16384 4096 1024" "4096 8192 1024" "16384 8192 1024" "1024 4096 1792" \
    "16384 4096 1792"
  summary+=("gemm 128x128 tile on small K A/B: gemm_smallk_summary.log")
fi
if [[ " $what " == *" gemm_pingpong "* ]]; then
  # Ping-pong consumers (CCFUSE_GEMM_PINGPONG=1: 128x128x64/5, each consumer warpgroup its own
  # tiles, one's epilogue under the other's mainloop; GemmConfig::pingpong) against the engine's
  # choice: the small-K shapes it is meant for, then long-K controls.
  gemm_ab gemm_pingpong CCFUSE_GEMM_PINGPONG 1 "1024 4096 512" "4096 4096 512" "8192 4096 512" "16384 4096 512" \
    "1024 4096 1024" "4096 8192 1024" "16384 8192 1024" "1024 4096 1792" "16384 4096 2048" "4096 4096 4096" \
    "8192 8192 8192"
  summary+=("gemm ping-pong A/B: gemm_pingpong_summary.log")
fi
if [[ " $what " == *" sanitize "* ]]; then
  # compute-sanitizer (Firecracker machines only, KINDS.md) on the newest kernels' smallest GPU
  # tests: racecheck (shared memory) and memcheck (then initcheck, below) on the GEMM's pairs along N (clean 2026-11-30
  # 11:00: the ping-pong GEMM and the chunked MoE preparation). CCFUSE_SANITIZE_FILTER: another
  # gtest filter.
  filter=${CCFUSE_SANITIZE_FILTER:-"*48x200x24_bf16_nk_bn128_sms0_row_cl0_tma_pairn*:*777x1000x136_bf16_nk_bn96_sms7_row_cl0_tma_pairn*:*48x96x24_fp16_nk_bn96_sms0_row_cl0_tma_pairn*"}
  : > "$OUT/sanitize.log"
  # The tools slow kernels 10-100x: the remote waits' bound goes from 5 s to 120 s (a 5 s
  # watchdog fired under racecheck on 2026-11-30). NCCL's own probing (kernel images for other
  # architectures, cuMemCreate refused in the VM) fails API calls by design: not reported.
  for tool in racecheck memcheck; do
    echo "==== $tool" >> "$OUT/sanitize.log"
    CCFUSE_WATCHDOG_MS=120000 timeout 280 compute-sanitizer --tool $tool --report-api-errors no \
      --error-exitcode 9 $BIN/ccfuse_gpu_tests --gtest_filter="$filter" >> "$OUT/sanitize.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    echo "==== $tool rc=$rc" >> "$OUT/sanitize.log"
  done
  # initcheck on the kernels only (the tests copy whole buffers back), on MoE cases with register
  # stores: it does not count TMA bulk stores as writes, so every read of a TMA-stored GEMM output
  # is reported (2026-12-07: gone with register stores on the same case). CCFUSE_INITCHECK_FILTER:
  # another gtest filter.
  echo "==== initcheck" >> "$OUT/sanitize.log"
  CCFUSE_WATCHDOG_MS=120000 timeout 200 compute-sanitizer --tool initcheck --check-api-memory-access no \
    --print-limit 50 --report-api-errors no --error-exitcode 9 $BIN/ccfuse_gpu_tests \
    --gtest_filter="${CCFUSE_INITCHECK_FILTER:-*GpuMoeFfn.*/regstore_*}" >> "$OUT/sanitize.log" 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  echo "==== initcheck rc=$rc" >> "$OUT/sanitize.log"
  grep -E "^====|ERROR SUMMARY|PASSED|FAILED" "$OUT/sanitize.log" | tee "$OUT/sanitize_summary.log"
  summary+=("sanitize: sanitize_summary.log")
fi
if [[ " $what " == *" grouped_ncu "* ]]; then
  # Why the grouped ping-pong tile wins at N >= 4096 and loses below (docs/gemm.md): ncu's full set
  # (clocks and caches left alone) on our grouped kernel, the engine's choice and the A/B variant
  # (CCFUSE_GROUPED_AB_PINGPONG=1: the other of 128x256/3 and 128x128/6 ping-pong) of the same
  # interleaved rounds, for the MoE cases named in CCFUSE_GROUPED_NCU (tools/moe_grouped.py names).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  mkdir -p "$OUT/grouped_ncu"
  # (the case's first line: uniform routing; "contains" as --only matches, so T4096 is not T40960).
  for name in ${CCFUSE_GROUPED_NCU:-qwen3-down-T4096 dsv3-down-T4096}; do
    args=$(python3 tools/moe_grouped.py --only "$name" | head -n 1)
    [ -n "$args" ] || { echo "grouped_ncu: no case $name" | tee -a "$OUT/grouped_ncu/$name.txt"; status=1; continue; }
    # Our kernels only (gemm_kernel<...>, not the prefix kernel or cuBLAS's); launches alternate
    # default, variant after the warm-up: 2 of each.
    CCFUSE_GROUPED_AB_PINGPONG=1 timeout 300 $NCU --set full --clock-control none --cache-control none \
      --kernel-name-base demangled --kernel-name regex:'gemm_kernel<' --launch-skip 4 --launch-count 4 \
      -o "$OUT/grouped_ncu/$name" $BIN/ccfuse bench --op grouped_gemm $args --dtype bf16 --iters 4 \
      < /dev/null > "$OUT/grouped_ncu/$name.run.log" 2>&1 || status=1
    $NCU -i "$OUT/grouped_ncu/$name.ncu-rep" --page details > "$OUT/grouped_ncu/$name.txt" 2>&1
    $NCU -i "$OUT/grouped_ncu/$name.ncu-rep" --page raw --csv > "$OUT/grouped_ncu/$name.raw.csv" 2>&1
    rm -f "$OUT/grouped_ncu/$name.ncu-rep"
    grep -E "gemm_kernel|Duration|DRAM Throughput|L2 Hit Rate|L1/TEX Hit|L2 Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Dynamic Shared" \
      "$OUT/grouped_ncu/$name.txt" | sed -E 's/(gemm_kernel<.{0,60}).*/\1/' >> "$OUT/grouped_ncu_summary.log"
  done
  summary+=("grouped ncu: grouped_ncu/*.txt grouped_ncu_summary.log")
fi
if [[ " $what " == *" moe_ncu_send "* ]]; then
  # Why layer 0's dispatch copy runs at 0.6-0.85 TB/s (docs/perf-notes.md, 2026-12-02): ncu's full
  # set and the per-SASS page on layer 0's kernel with no tiles (CCFUSE_MOE_DIAG=l0sendonly: the
  # send warps alone), Qwen3 at 4096 tokens, one GPU (W = 1: every row a local copy), striped
  # (the default) and by units (CCFUSE_MOE_STRIPED=0).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  mkdir -p "$OUT/moe_ncu_send"
  for st in 1 0; do
    tag=qwen3-T4096-sendonly-striped$st
    CUDA_VISIBLE_DEVICES=0 CCFUSE_MOE_STRIPED=$st CCFUSE_MOE_DIAG=l0sendonly timeout 200 $NCU --set full \
      --clock-control none --kernel-name-base demangled --kernel-name regex:L0Schedule --launch-skip 1 --launch-count 1 \
      -o "$OUT/moe_ncu_send/$tag" $BIN/ccfuse_moe_ffn_bench --model qwen3 --tokens 4096 --routing uniform --iters 1 \
      --warmup 1 --sample 4 < /dev/null > "$OUT/moe_ncu_send/$tag.run.log" 2>&1 || status=1
    $NCU -i "$OUT/moe_ncu_send/$tag.ncu-rep" --page details > "$OUT/moe_ncu_send/$tag.txt" 2>&1
    $NCU -i "$OUT/moe_ncu_send/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/moe_ncu_send/$tag.sass.csv" 2>&1
    gzip -f "$OUT/moe_ncu_send/$tag.sass.csv"
    rm -f "$OUT/moe_ncu_send/$tag.ncu-rep"
    grep -E "Duration|DRAM Throughput|L2 Hit Rate|L1/TEX Hit|Memory Throughput|Warp Cycles Per Issued|Achieved Active Warps|Stall|stall" \
      "$OUT/moe_ncu_send/$tag.txt" | head -30 | sed "s/^/$tag: /" >> "$OUT/moe_ncu_send_summary.log"
  done
  summary+=("moe ncu send: moe_ncu_send/*.txt moe_ncu_send_summary.log")
fi
if [[ " $what " == *" moe_ncu_prep "* ]]; then
  # Layer 0's preparation kernels one by one (docs/perf-notes.md, 2026-12-06: the exchange step
  # of l0pre grows with E): ncu's full set on the ranking, send-list and exchange kernels of one
  # call (CCFUSE_MOE_DIAG=l0pre: no GEMM), Qwen3 (E = 128) and DeepSeek-like (E = 256) at 4096
  # tokens, one GPU; the exchange kernel's per-SASS page (stalls by instruction).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
  mkdir -p "$OUT/moe_ncu_prep"
  : > "$OUT/moe_ncu_prep_summary.log"
  for model in qwen3 deepseek; do
    tag=$model-T4096-prep
    CUDA_VISIBLE_DEVICES=0 CCFUSE_MOE_DIAG=l0pre timeout 200 $NCU --set full --clock-control none \
      --kernel-name-base demangled --kernel-name "regex:exchange_kernel|chunk_rank_kernel|chunk_send_list_kernel" \
      --launch-skip 3 --launch-count 3 -o "$OUT/moe_ncu_prep/$tag" $BIN/ccfuse_moe_ffn_bench --model $model \
      --tokens 4096 --routing uniform --iters 1 --warmup 1 --sample 4 < /dev/null > "$OUT/moe_ncu_prep/$tag.run.log" 2>&1 || status=1
    $NCU -i "$OUT/moe_ncu_prep/$tag.ncu-rep" --page details > "$OUT/moe_ncu_prep/$tag.txt" 2>&1
    $NCU -i "$OUT/moe_ncu_prep/$tag.ncu-rep" --page source --csv --print-source sass \
      --kernel-name-base demangled --kernel-name regex:exchange_kernel > "$OUT/moe_ncu_prep/$tag.exchange.sass.csv" 2>&1
    gzip -f "$OUT/moe_ncu_prep/$tag.exchange.sass.csv"
    rm -f "$OUT/moe_ncu_prep/$tag.ncu-rep"
    grep -E "^  [a-z_:<>(), 0-9A-Za-z]*(kernel|Kernel)|Duration|Elapsed Cycles|Warp Cycles Per Issued|Registers Per" \
      "$OUT/moe_ncu_prep/$tag.txt" | sed "s/^/$tag: /" >> "$OUT/moe_ncu_prep_summary.log"
  done
  summary+=("moe ncu prep: moe_ncu_prep/*.txt moe_ncu_prep_summary.log")
fi
if [[ " $what " == *" moe_ncu "* ]]; then
  # Layer 0 with rows read in place (MoeFfnConfig::gather_rows; docs/moe-layers.md) against the
  # TMA-fed layer 0 (all-gather with the local permute, and all-to-all): one GPU (W = 1: no peer,
  # so ncu's serialised replay cannot deadlock on flags), Qwen3 and Mixtral at 4096 tokens, one
  # profiled launch of the layer-0 kernel each (its schedule type in the demangled name).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  : > "$OUT/moe_ncu.log"
  for v in "qwen3 gather L0GatherSchedule" "qwen3 allgather L0Schedule" "qwen3 alltoall L0Schedule" \
           "mixtral gather L0GatherSchedule" "mixtral allgather L0Schedule"; do
    set -- $v
    echo "==== model=$1 mode=$2 kernel=$3" >> "$OUT/moe_ncu.log"
    mode=$2; [ "$mode" = alltoall ] && mode=""
    CUDA_VISIBLE_DEVICES=0 CCFUSE_MOE_DISPATCH_MODE=$mode timeout 150 ${NCU:-ncu} --clock-control none \
      --kernel-name-base demangled --kernel-name regex:$3 --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats \
      $BIN/ccfuse_moe_ffn_bench --model $1 --tokens 4096 --routing uniform --iters 1 --warmup 1 --sample 4 \
      < /dev/null >> "$OUT/moe_ncu.log" 2>&1 || status=1
  done
  grep -E "^====|Duration|Memory Throughput|L1/TEX Hit|L2 Hit|Compute \(SM\) Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued" \
    "$OUT/moe_ncu.log" > "$OUT/moe_ncu_summary.log"
  summary+=("moe ncu: moe_ncu.log moe_ncu_summary.log")
fi
if [[ " $what " == *" gemm_ncu "* ]]; then
  # The narrow-tile L2 hypothesis (docs/gemm.md item 8): L2 and tensor-pipe counters of the
  # 128x256, 128x128 and 128x96 TMA-store tiles on 4096^3, then 128x256, 128x128 ping-pong and
  # cuBLASLt's first heuristic kernel (nvjet) on 16384x4096x512 (one profiled launch each; ncu
  # reads counters on Firecracker machines only, KINDS.md; clocks left alone).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  : > "$OUT/gemm_ncu.log"
  for v in "4096 4096 CCFUSE_GEMM_TMA_STORE=1 gemm_kernel" "4096 4096 CCFUSE_GEMM_TILE_N=128 gemm_kernel" \
           "4096 4096 CCFUSE_GEMM_TILE_N=96 gemm_kernel" "16384 512 CCFUSE_GEMM_TMA_STORE=1 gemm_kernel" \
           "16384 512 CCFUSE_GEMM_PINGPONG=1 gemm_kernel" "16384 512 CCFUSE_GEMM_TMA_STORE=1 nvjet"; do
    set -- $v
    echo "==== m=$1 n=4096 k=$2 $3 kernel=$4" >> "$OUT/gemm_ncu.log"
    skip=2; [ "$4" = nvjet ] && skip=0
    env $3 timeout 120 ${NCU:-ncu} --clock-control none --kernel-name regex:$4 --launch-skip $skip --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      $BIN/ccfuse bench --op gemm --m $1 --n 4096 --k $2 --dtype bf16 --iters 3 --warmup 1 < /dev/null \
      >> "$OUT/gemm_ncu.log" 2>&1 || status=1
  done
  set --
  grep -E "^====|Duration|Throughput|L2|Hit Rate|Bandwidth|Pipe|Executed Ipc|TFLOP|  nvjet|gemm_kernel" "$OUT/gemm_ncu.log" | tee "$OUT/gemm_ncu_summary.log"
  summary+=("gemm ncu (128x256, 128x128, 128x96 on 4096^3): gemm_ncu_summary.log")
fi
if [[ " $what " == *" gemm_raster "* ]]; then
  # The tile raster (L2 reuse) on the large sweep shapes at 92-95 % of cuBLASLt: the engine's
  # choice (row-major in groups of 8 row tiles), groups of 4 and 16, column-major; each shape's
  # variants back to back, each against cuBLASLt in its own bench.
  : > "$OUT/gemm_raster.jsonl"; : > "$OUT/gemm_raster.log"
  for shape in "8192 7168 4096" "4096 14336 4096" "16384 4096 2048" "16384 3584 4096" "8192 14336 4096" \
               "16384 3072 4096"; do
    for v in "" CCFUSE_GEMM_GROUP_M=4 CCFUSE_GEMM_GROUP_M=16 CCFUSE_GEMM_ORDER=col; do
      set -- $shape
      env $v timeout 60 $BIN/ccfuse bench --op gemm --m $1 --n $2 --k $3 --dtype bf16 --iters 10 \
        --json "$OUT/gemm_raster.jsonl" < /dev/null >> "$OUT/gemm_raster.log" 2>&1 || status=1
    done
  done
  python3 tools/summarize_gemm.py --table "$OUT/gemm_raster.jsonl" 2>&1 | tee "$OUT/gemm_raster_summary.log"
  summary+=("gemm raster A/B (default, group_m 4, 16, column-major per shape): gemm_raster_summary.log")
fi
if [[ " $what " == *" gemm_n192 "* ]]; then
  # The 128x192 TMA-store tile (CCFUSE_GEMM_TILE_N=192; measured 2026-11-30, now chosen by the model)
  # against the engine's choice and cuBLASLt, on the sweep shapes where 192-column tiles fill the
  # waves better than 128 or 256 (docs/perf-notes.md), and controls (two large shapes among them).
  gemm_ab gemm_n192 CCFUSE_GEMM_TILE_N 192 "1024 3072 4096" "4096 768 4096" "1024 2560 8192" "4096 1536 4096" \
    "8192 768 4096" "1024 1536 4096" "8192 14336 8192" "8192 8192 14336"
  summary+=("gemm 128x192 tile A/B: gemm_n192_summary.log")
fi
if [[ " $what " == *" trace "* ]]; then
  # Per-tile timestamps of the fused TP kernels (CCFUSE_TILE_TRACE, tools/tile_trace.py): where
  # their time goes against the same kernel without communication (W = 1) (docs/tp-fusion.md).
  : > "$OUT/tile_trace.log"
  # CCFUSE_TRACE_SPECS="op m n k w; ...": other shapes (e.g. "ag_gemm 8192 14336 8192 2; ag_gemm 8192 14336 8192 1").
  specs=("ag_gemm 8192 3072 4096 2" "gemm_rs 8192 4096 6144 2" "gemm_rs 8192 4096 3072 1" \
         "gemm_rs 8192 8192 28672 2" "gemm_ar 4096 4096 14336 2")
  [[ -n "${CCFUSE_TRACE_SPECS:-}" ]] && IFS=';' read -ra specs <<< "$CCFUSE_TRACE_SPECS"
  for spec in "${specs[@]}"; do
    set -- $spec
    prefix="$OUT/trace_$1_$2x$3x$4_w$5${CCFUSE_AG_TRANSPORT:+_$CCFUSE_AG_TRANSPORT}"
    CCFUSE_TILE_TRACE="$prefix" timeout 60 $BIN/ccfuse bench --op $1 --m $2 --n $3 --k $4 --world-size $5 --dtype bf16 \
      --iters 5 --warmup 2 >> "$OUT/tile_trace.log" 2>&1 || status=1
    # CCFUSE_TRACE_BINS=US: also the tiles by start time (tools/tile_trace.py --bins).
    python3 tools/tile_trace.py ${CCFUSE_TRACE_BINS:+--bins $CCFUSE_TRACE_BINS} "$prefix".rank*.csv | tee -a "$OUT/tile_trace.log"
  done
  summary+=("tile traces: tile_trace.log")
fi
# The device tool brings back only a few files (8): everything goes into two archives, tile
# traces apart (unpack with tar xzf).
pack() {
  ( cd "$OUT" || exit 0
    ls ./*.csv >/dev/null 2>&1 && tar czf /tmp/ccfuse-traces.tgz ./*.csv && rm -f ./*.csv
    tar czf /tmp/ccfuse-results.tgz . && find . -mindepth 1 -delete
    mv /tmp/ccfuse-results.tgz .; [ -f /tmp/ccfuse-traces.tgz ] && mv /tmp/ccfuse-traces.tgz . ; true )
}
echo "================ summary ================"
for s in "${summary[@]}"; do echo "$s"; done
[ -f "$OUT/comm_microbench.log" ] && tail -n 40 "$OUT/comm_microbench.log"
[[ " $what " == *" grouped "* ]] && [ -f "$OUT/grouped_summary.log" ] && cat "$OUT/grouped_summary.log"
pack
exit $status

#!/usr/bin/env bash
# The acceptance calls of issues 4 and 5 (2 GPUs), 6 (4) and 7 (8), at whatever W this machine
# has (nvidia-smi -L): one part per device call, each under the 10-minute limit, logs under
# $OUT/<part> (gpu_run.sh's tarball unpacked there), a short summary printed last.
# Stage first with every binary (bash tools/stage_gpu.sh; libccfuse_c.so for the torch parts) and
# carry [".carry"]. Written 2026-12-06 for the first multi-GPU session after a week of one GPU.
#
#   bash tools/gpu_session_multi.sh PART [PART ...]
#     tests    the whole GPU suite at W (gpu_run.sh tests: ~540 cases, 1000-call loops and CUDA-graph
#              replays included; 207 s at W = 1 on one H100, 2026-12-07) and ccfuse check
#     torch    through torch at W ranks (torchrun): the parallel linears with autograd
#              (tools/torch_tp_linear_check.py), the ops under torch.compile / opcheck
#              (tools/torch_compile_check.py), MoeFfn with autograd in every backward mode
#              (tools/torch_moe_autograd_check.py), MoeLayer under CUDA graphs for serving
#              (tools/torch_moe_graph_check.py), the MoE FFN on a second group's Team
#              (tools/torch_team_groups_check.py). Split from tests on 2026-12-07: both in one call
#              could pass the 10-minute limit.
#     layers   ccfuse.layers.MoeLayer trained at W ranks (tools/torch_layers_check.py --compile: gate,
#              GPU router, fused experts, both backward modes, eager and compiled, against fp32 torch)
#     tp       the TP table: comm microbench, fused vs serial NCCL+cuBLAS vs PyTorch async-TP in one
#              run (gpu_run.sh comm tp; tools/tp_report.py renders the README table from its JSON)
#     moe      the MoE FFN against the serial Megatron-style layer, the tuner's default
#              (gpu_run.sh moe moe_ab with CCFUSE_MOE_AB_VARIANTS, default "default")
#     moediag  Qwen3's diagnostics at EP = W (gpu_run.sh moe_diag; CCFUSE_MOE_DIAGS overrides)
#     pairs    CTA pairs on this GPU for the even 20-30-wave shapes (one GPU of the machine)
#     decode   the MoE FFN at decode-sized batches (64, 256, 1024 tokens a GPU; EP = W): ours
#              (bench/moe_ffn_bench.cu) and the serial layer with ours in its rounds (--ccfuse-lib);
#              at W = 1 on one H100 (2026-12-07) ours streamed the weights at 2.4-2.9 TB/s
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz" && chmod +x "${gz%.gz}"; done
ngpu=$(nvidia-smi -L | wc -l)
lines=()
# Seconds left of the call (CCFUSE_SESSION_BUDGET_S, default 570: the device tool's 600 less a margin).
left() { echo $(( ${CCFUSE_SESSION_BUDGET_S:-570} - SECONDS )); }
unpack() { [ -f "$1/ccfuse-results.tgz" ] && tar xzf "$1/ccfuse-results.tgz" -C "$1" && rm -f "$1/ccfuse-results.tgz"; }
for part in "$@"; do
  d=$O/$part
  mkdir -p "$d"
  case $part in
    tests)
      OUT=$d bash tools/gpu_run.sh tests > "$d/run.out" 2>&1
      unpack "$d"
      lines+=("tests at W = $ngpu: $(grep -E '^\[  (PASSED|FAILED) ' "$d/gpu_tests.log" | tr '\n' ' '); check $(grep -c '^PASS' "$d/gpu_check.log") PASS $(grep -c '^FAIL' "$d/gpu_check.log") FAIL")
      while read -r l; do lines+=("  $l"); done < <(grep -E '^\[  FAILED  \] [A-Z]' "$d/gpu_tests.log" | sort -u | head -10)
      ;;
    torch)
      # Each check under min(its limit, what is left of the call's budget); one that no longer
      # fits (under 60 s left) is skipped and named.
      torch_check() {
        local name=$1 limit=$2 script=$3
        shift 3
        local t=$(( $(left) - 15 ))
        [ "$t" -lt "$limit" ] && limit=$t
        if [ "$limit" -lt 60 ]; then echo "skipped: $(left) s left of the call" > "$d/$name.log"; return; fi
        ( source tools/gpu_env.sh
          timeout "$limit" python3 -m torch.distributed.run --nproc-per-node "$ngpu" "tools/$script" \
            --ccfuse-lib .carry/bin/libccfuse_c.so --json "$d/$name.jsonl" "$@" > "$d/$name.log" 2>&1
          echo "rc=$?" >> "$d/$name.log" )
      }
      torch_check tp_linear 150 torch_tp_linear_check.py
      lines+=("parallel linears at W = $ngpu: $(grep -E '^torch_tp_linear_check:|^rc=|^skipped' "$d/tp_linear.log" | tr '\n' ' ')")
      torch_check moe_autograd 180 torch_moe_autograd_check.py \
        --backward unfused,fused,fused_keep,fused_keep_kw,fused_kw_mg,fused_keep_b1
      lines+=("MoeFfn autograd at W = $ngpu: $(grep -E '^torch_moe_autograd_check:|timing|^rc=|^skipped' "$d/moe_autograd.log" | cut -c1-160 | tr '\n' ' ')")
      torch_check moe_graph 120 torch_moe_graph_check.py
      lines+=("MoeLayer under CUDA graphs at W = $ngpu: $(grep -E '^torch_moe_graph_check:|^rc=|^skipped' "$d/moe_graph.log" | tr '\n' ' ')")
      while read -r l; do lines+=("  $l"); done < <(grep -E '^rank 0 ' "$d/moe_graph.log" | cut -c1-200 | head -8)
      torch_check team_groups 90 torch_team_groups_check.py
      lines+=("two Teams (MoeFfn on an EP group) at W = $ngpu: $(grep -E '^torch_team_groups_check:|^rc=|^skipped' "$d/team_groups.log" | tr '\n' ' ')")
      torch_check compile 240 torch_compile_check.py
      lines+=("torch.compile / opcheck at W = $ngpu: $(grep -E '^torch_compile_check:|^rc=|^skipped' "$d/compile.log" | tr '\n' ' ')")
      ;;
    layers)
      ( source tools/gpu_env.sh
        timeout 300 python3 -m torch.distributed.run --nproc-per-node "$ngpu" tools/torch_layers_check.py \
          --ccfuse-lib .carry/bin/libccfuse_c.so --compile --json "$d/layers.jsonl" > "$d/layers.log" 2>&1
        echo "rc=$?" >> "$d/layers.log" )
      lines+=("MoeLayer trained at W = $ngpu: $(grep -E '^torch_layers_check:|^rc=' "$d/layers.log" | tr '\n' ' ')")
      while read -r l; do lines+=("  $l"); done < <(grep -E 'FAIL|Error' "$d/layers.log" | cut -c1-200 | head -8)
      ;;
    tp)
      OUT=$d bash tools/gpu_run.sh comm tp > "$d/run.out" 2>&1
      unpack "$d"
      lines+=("tp table (tp_table.log):")
      while read -r l; do lines+=("  $l"); done < <(tail -n 16 "$d/tp_table.log" 2>/dev/null)
      ;;
    moe)
      OUT=$d CCFUSE_MOE_DISPATCH=alltoall CCFUSE_MOE_AB_VARIANTS=${CCFUSE_MOE_AB_VARIANTS:-default} \
        bash tools/gpu_run.sh moe moe_ab > "$d/run.out" 2>&1
      unpack "$d"
      for f in "$d"/moe_table_*.log; do
        [ -f "$f" ] || continue
        lines+=("moe $(basename "$f" .log): $(grep -m1 '^geomean' "$f"); $(grep -m1 '^fused/limit' "$f")")
      done
      ;;
    moediag)
      OUT=$d CCFUSE_MOE_DIAG_MODELS=${CCFUSE_MOE_DIAG_MODELS:-qwen3} CCFUSE_MOE_DIAG_TOKENS="${CCFUSE_MOE_DIAG_TOKENS:-4096 16384}" \
        CCFUSE_MOE_DIAGS="${CCFUSE_MOE_DIAGS:-none l0pre nowait nosend l0sendonly l0nolocal l1gemm l1presum}" \
        bash tools/gpu_run.sh moe_diag > "$d/run.out" 2>&1
      unpack "$d"
      while read -r l; do lines+=("  $l"); done < <(cat "$d/moe_diag_summary.log" 2>/dev/null)
      ;;
    pairs)
      ( source tools/gpu_env.sh
        for round in 1 2; do
          for shape in "8192 14336 8192" "4096 28672 8192" "8192 8192 14336"; do
            set -- $shape
            for v in 1 2; do
              CUDA_VISIBLE_DEVICES=0 CCFUSE_GEMM_CLUSTER_M=$v timeout 60 .carry/bin/ccfuse bench --op gemm --m $1 --n $2 \
                --k $3 --dtype bf16 --iters 10 --json "$d/pairs.jsonl" > /dev/null 2>> "$d/pairs.err"
            done
          done
        done )
      while read -r l; do lines+=("  $l"); done < <(python3 - "$d/pairs.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print('%5d x %5d x %5d %-50s ours/cuBLASLt %5.1f %%' % (r['m'], r['n'], r['k'], r.get('config', '')[:50],
          r.get('pct_of_cublas', 0)))
PY
)
      ;;
    decode)
      ( source tools/gpu_env.sh
        timeout 200 .carry/bin/ccfuse_moe_ffn_bench --tokens 64 256 1024 --routing uniform zipf --iters 20 --warmup 5 \
          --json "$d/moe_decode.jsonl" > "$d/moe_decode.log" 2>&1
        echo "rc=$?" >> "$d/moe_decode.log"
        timeout 300 python3 -m torch.distributed.run --nproc-per-node "$ngpu" tools/torch_moe_layer_bench.py \
          --json "$d/moe_decode_serial.jsonl" --tokens 64 256 1024 --routing uniform zipf --dispatch alltoall \
          --iters 20 --warmup 5 --ccfuse-lib .carry/bin/libccfuse_c.so > "$d/moe_decode_serial.log" 2>&1
        echo "rc=$?" >> "$d/moe_decode_serial.log" )
      lines+=("moe decode at W = $ngpu: $(tail -2 "$d/moe_decode.log" | tr '\n' ' ')")
      while read -r l; do lines+=("  $l"); done < <(grep -E '^(mixtral|qwen3|deepseek) +T=' "$d/moe_decode.log" | cut -c1-120)
      lines+=("moe decode serial (ccfuse in its rounds): $(tail -1 "$d/moe_decode_serial.log")")
      while read -r l; do lines+=("  $l"); done < <(grep -E '^(mixtral|qwen3|deepseek) +T=' "$d/moe_decode_serial.log" |
        sed -E 's/ +gemm .*ccfuse_inproc/ ccfuse/; s/ combine.*serial_paired/ paired/; s/\] +limit.*(PASS|FAIL)/ \1/; s/rows.*//')
      ;;
    *) echo "gpu_session_multi.sh: unknown part '$part' (tests torch layers tp moe moediag pairs decode)" >&2; exit 2 ;;
  esac
done
echo "== $(nvidia-smi -L | head -1 | cut -c1-60) x $ngpu, binaries $(cat .carry/commit 2>/dev/null)"
printf '%s\n' "${lines[@]}"

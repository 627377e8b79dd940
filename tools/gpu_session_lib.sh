# Sourced by the one-call GPU session scripts (tools/gpu_session_*.sh) after `cd` to the repo root:
# the carried binaries unpacked (.carry/bin/*.gz), tools/gpu_env.sh, $O (the device tool's $OUT,
# logs under $O/logs), $B (the binaries), $gpu (its name), table=() for the summary, and
#   left            seconds left of CCFUSE_SESSION_BUDGET_S (default 570) since the script started
#   tests_line LOG  gtest's PASSED / FAILED / SKIPPED lines of LOG on one line
#   finish NAME     the summary (NAME, GPU, carried commit, seconds, the table) to $O/summary.txt and
#                   stdout, the logs into $O/logs.tar.gz
#   kgrouped_tests  the engine's K-grouped and validation tests, their result (and failures) in the table
#   wgrad_bench NAME TIMEOUT ARGS...  tools/torch_wgrad_bench.py ARGS into $O/logs/NAME.{jsonl,log},
#                   its last lines in the table
O=${OUT:-/tmp/ccfuse-out}
mkdir -p "$O/logs"
for gz in .carry/bin/*.gz; do [ -e "$gz" ] && gunzip -f "$gz"; done
source tools/gpu_env.sh
B=.carry/bin
table=()
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
left() { echo $(( ${CCFUSE_SESSION_BUDGET_S:-570} - SECONDS )); }
tests_line() { grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$1" | tr '\n' ' '; }
finish() {
  {
    echo "== $1 on $gpu, commit $(tr '\n' ' ' < .carry/commit), ${SECONDS} s"
    printf '%s\n' "${table[@]}"
  } | tee "$O/summary.txt"
  tar -czf "$O/logs.tar.gz" -C "$O" logs && rm -rf "$O/logs"
}
kgrouped_tests() {
  timeout 150 $B/ccfuse_gpu_tests --gtest_filter='*KGroupedGemm*:GemmValidation.*' > "$O/logs/kgrouped.log" 2>&1
  table+=("K-grouped + GemmValidation: rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$O/logs/kgrouped.log" | tr '\n' ' ')")
  while read -r l; do table+=("  $l"); done < <(grep -E '^\[  FAILED  \]|Failure$|error:' "$O/logs/kgrouped.log" | head -6 | cut -c1-200)
}
wgrad_bench() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 tools/torch_wgrad_bench.py --ccfuse-lib $B/libccfuse_c.so --json "$O/logs/$name.jsonl" "$@" \
    > "$O/logs/$name.log" 2>&1
  table+=("$name: rc=$?")
  while read -r l; do table+=("  $l"); done < <(cut -c1-250 "$O/logs/$name.log" | grep -v '^$' | tail -n 16)
}

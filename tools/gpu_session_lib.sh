# Sourced by the one-call GPU session scripts (tools/gpu_session_*.sh) after `cd` to the repo root:
# the carried binaries unpacked (.carry/bin/*.gz), tools/gpu_env.sh, $O (the device tool's $OUT,
# logs under $O/logs), $B (the binaries), $gpu (its name), table=() for the summary, and
#   left            seconds left of CCFUSE_SESSION_BUDGET_S (default 570) since the script started
#   tests_line LOG  gtest's PASSED / FAILED / SKIPPED lines of LOG on one line
#   finish NAME     the summary (NAME, GPU, carried commit, seconds, the table) to $O/summary.txt and
#                   stdout, the logs into $O/logs.tar.gz
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

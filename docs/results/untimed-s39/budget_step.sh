# Sourced by the run scripts of untimed-s39 to untimed-s42 (from the repository
# root).
#
# begin_run LIBDIR: the libraries in LIBDIR (relative to the root) for the binaries, budget from
# CALL_SECONDS (Default: 570), and the card and bundle/BUILD_INFO printed.
begin_run() {
  export LD_LIBRARY_PATH=$PWD/$1
  budget=${CALL_SECONDS:-570}
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
  cat bundle/BUILD_INFO 2>/dev/null
}

# unpack GZ EXE: the gzipped binary GZ as the executable EXE.
unpack() {
  gzip -dc "$1" >"$2" && chmod +x "$2"
}

# step NAME LIMIT COMMAND... runs COMMAND under `timeout`, its output in $OUT/NAME.log, the limit
# cut so that the script ends within `budget` seconds of its start (bash's SECONDS), and prints
# the exit status, the gtest and sanitizer summaries and the failed tests' names; skipped when
# under 20 s of the budget is left.
# REQUIRES: budget and OUT set.
step() {
  local name=$1 limit=$2 left=$((budget - SECONDS - 10))
  shift 2
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "$name: skipped ($left s left)"; return; fi
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "$name: rc=$? in $((SECONDS - start)) s (limit $limit); $(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \] [A-Za-z]" "$OUT/$name.log" | head -10
}

# sanitize TOOL[_TAG] LIMIT TESTS FILTER: step TOOL[_TAG] of compute-sanitizer's TOOL (memcheck,
# racecheck) over the GPU tests binary TESTS (scale 0.1), the tests the gtest FILTER names, exit
# status 1 on an error, 20 reports at the most.
sanitize() {
  step "$1" "$2" env KVTIER_GPU_TEST_SCALE=0.1 compute-sanitizer --tool "${1%%_*}" \
    --error-exitcode 1 --print-limit 20 "$3" --gtest_filter="$4"
}

# ab_step NAME DIR RESERVE FILTER SHAPE...: scripts/gpu_ab.sh over the builds in DIR at each
# SHAPE within what the budget leaves but RESERVE seconds (shapes not started 40 s before that
# are skipped), its output in $OUT/NAME.txt; prints the table's rows that match the extended
# regex FILTER and the shapes skipped or failed. gpu_ab.sh's AB_MAIN, BUILDS and ROUNDS pass
# through from the caller's environment.
ab_step() {
  local name=$1 dir=$2 reserve=$3 filter=$4
  shift 4
  local left=$((budget - SECONDS - reserve))
  echo "A/B: ${left} s left"
  AB_NAME=$name AB_DEADLINE=$((left - 40)) timeout "$left" bash scripts/gpu_ab.sh "$dir" "$@" \
    >"$OUT/$name.txt" 2>&1
  echo "ab rc=$?"
  sed -n '/^row/,/^mean SM/p' "$OUT/$name.txt" | grep -E "^row|$filter"
  grep -E "skipped|failed" "$OUT/$name.txt"
}

# pack_logs TGZ: the steps' logs under $OUT into one archive (the device tool returns at most
# 8 files a call), then lists $OUT.
pack_logs() {
  local logs
  logs=$(cd "$OUT" && ls ./*.log 2>/dev/null)
  [ -n "$logs" ] && (cd "$OUT" && tar czf "$1" $logs && rm -f $logs)
  ls "$OUT"
}

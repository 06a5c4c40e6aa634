# Sourced by this folder's run scripts: step NAME LIMIT COMMAND... runs COMMAND under `timeout`,
# its output in $OUT/NAME.log, the limit cut so that the script ends within `budget` seconds of
# its start (bash's SECONDS), and prints the exit status, the gtest and sanitizer summaries and
# the failed tests' names; skipped when under 20 s of the budget is left.
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

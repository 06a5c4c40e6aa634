#!/usr/bin/env bash
# The kvtier tool's refusals of bad arguments, before any long work: exit 2 with a message, and
# nothing written; and its outputs as asked (the JSON well-formed, a full disk an error).
# Usage: tool_arguments_test.sh <path to the kvtier tool>.
set -uo pipefail
tool=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect CODE PATTERN ARGS...: the tool exits CODE within 20 s and its output matches PATTERN.
expect() {
  local code=$1 pattern=$2
  shift 2
  local out
  out=$(timeout 20 "$tool" "$@" 2>&1)
  local got=$?
  [ "$got" = "$code" ] || fail "kvtier $* exited $got, not $code: $out"
  grep -qE -- "$pattern" <<<"$out" || fail "kvtier $* printed no line matching '$pattern': $out"
}
quick=(--steps 10 --budget-mib 16 --no-progress)
expect 2 "cannot write /nonexistent/x.json: its folder does not exist" \
  simulate --json /nonexistent/x.json
expect 2 "cannot write /nonexistent/p.svg" simulate --plot /nonexistent/p.svg
expect 2 "cannot write \.: it is a folder" simulate --json .
expect 2 "for one instance" simulate --instances 2 --json x.json
expect 2 "for one instance" simulate --instances 2 --plot p.svg
expect 2 "for one instance" simulate --instances 2 --host-tier-mib 64
expect 2 "name the same file" simulate --plot same.out --json same.out
# Budgets past the cache's block limits: refused before the first run (the host tier's after
# both runs and the report, exit 1, the files asked for never written).
expect 2 "host_tier_bytes" simulate --host-tier-mib 1048576 --json h.json
expect 2 "memory_budget_bytes" simulate --budget-mib 1048576
expect 2 "--remote: .*redis://" simulate --instances 2 --remote localhost:6379
expect 2 "--remote-timeout-ms needs --remote" simulate --remote-timeout-ms 5
expect 2 "--linger needs --metrics-port" simulate --linger 5
expect 2 "cannot write /nonexistent/r.json" recall --json /nonexistent/r.json
expect 2 "cannot write /proc/kvtier-plots" recall --plots /proc/kvtier-plots
expect 2 "the smallest context must hold" recall --contexts 64 --plots refused-plots
expect 0 "usage: kvtier demo" demo --help
expect 2 "unknown option '--json'" formats --json x
[ -z "$(ls -A)" ] || fail "refused calls wrote: $(ls -A)"
# The default command's options without its name; a full disk is an error after the run.
expect 0 "json: s.json" "${quick[@]}" --plot '' --json s.json
python3 -m json.tool s.json >/dev/null || fail "s.json is not JSON"
if [ -w /dev/full ]; then
  expect 1 "cannot write /dev/full" simulate "${quick[@]}" --plot '' --json /dev/full
fi
# A policy name that JSON must escape.
cat >policy.json <<'JSON'
{"name": "say \"hi\" \\ back",
 "tiers": [{"format": "fp16", "max_age_tokens": 256}, {"format": "fp8_e4m3/block_head"}]}
JSON
expect 0 "json: q.json" simulate "${quick[@]}" --plot '' --policy policy.json --json q.json
python3 -c 'import json, sys; assert json.load(open("q.json"))["policy"] == "say \"hi\" \\ back"' ||
  fail "q.json does not hold the policy's name: $(head -c 200 q.json)"
# A budget smaller than some requests alone: those are turned away, the others complete (they
# were preempted and readmitted at every step, blocking the queue; and the gain over an FP16
# run that held nothing read 0.00x).
expect 0 "rejected requests" simulate --steps 1000 --budget-mib 16 --no-progress --plot '' \
  --json small.json
python3 -c '
import json; r = json.load(open("small.json"))
assert r["rejected_requests"] > 0 and r["completed_requests"] > 0, r
g = r["capacity_gain_vs_fp16"]
assert g is None or g > 0, r' || fail "small.json: $(head -c 600 small.json)"
[ "$failures" = 0 ] && echo "tool arguments: OK"
exit $((failures > 0))

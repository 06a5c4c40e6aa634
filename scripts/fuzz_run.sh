#!/usr/bin/env bash
# Runs the fuzz bundle of scripts/fuzz_bundle.sh on every core: one libFuzzer job per core for
# SECONDS (default 480), each counting its API calls (KVTIER_FUZZ_COUNT). Writes summary.txt (API
# calls and runs, summed over the jobs), any crash input and the jobs' logs in one archive
# (fuzz-logs.tar.gz: a device tool returns a limited number of files) under $OUT. A job stopped
# by the 30 s grace (SIGINT) prints no count: summary.txt says how many did.
#   scripts/fuzz_run.sh [SECONDS] [JOBS]
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-480}
jobs=${2:-$(nproc)}
out=${OUT:-$PWD/fuzz-out}
mkdir -p "$out"
corpus=$(mktemp -d)  # new inputs: not brought back (a device tool returns a limited file count)
bundle=$PWD/fuzz-bundle
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
logs=$(mktemp -d)
cd "$logs"
# A job finishes the input it is in when its time is up: stop everything 30 s later at most.
KVTIER_FUZZ_COUNT=1 timeout -s INT $((seconds + 30)) "$bundle/kvtier_cache_fuzzer" \
  -jobs="$jobs" -workers="$jobs" -max_total_time="$seconds" -rss_limit_mb=4096 \
  -report_slow_units=100000 -print_final_stats=1 -artifact_prefix="$logs/" \
  "$corpus" "$bundle/corpus" >fuzz.log 2>&1
rc=$?
calls=$(grep -h "kvtier fuzz: .* API calls" fuzz-*.log | awk '{s += $3} END {print s + 0}')
runs=$(grep -h "stat::number_of_executed_units" fuzz-*.log | awk '{s += $2} END {print s + 0}')
crashes=0
for f in crash-* leak-* timeout-* oom-*; do  # slow-unit reports stay behind
  [ -e "$f" ] && cp "$f" "$out/" && crashes=$((crashes + 1))
done
tar -czf "$out/fuzz-logs.tar.gz" fuzz*.log
{
  cat "$bundle/BUILD_INFO"
  echo "ran $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nproc) cores: $jobs jobs x $seconds s, rc=$rc"
  echo "jobs that reported a count: $(grep -l "kvtier fuzz: .* API calls" fuzz-*.log | wc -l)"
  echo "API calls: $calls"
  echo "inputs run: $runs"
  echo "crash/leak/timeout/oom inputs: $crashes"
} | tee "$out/summary.txt"
rm -rf "$corpus" "$logs"
[ "$rc" = 0 ] && [ "$crashes" = 0 ]

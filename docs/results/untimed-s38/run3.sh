#!/usr/bin/env bash
# Session 38, call 3 (carry bundle/lib, variants/s38w, variants/s38t): the merge without
# barriers (docs/results/untimed-s37/warp_merge.diff) alone, since run 2 showed the prefetch
# slower at batch 1 x 8K and 32K. On an H200 first main's full decode bench (the a_head build of
# variants/s38w is main's bench), the issue's figures; then on either card the decode tests with
# warp_merge (scale 0.25), memcheck of the merge and split tests, and main against warp_merge in
# turns at every shape the merge serves (batch 1) and two that must not move, its shapes cut
# short so that the whole script ends within CALL_SECONDS (Default: 570).
set -u
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/bundle/lib
main_bench=$(ls variants/s38w/a_head_*.gz)
echo "main's bench: $main_bench"
case "$gpu" in
  *H200*)
    gzip -dc "$main_bench" >/tmp/main_bench && chmod +x /tmp/main_bench
    timeout ${FULL_TIMEOUT:-200} /tmp/main_bench "$OUT/decode_full.json" --decode-only \
      >"$OUT/decode_full.log" 2>&1
    echo "full bench rc=$?"
    grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" \
      "$OUT/decode_full.log" ;;
esac
t=/tmp/kvtier_gpu_tests
gzip -dc variants/s38t/kvtier_gpu_tests.gz >$t && chmod +x $t
KVTIER_GPU_TEST_SCALE=0.25 timeout ${TEST_TIMEOUT:-150} $t --gtest_filter='DecodeAttentionTest.*' \
  >"$OUT/tests.log" 2>&1
echo "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|^\[==========\]" "$OUT/tests.log" | tail -6
d=DecodeAttentionTest
KVTIER_GPU_TEST_SCALE=0.1 timeout ${MEMCHECK_TIMEOUT:-90} compute-sanitizer --tool memcheck --error-exitcode 1 \
  --print-limit 20 $t --gtest_filter="$d.MergeKernel*:$d.PageWeightsSplitKv:$d.MostlyFp16*" \
  >"$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/memcheck.log" | tail -4
left=$(( ${CALL_SECONDS:-570} - SECONDS ))  # what the device call has left for the A/B
echo "A/B: ${left} s left"
ROUNDS=${ROUNDS:-3} AB_NAME=ab_s38 AB_DEADLINE=$((left - 60)) timeout $left \
  bash scripts/gpu_ab.sh variants/s38w \
  "fp16 1 8192" "nvfp4_block_head 1 8192" "fp8_e4m3_block_head 1 8192" "balanced_mix 1 8192" \
  "nvfp4_block_head 1 1024" "fp16 1 1024" "nvfp4_block_head 1 131072" \
  "fp8_e4m3_block_head 1 131072" "nvfp4_block_head 1 32768" "balanced_mix 64 32768" \
  "nvfp4_block_head 256 32768" >"$OUT/ab_s38.txt" 2>&1
echo "ab rc=$?"
sed -n '/^row/,/^mean SM/p' "$OUT/ab_s38.txt"
grep -E "skipped" "$OUT/ab_s38.txt"
tar czf "$OUT/test_logs.tgz" -C "$OUT" tests.log memcheck.log && rm "$OUT/tests.log" "$OUT/memcheck.log"
ls "$OUT"

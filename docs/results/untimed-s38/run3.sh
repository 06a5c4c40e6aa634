#!/usr/bin/env bash
# Session 38, call 3 (carry bundle/lib, variants/s38w, variants/s38t): two changes to the batch-1
# step, timed against main in turns: the merge without barriers alone
# (docs/results/untimed-s37/warp_merge.diff; run 2 showed the prefetch beside it slower), and
# splits by cost in mixed palettes (split_balance.diff). variants/s38w holds main's bench
# (a_head), warp_merge and split_balance; variants/s38t the GPU tests with both diffs. On an H200
# first main's full decode bench, the issue's figures (FULL_BENCH=0 skips it); then on either card
# the decode tests (scale TEST_SCALE, Default: 0.25), memcheck of the merge, split and
# mixed-palette tests, racecheck of the long split test, and the A/B, its shapes cut short so
# that the whole script ends within CALL_SECONDS (Default: 570).
set -u
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/bundle/lib
main_bench=$(ls variants/s38w/a_head_*.gz)
echo "main's bench: $main_bench"
case "${FULL_BENCH:-1} $gpu" in
  1*H200*)
    gzip -dc "$main_bench" >/tmp/main_bench && chmod +x /tmp/main_bench
    timeout ${FULL_TIMEOUT:-200} /tmp/main_bench "$OUT/decode_full.json" --decode-only \
      >"$OUT/decode_full.log" 2>&1
    echo "full bench rc=$?"
    grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" \
      "$OUT/decode_full.log" ;;
esac
t=/tmp/kvtier_gpu_tests
gzip -dc variants/s38t/kvtier_gpu_tests.gz >$t && chmod +x $t
KVTIER_GPU_TEST_SCALE=${TEST_SCALE:-0.25} timeout ${TEST_TIMEOUT:-150} $t --gtest_filter='DecodeAttentionTest.*' \
  >"$OUT/tests.log" 2>&1
echo "tests rc=$?"
grep -E "^\[  PASSED|^\[  FAILED|^\[==========\]" "$OUT/tests.log" | tail -6
d=DecodeAttentionTest
KVTIER_GPU_TEST_SCALE=0.1 timeout ${MEMCHECK_TIMEOUT:-90} compute-sanitizer --tool memcheck --error-exitcode 1 \
  --print-limit 20 $t \
  --gtest_filter="$d.MergeKernel*:$d.PageWeightsSplitKv:$d.MostlyFp16*:$d.LongContextSplitKv:$d.Fp16Tails*" \
  >"$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"
grep -E "ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/memcheck.log" | tail -4
KVTIER_GPU_TEST_SCALE=0.1 timeout ${RACECHECK_TIMEOUT:-90} compute-sanitizer --tool racecheck \
  --error-exitcode 1 --print-limit 20 $t --gtest_filter="$d.LongContextSplitKv" \
  >"$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|^\[  PASSED|^\[  FAILED" "$OUT/racecheck.log" | tail -4
left=$(( ${CALL_SECONDS:-570} - SECONDS ))  # what the device call has left for the A/B
echo "A/B: ${left} s left"
ROUNDS=${ROUNDS:-2} AB_NAME=ab_s38 AB_DEADLINE=$((left - 60)) timeout $left \
  bash scripts/gpu_ab.sh variants/s38w \
  "balanced_mix 1 8192" "fp16_tail_nvfp4 1 8192" "fp8_e4m3_block_head 1 8192" \
  "balanced_mix 1 131072" "fp16_tail_fp8 1 8192" "nvfp4_block_head 1 8192" \
  "balanced_mix 1 32768" "balanced_mix 64 32768" "nvfp4_block_head 1 131072" \
  "fp16_in_mix_palette 1 8192" "fp16 1 8192" "nvfp4_block_head 1 1024" "balanced_mix 1 1024" >"$OUT/ab_s38.txt" 2>&1
echo "ab rc=$?"
sed -n '/^row/,/^mean SM/p' "$OUT/ab_s38.txt"
grep -E "skipped" "$OUT/ab_s38.txt"
tar czf "$OUT/test_logs.tgz" -C "$OUT" tests.log memcheck.log racecheck.log &&
  rm "$OUT/tests.log" "$OUT/memcheck.log" "$OUT/racecheck.log"
ls "$OUT"

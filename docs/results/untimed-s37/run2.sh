#!/usr/bin/env bash
# Session 37, call 2 (carry bundle/lib, variants/s37m, variants/s37t): the GPU tests of main
# with merge_prefetch.diff applied (the decode tests at scale 0.25, the new many-part merge test
# among them), memcheck of the merge and split tests, then the three builds of variants/s37m
# (main's device code, prefetch, merge_prefetch; warp_merge alone would take the call over the
# tool's 64 MiB) in turns at every shape the two changes touch.
set -u
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
export LD_LIBRARY_PATH=$PWD/bundle/lib
t=/tmp/kvtier_gpu_tests
gzip -dc variants/s37t/kvtier_gpu_tests.gz >$t && chmod +x $t
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
ROUNDS=${ROUNDS:-3} AB_NAME=ab_s37 AB_DEADLINE=${AB_DEADLINE:-120} timeout ${AB_TIMEOUT:-200} \
  bash scripts/gpu_ab.sh variants/s37m \
  "fp16 1 8192" "nvfp4_block_head 1 8192" "nvfp4_block_head 64 32768" \
  "nvfp4_block_head 1 131072" "fp8_e4m3_block_head 1 8192" "balanced_mix 1 8192" \
  "nvfp4_block_head 256 32768" "nvfp4_block_head 1 1024" "fp16 1 1024" "nvfp4_block_head 8 32768" \
  "fp16 64 32768" "fp16 1 131072" "balanced_mix 64 32768" "fp8_e4m3_block_head 1 131072" \
  "nvfp4_block_head 1 32768" "fp16 8 32768" "fp8_e4m3_block_head 256 32768" >"$OUT/ab_s37.txt" 2>&1
echo "ab rc=$?"
sed -n '/^row/,/^mean SM/p' "$OUT/ab_s37.txt"
grep -E "skipped" "$OUT/ab_s37.txt"
tar czf "$OUT/test_logs.tgz" -C "$OUT" tests.log memcheck.log && rm "$OUT/tests.log" "$OUT/memcheck.log"
ls "$OUT"

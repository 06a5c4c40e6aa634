#!/usr/bin/env bash
# vector_query.diff on a GPU (carry bundle/lib, bundle/kvtier_gpu_bench, bundle/BUILD_INFO,
# variants/s41, variants/s41t), within CALL_SECONDS (Default: 570): the variant's decode tests
# (scale 0.1; MisalignedQueriesAttendAsAligned among them), memcheck and racecheck of the tests
# that load queries through each path (misaligned, rotated into shared memory, the palettes'
# kernels), then main (bundle/kvtier_gpu_bench, a_main) and the variant in turns, 3 rounds.
# Builds (from main with the diff applied): kvtier_gpu_bench into variants/s41/vector_query.gz
# and kvtier_gpu_tests into variants/s41t/kvtier_gpu_tests.gz (README.md).
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run bundle/lib
d=DecodeAttentionTest
t=/tmp/kvtier_gpu_tests
unpack variants/s41t/kvtier_gpu_tests.gz $t
step tests 120 env KVTIER_GPU_TEST_SCALE=0.1 $t --gtest_filter="$d.*"
sanitize memcheck 70 $t "$d.Misaligned*:$d.RotatedKeys:$d.EveryFormatMix*:$d.LongContextSplitKv"
sanitize racecheck 60 $t "$d.Misaligned*:$d.RotatedKeys"
AB_MAIN=1 ab_step ab_vq variants/s41 0 "_graph|_b(8|64)_ctx32k  " \
  "nvfp4_block_head 1 8192" "fp16_tail_nvfp4 1 8192" "balanced_mix 1 8192" \
  "fp8_e4m3_block_head 1 8192" "fp16_tail_fp8 1 8192" "fp16 1 8192" \
  "nvfp4_block_head 1 1024" "balanced_mix 1 1024" "nvfp4_block_head 1 131072" \
  "balanced_mix 1 131072" "nvfp4_block_head 8 32768" "nvfp4_block_head 64 32768" \
  "balanced_mix 64 32768" "fp16_tail_nvfp4 64 32768"
pack_logs logs.tgz

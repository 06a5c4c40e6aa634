#!/usr/bin/env bash
# spread_query.diff and staged_query.diff on a GPU, within CALL_SECONDS (Default: 570). Carry
# variants/s40lib (bundle/lib without libkvtier.so, which the static binaries do not load),
# bundle/kvtier_gpu_bench, bundle/BUILD_INFO, variants/s41 (the two benches), variants/s41u and
# variants/s41v (their GPU tests): each variant's decode tests (scale 0.1), memcheck and
# racecheck of their query paths, then main and both variants in turns, 3 rounds.
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run variants/s40lib
d=DecodeAttentionTest
for v in u v; do unpack variants/s41$v/kvtier_gpu_tests.gz /tmp/tests_$v; done
step tests_spread 100 env KVTIER_GPU_TEST_SCALE=0.1 /tmp/tests_u --gtest_filter="$d.*"
step tests_staged 100 env KVTIER_GPU_TEST_SCALE=0.1 /tmp/tests_v --gtest_filter="$d.*"
for v in u v; do
  sanitize memcheck_$v 70 /tmp/tests_$v \
    "$d.Misaligned*:$d.RotatedKeys:$d.EveryFormatMix*:$d.LongContextSplitKv"
  sanitize racecheck_$v 60 /tmp/tests_$v "$d.Misaligned*:$d.RotatedKeys"
done
AB_MAIN=1 ab_step ab_s41 variants/s41 0 "_graph|_b(8|64)_ctx32k  " \
  "nvfp4_block_head 1 8192" "fp16_tail_nvfp4 1 8192" "balanced_mix 1 8192" \
  "fp8_e4m3_block_head 1 8192" "fp16_tail_fp8 1 8192" "fp16 1 8192" \
  "nvfp4_block_head 1 1024" "balanced_mix 1 1024" "nvfp4_block_head 1 131072" \
  "balanced_mix 1 131072" "nvfp4_block_head 8 32768" "nvfp4_block_head 64 32768" \
  "balanced_mix 64 32768" "fp16_tail_nvfp4 64 32768"
pack_logs logs.tgz

#!/usr/bin/env bash
# Session 43, for the next GPU session: query_first.diff (the queries' reads issued before the
# first pages' copies) on whatever card comes, within CALL_SECONDS (Default: 570). Carry
# variants/s40lib (bundle/lib without libkvtier.so*), bundle/BUILD_INFO, variants/s44
# (a_main.gz: main's bench, c7a636d's device code; query_first.gz) and variants/s44t
# (query_first.gz: its GPU tests): its GPU tests (scale 0.1), memcheck of the rotated,
# misaligned, split, page-weight and mixed-palette tests, racecheck of the rotated, misaligned and
# split ones, then main and the variant in turns, 3 rounds, at the batch-1 shapes it is for and
# the batches 8 and 64 it must not slow.
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run variants/s40lib
d=DecodeAttentionTest
t=/tmp/kvtier_gpu_tests
unpack variants/s44t/query_first.gz $t
step tests 150 env KVTIER_GPU_TEST_SCALE=0.1 $t
sanitize memcheck 90 $t \
  "$d.RotatedKeys:$d.Misaligned*:$d.LongContextSplitKv:$d.PageWeightsSplitKv:$d.MostlyFp16*:$d.Fp16Tails*"
sanitize racecheck 60 $t "$d.RotatedKeys:$d.Misaligned*:$d.LongContextSplitKv"
ab_step ab_s44 variants/s44 0 "_graph|_b(8|64)_ctx32k(_page_weight)?  |_b1_ctx128k_back" \
  "nvfp4_block_head 1 8192" "fp16 1 8192" "balanced_mix 1 8192" "fp16_tail_nvfp4 1 8192" \
  "fp16_tail_fp8 1 8192" "fp8_e4m3_block_head 1 8192" "nvfp4_block_head 1 1024" \
  "nvfp4_block_head 1 131072" "nvfp4_block_head 8 32768" "nvfp4_block_head 64 32768" \
  "balanced_mix 64 32768"
pack_logs logs.tgz

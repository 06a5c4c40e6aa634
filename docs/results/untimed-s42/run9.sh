#!/usr/bin/env bash
# Session 42, call 9: the generic kernel's common page kinds compiled apart (hot_nvfp4.diff,
# hot_three.diff) on a GPU, within CALL_SECONDS (Default: 570). Carry variants/s40lib
# (bundle/lib without libkvtier.so*), bundle/BUILD_INFO, variants/s43 (a_main.gz: main's bench,
# c7a636d's device code; hot_nvfp4.gz, hot_three.gz) and variants/s43t (each variant's GPU tests):
# hot_three's GPU tests (scale 0.1), memcheck and racecheck of the mixed palettes, hot_nvfp4's
# decode tests, then the three builds in turns, 3 rounds, at the mixed palettes' batch-1 shapes
# and batch 8 and 64 x 32K (page weights included).
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run variants/s40lib
d=DecodeAttentionTest
t=/tmp/kvtier_gpu_tests
unpack variants/s43t/hot_three.gz $t
step tests 150 env KVTIER_GPU_TEST_SCALE=0.1 $t
sanitize memcheck 70 $t "$d.EveryFormatMix*:$d.MostlyFp16*:$d.Fp16Tails*:$d.PageWeights*"
sanitize racecheck 50 $t "$d.EveryFormatMix*"
unpack variants/s43t/hot_nvfp4.gz $t
step tests_nvfp4 60 env KVTIER_GPU_TEST_SCALE=0.1 $t --gtest_filter="$d.*"
ab_step ab_s43 variants/s43 0 "_graph|_b(8|64)_ctx32k(_page_weight)?  " \
  "fp16_tail_nvfp4 1 8192" "balanced_mix 1 8192" "fp16_tail_fp8 1 8192" \
  "balanced_mix 64 32768" "fp16_tail_nvfp4 64 32768" "balanced_mix 1 131072" \
  "fp16_tail_nvfp4 8 32768"
pack_logs logs.tgz

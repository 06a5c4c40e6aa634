#!/usr/bin/env bash
# staged_plain.diff on a GPU, within CALL_SECONDS (Default: 570). Carry variants/s40lib
# (bundle/lib without libkvtier.so*), bundle/kvtier_gpu_bench (main, session 41 or later),
# bundle/BUILD_INFO, variants/s42 (the variant's bench) and variants/s42t (its GPU tests): every
# GPU test (scale 0.1), memcheck and racecheck of the query paths, then main and the variant in
# turns, 3 rounds, at the batch-1 shapes and at batch 64 x 32K with page weights (where
# staged_query lost 2%).
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run variants/s40lib
d=DecodeAttentionTest
t=/tmp/kvtier_gpu_tests
unpack variants/s42t/kvtier_gpu_tests.gz $t
step tests 150 env KVTIER_GPU_TEST_SCALE=0.1 $t
sanitize memcheck 70 $t "$d.Misaligned*:$d.RotatedKeys:$d.EveryFormatMix*:$d.PageWeights*"
sanitize racecheck 60 $t "$d.Misaligned*:$d.RotatedKeys"
AB_MAIN=1 ab_step ab_s42 variants/s42 0 "_graph|_b(8|64)_ctx32k(_page_weight)?  " \
  "balanced_mix 1 8192" "fp16_tail_nvfp4 1 8192" "fp16_tail_fp8 1 8192" "fp16 1 8192" \
  "balanced_mix 64 32768" "balanced_mix 1 1024" "balanced_mix 1 131072" \
  "fp16_tail_nvfp4 64 32768" "nvfp4_block_head 1 8192"
pack_logs logs.tgz

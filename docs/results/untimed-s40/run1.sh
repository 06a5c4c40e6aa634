#!/usr/bin/env bash
# Session 40, a call for an H200 (carry bundle but its tier bench, variants/s40, and variants/s40t
# where the tree allows: the tool carries 64 MiB): on an H200,
# docs/results/untimed-s39/run1.sh (main's bench, tests, cuDNN beside kvtier, sanitizers); on
# another card, direct_prefetch.diff: its decode tests (scale 0.1) and memcheck of the
# mixed-palette tests from variants/s40t, then main's bench (bundle/kvtier_gpu_bench, a_main)
# and the variant's in turns at the shapes with directly read FP16 pages, within CALL_SECONDS
# (Default: 570).
# OTHER_CARD=none: nothing on another card.
set -u
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$gpu" in
  *H200*) exec bash docs/results/untimed-s39/run1.sh ;;
esac
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
[ "${OTHER_CARD:-ab}" = none ] && { echo "not an H200: nothing run"; exit 0; }
export LD_LIBRARY_PATH=$PWD/bundle/lib
budget=${CALL_SECONDS:-570}
source docs/results/untimed-s39/budget_step.sh
t=/tmp/kvtier_gpu_tests
d=DecodeAttentionTest
if [ -f variants/s40t/kvtier_gpu_tests.gz ]; then  # not carried with the whole bundle (64 MiB)
  unpack variants/s40t/kvtier_gpu_tests.gz $t
  step tests 120 env KVTIER_GPU_TEST_SCALE=0.1 $t --gtest_filter="$d.*"
  sanitize memcheck 70 $t "$d.MostlyFp16*:$d.Fp16Tails*:$d.EveryFormatMix*:$d.PageWeightsSplitKv"
fi
AB_MAIN=1 ab_step ab_s40 variants/s40 0 . \
  "fp16_tail_nvfp4 1 8192" "balanced_mix 1 8192" "fp16_tail_fp8 1 8192" \
  "nvfp4_block_head 1 8192" "fp16_tail_nvfp4 1 32768" "balanced_mix 1 131072" \
  "balanced_mix 64 32768" "fp16_tail_nvfp4 8 32768"
pack_logs test_logs.tgz

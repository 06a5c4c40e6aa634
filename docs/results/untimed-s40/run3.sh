#!/usr/bin/env bash
# Session 40, call 3 (carry variants/s40lib, variants/s40b, variants/s40t,
# bundle/kvtier_gpu_tests, bundle/BUILD_INFO; within the tool's 64 MiB): interleaved_splits.diff
# (split s of a sequence attends its pages s, s + num_splits, ...) beside main's device code,
# both benches with diagnostic_cases.diff's three more palettes (variants/s40b: diag = main's
# device code, interleave), within CALL_SECONDS (Default: 570).
# On an H200: main's full bench (diag --decode-only), main's decode tests and sanitizers
# (bundle/kvtier_gpu_tests), then the A/B. On another card: the A/B, ncu's warp states of the
# generic and the all-NVFP4 kernels at batch 1 x 8K, then the variant's decode tests, memcheck
# and racecheck of its split tests (variants/s40t).
set -u
cd "$(dirname "$0")/../../.."
[ -e bundle/lib ] || { mkdir -p bundle && ln -s ../variants/s40lib bundle/lib; }
export LD_LIBRARY_PATH=$PWD/bundle/lib
budget=${CALL_SECONDS:-570}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
source docs/results/untimed-s39/budget_step.sh
d=DecodeAttentionTest
b=/tmp/diag_bench
gzip -dc variants/s40b/diag.gz >$b && chmod +x $b
tests() {  # binary
  step tests 120 env KVTIER_GPU_TEST_SCALE=0.1 "$1" --gtest_filter="$d.*"
  sanitize memcheck 70 "$1" \
    "$d.MergeKernel*:$d.PageWeights*:$d.MostlyFp16*:$d.LongContextSplitKv:$d.Fp16Tails*:$d.EveryFormatMix*"
  sanitize racecheck 50 "$1" "$d.LongContextSplitKv:$d.PageWeightsSplitKv"
}
ab() {  # the A/B of main's device code (diag) and the variant (interleave), in turns
  local shapes=()
  for c in nvfp4_block_head nvfp4_two_formats nvfp4_in_tail_palette fp16_first_nvfp4 \
    fp16_tail_nvfp4 balanced_mix mix_without_fp16_pages fp16_tail_fp8 fp8_e4m3_block_head; do
    shapes+=("$c 1 8192")
  done
  shapes+=("fp16_tail_nvfp4 1 131072" "balanced_mix 1 131072" "nvfp4_block_head 1 131072"
    "fp16_tail_nvfp4 8 32768" "balanced_mix 64 32768")
  ab_step ab_s40 variants/s40b "$1" "_graph|_b(8|64)_ctx32k  " "${shapes[@]}"
}
# Where a batch-1 x 8K step's warps wait, generic kernel (FP16 + NVFP4 palette, every page
# NVFP4) against the all-NVFP4 one: ncu's warp states of one launch each, caches as the bench
# leaves them.
profile() {
  for c in nvfp4_in_tail_palette nvfp4_block_head; do
    step "ncu_$c" 35 ncu --clock-control none --cache-control none -k regex:PagedDecodeKernel \
      --launch-skip 40 -c 1 --section WarpStateStats --section SchedulerStats \
      --section InstructionStats --section LaunchStats --print-units base \
      $b /tmp/ncu.json --only $c 1 8192
    grep -E "Stall|Warp Cycles|Issued|Eligible|Active Warps|Registers|Block Size|Grid Size" \
      "$OUT/ncu_$c.log" | head -40
  done
}
case "$gpu" in
  *H200*)
    step bench 210 $b "$OUT/bench.json" --decode-only
    grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" \
      "$OUT/bench.log"
    tests bundle/kvtier_gpu_tests
    ab 0 ;;
  *)
    ab 110
    profile
    t=/tmp/kvtier_gpu_tests
    gzip -dc variants/s40t/kvtier_gpu_tests.gz >$t && chmod +x $t
    tests $t ;;
esac
pack_logs logs.tgz

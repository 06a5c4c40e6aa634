#!/usr/bin/env bash
# Session 40, call 3 (carry variants/s40lib, variants/s40b, variants/s40t,
# bundle/kvtier_gpu_tests, bundle/BUILD_INFO; within the tool's 64 MiB): interleaved_splits.diff
# (split s of a sequence attends its pages s, s + num_splits, ...) beside main's device code,
# both benches with diagnostic_cases.diff's three more palettes (variants/s40b: diag = main's
# device code, interleave), within CALL_SECONDS (Default: 570).
# On an H200: main's full bench (diag --decode-only), main's decode tests and sanitizers
# (bundle/kvtier_gpu_tests), then the A/B. On another card: the variant's decode tests,
# memcheck and racecheck of its split tests (variants/s40t), then the A/B.
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
  step memcheck 70 env KVTIER_GPU_TEST_SCALE=0.1 compute-sanitizer --tool memcheck \
    --error-exitcode 1 --print-limit 20 "$1" \
    --gtest_filter="$d.MergeKernel*:$d.PageWeights*:$d.MostlyFp16*:$d.LongContextSplitKv:$d.Fp16Tails*:$d.EveryFormatMix*"
  step racecheck 50 env KVTIER_GPU_TEST_SCALE=0.1 compute-sanitizer --tool racecheck \
    --error-exitcode 1 --print-limit 20 "$1" --gtest_filter="$d.LongContextSplitKv:$d.PageWeightsSplitKv"
}
case "$gpu" in
  *H200*)
    step bench 210 $b "$OUT/bench.json" --decode-only
    grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" \
      "$OUT/bench.log"
    tests bundle/kvtier_gpu_tests ;;
  *)
    t=/tmp/kvtier_gpu_tests
    gzip -dc variants/s40t/kvtier_gpu_tests.gz >$t && chmod +x $t
    tests $t ;;
esac
shapes=()
for ctx in 8192 32768 131072; do
  for c in nvfp4_block_head nvfp4_in_tail_palette fp16_first_nvfp4 fp16_tail_nvfp4 \
    balanced_mix mix_without_fp16_pages fp16_tail_fp8 fp8_e4m3_block_head fp16; do
    shapes+=("$c 1 $ctx")
  done
done
shapes+=("fp16_tail_nvfp4 8 32768" "balanced_mix 8 32768" "nvfp4_block_head 8 32768"
  "balanced_mix 64 32768" "nvfp4_block_head 64 32768")
left=$((budget - SECONDS))
echo "A/B: ${left} s left"
ROUNDS=${ROUNDS:-3} AB_NAME=ab_s40 AB_DEADLINE=$((left - 60)) timeout $left \
  bash scripts/gpu_ab.sh variants/s40b "${shapes[@]}" >"$OUT/ab_s40.txt" 2>&1
echo "ab rc=$?"
sed -n '/^row/,/^mean SM/p' "$OUT/ab_s40.txt" | grep -E "^row|_graph|_b(8|64)_ctx32k  "
grep -E "skipped|failed" "$OUT/ab_s40.txt"
logs=$(cd "$OUT" && ls ./*.log 2>/dev/null)
[ -n "$logs" ] && (cd "$OUT" && tar czf logs.tgz $logs && rm -f $logs)
ls "$OUT"

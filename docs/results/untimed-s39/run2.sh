#!/usr/bin/env bash
# Session 39, call 2 (carry bundle/lib, bundle/BUILD_INFO, variants/s39, variants/s39t): cluster_merge.diff on whatever card comes, within CALL_SECONDS (Default: 570).
# variants/s39t holds the GPU tests built with cluster_merge.diff; variants/s39 the benches of
# main (a_head), splits16 (its split rule alone) and cluster_merge. First the decode tests, the
# prepared-append tests (a captured step replayed) and the backend's (scale 0.1), memcheck and
# racecheck of the split tests, then the A/B of the batch-1 shapes in turns.
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run bundle/lib
t=/tmp/kvtier_gpu_tests
unpack variants/s39t/kvtier_gpu_tests.gz $t
d=DecodeAttentionTest
step tests 130 env KVTIER_GPU_TEST_SCALE=0.1 $t \
  --gtest_filter="$d.*:PreparedAppendGpuTest.*:CudaBackendTest.*"
sanitize memcheck 80 $t "$d.PageWeightsSplitKv:$d.MostlyFp16*:$d.Fp16Tails*:$d.EveryFormatMix*"
sanitize racecheck 60 $t "$d.PageWeightsSplitKv:$d.Fp16Tails*"
left=$((budget - SECONDS))
echo "A/B: ${left} s left"
AB_MAIN=0 ROUNDS=${ROUNDS:-3} AB_NAME=ab_s39 AB_DEADLINE=$((left - 50)) timeout $left \
  bash scripts/gpu_ab.sh variants/s39 \
  "nvfp4_block_head 1 8192" "fp8_e4m3_block_head 1 8192" "fp16 1 8192" "balanced_mix 1 8192" \
  "nvfp4_block_head 1 1024" "balanced_mix 1 16384" "fp16_tail_nvfp4 1 8192" \
  "nvfp4_block_head 8 8192" "fp16 1 1024" "nvfp4_block_head 8 32768" >"$OUT/ab_s39.txt" 2>&1
echo "ab rc=$?"
sed -n '/^row/,/^mean SM/p' "$OUT/ab_s39.txt"
grep -E "skipped" "$OUT/ab_s39.txt"
pack_logs test_logs.tgz

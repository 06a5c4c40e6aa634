#!/usr/bin/env bash
# Session 39, call 1 (carry bundle, built by scripts/gpu_bundle.sh from main): main's device code
# (in session 39 a0f1aab + session 37's barrier-free merge; session 41's query loads since) on
# whatever card comes, each step's timeout cut so that the whole script ends within CALL_SECONDS
# (Default: 570).
# On an H200: the full decode bench first (issue 15's figures; no H200 has timed the 8-warp
# kernels), then every GPU test (scale 0.1; the decode tests alone until session 41), then cuDNN
# SDPA beside kvtier at 32K from Python (no FlashInfer: no wheels to carry), then memcheck and
# racecheck of the merge, split, page-weight, mixed-palette and misaligned-query tests. On an
# H100: the tests and sanitizers first, then the bench (OTHER_CARD=peers: the bench and the
# peers, as after run 1, which ran the tests there; OTHER_CARD=none: nothing). H200_STEPS
# (Default: bench tests peers sanitizers) changes the H200's steps and their order.
set -u
cd "$(dirname "$0")/../../.."
source docs/results/untimed-s39/budget_step.sh
begin_run bundle/lib
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
d=DecodeAttentionTest
bench() {
  step bench 210 bundle/kvtier_gpu_bench "$OUT/bench.json" --decode-only
  grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" \
    "$OUT/bench.log"
}
tests() {
  step tests 150 env KVTIER_GPU_TEST_SCALE=0.1 bundle/kvtier_gpu_tests
}
sanitizers() {
  sanitize memcheck 90 bundle/kvtier_gpu_tests \
    "$d.MergeKernel*:$d.PageWeights*:$d.MostlyFp16*:$d.LongContextSplitKv:$d.Fp16Tails*:$d.Misaligned*"
  sanitize racecheck 60 bundle/kvtier_gpu_tests \
    "$d.LongContextSplitKv:$d.MergeKernel*:$d.Misaligned*"
}
peers() {
  OUT=/tmp/py step module 60 bash scripts/gpu_python.sh --module-only
  tail -3 /tmp/py/module.log 2>/dev/null
  local kernel=()
  [ -s "$OUT/bench.json" ] && kernel=(--kernel-json "$OUT/bench.json")
  PYTHONPATH=/tmp/kvpy step peers 120 python3 tests/bench/decode_bench.py \
    --out "$OUT/decode_bench_py.json" "${kernel[@]}" --batches 8,64,256 --contexts 32768 \
    --skip fi_fp16,fi_fp16_tc,fi_fp8,fi_fp8_tc,fi_nvfp4_tc
  [ -s "$OUT/decode_bench_py.json" ] && [ -s "$OUT/bench.json" ] &&
    python3 tests/bench/peers_table.py "$OUT/decode_bench_py.json" "$OUT/bench.json" \
      >"$OUT/peers_table.md" 2>&1 && cat "$OUT/peers_table.md"
}
mkdir -p /tmp/py
case "$gpu" in
  *H200*) for s in ${H200_STEPS:-bench tests peers sanitizers}; do $s; done ;;
  *) case "${OTHER_CARD:-all}" in
       peers) bench; peers ;;
       none) echo "not an H200: nothing run" ;;
       *) tests; sanitizers; bench ;;
     esac ;;
esac
pack_logs logs.tgz

#!/usr/bin/env bash
# Session 34, call 2: eight warps per decode block (bundle of 3685133 + w8): the GPU tests,
# the full decode bench, memcheck of the decode tests.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $name"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.25 timeout 200 bundle/kvtier_gpu_tests --gtest_brief=1 >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "FAILED|Failure|expected|Which is" $o/tests.log | head -20; tail -3 $o/tests.log
t0=$SECONDS
timeout 120 bundle/kvtier_gpu_bench $o/decode_full.json --decode-only >$o/decode_full.log 2>&1
echo "full bench rc=$? in $((SECONDS-t0)) s"
grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" $o/decode_full.log
t=DecodeAttentionTest
t0=$SECONDS
left=$((570-SECONDS)); [ $left -gt 120 ] && left=120
KVTIER_GPU_TEST_SCALE=0.1 timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormat*:$t.PageWeightsUnsplit:$t.Fp16Tails*" >$o/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/memcheck.log)"
ls -la $o

#!/usr/bin/env bash
# Session 32: the GPU tests of main on any GPU; on an H200 also the full decode bench (with its
# SM clock column), main against 44f9f77 on the target rows, and the decode sanitizers.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $name"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.25 timeout 180 bundle/kvtier_gpu_tests --gtest_brief=1 >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; tail -3 $o/tests.log
t=DecodeAttentionTest
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormat*:$t.PageWeightsUnsplit:$t.Fp16Tails*" >$o/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/memcheck.log)"
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 80 compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormat*" >$o/racecheck.log 2>&1
echo "racecheck rc=$? in $((SECONDS-t0)) s; $(grep 'RACECHECK SUMMARY' $o/racecheck.log)"
# (every GPU: the bench rows name the card)
t0=$SECONDS
timeout 100 bundle/kvtier_gpu_bench $o/decode_full.json --decode-only >$o/decode_full.log 2>&1
echo "full bench rc=$? in $((SECONDS-t0)) s"
grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" $o/decode_full.log
if [ $SECONDS -lt 380 ]; then
t0=$SECONDS
OUT=$o AB_MAIN=1 BUILDS=a_head_44f9f77 ROUNDS=3 AB_DEADLINE=120 timeout 160 bash scripts/gpu_ab.sh variants/s30 \
  'nvfp4_block_head 64 32768' 'nvfp4_block_head 256 32768' 'fp8_e4m3_block_head 1 131072' \
  'nvfp4_block_head 8 32768' 'nvfp4_block_head 1 131072' >$o/ab.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"; grep -v "^done" $o/ab.txt | grep -v "rotated\|page_weight" | head -30
fi
ls -la $o

#!/usr/bin/env bash
# Session 32, short: the decode and prepared-append GPU tests (every mixed-palette decode test
# reads by format at kByFormatMinPages = 0), memcheck and racecheck of the by-format grids, and
# main against by-format on three rows.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $name"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.25 timeout 120 bundle/kvtier_gpu_tests --gtest_brief=1 \
  --gtest_filter='DecodeAttentionTest.*:PreparedAppendGpuTest.*' >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "FAILED|Failure|PASSED|tests ran" $o/tests.log | head -20
t=DecodeAttentionTest
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 45 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.Fp16Tails*" >$o/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/memcheck.log)"
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 40 compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.Fp16Tails*" >$o/racecheck.log 2>&1
echo "racecheck rc=$? in $((SECONDS-t0)) s; $(grep 'RACECHECK SUMMARY' $o/racecheck.log)"
t0=$SECONDS
OUT=$o ROUNDS=3 AB_DEADLINE=60 timeout 90 bash scripts/gpu_ab.sh variants/s32/ab \
  'fp16_tail_nvfp4 64 32768' 'fp16_tail_nvfp4 8 32768' 'fp16_tail_nvfp4 1 131072' >$o/ab.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"; grep -v "^done" $o/ab.txt | grep -v "rotated\|page_weight" | head -40
tar -C $OUT -czf $OUT/logs.tgz r; rm -rf $o

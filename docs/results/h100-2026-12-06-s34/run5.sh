#!/usr/bin/env bash
# Session 34, call 5: the warp count chosen per launch (c_chosen: bundle of 2a767ed + the
# change) against 4 warps always (a_w4) and 8 always (b_w8) over every decode row, in turns;
# then the GPU tests, memcheck and racecheck of the decode tests on the bundle.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
OUT=$o ROUNDS=3 timeout 230 bash scripts/gpu_ab.sh variants/s34ab decode >$o/ab_decode.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.25 timeout 150 bundle/kvtier_gpu_tests --gtest_brief=1 >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "Failure|expected|Which is|Expected" $o/tests.log | head -20; tail -3 $o/tests.log
t=DecodeAttentionTest
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormat*:$t.PageWeightsUnsplit:$t.Fp16Tails*" >$o/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/memcheck.log)"
t0=$SECONDS
left=$((580-SECONDS))
KVTIER_GPU_TEST_SCALE=0.1 timeout $left compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.Fp16TailsBesideOneSmallerKind:$t.PageWeightsUnsplit:$t.EveryFormatMixGroupAndRaggedLength" >$o/racecheck.log 2>&1
echo "racecheck rc=$? in $((SECONDS-t0)) s; $(grep 'RACECHECK SUMMARY' $o/racecheck.log)"; grep -E "^\[ +(OK|FAILED)" $o/racecheck.log
ls $o

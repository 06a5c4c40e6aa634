#!/usr/bin/env bash
# Session 34, call 3: eight warps (bundle of 3685133 + w8 + split test fix): the split test,
# racecheck of the decode tests.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $name"; cat bundle/BUILD_INFO
t=DecodeAttentionTest
bundle/kvtier_gpu_tests --gtest_brief=1 --gtest_filter="$t.SplitsFill*" >$o/split_test.log 2>&1
echo "split test rc=$?"; tail -2 $o/split_test.log
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 420 compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormatMixGroupAndRaggedLength:$t.Fp16TailsBesideOneSmallerKind:$t.PageWeightsUnsplit" >$o/racecheck.log 2>&1
echo "racecheck rc=$? in $((SECONDS-t0)) s; $(grep 'RACECHECK SUMMARY' $o/racecheck.log)"; grep -E "^\[ +(OK|FAILED)" $o/racecheck.log
t0=$SECONDS
left=$((575-SECONDS))
KVTIER_GPU_TEST_SCALE=0.1 timeout $left compute-sanitizer --tool synccheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormatMixGroupAndRaggedLength:$t.Fp16TailsBesideOneSmallerKind" >$o/synccheck.log 2>&1
echo "synccheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/synccheck.log)"
ls -la $o

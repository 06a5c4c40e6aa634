#!/usr/bin/env bash
# Session 36, call 2 (after run_h200.sh, same machine): main (a_head_1dc023a) against the two
# session-35 variants over every decode row, 3 rounds in turns; the GPU tests at scale 0.25;
# racecheck of three decode tests at scale 0.1.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
timeout 60 bundle/kvtier_gpu_tests --gtest_brief=1 --gtest_filter='*SplitsFillOneWave*' >$o/split_test.log 2>&1
echo "split test rc=$? in $((SECONDS-t0)) s"; tail -2 $o/split_test.log
t0=$SECONDS
OUT=$o ROUNDS=3 timeout 170 bash scripts/gpu_ab.sh variants/s35ab decode >$o/ab_decode.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"; grep -E "full:decode_(fp16|fp8|nvfp4_block_head|mix[a-z_]*)_b1_|ctx128k( |_back)" $o/ab_decode.txt | grep -v -E "rotated|page_weight" | head -40
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.25 timeout 170 bundle/kvtier_gpu_tests --gtest_brief=1 >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "Failure|expected|Which is|Expected" $o/tests.log | head -20; tail -3 $o/tests.log
t=DecodeAttentionTest
t0=$SECONDS
left=$((585-SECONDS))
KVTIER_GPU_TEST_SCALE=0.1 timeout $left compute-sanitizer --tool racecheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.Fp16TailsBesideOneSmallerKind:$t.PageWeightsUnsplit:$t.EveryFormatMixGroupAndRaggedLength" >$o/racecheck.log 2>&1
echo "racecheck rc=$? in $((SECONDS-t0)) s; $(grep 'RACECHECK SUMMARY' $o/racecheck.log)"; grep -E "^\[ +(OK|FAILED)" $o/racecheck.log
tar czf $OUT/r.tgz -C $OUT r && rm -rf $OUT/r; ls -l $OUT

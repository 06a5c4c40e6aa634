#!/usr/bin/env bash
# Session 35 on an H100 (no H200 came), in the device time left: the bundle of
# scripts/gpu_bundle.sh. The split test; every decode row in turns, 3 rounds: main (a_head_*), FP16 pages read directly
# (fp16_direct.diff), two waves for sequences of 4096 pages or more (two_waves_long.diff); Nsight
# Compute of the b1 x 8K step (FP16) and b1 x 128K NVFP4; the GPU tests; memcheck.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
bench=/tmp/bench && gzip -dc "$(ls variants/s35ab/a_head_*.gz | head -1)" >$bench && chmod +x $bench
t0=$SECONDS
timeout 60 bundle/kvtier_gpu_tests --gtest_brief=1 --gtest_filter='*SplitsFillOneWave*' >$o/split_test.log 2>&1
echo "split test rc=$? in $((SECONDS-t0)) s"; tail -2 $o/split_test.log
t0=$SECONDS
OUT=$o ROUNDS=3 timeout 170 bash scripts/gpu_ab.sh variants/s35ab decode >$o/ab_decode.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"; grep -E "full:fp16_b|ctx128k" $o/ab_decode.txt | grep -v -E "rotated|page_weight" | head -60
for shape in "fp16 1 8192" "nvfp4_block_head 1 131072"; do
  t0=$SECONDS; c=$(echo $shape | tr ' ' _)
  timeout 40 ncu --clock-control none --cache-control none --section SpeedOfLight --section LaunchStats \
    --section Occupancy --section WarpStateStats --kernel-name regex:'PagedDecode|MergeStates' \
    --launch-skip 20 --launch-count 4 $bench /tmp/p.json --only $shape >$o/ncu_$c.txt 2>&1
  echo "ncu $c rc=$? in $((SECONDS-t0)) s"; grep -E "^  [A-Za-z].*\(|Duration" $o/ncu_$c.txt | head -12
done
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.25 timeout 170 bundle/kvtier_gpu_tests --gtest_brief=1 >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "Failure|expected|Which is|Expected" $o/tests.log | head -20; tail -3 $o/tests.log
t=DecodeAttentionTest
t0=$SECONDS
KVTIER_GPU_TEST_SCALE=0.1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormat*:$t.PageWeightsUnsplit:$t.Fp16Tails*" >$o/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/memcheck.log)"
ls $o

#!/usr/bin/env bash
# Session 35, on an H200 in one call (bundle of b4ac64a, packed in variants/s35b to fit the
# 64 MiB the device tool carries): the split test, the full decode bench, the peers in one run
# (scripts/gpu_python.sh: the Python checks, kvtier_gpu_bench, decode_bench.py at batch 8, 64,
# 256 x 32K), memcheck of the decode tests, Nsight Compute of the FP16 batch-1 x 8K step.
set -u
cd "$(dirname "$0")/../.."
b=variants/s35b
mkdir -p bundle && tar xzf $b/lib.tgz -C bundle && tar xzf $b/inc.tgz -C bundle
gzip -dc $b/bench.gz >bundle/kvtier_gpu_bench && gzip -dc $b/tests.gz >bundle/kvtier_gpu_tests
chmod +x bundle/kvtier_gpu_bench bundle/kvtier_gpu_tests && cp $b/BUILD_INFO bundle/
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
timeout 60 bundle/kvtier_gpu_tests --gtest_brief=1 --gtest_filter='*SplitsFillOneWave*' >$o/split_test.log 2>&1
echo "split test rc=$? in $((SECONDS-t0)) s"; tail -2 $o/split_test.log
t0=$SECONDS
timeout 120 bundle/kvtier_gpu_bench $o/decode_full.json --decode-only >$o/decode_full.log 2>&1
echo "full bench rc=$? in $((SECONDS-t0)) s"
grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" $o/decode_full.log
t0=$SECONDS
OUT=$OUT/py VALIDATE_TIMEOUT=150 APPEND_TIMEOUT=60 CPP_BENCH_TIMEOUT=60 BENCH_TIMEOUT=150 \
  BENCH_ARGS="--batches 8,64,256 --contexts 32768" bash scripts/gpu_python.sh >$o/python.log 2>&1
echo "python rc=$? in $((SECONDS-t0)) s"; tail -12 $o/python.log; cat $OUT/py/peers_table.md 2>/dev/null | head -30
t=DecodeAttentionTest
t0=$SECONDS
left=$((560-SECONDS)); [ $left -gt 60 ] && left=60
KVTIER_GPU_TEST_SCALE=0.1 timeout $left compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter="$t.EveryFormat*:$t.PageWeightsUnsplit:$t.Fp16Tails*" >$o/memcheck.log 2>&1
echo "memcheck rc=$? in $((SECONDS-t0)) s; $(grep 'ERROR SUMMARY' $o/memcheck.log)"
t0=$SECONDS
left=$((590-SECONDS))
timeout $left ncu --clock-control none --cache-control none --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats --kernel-name regex:'PagedDecode|MergeStates' \
  --launch-skip 20 --launch-count 4 bundle/kvtier_gpu_bench /tmp/p.json --only fp16 1 8192 >$o/ncu_fp16_1_8192.txt 2>&1
echo "ncu rc=$? in $((SECONDS-t0)) s"; grep -E "^  [A-Za-z].*\(|Duration" $o/ncu_fp16_1_8192.txt | head -8
ls $o $OUT/py

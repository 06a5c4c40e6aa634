#!/usr/bin/env bash
# Session 34, call 6: 8 warps also for unsplit launches of at least 512 pages (d_long_unsplit:
# bundle of f27477f + the change) against f27477f, every decode row in turns; then the decode
# GPU tests of the bundle.
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; cat bundle/BUILD_INFO
t0=$SECONDS
OUT=$o ROUNDS=3 timeout 150 bash scripts/gpu_ab.sh variants/s34ab2 decode >$o/ab_decode.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"
t0=$SECONDS
left=$((280-SECONDS))
KVTIER_GPU_TEST_SCALE=0.25 timeout $left bundle/kvtier_gpu_tests --gtest_brief=1 --gtest_filter='DecodeAttentionTest.*' >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; grep -E "Failure|Expected|Which is" $o/tests.log | head -20; tail -3 $o/tests.log

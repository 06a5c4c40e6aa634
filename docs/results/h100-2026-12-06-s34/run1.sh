#!/usr/bin/env bash
# Session 34, call 1: eight warps (w8) against main's 4 warps on the issue-15 rows, on any GPU;
# on an H200 also the full decode bench and the GPU tests of main's bundle (1393eb2 = main's device code).
set -u
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=$PWD/bundle/lib
o=$OUT/r && mkdir -p $o
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $name"; cat bundle/BUILD_INFO
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv >$o/gpu.txt
t0=$SECONDS
OUT=$o ROUNDS=3 AB_DEADLINE=230 timeout 280 bash scripts/gpu_ab.sh variants/s33w8 \
  'nvfp4_block_head 1 8192' 'fp8_e4m3_block_head 1 8192' 'fp16 1 8192' 'balanced_mix 1 8192' \
  'nvfp4_block_head 1 131072' 'fp16 1 131072' 'nvfp4_block_head 8 32768' 'nvfp4_block_head 64 32768' \
  'balanced_mix 64 32768' 'fp16 64 32768' >$o/ab_w8.txt 2>&1
echo "ab rc=$? in $((SECONDS-t0)) s"; grep -v "^done" $o/ab_w8.txt | grep -v "rotated\|page_weight" | head -60
case "$name" in *H200*) ;; *) ls -la $o; exit 0;; esac
t0=$SECONDS
timeout 110 bundle/kvtier_gpu_bench $o/decode_full.json --decode-only >$o/decode_full.log 2>&1
echo "full bench rc=$? in $((SECONDS-t0)) s"
grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" $o/decode_full.log
t0=$SECONDS
left=$((560-SECONDS)); [ $left -gt 190 ] && left=190
KVTIER_GPU_TEST_SCALE=0.25 timeout $left bundle/kvtier_gpu_tests --gtest_brief=1 >$o/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-t0)) s"; tail -3 $o/tests.log
ls -la $o

#!/usr/bin/env bash
# Session 37, a device call (carry bundle/lib, bundle/kvtier_gpu_bench, bundle/BUILD_INFO,
# variants/s37; the wheels would take the call over the tool's 64 MiB). On an H200, first main's
# full decode bench (the issue's figures; the peers and Python checks need a call of their own,
# scripts/gpu_python.sh); then, on either card, the timeline variant against main (timeline.sh).
set -u
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $gpu"
cat bundle/BUILD_INFO
case "$gpu" in
  *H200*)
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
      --format=csv >"$OUT/gpu.txt"
    LD_LIBRARY_PATH=$PWD/bundle/lib timeout 200 bundle/kvtier_gpu_bench "$OUT/decode_full.json" \
      --decode-only >"$OUT/decode_full.log" 2>&1
    echo "full bench rc=$?"
    grep -E "read_4GiB|nvfp4_block_head_b(8|64|256)_ctx32k_splits[0-9]+( |_back)|_b1_ctx128k_splits[0-9]+_back_to_back|_b1_ctx8k_splits[0-9]+_graph" \
      "$OUT/decode_full.log" ;;
esac
bash docs/results/untimed-s37/timeline.sh

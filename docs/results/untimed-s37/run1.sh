#!/usr/bin/env bash
# Session 37, a device call (carry bundle/lib, bundle/include, bundle/kvtier_gpu_bench,
# bundle/BUILD_INFO, .whl, variants/s37). On an H200, what the issue needs from main
# (scripts/gpu_python.sh: the Python checks, the full bench, the peers), and nothing else (run2.sh
# follows). On an H100, the timeline variant against main's bench (timeline.sh).
set -u
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $gpu"
case "$gpu" in
  *H200*) BENCH_ARGS="--batches 8,64,256 --contexts 32768" timeout 560 bash scripts/gpu_python.sh
          echo "gpu_python rc=$?" ;;
  *) bash docs/results/untimed-s37/timeline.sh ;;
esac

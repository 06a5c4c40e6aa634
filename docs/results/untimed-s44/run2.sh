#!/usr/bin/env bash
# Session 44, for a short call (carry bundle/lib, bundle/include, bundle/BUILD_INFO,
# bundle/kvtier_gpu_bench, bundle/kvtier_gpu_tests): on any card the decode bench, then cuDNN
# beside kvtier at 32K (untimed-s39/run1.sh), then the GPU tests with what is left of
# CALL_SECONDS (Default: 570).
set -u
cd "$(dirname "$0")/../../.."
budget=${CALL_SECONDS:-570}
H200_STEPS="bench peers" OTHER_CARD=peers CALL_SECONDS=$((budget - 60)) \
  bash docs/results/untimed-s39/run1.sh
source docs/results/untimed-s39/budget_step.sh
step tests_after 150 env LD_LIBRARY_PATH=$PWD/bundle/lib KVTIER_GPU_TEST_SCALE=0.1 \
  bundle/kvtier_gpu_tests

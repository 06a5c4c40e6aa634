#!/usr/bin/env bash
# Installs what is missing, builds kvtier (Release) and runs the kvtier tool on the CPU backend.
# Arguments are passed to the tool; with none it runs `kvtier simulate` (about 15 s on 2 cores,
# once built): the balanced policy against all-FP16 on a long-context chat workload, with a report,
# kvtier_simulate.svg and kvtier_simulate.json in the current folder.
set -euo pipefail
here=$PWD  # the tool runs here, so that relative paths in its arguments mean what they say
cd "$(dirname "$0")/.."
root=$PWD
bash scripts/setup.sh
# The tool runs on the CPU backend; KVTIER_WITH_CUDA=ON in the environment builds the CUDA
# backend too (docs/gpu.md).
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_BUILD_TESTS=OFF \
  -DKVTIER_BUILD_BENCHMARKS=OFF -DKVTIER_WITH_CUDA="${KVTIER_WITH_CUDA:-OFF}" >/dev/null
cmake --build build-release -j "$(nproc)" --target kvtier_tool
if [ $# -eq 0 ]; then set -- simulate --json kvtier_simulate.json; fi
cd "$here"
exec "$root/build-release/kvtier" "$@"

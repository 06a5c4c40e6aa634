#!/usr/bin/env bash
# Profiles the fused decode kernel with Nsight Compute on a GPU machine, from the bundle of
# scripts/gpu_bundle.sh: one shape per format, the full section set, and the per-instruction
# (SASS) stall samples. Writes under $OUT (default ./gpu-out): <case>.txt (sections) and
# <case>_sass.csv (source page). Usage: scripts/gpu_profile.sh [BATCH CONTEXT] (default 64 8192)
#   run(command="bash scripts/gpu_profile.sh", carry=["bundle"])
# PROFILE_SKIP (default 5) picks the decode launch profiled. At batch 64 x 32K and batch 1 x 128K
# the bench times the variants in turns (plain, page weights, page weights zeroed, rotated,
# rotated with page weights: one launch of each per round, 3 warm-up rounds first), so
# PROFILE_SKIP=5 profiles the plain kernel, 6 the page-weight variant and 8 the rotated one.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
batch=${1:-64}
context=${2:-8192}
for case in ${PROFILE_CASES:-fp16 fp8_e4m3_block_head nvfp4_block_head}; do
  rep=/tmp/decode_$case
  timeout 240 ncu --clock-control none --set full --import-source yes \
    --kernel-name regex:PagedDecode --launch-skip "${PROFILE_SKIP:-5}" --launch-count 1 \
    -f -o "$rep" bundle/kvtier_gpu_bench /tmp/profile.json --only "$case" "$batch" "$context" \
    >"$out/${case}_run.log" 2>&1
  echo "$case: rc=$?"
  ncu -i "$rep.ncu-rep" --page details >"$out/$case.txt" 2>&1
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/${case}_sass.csv" 2>&1
done

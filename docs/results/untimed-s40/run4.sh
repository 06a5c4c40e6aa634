#!/usr/bin/env bash
# Session 40, call 4 (carry bundle/lib, bundle/kvtier_gpu_bench, bundle/BUILD_INFO): where the
# generic kernel's batch-1 x 8K step loses its 3.3 us against the all-NVFP4 kernel (run 3):
# ncu's full section set and per-instruction stall samples of one launch of each, main's
# device code (FP16 + NVFP4 palette: the generic kernel; all NVFP4: its own kernel).
set -u
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
PROFILE_CASES="fp16_tail_nvfp4 nvfp4_block_head" PROFILE_SKIP=5 timeout 130 \
  bash scripts/gpu_profile.sh 1 8192
for c in fp16_tail_nvfp4 nvfp4_block_head; do
  grep -E "Duration|Warp Cycles Per Issued|Issued Instructions  |Registers Per|Stall" "$OUT/$c.txt" | head -12
done
gzip -f "$OUT"/*_sass.csv
ls "$OUT"

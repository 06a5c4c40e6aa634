#!/usr/bin/env bash
# Session 37, the call after run1.sh on an H200 (carry bundle, variants/s37): main's decode
# tests, memcheck and racecheck (scripts/gpu_run.sh decode), then the timeline variant.
set -u
cd "$(dirname "$0")/../../.."
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p "$OUT/decode"
OUT=$OUT/decode timeout 330 bash scripts/gpu_run.sh decode >"$OUT/decode/gpu_run.log" 2>&1
echo "gpu_run decode rc=$?"
tail -25 "$OUT/decode/gpu_run.log"
cp "$OUT/decode/summary.txt" "$OUT/decode_summary.txt"
tar czf "$OUT/decode.tgz" -C "$OUT" decode && rm -r "$OUT/decode"
bash docs/results/untimed-s37/timeline.sh

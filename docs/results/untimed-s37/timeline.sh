#!/usr/bin/env bash
# The timeline variant (variants/s37/timeline.gz, built by scripts/build_variants.sh from
# timeline.diff) against main's bench (AB_MAIN=1) at batch 1, 2 rounds in turns; its
# timelines (KVTIER_TIMELINE_DIR) summarised by timeline_summary.py and packed.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p "$OUT/tl"
export KVTIER_TIMELINE_DIR=$OUT/tl
AB_MAIN=1 ROUNDS=2 AB_NAME=ab_timeline AB_DEADLINE=200 timeout 280 bash scripts/gpu_ab.sh \
  variants/s37 "fp16 1 1024" "fp16 1 8192" "nvfp4_block_head 1 1024" \
  "nvfp4_block_head 1 8192" "fp8_e4m3_block_head 1 8192" "balanced_mix 1 8192" \
  "nvfp4_block_head 1 32768" >"$OUT/ab_timeline.txt" 2>&1
echo "ab rc=$?"
tail -30 "$OUT/ab_timeline.txt"
python3 docs/results/untimed-s37/timeline_summary.py "$OUT"/tl/*.csv | tee "$OUT/timeline_summary.txt"
tar czf "$OUT/timelines.tgz" -C "$OUT" tl && rm -r "$OUT/tl"
ls "$OUT"

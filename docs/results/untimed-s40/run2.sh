#!/usr/bin/env bash
# Session 40, call 2 (carry bundle but its tier bench, variants/s40b): on an H200,
# docs/results/untimed-s39/run1.sh; on another card, diagnostic_cases.diff's bench (main's
# device code, three more palettes' cases) at batch 1 and 8, 3 rounds in turns: what the
# generic kernel costs over the all-NVFP4 one at batch 1 (all pages NVFP4 under an FP16 + NVFP4
# palette), and what directly read FP16 pages add (page 0 alone; page 0 and the last 16).
set -u
cd "$(dirname "$0")/../../.."
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$gpu" in
  *H200*) exec bash docs/results/untimed-s39/run1.sh ;;
esac
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
budget=${CALL_SECONDS:-570}
source docs/results/untimed-s39/budget_step.sh
shapes=()
for ctx in 8192 32768 131072; do
  for c in nvfp4_block_head nvfp4_in_tail_palette fp16_first_nvfp4 fp16_tail_nvfp4 \
    balanced_mix mix_without_fp16_pages; do
    shapes+=("$c 1 $ctx")
  done
done
shapes+=("nvfp4_in_tail_palette 8 32768" "fp16_tail_nvfp4 8 32768" "nvfp4_block_head 8 32768")
BUILDS=diag ab_step diag variants/s40b 0 "_graph|b8_ctx32k  |b8_ctx32k_back" "${shapes[@]}"

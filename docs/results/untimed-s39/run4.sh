#!/usr/bin/env bash
# Session 39, call 4 (carry bundle/lib, bundle/kvtier_gpu_bench, bundle/BUILD_INFO): main's NVFP4
# decode (e51dcc0, 8-warp blocks) at b8, b64 and b256 x 32K from memory and from L2
# (--shared-pages 512: the kernel's instruction issue alone, which session 30 found the H200's
# NVFP4 rows bound by, and an H100 reproduces), 3 rounds in turns; the medians estimate what an
# H200 would time, which none has run with 8 warps. On an H200 it runs run1.sh instead (carry
# the whole bundle then: run1.sh needs the tests).
set -u
cd "$(dirname "$0")/../../.."
case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
  *H200*) exec bash docs/results/untimed-s39/run1.sh ;;
esac
export LD_LIBRARY_PATH=$PWD/bundle/lib
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
cat bundle/BUILD_INFO
for round in 1 2 3; do
  for shape in "nvfp4_block_head 8 32768" "nvfp4_block_head 64 32768" "nvfp4_block_head 256 32768" \
               "fp8_e4m3_block_head 64 32768" "balanced_mix 64 32768"; do
    for pages in memory 512; do
      extra=()
      [ $pages = 512 ] && extra=(--shared-pages 512)
      # shellcheck disable=SC2086
      timeout 60 bundle/kvtier_gpu_bench "$OUT/r.json" --only $shape "${extra[@]}" 2>&1 |
        grep -E "^decode_" | sed "s/^/round $round $pages /"
    done
  done
done | tee "$OUT/l2_proxy.txt"
rm -f "$OUT/r.json"

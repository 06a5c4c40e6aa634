#!/usr/bin/env bash
# The recall sweep on the GPU (docs/recall.md, "The sweep on the GPU"): the arms and trials of the
# committed CPU sweep docs/recall/attentive/sweep.json (fp16 and the policy presets fp8,
# balanced, max_capacity and attentive; contexts 1K to 128K, 8 depths, 64 trials per cell,
# seed 1) with `kvtier recall --backend cuda` from recall-bundle/ (scripts/gpu_bundle.sh), then
# scripts/recall_compare.py against that JSON: exit status 0 when every (arm, context) agrees
# within the 95% intervals.
#
# One context per run of the tool, smallest first (--bisect-steps 0: the grid cells are the
# sweep's, the knee's bisection probes are not compared), so that a run cut by the time limit
# still returns every context it finished. Writes four files under $OUT (default ./gpu-out; the
# device tool returns 8 at most): sweep_cuda_json.tar.gz (sweep_cuda_<context>.json, one per
# context), sweep_cuda.md (the reports), recall.log (progress), compare.txt (the comparison
# table), and summary.txt (per-context times).
#   scripts/recall_gpu.sh                     # RECALL_SECONDS=N: the time limit (default 170)
#   RECALL_CONTEXTS="1k 16k 128k" scripts/recall_gpu.sh
# With the device tool: run(command="bash scripts/recall_gpu.sh", carry=["recall-bundle"]).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/recall-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
limit=${RECALL_SECONDS:-170}
contexts=${RECALL_CONTEXTS:-1k 2k 4k 8k 16k 32k 64k 128k}
cpu_json=docs/recall/attentive/sweep.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=$out/summary.txt
{
  cat recall-bundle/BUILD_INFO
  echo "run $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} >"$summary" 2>&1
jsons=()
for c in $contexts; do
  left=$((limit - SECONDS))
  if [ "$left" -le 5 ]; then
    echo "context $c: skipped, the time limit ($limit s) is reached" | tee -a "$summary"
    continue
  fi
  start=$SECONDS
  timeout "$left" recall-bundle/kvtier recall --backend cuda --arm fp16 --arm policy:fp8 \
    --arm policy:balanced --arm policy:max_capacity --arm policy:attentive --contexts "$c" \
    --bisect-steps 0 --json "$work/sweep_cuda_$c.json" >>"$out/sweep_cuda.md" 2>>"$out/recall.log"
  rc=$?
  echo "context $c: rc=$rc in $((SECONDS - start)) s" | tee -a "$summary"
  if [ "$rc" = 0 ]; then jsons+=("$work/sweep_cuda_$c.json"); else tail -n 5 "$out/recall.log"; fi
done
if [ "${#jsons[@]}" = 0 ]; then
  echo "no context finished" | tee -a "$summary"
  exit 1
fi
tar czf "$out/sweep_cuda_json.tar.gz" -C "$work" $(cd "$work" && ls sweep_cuda_*.json)
python3 scripts/recall_compare.py "$cpu_json" "${jsons[@]}" >"$out/compare.txt"
status=$?
cat "$out/compare.txt"
echo "recall_compare: exit $status (0: every (arm, context) agrees); ${#jsons[@]} of" \
  "$(echo $contexts | wc -w) contexts compared; $SECONDS s in all" | tee -a "$summary"
exit "$status"

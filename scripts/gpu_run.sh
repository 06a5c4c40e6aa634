#!/usr/bin/env bash
# Runs the GPU bundle made by scripts/gpu_bundle.sh on a GPU machine, in two parts that each fit
# the device tool's 10 minutes per command:
#   gpu_run.sh tests       1. all GPU tests, then parity and stress tests with the other
#                             migration kernel occupancies;
#                          2. the benchmarks (JSON), the host-tier bandwidth (tier_bench.json);
#   gpu_run.sh sanitizers  3. the GPU tests under compute-sanitizer --tool memcheck, then --tool
#                             racecheck (fewer steps, KVTIER_GPU_TEST_SCALE; the fast-codec
#                             self-check, run in 1, is skipped).
#   gpu_run.sh             both, one after the other (over 10 minutes: not for the device tool).
#   gpu_run.sh decode      after a change to the decode kernel alone (kernels/attention/), in
#                          about 4 minutes: its GPU tests (KVTIER_GPU_TEST_SCALE=0.25), the
#                          benchmarks (JSON), memcheck of the page-weight, rotated-key and
#                          staged-FP16 tests and racecheck of two page-weight tests and the
#                          staged-FP16 one (scale 0.1).
#   gpu_run.sh migration   after a change to the migration kernels alone (kernels/migrate.cu and
#                          the codecs they use), in about 2 minutes: the data-plane GPU tests (the
#                          fast-codec self-check, the parity of every palette pair with the CPU
#                          backend), the parity and stress tests at 2 to 5 blocks per SM, the
#                          data-plane benchmarks (JSON) and memcheck of the parity tests (scale
#                          0.2).
# Writes summary.txt, the benchmarks' JSON and the logs (logs-PART.tar.gz) under $OUT (default
# ./gpu-out) and prints a summary last.
# With the device tool: run(command="bash scripts/gpu_run.sh tests", carry=["bundle"]), then
# run(command="bash scripts/gpu_run.sh sanitizers", carry=["bundle"]).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
summary=$out/summary.txt
{
  cat bundle/BUILD_INFO
  echo "run $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  compute-sanitizer --version | tail -1
} >"$summary" 2>&1
part=${1:-all}
case "$part" in tests|sanitizers|decode|migration|all) ;;
  *) echo "usage: gpu_run.sh [tests|sanitizers|decode|migration]" >&2; exit 2 ;;
esac
status=0
step() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$name.log")" |
    tee -a "$summary"
  [ "$rc" = 0 ] || status=1
}
# The parity and stress tests again with the other migration kernel occupancies.
other_occupancies() {
  for blocks in 2 3 4 5; do
    step "tests_migrate$blocks" 40 env KVTIER_CUDA_MIGRATE=$blocks bundle/kvtier_gpu_tests \
      --gtest_filter='CudaParityTest.EveryPalette*:CudaStressTest.Tiny*'
  done
}
# The step limits of each part add up to under the device tool's 10 minutes per command.
if [ "$part" = tests ] || [ "$part" = all ]; then
step tests 420 bundle/kvtier_gpu_tests --gtest_output="json:$out/tests.json"
other_occupancies
step bench 60 bundle/kvtier_gpu_bench "$out/bench.json"
cat "$out/bench.log" >>"$summary"
# The same without programmatic dependent launches (kernels/dependent_launch.cuh), beside it.
step bench_pdl_off 60 env KVTIER_CUDA_PDL=off bundle/kvtier_gpu_bench "$out/bench_pdl_off.json"
cat "$out/bench_pdl_off.log" >>"$summary"
step tier_bench 30 bundle/kvtier_tier_bench "$out/tier_bench.json"
cat "$out/tier_bench.json" >>"$summary"
fi
if [ "$part" = decode ]; then
step tests 240 env KVTIER_GPU_TEST_SCALE=0.25 bundle/kvtier_gpu_tests \
  --gtest_filter='DecodeAttentionTest.*' --gtest_output="json:$out/tests.json"
step bench 60 bundle/kvtier_gpu_bench "$out/bench.json"
cat "$out/bench.log" >>"$summary"
# RotatedKeys and the third page-weight test under racecheck take over 100 s more at scale 0.1.
t=DecodeAttentionTest
step memcheck 120 env KVTIER_GPU_TEST_SCALE=0.1 compute-sanitizer --tool memcheck \
  --error-exitcode 1 --print-limit 20 bundle/kvtier_gpu_tests \
  --gtest_filter="$t.PageWeights*:$t.RotatedKeys:$t.MostlyFp16*"
step racecheck 150 env KVTIER_GPU_TEST_SCALE=0.1 compute-sanitizer --tool racecheck \
  --error-exitcode 1 --print-limit 20 bundle/kvtier_gpu_tests \
  --gtest_filter="$t.PageWeightsUnsplit:$t.PageWeightsSplitKv:$t.MostlyFp16*"
fi
if [ "$part" = migration ]; then
data_plane=CudaBackendTest.*:CudaParityTest.*:CudaStressTest.*:HostTierGpuTest.*
step tests 150 bundle/kvtier_gpu_tests --gtest_output="json:$out/tests.json" \
  --gtest_filter="$data_plane:PreparedAppendGpuTest.*"
other_occupancies
step bench 60 bundle/kvtier_gpu_bench "$out/bench.json" --data-plane-only
cat "$out/bench.log" >>"$summary"
step memcheck 120 env KVTIER_GPU_TEST_SCALE=0.2 compute-sanitizer --tool memcheck \
  --error-exitcode 1 --print-limit 20 bundle/kvtier_gpu_tests --gtest_filter='CudaParityTest.*'
fi
if [ "$part" = sanitizers ] || [ "$part" = all ]; then
export KVTIER_CUDA_FAST_CODEC=on KVTIER_GPU_TEST_SCALE=${KVTIER_GPU_TEST_SCALE:-0.2}
# The two largest decode tests add minutes under the sanitizers without new paths
# (EveryFormatMixGroupAndRaggedLength covers the staging ring, the splits and the merge); the
# out-of-memory test fills the device, which the sanitizers only slow down.
large=DecodeAttentionTest.LongContextSplitKv:DecodeAttentionTest.Batch256Ragged:CudaOomTest.*
step memcheck 240 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  bundle/kvtier_gpu_tests --gtest_filter=-$large
# Racecheck is the slowest tool: half the steps again.
step racecheck 300 env KVTIER_GPU_TEST_SCALE=0.1 compute-sanitizer --tool racecheck \
  --error-exitcode 1 --print-limit 20 bundle/kvtier_gpu_tests --gtest_filter=-$large
fi
echo "overall ($part): $([ $status = 0 ] && echo PASS || echo FAIL)" | tee -a "$summary"
[ -f "$out/tests.log" ] && grep -E "FAILED|Failure|error|ERROR" "$out/tests.log" | head -20
# The logs in one archive: a device tool brings back a limited number of files.
(cd "$out" && logs=$(ls ./*.log ./tests.json 2>/dev/null)
  [ -n "$logs" ] && tar -czf "logs-$part.tar.gz" $logs && rm -f $logs)
exit $status

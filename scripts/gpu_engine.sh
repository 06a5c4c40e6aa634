#!/usr/bin/env bash
# The engine example on the H200 (docs/engine.md), in one command of under 9 minutes:
#   1. compiles the kvtier Python module against bundle/ (scripts/gpu_python.sh --module-only;
#      the bundle comes from scripts/gpu_bundle.sh, run here first);
#   2. runs examples/engine/bench_engine.py on the CUDA backend: correctness against
#      transformers' generate(), decode speed against the contiguous FP16 SDPA loop, capacity
#      per palette; its JSON is written after each section, so a timeout keeps what finished;
#   3. prints the tables for docs/engine.md (bench_engine.py --tables); back on the workstation,
#      `bash scripts/engine_results.sh DIR NAME` files DIR (this $OUT) into docs/results/NAME/
#      and docs/engine.md's results.
# Everything goes under $OUT (default ./gpu-out): engine.json, engine.log, engine_tables.md,
# module/ (the module's build log).
# With the device tool:
#   run(command="bash scripts/gpu_engine.sh", kind="nvidia-h200",
#       carry=["bundle/lib", "bundle/include", "bundle/BUILD_INFO", ".whl"])
#   run(command="bash scripts/gpu_engine.sh --smoke", carry=["bundle"], kind="nvidia-h200")
# (.whl/: FlashInfer's wheels, `bash scripts/gpu_python.sh --fetch-wheels` here; without them
# the speed section has no FlashInfer rows.)
# Environment: ENGINE_TIMEOUT (seconds for step 2, default 540; --smoke 240), ENGINE_ARGS (more
# bench_engine.py arguments, e.g. "--layers 2" or "--sections speed").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
smoke=()
limit=${ENGINE_TIMEOUT:-540}
if [ "${1:-}" = "--smoke" ]; then
  smoke=(--smoke)
  limit=${ENGINE_TIMEOUT:-240}
fi
start=$SECONDS

# With .whl/ carried, FlashInfer too (the paged baseline of the speed section); its decode
# kernels compile (JIT, all cores) in the background while the correctness model trains.
module=--module-only
[ -d .whl ] && module=--module-and-wheels
OUT=$out/module bash scripts/gpu_python.sh $module || {
  echo "gpu_engine: the kvtier module did not build (see $out/module)"; exit 1; }
export PYTHONPATH=/tmp/kvpy:/tmp/site:$PWD/examples/engine${PYTHONPATH:+:$PYTHONPATH}
export FLASHINFER_WORKSPACE_BASE=/tmp/fi MAX_JOBS=$(nproc) FLASHINFER_CUDA_ARCH_LIST=9.0
export TVM_FFI_CACHE_DIR=/tmp/tvm-ffi
if [ $module = --module-and-wheels ]; then
  python3 -m kvtier_engine.flashinfer_kv >"$out/flashinfer_jit.log" 2>&1 &
fi
export LD_LIBRARY_PATH=$PWD/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -c "import torch, transformers as t; print('torch', torch.__version__,
  'transformers', t.__version__)" | tee "$out/versions.txt"

# bench_engine.py skips the speed and capacity cases it reaches after --time-limit seconds, so
# that it ends before `timeout` cuts it.
# shellcheck disable=SC2086  # ENGINE_ARGS is a list of arguments
timeout "$limit" python3 examples/engine/bench_engine.py "${smoke[@]}" --device cuda \
  --out "$out/engine.json" --time-limit $((limit - 90)) ${ENGINE_ARGS:-} 2>&1 |
  tee "$out/engine.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] &&
  echo "gpu_engine: bench_engine.py timed out after $limit s (engine.json: the sections done)"
if [ -s "$out/engine.json" ]; then
  python3 examples/engine/bench_engine.py --tables "$out/engine.json" | tee "$out/engine_tables.md"
fi
echo "gpu_engine: rc=$rc in $((SECONDS - start)) s; results in $out"
exit "$rc"

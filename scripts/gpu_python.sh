#!/usr/bin/env bash
# The Python side of the GPU runs, on the H200 (docs/gpu.md), in one go:
#   1. installs FlashInfer and the dependencies the H200 lacks from the wheels in .whl/ into
#      /tmp/site (no network there);
#   2. compiles the kvtier Python module for that machine's python3 with its g++ and pybind11,
#      against bundle/lib/libkvtier.so (made by scripts/gpu_bundle.sh, CUDA backend and adapters
#      inside) and the Abseil headers in bundle/include;
#   3. runs tests/gpu/python/validate_external.py (adapters vs FlashInfer and FlexAttention,
#      kvtier's fused kernel vs all of them), tests/gpu/python/prepared_append_cuda.py (the
#      prepared append from PyTorch, a CUDA graph replayed), tests/gpu/python/
#      write_kv_lifetime_cuda.py (write_kv holds its tensors until their copy is done),
#      tests/gpu/python/bindings_cuda.py (calibration and merge_states on CUDA),
#      kvtier_gpu_bench if the bundle has it (kvtier's kernel alone), then
#      tests/bench/decode_bench.py (decode side by side), each under `timeout`, JSON under $OUT
#      (default ./gpu-out), then the peers' table (tests/bench/peers_table.py); prints a summary
#      last (python_summary.txt) and packs the logs into logs-python.tar.gz.
# With the device tool:
#   run(command="bash scripts/gpu_python.sh", kind="nvidia-h200",
#       carry=["bundle/lib", "bundle/include", "bundle/kvtier_gpu_bench", "bundle/BUILD_INFO", ".whl"])
#   (the parts of bundle/ it reads: the whole bundle with the wheels exceeds the tool's 64 MiB)
# Here, with network, to (re)fetch the wheels (pinned versions, checked by SHA-256):
#   bash scripts/gpu_python.sh --fetch-wheels
# Only step 2 (the module into /tmp/kvpy, no wheels needed):
#   bash scripts/gpu_python.sh --module-only
# Steps 1 and 2 (used by scripts/gpu_engine.sh when .whl/ is carried, for FlashInfer):
#   bash scripts/gpu_python.sh --module-and-wheels
# Environment: VALIDATE_TIMEOUT, APPEND_TIMEOUT, CPP_BENCH_TIMEOUT, BENCH_TIMEOUT (seconds),
# KVTIER_CPP_BENCH=0 to skip kvtier_gpu_bench, BENCH_ARGS (extra decode_bench.py arguments).
# See tests/gpu/python/README.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# Wheels: what the H200 lacks to import and run flashinfer.BatchDecodeWithPagedKVCacheWrapper
# and flashinfer.merge_state (torch, triton, numpy, ninja, jinja2, filelock, requests, tqdm,
# packaging, nvidia-ml-py, typing-extensions, cuda-bindings are there).
WHEELS=(
  "flashinfer-python==0.6.18.post1 flashinfer_python-0.6.18.post1-py3-none-any.whl adb6d2952b47131138e108bd2999b1fe18b71f1a4c0b2684f168753db9563991"
  "apache-tvm-ffi==0.1.15.post2 apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl 059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b"
)

check_wheels() {
  local ok=0 spec file sum
  for w in "${WHEELS[@]}"; do
    read -r spec file sum <<<"$w"
    if [ ! -f ".whl/$file" ]; then
      echo "missing .whl/$file ($spec): run 'bash scripts/gpu_python.sh --fetch-wheels' here"
      ok=1
    elif [ "$(sha256sum ".whl/$file" | cut -d' ' -f1)" != "$sum" ]; then
      echo "SHA-256 mismatch: .whl/$file"
      ok=1
    fi
  done
  return $ok
}

if [ "${1:-}" = "--fetch-wheels" ]; then
  mkdir -p .whl
  platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
             --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
             --platform manylinux1_x86_64)
  for w in "${WHEELS[@]}"; do
    read -r spec file sum <<<"$w"
    extra=()
    case "$file" in *-none-any.whl) extra=(--platform any) ;; esac
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${platforms[@]}" "${extra[@]}" -d .whl "$spec" || exit 1
  done
  check_wheels || exit 1
  ls -l .whl/*.whl
  du -ch .whl/*.whl | tail -1
  exit 0
fi

out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
summary=$out/python_summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
status=0

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# FlashInfer JIT: cache under /tmp/fi, ninja -j (MAX_JOBS) over all cores, Hopper only.
export FLASHINFER_WORKSPACE_BASE=/tmp/fi MAX_JOBS=${MAX_JOBS:-$(nproc)} FLASHINFER_CUDA_ARCH_LIST=9.0
export TVM_FFI_CACHE_DIR=/tmp/tvm-ffi

{
  cat bundle/BUILD_INFO 2>/dev/null
  echo "run $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "$(command -v python3) $(python3 --version 2>&1), $(g++ --version | head -1), $(nvcc --version | tail -1)"
} | tee -a "$summary"

module_only=0 wheels=1
case "${1:-}" in
  --module-only) module_only=1 wheels=0 ;;
  --module-and-wheels) module_only=1 ;;
esac

# 1. Wheels.
start=$SECONDS
if [ $wheels = 0 ]; then
  say "wheels: not needed (--module-only)"
elif check_wheels; then
  rm -rf /tmp/site
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >"$out/pip.log" 2>&1; then
    say "wheels: installed into /tmp/site in $((SECONDS - start)) s: $(du -k .whl/*.whl | awk '{printf "%s (%d KiB) ", $2, $1}')"
  else
    say "wheels: pip install FAILED"; cat "$out/pip.log"; status=1
  fi
else
  say "wheels: FAILED (see above)"; status=1
fi
export PYTHONPATH=/tmp/kvpy:/tmp/site${PYTHONPATH:+:$PYTHONPATH}

# 2. The kvtier module: link libkvtier and each library of bundle/lib it needs (its NEEDED
# entries found there). libkvtier.so has no rpath of its own, so its dependencies are found
# through the module's DT_RPATH (--disable-new-dtags: unlike DT_RUNPATH it also serves the
# libraries the module loads) and, for the steps below, LD_LIBRARY_PATH.
export LD_LIBRARY_PATH=$PWD/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p /tmp/kvpy
rm -f /tmp/kvpy/kvtier*.so
lib=bundle/lib/libkvtier.so
if [ -e "$lib" ]; then
  links=(-Lbundle/lib -l:libkvtier.so)
  for n in $(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    [ -e "bundle/lib/$n" ] && links+=("-l:$n")
  done
  ext=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  start=$SECONDS
  # -include cstdint: Abseil 20220623's headers predate GCC 13's leaner <string>/<memory>.
  # shellcheck disable=SC2046  # pybind11 --includes is a list of -I flags
  if g++ -O2 -DNDEBUG -shared -fPIC -std=c++17 -fvisibility=hidden -include cstdint \
      $(python3 -m pybind11 --includes) -I. -Iinclude -Ibundle/include \
      adapters/python/*.cc -Wl,--no-as-needed "${links[@]}" -Wl,--as-needed \
      -Wl,--disable-new-dtags,-rpath,"$PWD/bundle/lib" \
      -o "/tmp/kvpy/kvtier$ext" >"$out/module_build.log" 2>&1; then
    say "module: /tmp/kvpy/kvtier$ext compiled in $((SECONDS - start)) s, linked ${links[*]}"
  else
    say "module: compile FAILED after $((SECONDS - start)) s"; tail -40 "$out/module_build.log"; status=1
  fi
  python3 -c "import kvtier; print('module: import ok', kvtier.__file__)" >"$out/module_import.log" 2>&1 ||
    status=1
  tee -a "$summary" <"$out/module_import.log"
  env -u LD_LIBRARY_PATH ldd /tmp/kvpy/kvtier*.so 2>/dev/null | grep "not found" | tee -a "$summary"
else
  say "module: $lib missing (run scripts/gpu_bundle.sh here and carry bundle/)"; status=1
fi

if [ $module_only = 1 ]; then
  say "overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
  exit $status
fi

step() {  # name, timeout seconds, command...: the log is tee'd to $out/name.log
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  say "$name: rc=$rc in $((SECONDS - start)) s$([ "$rc" = 124 ] && echo " (timed out after $limit s)")"
  [ "$rc" = 0 ] || status=1
}

# 3. Validation, kvtier's kernel alone, the decode benchmark.
step validate "${VALIDATE_TIMEOUT:-300}" python3 tests/gpu/python/validate_external.py \
  --out "$out/validate.json"
step prepared_append "${APPEND_TIMEOUT:-120}" python3 tests/gpu/python/prepared_append_cuda.py
step write_kv_lifetime 120 python3 tests/gpu/python/write_kv_lifetime_cuda.py
step bindings 60 python3 tests/gpu/python/bindings_cuda.py
kernel_json=()
if [ -x bundle/kvtier_gpu_bench ] && [ "${KVTIER_CPP_BENCH:-1}" != 0 ]; then
  step cpp_bench "${CPP_BENCH_TIMEOUT:-180}" bundle/kvtier_gpu_bench "$out/bench.json"
  [ -s "$out/bench.json" ] && kernel_json=(--kernel-json "$out/bench.json")
fi
# shellcheck disable=SC2086
step decode_bench "${BENCH_TIMEOUT:-300}" python3 tests/bench/decode_bench.py \
  --out "$out/decode_bench_py.json" "${kernel_json[@]}" ${BENCH_ARGS:-}

# The peers' table of docs/benchmarks.md, from this run's two JSON files.
if [ -s "$out/decode_bench_py.json" ] && [ -s "$out/bench.json" ]; then
  python3 tests/bench/peers_table.py "$out/decode_bench_py.json" "$out/bench.json" \
    >"$out/peers_table.md" 2>&1 || say "peers_table: FAILED (see $out/peers_table.md)"
fi

echo
say "---- summary ----"
grep -E "^(FAIL|SKIP) " "$out/validate.log" 2>/dev/null | tee -a "$summary"
grep -E "validate_external: " "$out/validate.log" 2>/dev/null | tee -a "$summary"
grep -E "^FAIL |prepared_append_cuda: " "$out/prepared_append.log" 2>/dev/null | tee -a "$summary"
grep -E "^FAIL |write_kv_lifetime_cuda: " "$out/write_kv_lifetime.log" 2>/dev/null |
  tee -a "$summary"
grep -E "^FAIL |bindings_cuda: " "$out/bindings.log" 2>/dev/null | tee -a "$summary"
grep -E "method\(s\) failed|^wrote " "$out/decode_bench.log" 2>/dev/null | tee -a "$summary"
say "overall: $([ $status = 0 ] && echo PASS || echo FAIL)"
# The logs in one archive: the device tool brings back at most 8 files a call.
(cd "$out" && logs=$(ls ./*.log 2>/dev/null)
  [ -n "$logs" ] && tar -czf logs-python.tar.gz $logs && rm -f $logs)
exit $status

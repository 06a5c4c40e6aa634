#!/usr/bin/env bash
# Builds the GPU tests and benchmark and the kvtier tool here (Release, CUDA on, sm_90) in
# build-gpu/, and a shared libkvtier with CUDA in build-pyshared/ (the Python module is compiled
# against it on the GPU machine, for that machine's Python), and gathers them, stripped, with the
# non-system shared libraries they load (ldd) and the Abseil headers, into bundle/ for the H200,
# where scripts/gpu_run.sh runs them; and the kvtier tool with its libraries into recall-bundle/
# (`kvtier recall --backend cuda`: scripts/recall_gpu.sh). See docs/gpu.md.
#   scripts/gpu_bundle.sh            # JOBS=N to change the build parallelism (default 2)
#   scripts/gpu_bundle.sh --no-python  # without the shared libkvtier and the Abseil headers (for
#                                      # gpu_run.sh and recall_gpu.sh only: one CUDA build less)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-gpu
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_WITH_CUDA=ON \
  -DKVTIER_BUILD_TESTS=ON -DKVTIER_BUILD_BENCHMARKS=OFF -DKVTIER_BUILD_TOOLS=ON \
  -DKVTIER_WITH_PROMETHEUS=ON -DKVTIER_BUILD_PYTHON=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "${JOBS:-2}" --target kvtier_gpu_tests kvtier_gpu_bench kvtier_tier_bench \
  kvtier_tool
python=1
[ "${1:-}" = --no-python ] && python=0
shared=build-pyshared
if [ $python = 1 ]; then
mkdir -p "$shared"
cmake -S . -B "$shared" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVTIER_WITH_CUDA=ON \
  -DBUILD_SHARED_LIBS=ON -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCHMARKS=OFF \
  -DKVTIER_BUILD_TOOLS=OFF -DKVTIER_WITH_PROMETHEUS=OFF -DKVTIER_BUILD_PYTHON=OFF \
  >"$shared/configure.log" 2>&1 || { cat "$shared/configure.log"; exit 1; }
cmake --build "$shared" -j "${JOBS:-2}" --target kvtier
fi

# Copies into DIR/lib everything that ldd resolves for the binaries given, except the C and C++
# runtimes, which the target system has (newer).
gather_libs() {
  local dir=$1
  shift
  for bin in "$@"; do
    ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
  strip --strip-unneeded "$dir"/lib/*.so* 2>/dev/null || true
}
build_info() {
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src/cuda kernels cmake/cuda.cmake tests/gpu tests/bench examples/kvtier 2>/dev/null || echo ' + uncommitted CUDA backend')"
  nvcc --version | tail -1
}

rm -rf bundle
mkdir -p bundle/lib bundle/include
cp "$build/kvtier_gpu_tests" "$build/kvtier_gpu_bench" "$build/kvtier_tier_bench" bundle/
strip bundle/kvtier_gpu_tests bundle/kvtier_gpu_bench bundle/kvtier_tier_bench
python_lib=()
if [ $python = 1 ]; then
  cp -L "$shared"/libkvtier.so.0 bundle/lib/ && ln -s libkvtier.so.0 bundle/lib/libkvtier.so
  cp -r /usr/include/absl bundle/include/
  python_lib=(bundle/lib/libkvtier.so.0)
fi
gather_libs bundle bundle/kvtier_gpu_tests bundle/kvtier_gpu_bench bundle/kvtier_tier_bench \
  "${python_lib[@]}"
build_info >bundle/BUILD_INFO
# The kvtier tool (scripts/recall_gpu.sh) in a folder of its own, so that the device tool's 64 MiB
# per call keep room for bundle/ with the wheels of gpu_python.sh.
rm -rf recall-bundle
mkdir -p recall-bundle/lib
cp "$build/kvtier" recall-bundle/
strip recall-bundle/kvtier
gather_libs recall-bundle recall-bundle/kvtier
build_info >recall-bundle/BUILD_INFO
du -sh bundle recall-bundle
ls bundle bundle/lib recall-bundle

#!/usr/bin/env bash
# Builds the libFuzzer target (clang, ASan+UBSan, as in CI) in build-fuzz/ and gathers it with the
# non-system shared libraries it loads and the seed corpus into fuzz-bundle/, for a long run on
# a machine with many cores (scripts/fuzz_run.sh; docs/reliability.md).
#   scripts/fuzz_bundle.sh [EXTRA_CORPUS_DIR]   # JOBS=N to change the build parallelism (default 2)
# With the device tool: run(command="bash scripts/fuzz_run.sh", carry=["fuzz-bundle"]).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-fuzz
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DKVTIER_SANITIZE=address,undefined -DKVTIER_BUILD_FUZZERS=ON \
  -DKVTIER_BUILD_TOOLS=OFF -DKVTIER_BUILD_PYTHON=OFF -DKVTIER_WITH_CUDA=OFF \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "${JOBS:-2}" --target kvtier_cache_fuzzer
rm -rf fuzz-bundle
mkdir -p fuzz-bundle/lib fuzz-bundle/corpus
cp "$build/kvtier_cache_fuzzer" fuzz-bundle/
ldd fuzz-bundle/kvtier_cache_fuzzer | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
    *) cp -L "$lib" fuzz-bundle/lib/ ;;
  esac
done
cp tests/fuzz/corpus/* fuzz-bundle/corpus/
if [ $# -gt 0 ]; then cp "$1"/* fuzz-bundle/corpus/; fi
echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) at commit $(git rev-parse --short HEAD)" >fuzz-bundle/BUILD_INFO
du -sh fuzz-bundle

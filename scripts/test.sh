#!/usr/bin/env bash
# Installs what is missing, checks the structure limits (scripts/check_structure.sh), then builds
# kvtier and runs every test:
#   1. g++ RelWithDebInfo (CUDA code compiled when nvcc exists; GPU tests skip without a GPU):
#      all unit tests, a real Prometheus server scraping `kvtier simulate`, the Python module's
#      pytest suite (the engine example's included: torch and transformers come from
#      scripts/setup_python.sh), the demo, `kvtier recall --quick --json`, and the embedding
#      example built against the installed CMake package and pkg-config file;
#   2. g++ with AddressSanitizer + UndefinedBehaviorSanitizer: all unit tests; then clang's
#      libFuzzer target under ASan+UBSan for 90 s from tests/fuzz/corpus (docs/reliability.md);
#   3. clang with -Wthread-safety as an error and ThreadSanitizer: all unit tests.
# Build trees live under build-ci/ (removed first, so every run starts clean).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_python.sh

jobs=$(nproc)
root=build-ci
rm -rf "$root"
export CTEST_OUTPUT_ON_FAILURE=1

step() { echo; echo "==== $* ($(date +%T))"; }

configure_build_test() {  # name, extra cmake args...
  local name=$1; shift
  step "$name: configure and build"
  cmake -S . -B "$root/$name" -G Ninja -DKVTIER_BUILD_BENCHMARKS=OFF "$@" >"$root/$name.configure.log"
  cmake --build "$root/$name" -j "$jobs"
  step "$name: tests"
  ctest --test-dir "$root/$name" -j "$jobs" --timeout 600
}

step "structure: file and function lengths"
bash scripts/check_structure.sh

mkdir -p "$root"
configure_build_test release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$PWD/$root/prefix"

step "release: Python module tests (pytest, CPU backend)"
PYTHONPATH="$PWD/$root/release/python" KVTIER_PYTHON_REQUIRED=1 KVTIER_ENGINE_REQUIRED=1 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python

step "release: demo"
"$root/release/kvtier" demo

step "release: kvtier recall --quick --json (the recall sweep end to end)"
"$root/release/kvtier" recall --quick --json "$root/recall_quick.json" --plots "$root/recall_plots"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["arms"] and all("knee_context_tokens" in a for a in d["arms"]); print(len(d["arms"]), "arms")' "$root/recall_quick.json"

step "release: install, then build examples/embed against the installed package"
cmake --install "$root/release" >/dev/null
cmake -S examples/embed -B "$root/embed" -G Ninja -DCMAKE_PREFIX_PATH="$PWD/$root/prefix" >/dev/null
cmake --build "$root/embed"
"$root/embed/embed"
"$root/embed/embed_metrics"
step "release: build examples/embed with the installed pkg-config file"
# shellcheck disable=SC2046  # the flags are separate words
c++ -std=c++17 -O1 examples/embed/main.cc -o "$root/embed/embed_pkg_config" \
  $(PKG_CONFIG_PATH="$PWD/$root/prefix/lib/pkgconfig" pkg-config --cflags --libs kvtier)
"$root/embed/embed_pkg_config"

configure_build_test asan-ubsan -DCMAKE_BUILD_TYPE=Debug -DKVTIER_BUILD_TOOLS=OFF \
  -DKVTIER_SANITIZE=address,undefined -DKVTIER_WITH_CUDA=OFF

step "fuzz: kvtier_cache_fuzzer for 90 s from tests/fuzz/corpus (clang, ASan+UBSan)"
cmake -S . -B "$root/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DKVTIER_SANITIZE=address,undefined -DKVTIER_BUILD_FUZZERS=ON -DKVTIER_BUILD_TESTS=OFF \
  -DKVTIER_BUILD_TOOLS=OFF -DKVTIER_BUILD_BENCHMARKS=OFF -DKVTIER_WITH_PROMETHEUS=OFF \
  -DKVTIER_WITH_CUDA=OFF >"$root/fuzz.configure.log"
cmake --build "$root/fuzz" -j "$jobs" --target kvtier_cache_fuzzer
mkdir -p "$root/fuzz-corpus"  # new inputs go here; the committed seeds stay as they are
KVTIER_FUZZ_COUNT=1 "$root/fuzz/kvtier_cache_fuzzer" -max_total_time=90 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$root/" "$root/fuzz-corpus" tests/fuzz/corpus

configure_build_test tsan-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_BUILD_TOOLS=OFF \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="-Werror=thread-safety" -DKVTIER_SANITIZE=thread -DKVTIER_WITH_CUDA=OFF

step "all builds and tests passed"

#!/usr/bin/env bash
# Builds kvtier_gpu_bench at HEAD and with each patch given applied to HEAD, stripped and
# gzipped into $VARIANTS (NAME.gz: a patch's file name without .diff; HEAD's is
# a_head_<commit>.gz, the first in alphabetical order: scripts/gpu_ab.sh's reference), for
# timing in turns on the GPU machine. VARIANTS: a folder under the ignored variants/ (Default:
# variants), so that each device call carries only its own builds within the 64 MiB:
#   VARIANTS=variants/mig scripts/build_variants.sh docs/results/untimed-s19/m5_e4m3_5_blocks.diff
#   run(command="ROUNDS=3 bash scripts/gpu_ab.sh variants/mig data-plane",
#       carry=["bundle/lib", "variants/mig"])
# Uses build-gpu/ (scripts/gpu_bundle.sh configures it) and leaves the working tree as it found
# it, also when a build fails or the script is stopped; refuses to start on a tree with
# uncommitted changes to tracked files, which the patches would mix with.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build-gpu/build.ninja ]; then
  echo "build-gpu/ is not configured: run scripts/gpu_bundle.sh" >&2
  exit 1
fi
if ! git diff --quiet HEAD; then
  echo "uncommitted changes to tracked files: commit or stash them first" >&2
  exit 1
fi
for patch in "$@"; do
  git apply --check "$patch" || { echo "$patch does not apply to HEAD" >&2; exit 1; }
done
out=${VARIANTS:-variants}
mkdir -p "$out"
build() {  # name
  echo "building $1"
  local log=build-gpu/variant_$1.log
  cmake --build build-gpu -j "${JOBS:-2}" --target kvtier_gpu_bench >"$log" 2>&1 ||
    { tail -20 "$log"; return 1; }
  strip -o "build-gpu/variant_$1" build-gpu/kvtier_gpu_bench
  gzip -c "build-gpu/variant_$1" >"$out/$1.gz"
  rm "build-gpu/variant_$1"
}
applied=""
trap '[ -z "$applied" ] || git apply -R "$applied"' EXIT
build "a_head_$(git rev-parse --short HEAD)"
for patch in "$@"; do
  git apply "$patch"
  applied=$patch
  build "$(basename "$patch" .diff)"
  git apply -R "$patch"
  applied=""
done
ls -l "$out"

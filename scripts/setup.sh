#!/usr/bin/env bash
# Installs, from Debian's packages, whatever kvtier's build and tests need that is missing.
# Idempotent: packages already present are left alone, and nothing runs apt when none are missing.
# CUDA is optional and never installed here (nvcc is used when found).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev libmimalloc-dev libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev libboost-dev libxxhash-dev
  clang libclang-rt-dev
  python3 prometheus curl
  pybind11-dev python3-dev python3-numpy python3-pytest
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

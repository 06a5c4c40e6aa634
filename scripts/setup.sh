#!/usr/bin/env bash
# Installs, from Debian's packages, whatever kvtier's build and tests need that is missing.
# Then lizard, with pip. Idempotent: what is already present is left alone, and nothing runs apt
# (or pip) when nothing is missing.
# CUDA is optional and never installed here (nvcc is used when found).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libabsl-dev libmimalloc-dev libgtest-dev libgmock-dev libbenchmark-dev
  prometheus-cpp-dev libboost-dev libxxhash-dev
  clang libclang-rt-dev
  python3 python3-pip prometheus curl
  pybind11-dev python3-dev python3-numpy python3-pytest
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack python3-cbor2
  libhiredis-dev redis-server libssl-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# lizard (function lengths, for scripts/check_structure.sh) is not packaged by Debian: pip, for
# the Python that scripts/test.sh runs (/usr/bin/python3).
lizard_version=1.24.3
if [ "$(/usr/bin/python3 -m lizard --version 2>/dev/null)" = "$lizard_version" ]; then
  echo "setup: lizard $lizard_version present"
else
  echo "setup: installing lizard $lizard_version (pip)"
  extra=()
  # Debian 12 marks its Python as externally managed (PEP 668): pip needs the override.
  if /usr/bin/python3 -m pip install --help | grep -- --break-system-packages >/dev/null; then
    extra+=(--break-system-packages)
  fi
  $sudo /usr/bin/python3 -m pip install -q --progress-bar off "${extra[@]}" "lizard==$lizard_version"
fi

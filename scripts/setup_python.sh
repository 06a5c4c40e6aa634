#!/usr/bin/env bash
# Installs PyTorch and transformers for /usr/bin/python3 (the Python the tests use) when either
# is missing, for the engine example's CPU test (tests/python/test_engine.py, docs/engine.md).
# Idempotent: nothing runs when both import. Versions are pinned to what the H200 runs (torch
# 2.11, transformers 5.17), so that the CPU test and the GPU run use one transformers API.
# PyPI's Linux torch wheel is the CUDA build: it brings the NVIDIA runtime wheels (about 3 GiB
# downloaded, once); PyTorch's CPU-only index is not reachable from this workplace.
set -euo pipefail
python=/usr/bin/python3
versions="import torch, transformers as t; print('torch', torch.__version__, 'transformers',
  t.__version__)"
if "$python" -c "$versions" 2>/dev/null; then
  exit 0
fi
extra=()
# Debian 12 marks its Python as externally managed (PEP 668): pip needs the override.
if "$python" -m pip install --help | grep -- --break-system-packages >/dev/null; then
  extra+=(--break-system-packages)
fi
echo "setup_python: installing torch 2.11.0 and transformers 5.17.0 for $python"
"$python" -m pip install -q --no-cache-dir --progress-bar off "${extra[@]}" \
  "torch==2.11.0" "transformers==5.17.0"
"$python" -c "$versions"

#!/usr/bin/env bash
# Files an H200 run of scripts/gpu_engine.sh into the docs (docs/engine.md, "Results"):
#   bash scripts/engine_results.sh DIR NAME
# DIR: the run's $OUT (engine.json, engine.log, engine_tables.md, versions.txt); NAME: the
# folder under docs/results/ (e.g. h200-2026-12-01-engine). Copies those files there and
# replaces the block between docs/engine.md's engine-results markers with the run's tables
# (bench_engine.py --tables, which imports torch and transformers: $PYTHON, else the first of
# python3 and /usr/bin/python3 that has them).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 DIR NAME" >&2; exit 2; }
dir=$1
name=$2
[ -s "$dir/engine.json" ] || { echo "engine_results: no $dir/engine.json" >&2; exit 1; }
mkdir -p "docs/results/$name"
for f in engine.json engine.log engine_tables.md versions.txt; do
  [ -e "$dir/$f" ] && cp "$dir/$f" "docs/results/$name/"
done
py=${PYTHON:-python3}
"$py" -c "import torch, transformers" 2>/dev/null || py=/usr/bin/python3
tables=$("$py" examples/engine/bench_engine.py --tables "$dir/engine.json")
TABLES=$tables NAME=$name python3 - <<'PY'
import os
path = "docs/engine.md"
text = open(path).read()
begin, end = "<!-- engine-results:begin -->", "<!-- engine-results:end -->"
if text.count(begin) != 1 or text.count(end) != 1:
    raise SystemExit("engine_results: docs/engine.md lacks one pair of engine-results markers")
body = (f"From `docs/results/{os.environ['NAME']}/engine.json` "
        f"(`bash scripts/engine_results.sh`).\n\n{os.environ['TABLES']}\n")
head, rest = text.split(begin)
_, tail = rest.split(end)
open(path, "w").write(f"{head}{begin}\n{body}{end}{tail}")
PY
echo "engine_results: docs/results/$name/ and docs/engine.md's results updated"

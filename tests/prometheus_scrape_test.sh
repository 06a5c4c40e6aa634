#!/usr/bin/env bash
# End to end: a real Prometheus server scrapes `kvtier simulate --metrics-port`, and what its
# HTTP API returns for kvtier_blocks and two counters must equal the tool's JSON report.
# Usage: prometheus_scrape_test.sh <path to the kvtier tool>. Exit 77 (skipped) without Prometheus.
set -euo pipefail
tool=$1
prometheus=$(command -v prometheus || true)
if [ -z "$prometheus" ]; then
  echo "SKIP: no prometheus binary (Debian package 'prometheus'; scripts/setup.sh installs it)"
  exit 77
fi
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
tool_port=$(free_port)
prom_port=$(free_port)
cat >"$dir/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: kvtier
    static_configs:
      - targets: ['127.0.0.1:$tool_port']
YML
"$prometheus" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$dir/prometheus.log" 2>&1 &
pids+=($!)
api="http://127.0.0.1:$prom_port"
for _ in $(seq 60); do curl -sf "$api/-/ready" >/dev/null && break; sleep 0.5; done
curl -sf "$api/-/ready" >/dev/null || { cat "$dir/prometheus.log"; echo "FAIL: prometheus did not start"; exit 1; }

"$tool" simulate --steps 150 --budget-mib 64 --arrivals-per-step 0.3 --metrics-port "$tool_port" \
  --linger 30 --json "$dir/sim.json" --plot '' --no-progress >"$dir/tool.log" 2>&1 &
pids+=($!)
for _ in $(seq 240); do [ -s "$dir/sim.json" ] && break; sleep 0.5; done
[ -s "$dir/sim.json" ] || { cat "$dir/tool.log"; echo "FAIL: the tool wrote no JSON"; exit 1; }
query() {  # prints the single value of an instant query, or nothing
  curl -sfG "$api/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")'
}
# The tool now serves its final state: wait until Prometheus has its target, then for two more
# scrapes so that the newest samples are the final ones.
for _ in $(seq 40); do [ -n "$(query 'kvtier_capacity_bytes')" ] && break; sleep 0.5; done
[ -n "$(query 'kvtier_capacity_bytes')" ] || { echo "FAIL: prometheus never scraped the tool"; exit 1; }
sleep 2.5
python3 - "$dir/sim.json" "$(query 'sum(kvtier_blocks{state="in_use"})')" \
  "$(query 'sum(kvtier_migrated_blocks_total)')" "$(query 'sum(kvtier_evicted_blocks_total)')" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
in_use = sum(t["blocks_in_use"] for t in report["tier_mix"])
checks = [("kvtier_blocks{state=in_use}", sys.argv[2], in_use),
          ("kvtier_migrated_blocks_total", sys.argv[3], report["migrated_blocks"]),
          ("kvtier_evicted_blocks_total", sys.argv[4], report["evicted_blocks"])]
failed = False
for name, got, want in checks:
    ok = got != "" and float(got) == float(want)
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: prometheus {got or '(none)'}, tool JSON {want}")
sys.exit(1 if failed else 0)
PY

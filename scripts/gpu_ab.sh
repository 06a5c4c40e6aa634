#!/usr/bin/env bash
# Times builds of kvtier_gpu_bench against each other on a GPU machine, in turns: for each shape,
# ROUNDS rounds, each running `--only CASE BATCH CONTEXT` of every build once, so that a slow
# spell of the GPU falls on all builds alike. Then the median of each row over the rounds, per
# build, beside the reference build's.
#   scripts/gpu_ab.sh DIR "CASE BATCH CONTEXT [--shared-pages N]"|data-plane|decode ...
# (data-plane: the copy roof, migration and append rows of `--data-plane-only`; decode: every
# decode row of `--decode-only`, one process timing every shape in turn, where a row can depend
# on the shapes before it; its rows are named full:ROW)
# DIR holds the builds (kvtier_gpu_bench binaries, or gzip files of them, named by variant; the
# first name in alphabetical order is the reference), and bundle/lib the libraries they load
# (scripts/gpu_bundle.sh). ROUNDS (default 3); BUILDS (default all): the variant names to time,
# in that order. Writes every run's rows to $OUT/ab.json (AB_NAME.json with AB_NAME set) and
# prints the table (builds that split a shape differently on one line, with their split counts),
# the mean SM clock of each row and build (where the bench sampled it), then each variant row's
# cost over its plain row (page weights, rotation). AB_DEADLINE
# (seconds, Default: none): shapes not started by then are skipped, so that a device call's
# limit never loses the shapes already timed. AB_MAIN=1: bundle/kvtier_gpu_bench (main's build,
# carried with the bundle) is timed too, as the reference, named a_main, so that DIR need not
# hold a copy of it (the device tool carries 64 MiB a call).
# With the device tool:
#   run(command="bash scripts/gpu_ab.sh variants 'fp16 1 8192'", carry=["bundle/lib", "variants"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
dir=$1
shift
bins=/tmp/ab_bins
rm -rf "$bins" /tmp/ab_runs && mkdir -p "$bins" /tmp/ab_runs
names=${BUILDS:-$(for f in "$dir"/*; do basename "$f" .gz; done)}
list=()
if [ "${AB_MAIN:-0}" = 1 ]; then
  cp bundle/kvtier_gpu_bench "$bins/a_main" && list+=("$bins/a_main")
fi
for name in $names; do
  if [ -f "$dir/$name.gz" ]; then
    gzip -dc "$dir/$name.gz" >"$bins/$name"
  else
    cp "$dir/$name" "$bins/$name"
  fi
  chmod +x "$bins/$name"
  list+=("$bins/$name")
done
for shape in "$@"; do
  if [ -n "${AB_DEADLINE:-}" ] && [ "$SECONDS" -ge "$AB_DEADLINE" ]; then
    echo "skipped (AB_DEADLINE ${AB_DEADLINE} s): $shape"
    continue
  fi
  if [ "$shape" = data-plane ]; then
    args=(--data-plane-only)
  elif [ "$shape" = decode ]; then
    args=(--decode-only)
  else
    read -r -a args <<<"$shape"  # CASE BATCH CONTEXT [--shared-pages N]
    args=(--only "${args[@]}")
  fi
  for round in $(seq "${ROUNDS:-3}"); do
    for b in "${list[@]}"; do
      run=/tmp/ab_runs/$(basename "$b")__$(echo "$shape" | tr ' ' _)__$round.json
      timeout 120 "$b" "$run" "${args[@]}" >/dev/null 2>"$run.err" ||
        { echo "$(basename "$b") $shape round $round failed:"; tail -3 "$run.err"; }
    done
  done
  echo "done: $shape"
done
python3 - "$out/${AB_NAME:-ab}.json" /tmp/ab_runs <<'EOF'
import collections, json, os, re, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))  # row -> build -> [us]
mhz = collections.defaultdict(lambda: collections.defaultdict(list))  # row -> build -> [SM MHz]
split_re = re.compile(r'_splits(\d+)')  # a row's split count, in its name
builds = []
for f in sorted(os.listdir(sys.argv[2])):
    if not f.endswith('.json'):
        continue
    build, shape = f.split('__')[:2]
    if build not in builds:
        builds.append(build)
    # A full run's rows carry 'full:', so that they never pool with the same rows timed alone.
    prefix = 'full:' if shape == 'decode' else ''
    for key, rows in json.load(open(os.path.join(sys.argv[2], f))).items():
        if isinstance(rows, list) and key not in ('roof', 'read_roof'):
            for r in rows:
                if isinstance(r, dict) and 'median_ms' in r:
                    runs[prefix + r['name']][build].append(r['median_ms'] * 1e3)
                    if r.get('sm_mhz'):  # 0 where the bench had no NVML
                        mhz[prefix + split_re.sub('', r['name'])][build].append(r['sm_mhz'])
json.dump(runs, open(sys.argv[1], 'w'), indent=1)
ref = builds[0]
# A row's name carries its split count (_splitsN); builds that split a shape differently are
# compared on one line, each cell with its split count in brackets.
shapes = collections.defaultdict(dict)  # row without _splitsN -> build -> (splits, [us])
for row, by in runs.items():
    m = split_re.search(row)
    for b, us in by.items():
        shapes[split_re.sub('', row)][b] = (m.group(1) if m else '', us)
print(f"{'row (median us over rounds; [splits] where builds differ)':58s}" +
      ''.join(f'{b:>22s}' for b in builds))
for shape, by in shapes.items():
    base = statistics.median(by[ref][1]) if ref in by else None
    differ = len({s for s, _ in by.values()}) > 1
    cells = []
    for b in builds:
        if b not in by:
            cells.append(f"{'-':>22s}")
            continue
        splits, us = by[b]
        m = statistics.median(us)
        rel = f' {100 * (m / base - 1):+5.1f}%' if base and b != ref else ''
        cells.append(f'{m:>11.1f}{rel:>7s}' + (f'{"[" + splits + "]":>4s}' if differ else ' ' * 4))
    print(f'{shape[:58]:58s}' + ''.join(cells))
# The SM clock each build's rows ran at (a row bound by instruction issue slows with it).
if mhz:
    print(f"\n{'mean SM clock over the rounds, MHz':58s}" + ''.join(f'{b:>22s}' for b in builds))
    for row, by in mhz.items():
        print(f'{row[:58]:58s}' +
              ''.join(f'{statistics.mean(by[b]):>22.0f}' if b in by else f"{'-':>22s}"
                      for b in builds))
# Each variant row (page weights, rotation) over its plain row, per build: the cost that issue 14
# bounds, from the medians above (a build's variant and plain rows split alike).
suffixes = ('_rotated_page_weight', '_page_weight_zeroed', '_page_weight', '_rotated')
modes = ('_back_to_back', '_graph')  # how the calls were timed, after the variant suffix
def plain_of(shape):  # the shape without its longest variant suffix, if that shape was timed
    mode = next((m for m in modes if shape.endswith(m)), '')
    core = shape[:len(shape) - len(mode)]
    s = next((s for s in suffixes if core.endswith(s)), None)
    return core[:-len(s)] + mode if s and core[:-len(s)] + mode in shapes else None
costs = [(shape, plain_of(shape)) for shape in shapes if plain_of(shape)]
if costs:
    print(f"\n{'variant over its plain row':58s}" + ''.join(f'{b:>22s}' for b in builds))
    for shape, plain in costs:
        cells = []
        for b in builds:
            if b in shapes[shape] and b in shapes[plain]:
                ratio = (statistics.median(shapes[shape][b][1]) /
                         statistics.median(shapes[plain][b][1]))
                cells.append(f'{100 * (ratio - 1):>+21.2f}%')
            else:
                cells.append(f"{'-':>22s}")
        print(f'{shape[:58]:58s}' + ''.join(cells))
EOF

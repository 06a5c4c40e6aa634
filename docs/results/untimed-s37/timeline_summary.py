#!/usr/bin/env python3
"""Summarises the decode-step timelines of timeline.diff's bench (timeline_<case>.csv).

Records are sorted by their end; runs of one kernel id are one launch (a block ends after its
wait for the kernel before, which ends after all of that kernel's blocks). For each step (an
attention launch and its merge, the first and last of the replay left out) it takes, in us:
  period      attention wait release to the next step's
  gap_in      merge n-1's last end -> attention n's first wait release
  spread      attention n's wait releases, last minus first
  first_page  wait release -> warp 0's first page landed (median block; p90)
  pages       first page -> warp 0's pages done (median block; max)
  epilogue    pages done -> block end (median)
  attention   first wait release -> last block end
  gap_mid     attention's last end -> merge's first wait release
  merge       merge's first wait release -> its last end
  early       attention's first block start relative to merge n-1's last end (negative: early)
and prints the median of each over the steps. Usage: timeline_summary.py FILE.csv...
"""
import csv
import statistics
import sys


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summarise(path):
    rows = [tuple(int(v) for v in r.values()) for r in csv.DictReader(open(path))]
    rows.sort(key=lambda r: r[7])
    runs = []
    for r in rows:
        if runs and runs[-1][0][0] == r[0]:
            runs[-1].append(r)
        else:
            runs.append([r])
    stamps = sorted({t for r in rows for t in r[3:8]})
    resolution = min((b - a for a, b in zip(stamps, stamps[1:]) if b > a), default=0)
    steps = []
    for i in range(len(runs) - 1):
        if runs[i][0][0] == 0 and runs[i + 1][0][0] == 1:
            steps.append((runs[i], runs[i + 1]))
    metrics = {k: [] for k in ("period", "gap_in", "spread", "first_page", "first_page_p90",
                               "pages", "pages_max", "epilogue", "attention", "gap_mid",
                               "merge", "early")}
    for n in range(1, len(steps) - 1):
        a, m = steps[n]
        prev_m = steps[n - 1][1]
        nxt_a = steps[n + 1][0]
        us = 1e-3
        wait_min = min(r[4] for r in a)
        metrics["period"].append((min(r[4] for r in nxt_a) - wait_min) * us)
        metrics["gap_in"].append((wait_min - max(r[7] for r in prev_m)) * us)
        metrics["spread"].append((max(r[4] for r in a) - wait_min) * us)
        first = [(r[5] - r[4]) * us for r in a]
        metrics["first_page"].append(statistics.median(first))
        metrics["first_page_p90"].append(pct(first, 0.9))
        pages = [(r[6] - r[5]) * us for r in a]
        metrics["pages"].append(statistics.median(pages))
        metrics["pages_max"].append(max(pages))
        metrics["epilogue"].append(statistics.median((r[7] - r[6]) * us for r in a))
        metrics["attention"].append((max(r[7] for r in a) - wait_min) * us)
        metrics["gap_mid"].append((min(r[4] for r in m) - max(r[7] for r in a)) * us)
        metrics["merge"].append((max(r[7] for r in m) - min(r[4] for r in m)) * us)
        metrics["early"].append((min(r[3] for r in a) - max(r[7] for r in prev_m)) * us)
    print(f"{path}: {len(steps)} steps ({len(steps[0][0]) if steps else 0} attention blocks, "
          f"{len(steps[0][1]) if steps else 0} merge blocks a step); timer resolution "
          f"{resolution} ns")
    print("  " + "  ".join(f"{k} {statistics.median(v):.2f}" for k, v in metrics.items() if v))


for p in sys.argv[1:]:
    summarise(p)

#!/usr/bin/env python3
"""Compares `kvtier recall --json` results of the same trials on two backends (docs/recall.md,
"The sweep on the GPU").

For every (arm, context) that both sides hold, the top-1 recall and the flip rate pooled over
the depths, each with its 95% Wilson interval (the sweep's own, recomputed from the cells'
counts): the two agree when each side's rate lies inside the other side's interval. Also
printed: the depth cells whose counts differ at all, each arm's knee and, for the second side,
its compute error (max_compute_rel_error).

Usage: recall_compare.py A.json B.json [B2.json ...]
  (the B files are merged: a sweep run in pieces, e.g. one context per run)
Exit status: 0 when every compared (arm, context) agrees; 1 when one disagrees; 2 when the files
do not describe the same trials (other generator settings or seed, other trials per cell, a
different FP32 reference recall in a cell) or share no (arm, context).
"""
import json
import math
import sys

Z = 1.959963984540054  # two-sided 95%, as recall_metrics.cc
# Settings that may differ between the sides: how and where the sweep ran, not which trials.
RUN_SETTINGS = {"backend", "contexts", "bisect_steps"}


def wilson(hits, n):
    if n == 0:
        return 0.0, 1.0
    p, z2 = hits / n, Z * Z
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, center - half), min(1.0, center + half)


def counts(cell):
    """(trials, top-1 hits, reference hits, flips) of a cell, from its rates."""
    n = cell["trials"]
    hits = round(cell["recall_top1"] * n)
    ref_hits = round(cell["reference_recall_top1"] * n)
    flips = round(cell["flip_rate"] * ref_hits)
    return n, hits, ref_hits, flips


def load(paths):
    """settings, {(context, depth): reference cell}, {arm: arm}, {(arm, context, depth): cell}."""
    settings, reference, arms, cells = None, {}, {}, {}
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        s = {k: v for k, v in d["settings"].items() if k not in RUN_SETTINGS}
        if settings is not None and s != settings:
            print(f"{path}: other settings than the files before it: {s} vs {settings}",
                  file=sys.stderr)
            sys.exit(2)  # not the same trials
        settings = s
        for c in d["reference"]["cells"]:
            reference[(c["context_tokens"], c["depth"])] = c
        for a in d["arms"]:
            arm = arms.setdefault(a["name"], {"knees": [], "max_compute_rel_error": 0.0})
            arm["knees"].append(a["knee_context_tokens"])
            arm["max_compute_rel_error"] = max(arm["max_compute_rel_error"],
                                               a["max_compute_rel_error"])
            for c in a["cells"]:
                cells[(a["name"], c["context_tokens"], c["depth"])] = c
    return settings, reference, arms, cells


def pooled(cells, arm, context):
    n = hits = ref_hits = flips = 0
    for (name, c, _), cell in cells.items():
        if name == arm and c == context:
            dn, dh, dr, df = counts(cell)
            n, hits, ref_hits, flips = n + dn, hits + dh, ref_hits + dr, flips + df
    return n, hits, ref_hits, flips


def agree(a_hits, a_n, b_hits, b_n):
    """Each side's rate inside the other's 95% Wilson interval; and the two intervals."""
    a_ci, b_ci = wilson(a_hits, a_n), wilson(b_hits, b_n)
    pa = a_hits / a_n if a_n else 0.0
    pb = b_hits / b_n if b_n else 0.0
    ok = b_ci[0] - 1e-12 <= pa <= b_ci[1] + 1e-12 and a_ci[0] - 1e-12 <= pb <= a_ci[1] + 1e-12
    return ok, pa, a_ci, pb, b_ci


def same_trials(ref_a, ref_b):
    """Problems that show the two sides did not run the same trials."""
    problems = []
    for key in sorted(set(ref_a) & set(ref_b)):
        if counts(ref_a[key])[:2] != counts(ref_b[key])[:2]:
            problems.append(f"reference cell {key}: {counts(ref_a[key])} vs {counts(ref_b[key])}")
    return problems


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sa, ref_a, arms_a, cells_a = load([argv[1]])
    sb, ref_b, arms_b, cells_b = load(argv[2:])
    if sa != sb:
        diff = {k: (sa.get(k), sb.get(k)) for k in set(sa) | set(sb) if sa.get(k) != sb.get(k)}
        print(f"not the same trials: settings differ: {diff}")
        return 2
    problems = same_trials(ref_a, ref_b)
    if problems:
        print("not the same trials (the FP32 reference differs):\n  " + "\n  ".join(problems))
        return 2
    keys = sorted({(a, c) for (a, c, _) in cells_a} & {(a, c) for (a, c, _) in cells_b},
                  key=lambda k: (list(arms_a).index(k[0]), k[1]))
    if not keys:
        print("no (arm, context) in both")
        return 2
    print(f"A: {argv[1]}\nB: {' '.join(argv[2:])}\n")
    print("| arm | context | top-1 recall A [95%] | top-1 recall B [95%] | flip rate A [95%] "
          "| flip rate B [95%] | depth cells differing | agree |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = 0
    for arm, context in keys:
        n_a, h_a, r_a, f_a = pooled(cells_a, arm, context)
        n_b, h_b, r_b, f_b = pooled(cells_b, arm, context)
        ok_r, pa, ca, pb, cb = agree(h_a, n_a, h_b, n_b)
        ok_f, fa, fca, fb, fcb = agree(f_a, r_a, f_b, r_b)
        differing = sum(1 for (a, c, d) in cells_a if a == arm and c == context and
                        (a, c, d) in cells_b and
                        counts(cells_a[(a, c, d)]) != counts(cells_b[(a, c, d)]))
        ok = ok_r and ok_f
        failed += not ok
        print(f"| {arm} | {context} | {100 * pa:.1f} [{100 * ca[0]:.1f}, {100 * ca[1]:.1f}] "
              f"| {100 * pb:.1f} [{100 * cb[0]:.1f}, {100 * cb[1]:.1f}] "
              f"| {100 * fa:.1f} [{100 * fca[0]:.1f}, {100 * fca[1]:.1f}] "
              f"| {100 * fb:.1f} [{100 * fcb[0]:.1f}, {100 * fcb[1]:.1f}] "
              f"| {differing} | {'yes' if ok else 'NO'} |")
    # A knee is a whole sweep's: with B run in pieces (one context each), B's is not shown.
    print("\n| arm | knee A (tokens) | knee B (tokens) | max compute rel. error A | B |")
    print("| --- | --- | --- | --- | --- |")
    for arm in arms_a:
        if arm in arms_b:
            knee_b = arms_b[arm]["knees"][0] if len(argv) == 3 else "(run in pieces)"
            print(f"| {arm} | {arms_a[arm]['knees'][0] or 'none'} | {knee_b or 'none'} | "
                  f"{arms_a[arm]['max_compute_rel_error']:.2e} | "
                  f"{arms_b[arm]['max_compute_rel_error']:.2e} |")
    print(f"\n{len(keys) - failed} of {len(keys)} (arm, context) agree within the 95% intervals")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Executed warp instructions by opcode, per unit of work, from Nsight Compute source pages.

scripts/gpu_profile.sh writes <case>_sass.csv (ncu --page source --csv --print-source sass): one
row per SASS instruction with its "Instructions Executed". This sums them by opcode (predicates
and modifiers dropped: `@P3 STG.E` counts as STG) and divides by UNITS, e.g. the page-heads a
decode attends (batch x KV heads x pages: 64 x 8 x 2048 at batch 64 x 32K), so that two kernels
compare per page. With two files it prints both columns and their difference, largest first:
where a variant's extra instructions are (docs/benchmarks.md, session 14: the page-weight
kernel's 27 a page, of which 10 are its own work and the rest rematerialised values).

  scripts/profile_opcodes.py UNITS A_sass.csv [B_sass.csv]   # .csv or .csv.gz
"""
import collections
import csv
import gzip
import re
import sys


def opcode_counts(path):
    """Executed warp instructions by opcode, and the kernel's name (first line of the file)."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt', newline='') as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or 'Source' not in rows[1] or 'Instructions Executed' not in rows[1]:
        sys.exit(f'{path}: not an ncu source page (expected Source and Instructions Executed)')
    header = rows[1]
    source, executed = header.index('Source'), header.index('Instructions Executed')
    counts = collections.Counter()
    for row in rows[2:]:
        if len(row) <= executed or not row[executed].isdigit():
            continue
        text = re.sub(r'^@!?U?P[T0-9]+\s+', '', row[source].strip())
        if text:
            counts[text.split()[0].split('.')[0]] += int(row[executed])
    name = rows[0][1] if len(rows[0]) > 1 else path
    return name, counts


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    try:
        units = float(argv[1])
    except ValueError:
        sys.exit(f'UNITS must be a number, not {argv[1]!r}')
    if units <= 0:
        sys.exit('UNITS must be positive')
    tables = [opcode_counts(path) for path in argv[2:]]
    for i, (name, counts) in enumerate(tables):
        total = sum(counts.values())
        print(f'{"AB"[i]}: {name}\n   {total / units:.1f} instructions per unit ({total} in all)')
    ops = set().union(*(counts for _, counts in tables))
    per = [{op: counts[op] / units for op in ops} for _, counts in tables]
    if len(per) == 1:
        order = sorted(ops, key=lambda op: -per[0][op])
        print(f'{"opcode":12s}{"A":>9s}')
        for op in order:
            print(f'{op:12s}{per[0][op]:9.2f}')
        return
    order = sorted(ops, key=lambda op: -abs(per[1][op] - per[0][op]))
    print(f'{"opcode":12s}{"A":>9s}{"B":>9s}{"B - A":>9s}')
    for op in order:
        print(f'{op:12s}{per[0][op]:9.2f}{per[1][op]:9.2f}{per[1][op] - per[0][op]:+9.2f}')


if __name__ == '__main__':
    main(sys.argv)

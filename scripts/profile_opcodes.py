#!/usr/bin/env python3
"""Executed warp instructions by opcode, per unit of work, and stall samples by reason, from
Nsight Compute source pages.

scripts/gpu_profile.sh writes <case>_sass.csv (ncu --page source --csv --print-source sass): one
row per SASS instruction with its "Instructions Executed" and its warp-stall samples per reason
(the stall_* columns). This sums the instructions by opcode (predicates and modifiers dropped:
`@P3 STG.E` counts as STG) and divides by UNITS, e.g. the page-heads a decode attends (batch x KV
heads x pages: 64 x 8 x 2048 at batch 64 x 32K), so that two kernels compare per page; then it
sums the stall samples by reason (a kernel that issues as many instructions but waits longer
shows it there). With two files it prints both columns and their difference, largest first:
where a variant's extra instructions and waits are (docs/benchmarks.md, sessions 14 and 15).
Last, for each file, the instructions grouped by how many times each executed, per unit: at
batch 1 x 8K (2 pages a warp) 1.0 is a page's work, 0.5 a warp's, 0.0625 one warp's of a block
of 8; with the stall samples of each group, this separates the fixed costs from the loop's
(docs/results/untimed-s43/README.md).

  scripts/profile_opcodes.py UNITS A_sass.csv [B_sass.csv]   # .csv or .csv.gz
"""
import collections
import csv
import gzip
import re
import sys


def opcode(text):
    """The opcode of a SASS instruction's text, without its predicate and modifiers ('' if none):
    `@P3 STG.E.64 [R2], R4` is STG."""
    text = re.sub(r'^@!?U?P[T0-9]+\s+', '', text.strip())
    return text.split()[0].split('.')[0] if text else ''


def source_page(path):
    """The rows of an ncu source page (.csv or .csv.gz): the kernel's name (first line), the
    header, and the instruction rows; exits with a message for anything else."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt', newline='') as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or 'Source' not in rows[1] or 'Instructions Executed' not in rows[1]:
        sys.exit(f'{path}: not an ncu source page (expected Source and Instructions Executed)')
    name = rows[0][1] if len(rows[0]) > 1 else path
    return name, rows[1], rows[2:]


def read_page(path):
    """The kernel's name (first line of the file), executed warp instructions by opcode, and
    stall samples by reason."""
    name, header, rows = source_page(path)
    source, executed = header.index('Source'), header.index('Instructions Executed')
    reasons = {i: c[len('stall_'):] for i, c in enumerate(header)
               if c.startswith('stall_') and '(Not Issued)' not in c}
    opcodes, stalls = collections.Counter(), collections.Counter()
    # by_count[times executed] = [instructions, their stall samples]
    by_count = collections.defaultdict(lambda: [0, 0])
    for row in rows:
        if len(row) <= executed or not row[executed].isdigit():
            continue
        op = opcode(row[source])
        n = int(row[executed])
        if op:
            opcodes[op] += n
        samples = 0
        for i, reason in reasons.items():
            if i < len(row) and row[i].isdigit():
                stalls[reason] += int(row[i])
                samples += int(row[i])
        if n or samples:
            by_count[n][0] += 1
            by_count[n][1] += samples
    return name, opcodes, stalls, by_count


def print_by_count(label, units, by_count):
    """The instructions grouped by times executed, most executed work first."""
    total = sum(n * count for n, (count, _) in by_count.items()) or 1
    samples = sum(stalled for _, stalled in by_count.values()) or 1
    print(f'{label}: by times executed{"per unit":>12s}{"instrs":>8s}{"executed %":>12s}'
          f'{"samples":>9s}{"samples %":>11s}')
    for n, (count, stalled) in sorted(by_count.items(), key=lambda kv: -kv[0] * kv[1][0]):
        print(f'{"":20s}{n / units:12.4f}{count:8d}{100 * n * count / total:12.1f}{stalled:9d}'
              f'{100 * stalled / samples:11.1f}')


def print_table(label, per, digits):
    """Rows of per[k][key] (one column per file; with two, their difference, largest first)."""
    keys = set().union(*per)
    if len(per) == 1:
        print(f'{label:24s}{"A":>10s}')
        for key in sorted(keys, key=lambda k: -per[0].get(k, 0)):
            print(f'{key:24s}{per[0].get(key, 0):10.{digits}f}')
        return
    print(f'{label:24s}{"A":>10s}{"B":>10s}{"B - A":>10s}')
    for key in sorted(keys, key=lambda k: -abs(per[1].get(k, 0) - per[0].get(k, 0))):
        a, b = per[0].get(key, 0), per[1].get(key, 0)
        print(f'{key:24s}{a:10.{digits}f}{b:10.{digits}f}{b - a:+10.{digits}f}')


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__)
    try:
        units = float(argv[1])
    except ValueError:
        sys.exit(f'UNITS must be a number, not {argv[1]!r}')
    if units <= 0:
        sys.exit('UNITS must be positive')
    pages = [read_page(path) for path in argv[2:]]
    for i, (name, opcodes, stalls, _) in enumerate(pages):
        total = sum(opcodes.values())
        print(f'{"AB"[i]}: {name}\n   {total / units:.1f} instructions per unit ({total} in all), '
              f'{sum(stalls.values())} stall samples')
    per_unit = [{op: n / units for op, n in opcodes.items()} for _, opcodes, _, _ in pages]
    print_table('opcode (per unit)', per_unit, 2)
    print()
    print_table('stall (samples)', [dict(s) for _, _, s, _ in pages], 0)
    for i, (_, _, _, by_count) in enumerate(pages):
        print()
        print_by_count('AB'[i], units, by_count)


if __name__ == '__main__':
    main(sys.argv)

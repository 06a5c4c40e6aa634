#!/usr/bin/env python3
"""Executed warp instructions per unit of work by source function and by source line, from an
Nsight Compute source page and the same kernel compiled with line information.

An ncu source page (scripts/gpu_profile.sh's <case>_sass.csv) has one row per SASS instruction
with its "Instructions Executed", but no source lines. `nvdisasm -g` of a cubin built from the
same code with the build's flags and -lineinfo gives each instruction's innermost inlined source
line, in the same order: this pairs the two row by row (it stops if their opcodes differ; the
page is read and its opcodes named as profile_opcodes.py does) and sums the executions by line
and by the function that encloses the line (the nearest definition above it), divided by UNITS
(e.g. the page-heads a decode attends), so that the cost of each stage of a kernel reads per
page (docs/benchmarks.md, session 16). Lines in the CUDA headers, whose functions are defined
through macros, read as function `?`. An instruction counts where
ptxas puts it: a subexpression that several lines share (a lane's offset, recomputed in a loop
at the register limit) lands on one of them, which need not be the one that costs it.

  nvcc -O3 -DNDEBUG -gencode arch=compute_90,code=sm_90 --fmad=false -lineinfo -std=c++17 \\
      -I. -Iinclude -cubin -o /tmp/k.cubin kernels/attention/decode_launch.cu
  nvdisasm -g -c /tmp/k.cubin > /tmp/k.dis
  scripts/profile_by_source.py /tmp/k.dis KERNEL_SYMBOL UNITS A_sass.csv[.gz]
"""
import collections
import os
import re
import sys

from profile_opcodes import opcode, source_page

# A line that opens a C++ function definition: its name before the parameter list (a kernel's
# name is on the line after its __launch_bounds__).
DEFINITION = re.compile(r'^\s*(?:template\b.*|.*\b__(?:device|global)__\b.*?)\b(\w+)\s*\(')
NAME = re.compile(r'^\s*(\w+)\s*\(')


def instructions(listing, symbol):
    """(file, line) and opcode of each instruction of `symbol` in an `nvdisasm -g` listing."""
    with open(listing) as f:
        lines = f.read().split('\n')
    header = '.text.' + symbol + ':'
    if header not in lines:
        sys.exit(f'{listing}: no function {symbol}')
    where, out = None, []
    for line in lines[lines.index(header) + 1:]:
        if line.startswith('//----'):
            break
        m = re.match(r'\s*//## File "(.*?)", line (\d+)', line)
        if m:
            where = (os.path.normpath(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r'\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;', line)
        if m:
            out.append((where, opcode(m.group(1))))
    return out


def executions(page):
    """Opcode and executed warp instructions of each instruction row of an ncu source page."""
    _, header, rows = source_page(page)
    src, count = header.index('Source'), header.index('Instructions Executed')
    return [(opcode(r[src]), int(r[count]) if r[count].isdigit() else 0)
            for r in rows if opcode(r[src])]


def enclosing_function(path, line, cache={}):
    """The name of the definition above `line` of `path` ('?' where none is found)."""
    if path not in cache:
        try:
            with open(path) as f:
                cache[path] = f.read().split('\n')
        except OSError:
            cache[path] = []
    text = cache[path]
    for i in range(min(line, len(text)) - 1, -1, -1):
        m = DEFINITION.match(text[i])
        if m and not text[i].rstrip().endswith(';'):
            after = NAME.match(text[i + 1]) if i + 1 < len(text) else None
            return after.group(1) if m.group(1) == '__launch_bounds__' and after else m.group(1)
    return '?'


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    listing, symbol, units, page = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    ins, exe = instructions(listing, symbol), executions(page)
    if len(ins) != len(exe):
        sys.exit(f'{len(ins)} instructions in the listing, {len(exe)} rows in the page: '
                 'not the same build')
    by_line = collections.Counter()
    for i, ((where, op), (op_page, n)) in enumerate(zip(ins, exe)):
        if op != op_page:
            sys.exit(f'instruction {i}: {op} in the listing, {op_page} in the page: '
                     'not the same build')
        by_line[where] += n
    by_function = collections.Counter()
    for (path, line), n in by_line.items():
        by_function[(os.path.basename(path), enclosing_function(path, line))] += n
    print(f'{symbol}\n  {sum(by_line.values()) / units:.1f} instructions per unit')
    print('\nper unit  file: function')
    for (name, function), n in by_function.most_common(30):
        print(f'{n / units:8.1f}  {name}: {function}')
    print('\nper unit  file:line')
    for (path, line), n in by_line.most_common(30):
        print(f'{n / units:8.1f}  {os.path.basename(path)}:{line}')


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""Static SASS of one decode kernel instance's page loop, without a GPU.

Compiles PagedDecodeKernel<ARGS> alone (kernels/attention/decode_kernel.cuh, the build's nvcc
flags, sm_90) in about two seconds and prints its registers and spills (ptxas), and the
instructions of its page loop: the shortest backward branch whose body holds one page's
tensor-core products (16 HMMA a tile of 8 query heads, and one more with page weights). With a
kernel whose side kinds are known at compile time (a kKinds argument, or `--nvfp4-only`, which
makes every page of the generic kernel an NVFP4 one), the loop is the NVFP4 page's code; its
rare blocks (the rescale, the next batch of table entries, the clearing of a last page) are
counted too, so compare variants with each other, not with the profiler's executed
instructions per page (docs/results/untimed-s18/README.md).
  scripts/decode_loop_sass.py '1, 5, PageLse::kNone, true' [--nvfp4-only] [--opcodes]
Run from the repository root, on the working tree as it is (apply a variant's patch first).
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

FLAGS = ['-O3', '-DNDEBUG', '-gencode', 'arch=compute_90,code=sm_90', '--fmad=false',
         '-lineinfo', '-std=c++17', '-I.', '-Iinclude', '-Xptxas', '-v', '-cubin']
# Makes the generic kernel read every page as NVFP4 K and V with micro-blocks along head_dim,
# none of them direct FP16: the dispatch's first branch taken, the others compiled away.
NVFP4_ONLY = {
    'kernels/attention/side_kind.cuh': ('  if (kind == kNvfp4DimSide) {', '  if (true) {'),
    'kernels/attention/stage_page.cuh': ('  if (kind == kFp16Side) {\n    f(Rows<4096>());\n'
                                         '  } else if (kind <= kE5M2Side) {',
                                         '  if (false) {\n    f(Rows<4096>());\n'
                                         '  } else if (false) {'),
    'kernels/attention/decode_kernel.cuh': ('  pg.direct = pg.kinds & kDirectFp16;',
                                            '  pg.direct = false;'),
}


def page_loop(sass, tiles):
    ins = []
    for line in sass.splitlines():
        m = re.match(r'\s+/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;', line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    loops = []
    for at, text in ins:
        m = re.search(r'\bBRA\s.*?0x([0-9a-f]+)', text)
        if m and 'BRA.DIV' not in text and int(m.group(1), 16) < at:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= at]
            if 16 * tiles <= sum('HMMA' in t for t in body) <= 17 * tiles:
                loops.append(body)
    return min(loops, key=len) if loops else None


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    if len(args) != 1:
        sys.exit(__doc__)
    patched = {}
    if '--nvfp4-only' in sys.argv:
        for path, (old, new) in NVFP4_ONLY.items():
            text = open(path).read()
            if text.count(old) != 1:
                sys.exit(f'--nvfp4-only: {path} no longer has the line it replaces')
            patched[path] = text
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, 'one.cu'), os.path.join(tmp, 'one.cubin')
        with open(src, 'w') as f:
            f.write('#include "kernels/attention/decode_kernel.cuh"\n'
                    'namespace kvtier::gpu::attention {\n'
                    f'template __global__ void PagedDecodeKernel<{args[0]}>('
                    'const __grid_constant__ PagedDecodeParams);\n}\n')
        try:
            for path, text in patched.items():
                old, new = NVFP4_ONLY[path]
                open(path, 'w').write(text.replace(old, new))
            ptxas = subprocess.run(['nvcc', *FLAGS, '-o', cubin, src],
                                   capture_output=True, text=True)
        finally:
            for path, text in patched.items():
                open(path, 'w').write(text)
        if ptxas.returncode != 0:
            sys.exit(ptxas.stderr)
        usage = [l.strip() for l in ptxas.stderr.splitlines() if 'Used' in l or 'spill' in l]
        print('\n'.join(usage[:2]))
        sass = subprocess.run(['cuobjdump', '-sass', cubin], capture_output=True,
                              text=True, check=True).stdout
    body = page_loop(sass, int(args[0].split(',')[0]))
    if body is None:
        sys.exit("no loop with one page's HMMA: a generic kernel holds every kind (--nvfp4-only)")
    print(f'page loop: {len(body)} instructions')
    if '--opcodes' in sys.argv:
        ops = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', t).split()[0].split('.')[0]
                                  for t in body)
        print(' '.join(f'{o}:{n}' for o, n in ops.most_common()))


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""Static SASS of one decode kernel instance's page loop, without a GPU.

Compiles PagedDecodeKernel<ARGS> alone (kernels/attention/decode_kernel.cuh, the build's nvcc
flags, sm_90) in about two seconds and prints its registers and spills (ptxas), the
instructions of its page loop (the shortest backward branch whose body holds one page's
tensor-core products: 16 HMMA a tile of 8 query heads, one more with page weights) and its hot
path: the loop less its rare regions, the bodies of forward branches that hold the rescale (the
new unit's reciprocal, MUFU.RCP), the next batch of table entries (an LDG) or the clearing of a
last page (a CALL). With the all-NVFP4 palettes' kernel (kKinds = kNvfp4Kinds), or with
`--nvfp4-only`, which makes every page of the generic kernel (kAnyKinds) an NVFP4 one, that is
the NVFP4 page's path. It is an estimate, for comparing variants: session 15's generic kernel
executed 527 distinct instructions once a page in its profile (538 with page weights), where
`--nvfp4-only` estimates 541 (549) for it (docs/results/untimed-s18/README.md); main's
all-NVFP4 kernel since session 19 estimates 487 (499).
  scripts/decode_loop_sass.py '8, 1, 5, PageLse::kNone, true, kNvfp4Kinds' [--opcodes]
  scripts/decode_loop_sass.py '4, 1, 5, PageLse::kNone, true, kAnyKinds' --nvfp4-only
(ARGS: kWarps, kTiles, kStages, kPageLse, kUniformV, kKinds)
Run from the repository root, on the working tree as it is (apply a variant's patch first);
it writes nothing there. Needs nvcc, cuobjdump and nvdisasm (which cuobjdump runs) on PATH;
where the toolkit lacks them, NVIDIA's wheels have them: `pip download --no-deps
nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, then unzip their nvidia/cu13/bin/ (13.5 reads nvcc
13.0's sm_90 cubins).
"""
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

FLAGS = ['-O3', '-DNDEBUG', '-gencode', 'arch=compute_90,code=sm_90', '--fmad=false',
         '-lineinfo', '-std=c++17', '-Xptxas', '-v', '-cubin']
# Makes the generic kernel read every page as NVFP4 K and V with micro-blocks along head_dim,
# none of them direct FP16: the dispatch's first branch taken, the others compiled away. The
# edited copies go to an include directory searched before the tree (every include names its
# file from the repository root), which stays as it is.
NVFP4_ONLY = {
    'kernels/attention/side_kind.cuh': ('  if (kind == kNvfp4DimSide) {', '  if (true) {'),
    'kernels/attention/stage_page.cuh': ('  if (kind == kFp16Side) {\n    f(Rows<4096>());\n'
                                         '  } else if (kind <= kE5M2Side) {',
                                         '  if (false) {\n    f(Rows<4096>());\n'
                                         '  } else if (false) {'),
    'kernels/attention/decode_kernel.cuh': ('  pg.direct = pg.kinds & kDirectFp16;',
                                            '  pg.direct = false;'),
}


def parse(sass):
    """[(address, instruction)] of cuobjdump's SASS."""
    out = []
    for line in sass.splitlines():
        m = re.match(r'\s+/\*([0-9a-f]{4,5})\*/\s+(.*?)\s*;', line)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def branch_target(text):
    m = re.search(r'\bBRA\s.*?0x([0-9a-f]+)', text)
    return int(m.group(1), 16) if m and 'BRA.DIV' not in text else None


def page_loop(ins, tiles):
    loops = []
    for at, text in ins:
        target = branch_target(text)
        if target is not None and target < at:
            body = [(a, t) for a, t in ins if target <= a <= at]
            if 16 * tiles <= sum('HMMA' in t for _, t in body) <= 17 * tiles:
                loops.append(body)
    return min(loops, key=len) if loops else None


def rare_regions(body):
    """Addresses of the loop's rare regions: each marker's innermost forward-branch body."""
    regions = [(a, branch_target(t)) for a, t in body
               if t.startswith('@') and (branch_target(t) or 0) > a]
    rare = set()
    for at, text in body:
        plain = re.sub(r'^@!?P\d\s+', '', text)
        if re.match(r'(MUFU\.RCP|LDG|CALL)\b', plain):  # not LDGSTS, the staging's copies
            inner = [(s, e) for s, e in regions if s < at < e]
            if inner:
                s, e = min(inner, key=lambda r: r[1] - r[0])
                rare.update(a for a, _ in body if s < a < e)
    return rare


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    if len(args) != 1:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, 'one.cu'), os.path.join(tmp, 'one.cubin')
        shadow = os.path.join(tmp, 'shadow')
        if '--nvfp4-only' in sys.argv:
            for path, (old, new) in NVFP4_ONLY.items():
                text = open(path).read()
                if text.count(old) != 1:
                    sys.exit(f'--nvfp4-only: {path} no longer has the line it replaces')
                os.makedirs(os.path.dirname(os.path.join(shadow, path)), exist_ok=True)
                with open(os.path.join(shadow, path), 'w') as f:
                    f.write(text.replace(old, new))
        with open(src, 'w') as f:
            f.write('#include "kernels/attention/decode_kernel.cuh"\n'
                    'namespace kvtier::gpu::attention {\n'
                    f'template __global__ void PagedDecodeKernel<{args[0]}>('
                    'const __grid_constant__ PagedDecodeParams);\n}\n')
        ptxas = subprocess.run(['nvcc', *FLAGS, f'-I{shadow}', '-I.', '-Iinclude', '-o', cubin,
                                src], capture_output=True, text=True)
        if ptxas.returncode != 0:
            sys.exit(ptxas.stderr)
        usage = [l.strip() for l in ptxas.stderr.splitlines() if 'Used' in l or 'spill' in l]
        print('\n'.join(usage[:2]))
        if shutil.which('cuobjdump') is None:
            sys.exit('cuobjdump is not on PATH (this script\'s docstring says where to get it)')
        sass = subprocess.run(['cuobjdump', '-sass', cubin], capture_output=True,
                              text=True, check=True).stdout
    body = page_loop(parse(sass), int(args[0].split(',')[1]))  # ARGS' second: kTiles
    if body is None:
        sys.exit("no loop with one page's HMMA: a generic kernel holds every kind (--nvfp4-only)")
    rare = rare_regions(body)
    print(f'page loop: {len(body)} instructions, rare regions {len(rare)}, '
          f'hot path {len(body) - len(rare)}')
    if '--opcodes' in sys.argv:
        ops = collections.Counter(re.sub(r'^@!?U?P\w+\s+', '', t).split()[0].split('.')[0]
                                  for a, t in body if a not in rare)
        print('hot path:', ' '.join(f'{o}:{n}' for o, n in ops.most_common()))


if __name__ == '__main__':
    main()

#!/usr/bin/env python3
"""The peers' table of docs/benchmarks.md from one GPU run (scripts/gpu_python.sh): cuDNN SDPA
and FlashInfer from tests/bench/decode_bench.py's JSON, kvtier's kernel from kvtier_gpu_bench's
JSON of the same run (its % of the read roof measured in that run, and its splits).

  python3 tests/bench/peers_table.py OUT/decode_bench_py.json OUT/bench.json

Prints a Markdown table, one row per (batch, context) that decode_bench.py ran, and a line per
row that only kvtier ran. Speedups are cuDNN's time over kvtier's: the kernel alone (C++ bench, a
process of its own), and the library's call through a PreparedDecode from Python
(`kvtier_py_prepared_*` of decode_bench.py: launches only, in the process that timed cuDNN).
"""
import json
import re
import sys

FORMATS = ["fp16", "fp8_e4m3_block_head", "nvfp4_block_head", "balanced_mix"]
PEERS = [("flashinfer_fp16_tc", "FlashInfer FP16 tc µs"),
         ("flashinfer_fp8_tc", "FlashInfer FP8 tc µs"),
         ("flashinfer_nvfp4_tc", "FlashInfer NVFP4 tc µs")]
# decode_<format>_b<batch>_ctx<context>k_splits<n>, the plain row (no variant suffix).
KERNEL_ROW = re.compile(r"decode_(\w+?)_b(\d+)_ctx(\d+)k_splits(\d+)$")


def context_label(ctx):
    return f"{ctx // 1024}K"


def kernel_rows(bench):
    """{(format, batch, context): (us, % of the read roof, splits)} from kvtier_gpu_bench."""
    rows = {}
    for r in bench["decode"]:
        m = KERNEL_ROW.match(r["name"])
        if m:
            fmt = m.group(1)
            batch, ctx_k, splits = (int(m.group(i)) for i in (2, 3, 4))
            rows[(fmt, batch, ctx_k * 1024)] = (r["median_ms"] * 1e3, r["pct_of_read_roof"], splits)
    return rows


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        peers = json.load(f)
    with open(argv[2]) as f:
        bench = json.load(f)
    kernel = kernel_rows(bench)
    head = (["batch", "context", "cuDNN SDPA FP16 µs (TB/s)"] + [p[1] for p in PEERS] +
            [f"kvtier {n} µs (% roof)" for n in ("FP16", "FP8", "NVFP4", "balanced mix")] +
            ["kvtier speedup over cuDNN FP16: FP16 / FP8 / NVFP4 / mix",
             "kvtier PreparedDecode from Python µs: FP16 / FP8 / NVFP4 / mix",
             "its speedup over cuDNN FP16: FP16 / FP8 / NVFP4 / mix",
             "splits FP16 / FP8 / NVFP4 / mix"])
    print(f"Read roof in the same run: {bench['read_roof_tb_per_s']:.2f} TB/s ({bench['gpu']}, "
          f"{bench['date']}).\n")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    done = set()
    for r in peers["results"]:
        batch, ctx, methods = r["batch"], r["ctx"], r["methods"]
        cudnn = methods.get("cudnn_sdpa_fp16")
        cells = [str(batch), context_label(ctx),
                 f"{cudnn['median_ms'] * 1e3:.0f} ({cudnn['tb_per_s']:.2f})" if cudnn else "-"]
        cells += [f"{methods[k]['median_ms'] * 1e3:.0f}" if k in methods else "-" for k, _ in PEERS]
        ours = [kernel.get((fmt, batch, ctx)) for fmt in FORMATS]
        cells += [f"{k[0]:.0f} ({k[1]:.0f}%)" if k else "-" for k in ours]
        cells.append(" / ".join(f"{cudnn['median_ms'] * 1e3 / k[0]:.2f}" if k and cudnn else "-"
                                for k in ours))
        prepared = [methods.get(f"kvtier_py_prepared_{fmt}") for fmt in FORMATS]
        cells.append(" / ".join(f"{p['median_ms'] * 1e3:.0f}" if p else "-" for p in prepared))
        cells.append(" / ".join(f"{cudnn['median_ms'] / p['median_ms']:.2f}" if p and cudnn else "-"
                                for p in prepared))
        cells.append(" / ".join(str(k[2]) if k else "-" for k in ours))
        print("| " + " | ".join(cells) + " |")
        done.add((batch, ctx))
    for (fmt, batch, ctx), (us, pct, _) in sorted(kernel.items(), key=lambda x: (x[0][1], x[0][2])):
        if (batch, ctx) not in done:
            print(f"| {batch} | {context_label(ctx)} (kvtier only) | {fmt}: {us:.0f} µs, "
                  f"{pct:.0f}% of the roof |")


if __name__ == "__main__":
    main(sys.argv)

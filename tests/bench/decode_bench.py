#!/usr/bin/env python3
"""Decode attention on one GPU, side by side, in one run (the H200 of docs/gpu.md):

  (a) PyTorch SDPA, cuDNN backend (`sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`), on a contiguous
      FP16 cache K, V [batch, 8, ctx, 128] with q [batch, 32, 1, 128] and `enable_gqa=True`
      (no K/V expansion; if cuDNN refuses GQA the run falls back to expanded K/V and says so);
  (b) FlashInfer `BatchDecodeWithPagedKVCacheWrapper`, FP16 pages, HND, pages in random order
      (CUDA-core decode, FlashInfer's default), and the same with `use_tensor_cores=True`;
  (c) the same wrapper with FP8 E4M3 pages (per-tensor k_scale / v_scale; CUDA-core and
      tensor-core kernels), and FlashInfer's NVFP4 pages (tensor-core kernel, E4M3 micro-scales
      in `kv_cache_sf`; a software path on sm_90);
  (d) kvtier's fused kernel through the Python module, `cache.decode_attention`, for FP16,
      fp8_e4m3/block_head, nvfp4/block_head and the balanced mix of tests/bench/gpu_bench.cu
      (first page and last 256 tokens FP16, the 2048 before them fp8_e4m3/block_head, everything
      older k: nvfp4_channel/block_head, v: nvfp4/block_head). Three Python calls: with a list
      of sequences (builds the page tables on the host, uploads them, launches, synchronizes),
      with prebuilt PageTables (uploads, launches, synchronizes), and with a PreparedDecode made
      once per step (launches only: what an engine pays per layer). kvtier's kernel alone is timed by the C++
      benchmark (`kvtier_gpu_bench OUT.json`); pass that JSON with --kernel-json to print its
      numbers beside these, labelled "kvtier kernel (C++ bench)".

Grid: batch {1, 8, 64, 256} x context {1K, 8K, 32K, 128K}, 32 query heads, 8 KV heads,
head_dim 128, 16-token pages; combinations whose FP16 K/V exceed --max-gib (60 GiB: batch 256 x
128K) are skipped and listed. Timing: CUDA events around each call after 3 warm-up calls,
median of 30 runs (20 when the FP16 K/V exceeds 8 GiB); small problems rotate over enough copies
of the data to exceed 512 MiB so that they are not served from the 60 MB L2. Effective bandwidth = K/V
bytes read (payload, micro-scales, scales) / median time; "% roof" is against the 4.48 TB/s
streaming-read roof of shared/design/PERFORMANCE.md.

Writes JSON (--out) and prints a table. Runs without kvtier (parts a-c only) when the module is
missing or has no `decode_attention`.
"""
import argparse
import gc
import json
import math
import os
import re
import statistics
import sys
import time

HQ, H, D, S = 32, 8, 128, 16
GROUP = HQ // H
READ_ROOF_TBS = 4.48  # shared/design/PERFORMANCE.md, streaming read, H200
ROTATE_BYTES = 512 << 20  # rotate copies until at least this much data is touched
BALANCED_PALETTE = ["fp16", "fp8_e4m3/block_head", "k:nvfp4_channel/block_head,v:nvfp4/block_head"]


def log(*a):
    print(*a, flush=True)


def balanced_format(page, pages):
    """tests/bench/gpu_bench.cu BalancedFormat: page index -> palette index."""
    if page == 0 or page >= pages - 16:
        return 0
    return 1 if page >= pages - 16 - 128 else 2


def fp16_kv_bytes(batch, ctx):
    return batch * ctx * H * D * 2 * 2


def copies_for(bytes_one):
    return max(1, math.ceil(ROTATE_BYTES / max(1, bytes_one)))


class Timer:
    def __init__(self, torch, warmup, runs):
        self.torch, self.warmup, self.runs = torch, warmup, runs

    def __call__(self, fns):
        """Median ms of calling fns[i % len(fns)]; also p10/p90 and host wall per call."""
        torch = self.torch
        for i in range(self.warmup):
            fns[i % len(fns)]()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.runs)]
        t = time.perf_counter()
        for i in range(self.runs):
            starts[i].record()
            fns[i % len(fns)]()
            ends[i].record()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / self.runs * 1e3
        ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
        q = lambda p: ms[min(len(ms) - 1, int(p * len(ms)))]  # noqa: E731
        return dict(median_ms=statistics.median(ms), p10_ms=q(0.1), p90_ms=q(0.9),
                    host_wall_ms=wall, runs=self.runs)


def page_tables(torch, batch, ctx, device, gen):
    """FlashInfer CSR for `batch` rows of `ctx` tokens over a pool of batch*pages pages,
    pages in random order."""
    pages = (ctx + S - 1) // S
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = torch.randperm(batch * pages, generator=gen).to(torch.int32).to(device)
    last = torch.full((batch,), ctx - S * (pages - 1), dtype=torch.int32)
    return indptr, indices, last, batch * pages


def bench_cudnn(torch, t, batch, ctx, copies):
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev = "cuda"
    q = torch.randn(batch, HQ, 1, D, device=dev, dtype=torch.float16)
    k = torch.randn(copies * batch, H, ctx, D, device=dev, dtype=torch.float16)
    v = torch.randn(copies * batch, H, ctx, D, device=dev, dtype=torch.float16)
    ks = [k[i * batch:(i + 1) * batch] for i in range(copies)]
    vs = [v[i * batch:(i + 1) * batch] for i in range(copies)]
    note = "enable_gqa=True"
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        try:
            F.scaled_dot_product_attention(q, ks[0], vs[0], enable_gqa=True)
            torch.cuda.synchronize()
            fns = [lambda i=i: F.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=True)
                   for i in range(copies)]
        except RuntimeError as e:
            note = f"K/V expanded to 32 heads (cuDNN refused GQA: {str(e)[:120]})"
            ks = [x.repeat_interleave(GROUP, 1) for x in ks]
            vs = [x.repeat_interleave(GROUP, 1) for x in vs]
            fns = [lambda i=i: F.scaled_dot_product_attention(q, ks[i], vs[i]) for i in range(copies)]
        r = t(fns)
    r.update(bytes=fp16_kv_bytes(batch, ctx), note=note)
    return r


def bench_flashinfer(torch, flashinfer, t, batch, ctx, copies, kind, gen):
    """kind: fp16, fp16_tc, fp8, fp8_tc, nvfp4_tc. One plan, `copies` pools (rotation)."""
    dev = "cuda"
    indptr, indices, last, pages = page_tables(torch, batch, ctx, dev, gen)
    q = torch.randn(batch, HQ, D, device=dev, dtype=torch.float16)
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
    tc = kind.endswith("_tc")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=tc)
    total = copies * pages
    kw = {}
    if kind.startswith("fp16"):
        kv = torch.randn(total, 2, H, S, D, device=dev, dtype=torch.float16)
        kvdt, nbytes = torch.float16, fp16_kv_bytes(batch, ctx)
    elif kind.startswith("fp8"):
        kv = torch.empty(total, 2, H, S, D, device=dev, dtype=torch.float8_e4m3fn)
        for i in range(0, total, 4096):  # chunked: no FP16 copy of the whole pool
            kv[i:i + 4096] = (torch.randn(min(4096, total - i), 2, H, S, D, device=dev) * 64).to(
                torch.float8_e4m3fn)
        kvdt, nbytes = torch.float8_e4m3fn, fp16_kv_bytes(batch, ctx) // 2
        kw = dict(k_scale=0.02, v_scale=0.02)
    else:  # nvfp4: packed E2M1 [.., D/2] + E4M3 micro-scales [.., D/16]
        kv = torch.randint(0, 256, (total, 2, H, S, D // 2), device=dev, dtype=torch.uint8)
        sf = (torch.rand(total, 2, H, S, D // 16, device=dev) * 400 + 16).to(torch.float8_e4m3fn)
        kvdt = torch.uint8
        nbytes = batch * ctx * H * 2 * (D // 2 + D // 16)
        kw = dict(k_scale=0.003, v_scale=0.003)
    w.plan(indptr, indices, last, HQ, H, D, S, q_data_type=torch.float16, kv_data_type=kvdt,
           o_data_type=torch.float16)
    views = [kv[i * pages:(i + 1) * pages] for i in range(copies)]
    if kind == "nvfp4_tc":
        sfs = [sf[i * pages:(i + 1) * pages] for i in range(copies)]
        fns = [lambda i=i: w.run(q, views[i], kv_cache_sf=sfs[i], **kw) for i in range(copies)]
    else:
        fns = [lambda i=i: w.run(q, views[i], **kw) for i in range(copies)]
    r = t(fns)
    r.update(bytes=nbytes, note="HND, random page order" + (", tensor cores" if tc else ""))
    return r


def kvtier_read_bytes(cache, tokens_per_format):
    """K/V bytes read: tokens x H x D x 2 x bits_per_element / 8 (payload, micro-scales and
    scales; cache.stats() gives each format's bits per element)."""
    bits = [f["bits_per_element"] for f in cache.stats()["formats"]]
    return sum(n * H * D * 2 * bits[f] / 8 for f, n in tokens_per_format.items())


def bench_kvtier(torch, kvtier, t, batch, ctx, copies, log_prefix):
    """Returns {variant: result}: fp16, fp8_e4m3_block_head, nvfp4_block_head, balanced_mix."""
    dev = "cuda"
    out = {}
    q = torch.randn(batch, HQ, D, device=dev, dtype=torch.float32)
    o = torch.empty(batch, HQ, D, device=dev, dtype=torch.float32)
    lse = torch.empty(batch, HQ, device=dev, dtype=torch.float32)
    pages = (ctx + S - 1) // S
    total_tokens = copies * batch * ctx
    chunk = 1 << 18

    def fill(cache):
        seqs = [cache.add_sequence()[0] for _ in range(copies * batch)]
        slots = cache.append_batch(seqs, [ctx] * len(seqs))
        for i in range(0, total_tokens, chunk):
            n = min(chunk, total_tokens - i)
            k = torch.randn(n, H, D, device=dev, dtype=torch.float16)
            v = torch.randn(n, H, D, device=dev, dtype=torch.float16)
            torch.cuda.synchronize()
            cache.write_kv(0, slots[i:i + n], k, v)
            del k, v
        torch.cuda.synchronize()
        return [seqs[i * batch:(i + 1) * batch] for i in range(copies)]

    def run(cache, groups, name, tokens_per_format):
        nbytes = kvtier_read_bytes(cache, tokens_per_format)
        tables = [cache.build_page_tables(g) for g in groups]
        steps = [cache.prepare_decode(tb) for tb in tables] if hasattr(cache, "prepare_decode") else []
        for label, batches, note, sync in (
                ("", groups, "python call with a list of sequences: BuildPageTables + upload + "
                 "launch + sync", True),
                ("tables_", tables, "python call with prebuilt PageTables: upload + launch + sync",
                 True),
                ("prepared_", steps, "python call with a PreparedDecode (tables on the device, "
                 "prepared once per step): launch, no sync", False)):
            if not batches:
                continue
            fns = [lambda b=b, sync=sync: cache.decode_attention(0, b, q, o, lse, synchronize=sync)
                   for b in batches]
            r = t(fns)
            r.update(bytes=nbytes, note=note)
            out[label + name] = r
            log(f"{log_prefix} kvtier_py_{label}{name}: {r['median_ms'] * 1e3:.1f} us, "
                f"{nbytes / (r['median_ms'] * 1e-3) / 1e12:.2f} TB/s")
        if not torch.isfinite(o).all() or not torch.isfinite(lse).all():
            out[name]["note"] += "; WARNING: non-finite output"

    def demote_all(cache, groups, fmt_of):
        by_fmt = {}
        for g in groups:
            for s in g:
                for i, b in enumerate(cache.sequence_blocks(s)):
                    f = fmt_of(i, pages)
                    if f and i < ctx // S:  # full blocks only
                        by_fmt.setdefault(f, []).append(b)
        for f, blocks in sorted(by_fmt.items()):
            cache.demote(blocks, f)
        cache.end_step()
        torch.cuda.synchronize()

    fp16_bytes = fp16_kv_bytes(copies * batch, ctx)
    budget = int(fp16_bytes * 2) + (1 << 30)  # FP16 + FP8 + NVFP4 copies during demotion
    cache = kvtier.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_tokens=S,
                         budget_bytes=budget,
                         palette=["fp16", "fp8_e4m3/block_head", "nvfp4/block_head"],
                         k_tensor_amax=[4.0], v_tensor_amax=[4.0], backend="cuda")
    groups = fill(cache)
    tokens = batch * ctx
    run(cache, groups, "fp16", {0: tokens})
    demote_all(cache, groups, lambda i, n: 1)
    run(cache, groups, "fp8_e4m3_block_head", {1: tokens})
    demote_all(cache, groups, lambda i, n: 2)
    run(cache, groups, "nvfp4_block_head", {2: tokens})
    del cache, groups
    gc.collect()
    torch.cuda.synchronize()

    cache = kvtier.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_tokens=S,
                         budget_bytes=budget, palette=BALANCED_PALETTE,
                         k_tensor_amax=[4.0], v_tensor_amax=[4.0], backend="cuda")
    groups = fill(cache)
    demote_all(cache, groups, balanced_format)
    per = {0: 0, 1: 0, 2: 0}
    for i in range(pages):
        per[balanced_format(i, pages)] += batch * min(S, ctx - i * S)
    run(cache, groups, "balanced_mix", per)
    del cache, groups
    gc.collect()
    torch.cuda.synchronize()
    return out


def load_kernel_json(path):
    """{(case, batch, ctx_k): {median_ms, tb_per_s}} from kvtier_gpu_bench's JSON."""
    if not path or not os.path.exists(path):
        return {}, None
    with open(path) as f:
        data = json.load(f)
    table = {}
    for e in data.get("decode", []):
        m = re.match(r"decode_(.+)_b(\d+)_ctx(\d+)k_splits(\d+)$", e.get("name", ""))
        if m:
            table[(m.group(1), int(m.group(2)), int(m.group(3)))] = dict(
                median_ms=e["median_ms"], tb_per_s=e.get("tb_per_s"), splits=int(m.group(4)),
                bytes=e.get("bytes"))
    return table, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="decode_bench_py.json")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--contexts", default="1024,8192,32768,131072")
    ap.add_argument("--max-gib", type=float, default=60.0,
                    help="skip combinations whose FP16 K/V exceed this")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kernel-json", default=os.environ.get("KVTIER_GPU_BENCH_JSON", ""),
                    help="kvtier_gpu_bench OUT.json: kvtier's kernel alone, printed beside")
    ap.add_argument("--skip", default="", help="comma list of methods to skip "
                    "(cudnn, fi_fp16, fi_fp16_tc, fi_fp8, fi_fp8_tc, fi_nvfp4_tc, kvtier)")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    t_start = time.time()

    import torch
    if not torch.cuda.is_available():
        log("no CUDA device")
        return 2
    try:
        import flashinfer
        fi_version = flashinfer.__version__
    except Exception as e:  # noqa: BLE001
        flashinfer, fi_version = None, f"unavailable: {e}"
    kvtier, kv_note = None, ""
    try:
        import kvtier as _kv
        if hasattr(_kv.Cache, "decode_attention"):
            kvtier = _kv
        else:
            kv_note = "kvtier module has no Cache.decode_attention: part (d) skipped"
    except Exception as e:  # noqa: BLE001
        kv_note = f"kvtier module unavailable ({e}): part (d) skipped"
    if kv_note:
        log(kv_note)
    kernel_table, kernel_json = load_kernel_json(args.kernel_json)

    props = torch.cuda.get_device_properties(0)
    meta = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                cuda=torch.version.cuda, flashinfer=fi_version,
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                heads=dict(q=HQ, kv=H, head_dim=D, page=S), read_roof_tb_per_s=READ_ROOF_TBS,
                runs=args.runs, warmup=args.warmup, rotate_bytes=ROTATE_BYTES,
                kvtier=("available" if kvtier else kv_note),
                kernel_json=args.kernel_json or None)
    log(json.dumps(meta))
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)

    # FlashInfer JIT (cached under FLASHINFER_WORKSPACE_BASE if validate_external.py ran first).
    fi_kinds = [k for k in ("fi_fp16", "fi_fp16_tc", "fi_fp8", "fi_fp8_tc", "fi_nvfp4_tc")
                if k not in skip]
    if flashinfer is not None and fi_kinds:
        from concurrent.futures import ThreadPoolExecutor
        t = time.time()
        tiny = Timer(torch, 0, 1)

        def warm(k):  # JIT-compiles the module on first use; threads compile in parallel
            try:
                bench_flashinfer(torch, flashinfer, tiny, 1, 64, 1, k[3:], torch.Generator().manual_seed(1))
                return None
            except Exception as e:  # noqa: BLE001
                return f"{type(e).__name__}: {str(e)[:200]}"

        with ThreadPoolExecutor(len(fi_kinds)) as ex:
            errs = dict(zip(fi_kinds, ex.map(warm, fi_kinds)))
        for k, e in errs.items():
            if e:
                log(f"FlashInfer {k} unavailable: {e}")
                fi_kinds.remove(k)
        torch.cuda.synchronize()
        log(f"FlashInfer kernels ready in {time.time() - t:.1f}s: {fi_kinds}")
    else:
        fi_kinds = []

    results, skipped = [], []
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    for batch in batches:
        for ctx in contexts:
            nbytes = fp16_kv_bytes(batch, ctx)
            if nbytes > args.max_gib * (1 << 30):
                skipped.append(dict(batch=batch, ctx=ctx, reason=f"FP16 K/V {nbytes / (1 << 30):.0f} GiB "
                                    f"> {args.max_gib:.0f} GiB"))
                log(f"skip batch {batch} x {ctx}: {skipped[-1]['reason']}")
                continue
            copies = copies_for(nbytes)
            runs = args.runs if nbytes < (8 << 30) else max(20, args.runs // 2)
            t = Timer(torch, args.warmup, runs)
            prefix = f"[{time.time() - t_start:5.0f}s] b{batch} ctx{ctx // 1024}K"
            row = dict(batch=batch, ctx=ctx, fp16_kv_bytes=nbytes, copies=copies, methods={})

            def record(name, fn):
                try:
                    r = fn()
                    r["tb_per_s"] = r["bytes"] / (r["median_ms"] * 1e-3) / 1e12
                    r["pct_of_read_roof"] = 100 * r["tb_per_s"] / READ_ROOF_TBS
                    row["methods"][name] = r
                    log(f"{prefix} {name}: {r['median_ms'] * 1e3:.1f} us, {r['tb_per_s']:.2f} TB/s")
                except Exception as e:  # noqa: BLE001
                    row["methods"][name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                    log(f"{prefix} {name}: ERROR {type(e).__name__}: {str(e)[:300]}")
                gc.collect()
                torch.cuda.empty_cache()

            if "cudnn" not in skip:
                record("cudnn_sdpa_fp16", lambda: bench_cudnn(torch, t, batch, ctx, copies))
            for k in fi_kinds:
                record(k.replace("fi_", "flashinfer_"),
                       lambda k=k: bench_flashinfer(torch, flashinfer, t, batch, ctx, copies, k[3:], gen))
            if kvtier is not None and "kvtier" not in skip:
                try:
                    kr = bench_kvtier(torch, kvtier, t, batch, ctx, copies, prefix)
                    for name, r in kr.items():
                        r["tb_per_s"] = r["bytes"] / (r["median_ms"] * 1e-3) / 1e12
                        r["pct_of_read_roof"] = 100 * r["tb_per_s"] / READ_ROOF_TBS
                        row["methods"]["kvtier_py_" + name] = r
                except Exception as e:  # noqa: BLE001
                    row["methods"]["kvtier_py"] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                    log(f"{prefix} kvtier: ERROR {type(e).__name__}: {str(e)[:300]}")
                gc.collect()
                torch.cuda.empty_cache()
            for case in ("fp16", "fp8_e4m3_block_head", "nvfp4_block_head", "balanced_mix"):
                k = kernel_table.get((case, batch, ctx // 1024))
                if k:
                    row["methods"]["kvtier_kernel_cpp_" + case] = dict(
                        median_ms=k["median_ms"], tb_per_s=k["tb_per_s"], bytes=k["bytes"],
                        pct_of_read_roof=100 * (k["tb_per_s"] or 0) / READ_ROOF_TBS,
                        note=f"kvtier_gpu_bench, kernel alone, splits {k['splits']}")
            cud = row["methods"].get("cudnn_sdpa_fp16", {}).get("median_ms")
            if cud:
                for r in row["methods"].values():
                    if r.get("median_ms"):
                        r["speedup_vs_cudnn"] = cud / r["median_ms"]
            results.append(row)

    doc = dict(meta=meta, results=results, skipped=skipped, elapsed_s=time.time() - t_start)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)

    log("\nDecode, 32 q / 8 KV heads, head_dim 128, 16-token pages. us = median per call; TB/s = K/V "
        "bytes read / time; % = of the 4.48 TB/s read roof; x = speed-up over cuDNN SDPA FP16.\n"
        "kvtier_py_* = Python call incl. host tables + upload + sync; kvtier_py_prepared_* = "
        "Python call with a PreparedDecode (launch only); "
        "kvtier_kernel_cpp_* = kernel alone from kvtier_gpu_bench.")
    log(f"{'batch':>5s} {'ctx':>5s}  {'method':36s} {'us':>10s} {'TB/s':>6s} {'%roof':>6s} {'x cuDNN':>8s}")
    for row in results:
        for n, r in row["methods"].items():
            head = f"{row['batch']:5d} {row['ctx'] // 1024:4d}K  {n:36s}"
            if "error" in r:
                log(f"{head} error: {r['error'][:80]}")
            else:
                log(f"{head} {r['median_ms'] * 1e3:10.1f} {r['tb_per_s']:6.2f} "
                    f"{r['pct_of_read_roof']:6.1f} {r.get('speedup_vs_cudnn', float('nan')):8.2f}")
    for s in skipped:
        log(f"skipped batch {s['batch']} x {s['ctx']}: {s['reason']}")
    log(f"wrote {args.out} in {time.time() - t_start:.0f}s")
    errors = [(row["batch"], row["ctx"], n) for row in results for n, r in row["methods"].items()
              if "error" in r]
    if errors:
        log(f"{len(errors)} method(s) failed: {errors[:10]}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

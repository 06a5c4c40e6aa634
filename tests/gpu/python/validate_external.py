#!/usr/bin/env python3
"""kvtier's page-table adapters against the real external kernels, and kvtier's fused decode
kernel against all of them, on one GPU (the H200 of docs/gpu.md; run by scripts/gpu_python.sh).

Every check attends the same bytes two ways. A CUDA cache and a CPU "mirror" cache get identical
calls (same sequences, same FP16 K/V, same demotions; the CUDA backend writes bit-identical
pages, docs/gpu.md), and:
  - reference = the mirror's CPU reference attention (`reference_attention`,
    `reference_attention_part`: float32, natural-log LSE);
  - FlashInfer 0.6.x `BatchDecodeWithPagedKVCacheWrapper(kv_layout="HND")` reads the CUDA
    cache's pools through `cache.flashinfer_parts` / `cache.flashinfer_layer` (DLPack, no copy),
    one call per format part: FP16 and FP8 E4M3 (`fp8_e4m3/tensor`, k_scale / v_scale from the
    adapter) on the CUDA-core decode kernel and on the tensor-core (prefill) kernel, NVFP4
    (`nvfp4/tensor`, `kv_cache_sf`) on the tensor-core kernel; FlashInfer's base-2 LSE is
    converted with `kvtier.base2_to_natural_lse`;
  - mixed sequences (old blocks FP8 / NVFP4, recent blocks FP16) are attended as one FlashInfer
    call per format and merged by LSE three ways: `flashinfer.merge_state`, kvtier's GPU merge
    (`kvtier.merge_states`) and kvtier's CPU merge (`kvtier.merge_partial_states`);
  - PyTorch FlexAttention: `torch.nn.attention.experimental._paged_attention.PagedAttention`
    with the adapter's `flex_attention_parts` page table (int64), physical_to_logical and
    seq_lens (kv_len), BlockMask BLOCK_SIZE = 16, over K/V gathered on the GPU from the pool view
    (FP16 only), eager and torch.compile'd;
  - kvtier's fused kernel, `cache.decode_attention(layer, seqs, q, out, lse)`, over the packed
    table: against the reference, and against the FlashInfer results; also for the formats no
    external kernel reads (fp8_e4m3/block_head, nvfp4/block_head, nvfp4_channel K), whose
    adapter refusal is checked too.

Prints a table and a final 'N passed, N failed' line, writes JSON (--out), exits 1 on any
failure. `--backend cpu` runs only the kvtier side (both caches on the CPU, no torch), to test
the script itself on a machine without a GPU.
"""
import argparse
import json
import math
import sys
import time
import traceback

import numpy as np

# ---- Tolerances: (relative L2 error of the output per (sequence, head), absolute LSE error in
# natural log). Both sides read identical stored bytes, so the errors are arithmetic only. ----
TOL_FI = (2e-3, 2e-3)          # FlashInfer FP16 / FP8 (FP16 output; measured ~5e-4 / 1.6e-4)
TOL_FI_NVFP4 = (5e-3, 5e-3)    # FlashInfer NVFP4, tensor-core path (measured ~5e-4 / 1.4e-4)
TOL_FUSED = (5e-3, 5e-3)       # kvtier's fused kernel (tests/gpu/decode_attention_test.cc)
TOL_FLEX = (2e-3, 2e-3)        # FlexAttention, FP16 in and out
TOL_MERGE_CPU = (1e-5, 1e-5)   # kvtier merges of the same partial states, against each other

HQ, H, D, S = 32, 8, 128, 16
GROUP = HQ // H
LAYERS = 2
LAYER = 1  # checks attend layer 1, so that a layer offset in a view would show
PALETTE_FI = ["fp16", "fp8_e4m3/tensor", "nvfp4/tensor"]
PALETTE_KV = ["fp16", "fp8_e4m3/block_head", "nvfp4/block_head",
              "k:nvfp4_channel/block_head,v:nvfp4/block_head"]
AMAX = 8.0  # per-tensor amax of every layer's K and V (FP8/NVFP4 tensor scales)


def log(*a):
    print(*a, flush=True)


# ---- Results ----

class Report:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, tol=None, out_err=None, lse_err=None, note=""):
        status = "PASS" if ok is True else ("SKIP" if ok is None else "FAIL")
        self.rows.append(dict(check=name, status=status, out_rel_l2=out_err, lse_abs=lse_err,
                              tol=tol, note=note))
        e = lambda x: "-" if x is None else f"{x:.2e}"  # noqa: E731
        t = "-" if tol is None else f"{tol[0]:.0e}/{tol[1]:.0e}"
        log(f"{status:4s}  {name:58s} out {e(out_err):>9s}  lse {e(lse_err):>9s}  tol {t:>11s}  {note}")

    def compare(self, name, out, lse, ref_out, ref_lse, tol, rows=None, note=""):
        """out/lse vs ref: per (row, head) relative L2 of out, absolute LSE. Rows whose reference
        LSE is -inf (empty sequences) must give out == 0 and LSE == -inf."""
        out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
        ref_out, ref_lse = np.asarray(ref_out, np.float64), np.asarray(ref_lse, np.float64)
        if rows is not None:
            out, lse, ref_out, ref_lse = out[rows], lse[rows], ref_out[rows], ref_lse[rows]
        if out.shape != ref_out.shape or lse.shape != ref_lse.shape:
            self.add(name, False, tol, note=f"shape {out.shape}/{lse.shape} vs {ref_out.shape}/{ref_lse.shape}")
            return False
        empty = np.isneginf(ref_lse)
        live = ~empty
        with np.errstate(invalid="ignore"):
            num = np.linalg.norm(out - ref_out, axis=-1)
            den = np.maximum(np.linalg.norm(ref_out, axis=-1), 1e-30)
            rel = np.where(live, num / den, 0.0)
            lse_err = np.where(live, np.abs(lse - ref_lse), 0.0)
        bad_empty = bool(np.any(empty & (~np.isneginf(lse) | (np.abs(out).max(axis=-1) != 0))))
        finite = bool(np.all(np.isfinite(out[live])) and np.all(np.isfinite(lse[live])))
        oe = float(rel.max()) if rel.size else 0.0
        le = float(lse_err.max()) if lse_err.size else 0.0
        ok = finite and not bad_empty and oe <= tol[0] and le <= tol[1]
        extra = note
        if not finite:
            extra += " non-finite output"
        if bad_empty:
            extra += " empty sequence not (0, -inf)"
        if oe > tol[0] or le > tol[1]:
            i = np.unravel_index(int(np.argmax(rel if oe > tol[0] else lse_err)), rel.shape)
            extra += f" worst at (row {i[0]}, head {i[1]})"
        self.add(name, ok, tol, oe, le, extra.strip())
        return ok

    def summary(self):
        p = sum(r["status"] == "PASS" for r in self.rows)
        f = sum(r["status"] == "FAIL" for r in self.rows)
        s = sum(r["status"] == "SKIP" for r in self.rows)
        return p, f, s


R = Report()


def guarded(name):
    """Runs a check body; an exception is a FAIL carrying the message."""
    def deco(fn):
        def run(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                R.add(name if isinstance(name, str) else name(*a), False,
                      note=f"{type(e).__name__}: {str(e)[:300]}")
                return None
        return run
    return deco


# ---- A CUDA cache and its CPU mirror, driven with identical calls ----

class Pair:
    def __init__(self, kvtier, palette, backend, torch=None, budget=4 << 30):
        args = dict(num_layers=LAYERS, num_kv_heads=H, head_dim=D, block_tokens=S,
                    budget_bytes=budget, palette=list(palette), k_tensor_amax=[AMAX] * LAYERS,
                    v_tensor_amax=[AMAX] * LAYERS)
        self.torch = torch
        self.cuda = backend == "cuda"
        self.dev = kvtier.Cache(backend=backend, **args)
        self.ref = kvtier.Cache(backend="cpu", **args) if self.cuda else self.dev
        self.palette = list(palette)
        self.seqs = []  # (dev seq, ref seq, length)

    def add(self, length, rng):
        sd, _ = self.dev.add_sequence()
        sr = self.ref.add_sequence()[0] if self.cuda else sd
        if length:
            slots_d = self.dev.append(sd, length)
            slots_r = self.ref.append(sr, length) if self.cuda else slots_d
            for layer in range(LAYERS):
                k = (rng.standard_normal((length, H, D)) * 1.5).astype(np.float16)
                v = rng.standard_normal((length, H, D)).astype(np.float16)
                if self.cuda:
                    kt = self.torch.from_numpy(k).cuda()
                    vt = self.torch.from_numpy(v).cuda()
                    self.torch.cuda.synchronize()
                    self.dev.write_kv(layer, slots_d, kt, vt)
                    self.ref.write_kv(layer, slots_r, k, v)
                else:
                    self.dev.write_kv(layer, slots_d, k, v)
        self.seqs.append((sd, sr, length))
        return len(self.seqs) - 1

    def demote(self, idx, formats):
        """formats[i]: palette index for full block i of sequence idx (0 keeps it)."""
        sd, sr, _ = self.seqs[idx]
        for cache, seq in ((self.dev, sd), (self.ref, sr)) if self.cuda else ((self.dev, sd),):
            blocks = cache.sequence_blocks(seq)
            by = {}
            for i, f in enumerate(formats):
                if f:
                    by.setdefault(f, []).append(blocks[i])
            for f in sorted(by):
                cache.demote(by[f], f)

    def batch(self, idxs):
        dev = [self.seqs[i][0] for i in idxs]
        ref = [self.seqs[i][1] for i in idxs]
        return dev, ref, [self.seqs[i][2] for i in idxs]

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def split_formats(length, fractions):
    """Full blocks of a sequence, oldest first, by fractions [(format, share), ...] in order;
    the rest (and the partial tail) stay FP16."""
    full = length // S
    out, start = [0] * full, 0
    for f, share in fractions:
        n = int(math.ceil(full * share))
        for i in range(start, min(full, start + n)):
            out[i] = f
        start += n
    return out


def balanced_formats(length, cold):
    """As tests/bench/gpu_bench.cu: the first page and the last 16 pages FP16, the 128 before
    them FP8 (format 1), older `cold`; partial tail FP16."""
    full = length // S
    pages = (length + S - 1) // S
    out = []
    for i in range(full):
        if i == 0 or i >= pages - 16:
            out.append(0)
        else:
            out.append(1 if i >= pages - 16 - 128 else cold)
    return out


# ---- FlashInfer ----

KV_DTYPES = {"float16": "float16", "bfloat16": "bfloat16", "float8_e4m3fn": "float8_e4m3fn",
             "float8_e5m2": "float8_e5m2", "float4_e2m1x2": "uint8"}


class FlashInferRunner:
    def __init__(self, torch, flashinfer):
        self.torch, self.fi = torch, flashinfer
        self.ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")

    def pool(self, cache, fmt, layer):
        torch = self.torch
        view = cache.flashinfer_layer(fmt, layer)
        kv = torch.from_dlpack(view["kv"])
        assert kv.data_ptr() == view["kv"].data_ptr, "the DLPack view copied"
        assert kv.is_cuda and tuple(kv.shape[1:4]) == (2, H, S), tuple(kv.shape)
        tag = view["kv"].dtype
        kv = kv.view(getattr(torch, KV_DTYPES[tag]))
        sf = None
        if view["kv_cache_sf"] is not None:
            sf = torch.from_dlpack(view["kv_cache_sf"]).view(torch.float8_e4m3fn)
        return kv, sf, view["k_scale"], view["v_scale"], tag

    def run(self, cache, part, layer, q16, tensor_cores=False, k_scale=None, v_scale=None):
        """One FlashInfer decode call over one format part: (out fp16 [rows, HQ, D], base-2 lse)."""
        torch = self.torch
        kv, sf, ks, vs, tag = self.pool(cache, part["format"], layer)
        ks = ks if k_scale is None else k_scale
        vs = vs if v_scale is None else v_scale
        w = self.fi.BatchDecodeWithPagedKVCacheWrapper(self.ws, "HND", use_tensor_cores=tensor_cores)
        indices = torch.from_numpy(part["indices"]).cuda()
        w.plan(torch.from_numpy(part["indptr"]), indices, torch.from_numpy(part["last_page_len"]),
               HQ, H, D, S, q_data_type=torch.float16, kv_data_type=kv.dtype,
               o_data_type=torch.float16)
        bi = torch.from_numpy(part["batch_index"].astype(np.int64)).cuda()
        kw = dict(k_scale=float(ks), v_scale=float(vs), return_lse=True)
        if sf is not None:
            kw["kv_cache_sf"] = sf
        out, lse = w.run(q16.index_select(0, bi).contiguous(), kv, **kw)
        torch.cuda.synchronize()
        return out, lse


def fi_warm(torch, flashinfer, kinds):
    """JIT-compiles the FlashInfer modules used here, in parallel threads (each is its own ninja
    build under FLASHINFER_WORKSPACE_BASE, MAX_JOBS jobs): one tiny plan + run per variant."""
    from concurrent.futures import ThreadPoolExecutor

    def one(kind):
        t = time.time()
        try:
            if kind == "cascade":
                a = torch.zeros(1, HQ, D, dtype=torch.float16, device="cuda")
                s = torch.zeros(1, HQ, dtype=torch.float32, device="cuda")
                flashinfer.merge_state(a, s, a, s)
            else:
                fmt, tc = kind.split("/")
                pages = 4
                if fmt == "nvfp4":
                    kv = torch.zeros(pages, 2, H, S, D // 2, dtype=torch.uint8, device="cuda")
                    sf = torch.ones(pages, 2, H, S, D // 16, device="cuda").to(torch.float8_e4m3fn)
                else:
                    dt = torch.float16 if fmt == "fp16" else torch.float8_e4m3fn
                    kv = torch.zeros(pages, 2, H, S, D, device="cuda").to(dt)
                    sf = None
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    torch.zeros(16 << 20, dtype=torch.uint8, device="cuda"), "HND",
                    use_tensor_cores=tc == "tc")
                w.plan(torch.tensor([0, pages], dtype=torch.int32),
                       torch.arange(pages, dtype=torch.int32, device="cuda"),
                       torch.tensor([S], dtype=torch.int32), HQ, H, D, S,
                       q_data_type=torch.float16, kv_data_type=kv.dtype, o_data_type=torch.float16)
                q = torch.zeros(1, HQ, D, dtype=torch.float16, device="cuda")
                kw = dict(return_lse=True)
                if sf is not None:
                    kw["kv_cache_sf"] = sf
                w.run(q, kv, **kw)
            torch.cuda.synchronize()
            return kind, time.time() - t, None
        except Exception as e:  # noqa: BLE001
            return kind, time.time() - t, f"{type(e).__name__}: {str(e)[:400]}"

    with ThreadPoolExecutor(len(kinds)) as ex:
        return list(ex.map(one, kinds))


FI_KINDS = ["fp16/cc", "fp8/cc", "fp16/tc", "fp8/tc", "nvfp4/tc", "cascade"]


# ---- The checks ----

class Validator:
    def __init__(self, args, kvtier, torch, flashinfer):
        self.args, self.kv, self.torch, self.fi = args, kvtier, torch, flashinfer
        self.cuda = args.backend == "cuda"
        self.fir = FlashInferRunner(torch, flashinfer) if (self.cuda and flashinfer) else None
        self.has_fused = hasattr(kvtier.Cache, "decode_attention")
        self.has_merge = hasattr(kvtier, "merge_states")

    # q: float32 values exactly representable in FP16, so every kernel sees the same query.
    def queries(self, batch, seed):
        q = np.random.default_rng(seed).standard_normal((batch, HQ, D)).astype(np.float16)
        return q.astype(np.float32)

    def to_dev(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a)).cuda() if self.cuda else a

    def to_np(self, t):
        return t.detach().float().cpu().numpy() if self.cuda else np.asarray(t)

    def fused(self, pair, seqs_dev, q, name, layer=LAYER):
        """kvtier's kernel: (out, lse) as numpy, or None when the module lacks it."""
        if not self.has_fused:
            R.add(name, False if self.cuda else None,
                  note="kvtier module has no Cache.decode_attention")
            return None
        if self.cuda:
            torch = self.torch
            qt = self.to_dev(q)
            out = torch.full((len(seqs_dev), HQ, D), float("nan"), device="cuda")
            lse = torch.full((len(seqs_dev), HQ), float("nan"), device="cuda")
            pair.dev.decode_attention(layer, seqs_dev, qt, out, lse)
            torch.cuda.synchronize()
            return out.cpu().numpy(), lse.cpu().numpy()
        out = np.full((len(seqs_dev), HQ, D), np.nan, np.float32)
        lse = np.full((len(seqs_dev), HQ), np.nan, np.float32)
        pair.dev.decode_attention(layer, seqs_dev, q, out, lse)
        return out, lse

    def check_parts_match(self, name, pair, tables_dev, tables_ref):
        dp = pair.dev.flashinfer_parts(tables_dev)
        rp = pair.ref.flashinfer_parts(tables_ref)
        ok = [p["format"] for p in dp] == [p["format"] for p in rp] and all(
            np.array_equal(a[k], b[k]) for a, b in zip(dp, rp)
            for k in ("indptr", "last_page_len", "batch_index", "lengths"))
        R.add(f"{name}: FlashInfer parts, CUDA cache == CPU mirror", ok,
              note=f"formats {[p['format_name'] for p in dp]}")
        return dp

    def flashinfer_batch(self, name, pair, idxs, seed, tensor_cores_too=True):
        """FlashInfer per part vs the reference part, merges vs the whole reference, and the
        fused kernel vs both."""
        kv = self.kv
        seqs_dev, seqs_ref, lens = pair.batch(idxs)
        B = len(idxs)
        q = self.queries(B, seed)
        pair.sync()
        td = pair.dev.build_page_tables(seqs_dev)
        tr = pair.ref.build_page_tables(seqs_ref)
        ok_lens = list(td.seq_lens) == list(lens) == list(tr.seq_lens)
        R.add(f"{name}: page-table lengths (B={B}, max {max(lens)})", ok_lens)
        parts = self.check_parts_match(name, pair, td, tr)
        ref_out, ref_lse = pair.ref.reference_attention(LAYER, tr, q)
        live = np.array([n > 0 for n in lens])

        states_fi = []  # (batch_index, out fp16 torch, lse2 torch) per part
        for p in parts:
            fmt_name = p["format_name"]
            bi = p["batch_index"]
            po, pl, pbi = pair.ref.reference_attention_part(LAYER, tr, p["format"], q[bi])
            assert np.array_equal(pbi, bi)
            if not self.cuda or self.fir is None:
                if self.cuda:
                    R.add(f"{name}: FlashInfer {fmt_name}", False, note="flashinfer not importable")
                states_fi.append(None)
                continue
            nvfp4 = fmt_name.startswith("nvfp4")
            tol = TOL_FI_NVFP4 if nvfp4 else TOL_FI
            q16 = self.to_dev(q).half()
            variants = [True] if nvfp4 else ([False, True] if tensor_cores_too else [False])
            kept = None
            for tc in variants:
                label = f"{name}: FlashInfer {fmt_name} part ({'tensor-core' if tc else 'CUDA-core'}) vs reference part"
                try:
                    out, lse2 = self.fir.run(pair.dev, p, LAYER, q16, tensor_cores=tc)
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    R.add(label, False, tol, note=f"{type(e).__name__}: {str(e)[:300]}")
                    continue
                lse_nat = kv.base2_to_natural_lse(lse2.cpu().numpy())
                good = R.compare(label, out.float().cpu().numpy(), lse_nat, po, pl, tol,
                                 note=f"rows {len(bi)}, k_scale {self.fir.pool(pair.dev, p['format'], LAYER)[2]:.6g}")
                if nvfp4 and not good:
                    self.diagnose_nvfp4(name, pair, p, q16, po, pl)
                if kept is None or not tc:
                    kept = (bi, out, lse2)
            states_fi.append(kept)

        # Merges of the FlashInfer partial states, against the whole reference.
        if self.cuda and self.fir is not None and states_fi and all(s is not None for s in states_fi):
            self.merges(name, B, states_fi, ref_out, ref_lse, live,
                        tol=TOL_FI_NVFP4 if any(p["format_name"].startswith("nvfp4") for p in parts)
                        else TOL_FI)
        elif not self.cuda:
            # CPU dry run: the reference parts stand in for FlashInfer (as docs/adapters.md).
            states = []
            for p in parts:
                po, pl, bi = pair.ref.reference_attention_part(LAYER, tr, p["format"], q[p["batch_index"]])
                states.append((bi, po, kv.natural_to_base2_lse(pl), "base2"))
            mo, ml = kv.merge_partial_states(B, states)
            R.compare(f"{name}: CPU merge of reference parts vs whole (dry run)", mo, ml, ref_out,
                      ref_lse, TOL_MERGE_CPU)
            if self.has_merge and len(states) > 1:  # kvtier.merge_states on numpy (CPU merge)
                v = np.zeros((B, HQ, D), np.float32)
                s = np.full((B, HQ), -np.inf, np.float32)
                for bi, po, pl2, _ in states:
                    o = np.zeros_like(v)
                    l = np.full_like(s, -np.inf)
                    o[bi], l[bi] = po, kv.base2_to_natural_lse(pl2)
                    kv.merge_states(v, s, o, l, v, s)
                R.compare(f"{name}: kvtier.merge_states (numpy) of reference parts vs whole (dry run)",
                          v, s, ref_out, ref_lse, TOL_MERGE_CPU)

        fused = self.fused(pair, seqs_dev, q, f"{name}: kvtier fused kernel vs reference")
        if fused is not None:
            R.compare(f"{name}: kvtier fused kernel vs reference", fused[0], fused[1], ref_out,
                      ref_lse, TOL_FUSED, note=f"B={B}")
            if self.fi_merged is not None:
                fo, fl = self.fi_merged
                tol = TOL_FI_NVFP4 if any(p["format_name"].startswith("nvfp4") for p in parts) else TOL_FI
                R.compare(f"{name}: kvtier fused kernel vs FlashInfer (merged)", fused[0],
                          fused[1], fo, fl, (tol[0] + TOL_FUSED[0], tol[1] + TOL_FUSED[1]),
                          rows=live)
        self.fi_merged = None
        return q, td, tr, ref_out, ref_lse

    fi_merged = None

    def merges(self, name, B, states_fi, ref_out, ref_lse, live, tol):
        """FlashInfer part states merged by flashinfer.merge_state, kvtier.merge_states (GPU) and
        kvtier.merge_partial_states (CPU)."""
        torch, kv, fi = self.torch, self.kv, self.fi
        full_o16, full_l2 = [], []
        for bi, out, lse2 in states_fi:
            o = torch.zeros(B, HQ, D, dtype=torch.float16, device="cuda")
            l2 = torch.full((B, HQ), float("-inf"), dtype=torch.float32, device="cuda")
            idx = torch.from_numpy(bi.astype(np.int64)).cuda()
            o[idx] = out
            l2[idx] = lse2
            full_o16.append(o)
            full_l2.append(l2)
        # CPU merge (the documented route), FlashInfer's base-2 states as they come.
        cpu_states = [(bi, out.float().cpu().numpy(), lse2.cpu().numpy(), "base2")
                      for bi, out, lse2 in states_fi]
        mo, ml = kv.merge_partial_states(B, cpu_states)
        R.compare(f"{name}: FlashInfer parts + kvtier.merge_partial_states (CPU) vs reference",
                  mo, ml, ref_out, ref_lse, tol, note=f"{len(states_fi)} part(s)")
        self.fi_merged = (mo, ml)
        if len(states_fi) == 1:
            return
        # flashinfer.merge_state: FP16 v, base-2 s; rows with no part at all (empty sequences)
        # are left out, FlashInfer gives NaN there.
        try:
            v, s = full_o16[0], full_l2[0]
            for o, l2 in zip(full_o16[1:], full_l2[1:]):
                v, s = fi.merge_state(v, s, o, l2)
            torch.cuda.synchronize()
            R.compare(f"{name}: FlashInfer parts + flashinfer.merge_state vs reference",
                      v.float().cpu().numpy(), kv.base2_to_natural_lse(s.cpu().numpy()),
                      ref_out, ref_lse, tol, rows=live)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            R.add(f"{name}: FlashInfer parts + flashinfer.merge_state vs reference", False, tol,
                  note=f"{type(e).__name__}: {str(e)[:300]}")
        # kvtier's GPU merge: float32, natural LSE.
        label = f"{name}: FlashInfer parts + kvtier.merge_states (GPU) vs reference"
        if not self.has_merge:
            R.add(label, False, note="kvtier module has no merge_states")
            return
        try:
            ln2 = math.log(2.0)
            v = full_o16[0].float().contiguous()
            s = (full_l2[0] * ln2).contiguous()
            for o, l2 in zip(full_o16[1:], full_l2[1:]):
                out = torch.empty_like(v)
                lse = torch.empty_like(s)
                kv.merge_states(v, s, o.float().contiguous(), (l2 * ln2).contiguous(), out, lse)
                torch.cuda.synchronize()
                v, s = out, lse
            R.compare(label, v.cpu().numpy(), s.cpu().numpy(), ref_out, ref_lse, tol)
            R.compare(f"{name}: kvtier.merge_states (GPU) vs merge_partial_states (CPU)",
                      v.cpu().numpy(), s.cpu().numpy(), mo, ml, (1e-5, 1e-5))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            R.add(label, False, tol, note=f"{type(e).__name__}: {str(e)[:300]}")

    def diagnose_nvfp4(self, name, pair, part, q16, po, pl):
        """Which k_scale/v_scale FlashInfer needs for kvtier's NVFP4 bytes: the adapter's value
        or the pool's decode multiplier d (kvtier's tensor scale)."""
        pool = pair.dev.pool(part["format"], LAYER)
        view = pair.dev.flashinfer_layer(part["format"], LAYER)
        ks, vs = pool["k_tensor_scale"], pool["v_tensor_scale"]
        out, lse2 = self.fir.run(pair.dev, part, LAYER, q16, tensor_cores=True, k_scale=ks, v_scale=vs)
        R.compare(f"{name}: diagnosis: FlashInfer NVFP4 with k_scale = pool decode multiplier d",
                  out.float().cpu().numpy(), self.kv.base2_to_natural_lse(lse2.cpu().numpy()), po, pl,
                  TOL_FI_NVFP4,
                  note=f"adapter k_scale {view['k_scale']:.6g} = {view['k_scale'] / ks:.3g} x d ({ks:.6g})")

    # ---- FlexAttention ----

    def flex_batch(self, name, pair, idxs, q, td, tr, ref_out, ref_lse):
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        (part,) = pair.dev.flex_attention_parts(td)
        (rpart,) = pair.ref.flex_attention_parts(tr)
        same = all(np.array_equal(part[k], rpart[k]) for k in ("batch_index", "seq_lens")) and \
            part["n_pages"] == rpart["n_pages"]
        R.add(f"{name}: FlexAttention parts, CUDA cache == CPU mirror", same,
              note=f"n_pages {part['n_pages']}, page_table {part['page_table'].dtype}")
        rows, n = len(part["batch_index"]), part["n_pages"]
        kv, _, _, _, _ = self.fir.pool(pair.dev, part["format"], LAYER) if self.fir else \
            FlashInferRunner(torch, None).pool(pair.dev, part["format"], LAYER)
        src = torch.from_numpy(part["source_pages"].astype(np.int64)).cuda()
        k = kv[src, 0].permute(1, 0, 2, 3).reshape(1, H, n * S, D).contiguous()
        v = kv[src, 1].permute(1, 0, 2, 3).reshape(1, H, n * S, D).contiguous()
        # The GPU gather equals the adapter's CPU copy (GatherFlexKV) of the mirror, bit for bit.
        ck, cv = pair.ref.gather_flex_kv(rpart["format"], LAYER, rpart["source_pages"])
        same_bytes = np.array_equal(k.cpu().numpy().view(np.uint16), ck.view(np.uint16)) and \
            np.array_equal(v.cpu().numpy().view(np.uint16), cv.view(np.uint16))
        R.add(f"{name}: K/V gathered on the GPU == gather_flex_kv of the mirror", same_bytes,
              note=f"(1, {H}, {n * S}, {D})")
        pa = PagedAttention(n, S, rows, device="cuda")
        pa.page_table.copy_(torch.from_numpy(part["page_table"]))
        pa.physical_to_logical.copy_(torch.from_numpy(part["physical_to_logical"]))
        kv_len = torch.from_numpy(part["seq_lens"].astype(np.int64)).cuda()
        max_pages = int((part["page_table"] >= 0).sum(axis=1).max())

        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx < kv_len[b]

        bm = create_block_mask(mask_mod, rows, None, 1, max_pages * S, device="cuda", BLOCK_SIZE=S)
        cbm = pa.convert_logical_block_mask(bm, kv_len=kv_len)
        smod = pa.get_score_mod(None, kv_len=kv_len)
        bi = part["batch_index"]
        qq = torch.from_numpy(q[bi]).cuda().half().view(rows, HQ, 1, D)
        for compiled in (False, True):
            label = f"{name}: FlexAttention PagedAttention ({'compiled' if compiled else 'eager'}) vs reference"
            # Compiled with static shapes: a recompile for a second batch size with dynamic
            # shapes lowers through the non-decoding template, which refuses 16-token blocks
            # ("Q and KV block size must be divisible by BLOCK_M and BLOCK_N"). If a compile still
            # fails, retry once with 16 x 16 tiles.
            options = [None, {"BLOCK_M": 16, "BLOCK_N": 16}] if compiled else [None]
            first_error = None
            for opt in options:
                try:
                    f = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
                    kw = dict(block_mask=cbm, score_mod=smod, enable_gqa=True, return_lse=True)
                    if opt:
                        kw["kernel_options"] = opt
                    t = time.time()
                    out, lse = f(qq, k, v, **kw)
                    torch.cuda.synchronize()
                    note = f"rows {rows}, first call {time.time() - t:.1f}s"
                    if opt:
                        note += f", kernel_options {opt} (default failed: {first_error})"
                    R.compare(label, out.view(rows, HQ, D).float().cpu().numpy(),
                              lse.view(rows, HQ).float().cpu().numpy(), ref_out[bi], ref_lse[bi],
                              TOL_FLEX, note=note)
                    break
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    first_error = first_error or f"{type(e).__name__}: {str(e)[:160]}"
                    if opt is options[-1]:
                        R.add(label, False, TOL_FLEX, note=f"{type(e).__name__}: {str(e)[:300]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="validate.json")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: kvtier side only (both caches on the CPU, no torch)")
    ap.add_argument("--quick", action="store_true", help="shorter sequences (longest 4097)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()
    t0 = time.time()
    import kvtier
    torch = flashinfer = None
    meta = dict(backend=args.backend, tolerances=dict(
        flashinfer=TOL_FI, flashinfer_nvfp4=TOL_FI_NVFP4, fused=TOL_FUSED, flex=TOL_FLEX),
        kvtier_module=kvtier.__file__, has_decode_attention=hasattr(kvtier.Cache, "decode_attention"),
        has_merge_states=hasattr(kvtier, "merge_states"))
    warm = None
    if args.backend == "cuda":
        import torch
        meta.update(torch=torch.__version__, cuda=torch.version.cuda,
                    gpu=torch.cuda.get_device_name())
        try:
            import flashinfer
            meta["flashinfer"] = flashinfer.__version__
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            meta["flashinfer"] = f"import failed: {e}"
        if flashinfer is not None:  # compile while the caches are filled
            from concurrent.futures import ThreadPoolExecutor
            warm = ThreadPoolExecutor(1).submit(fi_warm, torch, flashinfer, FI_KINDS)
    log(json.dumps(meta))
    rng = np.random.default_rng(args.seed)
    long_len = 4097 if args.quick else 32768
    V = Validator(args, kvtier, torch, flashinfer)

    # Scenario A: formats FlashInfer reads.
    t = time.time()
    A = Pair(kvtier, PALETTE_FI, args.backend, torch)
    ragged = [A.add(n, rng) for n in (1, 15, 16, 17, 1000, 4097, long_len)]
    b64_lens = list(rng.integers(1, 2049, 62)) + [16, 2048]
    b64 = [A.add(int(n), rng) for n in b64_lens]
    fp8_lens = [16, 17, 100, 1000, 4097, long_len, 1, 0]
    fp8 = [A.add(n, rng) for n in fp8_lens]
    for i, n in zip(fp8, fp8_lens):
        A.demote(i, split_formats(n, [(1, 0.75)]))
    three_lens = [48, 1000, 4097, 17, 0, 300]
    three = [A.add(n, rng) for n in three_lens]
    for i, n in zip(three, three_lens):
        A.demote(i, split_formats(n, [(2, 0.5), (1, 0.25)]))
    nv_lens = [16, 33, 500, 4097, 1]
    nv = [A.add(n, rng) for n in nv_lens]
    for i, n in zip(nv, nv_lens):
        A.demote(i, split_formats(n, [(2, 0.75)]))
    A.sync()
    log(f"scenario A filled in {time.time() - t:.1f}s: "
        f"{sum(n for _, _, n in A.seqs)} tokens x {LAYERS} layers")

    if warm is not None:
        for kind, secs, err in warm.result():
            R.add(f"FlashInfer JIT {kind}", err is None, note=f"{secs:.0f}s" + (f" {err}" if err else ""))

    @guarded(lambda nm, *a: f"{nm}: (exception)")
    def batch_checks(nm, idxs, seed, flex=False):
        q, td, tr, ro, rl = V.flashinfer_batch(nm, A, idxs, seed)
        if flex and args.backend == "cuda" and not args.no_flex:
            V.flex_batch(nm, A, idxs, q, td, tr, ro, rl)

    batch_checks("fp16 ragged", ragged, 1, flex=True)
    batch_checks("fp16 batch 64", b64, 2, flex=True)
    batch_checks("fp8 old + fp16 recent", fp8, 3)
    batch_checks("nvfp4 + fp8 + fp16", three, 4)
    batch_checks("nvfp4 old + fp16 recent", nv, 5)

    @guarded("fp16 ragged, layer 0: kvtier fused kernel vs reference")
    def layer0():
        seqs_dev, seqs_ref, _ = A.batch(ragged)
        q = V.queries(len(ragged), 6)
        ro, rl = A.ref.reference_attention(0, A.ref.build_page_tables(seqs_ref), q)
        r = V.fused(A, seqs_dev, q, "fp16 ragged, layer 0: kvtier fused kernel vs reference", layer=0)
        if r is not None:
            R.compare("fp16 ragged, layer 0: kvtier fused kernel vs reference", r[0], r[1], ro, rl, TOL_FUSED)
    layer0()
    A = None  # frees scenario A's caches before B

    # Scenario B: formats only kvtier's kernel reads, balanced-like mixes within sequences.
    t = time.time()
    Bp = Pair(kvtier, PALETTE_KV, args.backend, torch)
    lens = [0, 1, 16, 17, 255, 256, 1000, 4097, long_len, 2600]
    idxs = [Bp.add(n, rng) for n in lens]
    for j, (i, n) in enumerate(zip(idxs, lens)):
        Bp.demote(i, balanced_formats(n, 2 if j % 2 else 3))
    Bp.sync()
    log(f"scenario B filled in {time.time() - t:.1f}s")

    @guarded("kvtier-only formats: (exception)")
    def scenario_b():
        seqs_dev, seqs_ref, _ = Bp.batch(idxs)
        q = V.queries(len(idxs), 7)
        td = Bp.dev.build_page_tables(seqs_dev)
        tr = Bp.ref.build_page_tables(seqs_ref)
        try:
            Bp.dev.flashinfer_parts(td)
            R.add("kvtier-only formats: FlashInfer adapter refuses block_head formats", False,
                  note="no error raised")
        except ValueError as e:
            R.add("kvtier-only formats: FlashInfer adapter refuses block_head formats",
                  "FlashInfer cannot read format" in str(e), note=str(e)[:90])
        ro, rl = Bp.ref.reference_attention(LAYER, tr, q)
        r = V.fused(Bp, seqs_dev, q, "kvtier-only formats (balanced mix): fused kernel vs reference")
        if r is not None:
            R.compare("kvtier-only formats (balanced mix): fused kernel vs reference", r[0], r[1],
                      ro, rl, TOL_FUSED, note=f"palette {PALETTE_KV[1:]}")
    scenario_b()
    Bp = None

    p, f, s = R.summary()
    doc = dict(meta=meta, checks=R.rows, passed=p, failed=f, skipped=s, elapsed_s=time.time() - t0)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1, default=float)
    log(f"\nwrote {args.out} in {time.time() - t0:.0f}s")
    for r in R.rows:
        if r["status"] == "FAIL":
            log(f"FAILED: {r['check']} {r['note']}")
    log(f"validate_external: {p} passed, {f} failed" + (f", {s} skipped" if s else ""))
    return 1 if f else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Bindings whose CUDA side the CPU tests cannot reach (run by scripts/gpu_python.sh; reliability
rows 118 and 120):

  - calibrate_tensor_scales on the CUDA backend takes its sample in host memory (numpy, CPU
    tensors) and refuses CUDA tensors with a ValueError (they were accepted and read by the host:
    SIGSEGV), and the scales it sets are used: a per-tensor FP8 cache written after it reads back
    within FP8's error;
  - merge_states on CUDA tensors runs on the `stream` given (a side stream's work, not waited for
    by the default stream, is merged correctly once that stream is synchronized) and equals the
    numpy merge; a tensor on another device than out_a's is refused (ValueError).
Prints a line per check and 'bindings_cuda: N passed, N failed'; exits 1 on any failure.
"""
import sys

import numpy as np
import torch

import kvtier

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def calibration():
    cache = kvtier.Cache(num_layers=1, num_kv_heads=2, head_dim=128, backend="cuda",
                         palette=["fp8_e4m3/tensor"])
    rng = np.random.default_rng(1)
    sample = (rng.normal(size=(64, 2, 128)) * 0.01).astype(np.float16)
    cache.calibrate_tensor_scales(0, sample, sample)
    check("calibrate_tensor_scales takes numpy on CUDA", True)
    try:
        gpu = torch.from_numpy(sample).cuda()
        cache.calibrate_tensor_scales(0, gpu, gpu)
        check("calibrate_tensor_scales refuses CUDA tensors", False, "accepted")
    except ValueError as e:
        check("calibrate_tensor_scales refuses CUDA tensors", True, str(e)[:80])
    seq, _ = cache.add_sequence()
    slots = cache.append(seq, 64)
    k = torch.from_numpy(sample).cuda()
    cache.write_kv(0, slots, k, k)
    torch.cuda.synchronize()
    rk, _ = cache.read_kv(seq, 0)
    err = float(np.linalg.norm(rk - sample.astype(np.float32)) / np.linalg.norm(sample))
    # Uncalibrated (scale 1) these 0.01-scale values sit in FP8's subnormals: error over 10%.
    check("the calibrated scales are used", err < 0.05, f"relative error {err:.4f}")


def merge():
    rng = np.random.default_rng(2)
    shape = (32, 8, 128)
    a, b = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
    la, lb = (rng.normal(size=shape[:2]).astype(np.float32) for _ in range(2))
    want, want_lse = np.empty_like(a), np.empty_like(la)
    kvtier.merge_states(a, la, b, lb, want, want_lse)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        ta, tb, tla, tlb = (torch.from_numpy(x).cuda() for x in (a, b, la, lb))
        out, lse = torch.empty_like(ta), torch.empty_like(tla)
        torch.cuda._sleep(200_000_000)  # the side stream's inputs are late
    kvtier.merge_states(ta, tla, tb, tlb, out, lse, stream=side.cuda_stream, synchronize=False)
    side.synchronize()
    ok = np.allclose(out.cpu().numpy(), want, rtol=1e-5, atol=1e-6) and np.allclose(
        lse.cpu().numpy(), want_lse, rtol=1e-5, atol=1e-6)
    check("merge_states on a side stream equals the numpy merge", ok)
    try:
        kvtier.merge_states(ta, tla, tb, torch.from_numpy(lb), out, lse)
        check("merge_states refuses a tensor off out_a's device", False, "accepted")
    except ValueError as e:
        check("merge_states refuses a tensor off out_a's device", True, str(e)[:80])


for test in (calibration, merge):
    try:
        test()
    except Exception as e:  # a failure to report, not to stop the others
        check(test.__name__, False, f"{type(e).__name__}: {e}")
passed = sum(results)
print(f"bindings_cuda: {passed} passed, {len(results) - passed} failed")
sys.exit(0 if passed == len(results) else 1)

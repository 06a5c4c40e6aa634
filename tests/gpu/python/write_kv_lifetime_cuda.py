#!/usr/bin/env python3
"""Cache.write_kv on the CUDA backend holds the torch tensors it imported until its copy is done
(run by scripts/gpu_python.sh). write_kv returns with the copy queued on the cache's stream; a
tensor the caller frees at once goes back to torch's caching allocator, which hands the block out
again at once on the stream it was allocated on. Here that stream is a side stream (not ordered
with the cache's), and the cache's stream is held back behind a sleep on the legacy default
stream, so a block released early is refilled before the copy reads it.

  - control: torch's own copy_ on the held-back stream, its source freed at once (no
    record_stream) and its block refilled on the side stream, reads the refill: the scenario
    catches an early release (if it does not, on this machine, the check below proves nothing
    and says so);
  - write_kv in the same scenario: the rows read back are the tensors' as written, and the
    refill got another block;
  - the held tensors are released once their copies are done: after torch.cuda.synchronize()
    and end_step, torch's allocated memory is back where it was;
  - a note (not a check): write_kv's host time per call, a fence each, and the fence's alone.
Prints a line per check and 'write_kv_lifetime_cuda: N passed, N failed'; exits 1 on any failure.
"""
import sys
import time

import torch

import kvtier

H, D, ROWS = 8, 128, 4096  # 8 MiB of K and of V
SLEEP_CYCLES = 400_000_000  # about 0.2 s at 2 GHz: the held-back stream's head start


def log(*a):
    print(*a, flush=True)


def side_tensor(side, fill=None):
    """A [ROWS, H, D] float16 tensor allocated on the side stream: random and complete when it
    returns, or filled with `fill` by work queued there (not waited for)."""
    with torch.cuda.stream(side):
        t = torch.empty((ROWS, H, D), device="cuda", dtype=torch.float16)
        if fill is None:
            t.normal_()
            side.synchronize()
        else:
            t.fill_(fill)
    return t


def control(side):
    """True when torch's own copy from a block freed early reads the refill."""
    src = side_tensor(side)
    expect = src.float().cpu()
    dst = torch.empty_like(src)
    torch.cuda._sleep(SLEEP_CYCLES)  # the legacy default stream, held back
    dst.copy_(src)
    src_ptr = src.data_ptr()
    del src
    refill = side_tensor(side, fill=7.0)
    torch.cuda.synchronize()
    reused = refill.data_ptr() == src_ptr
    return reused and not torch.equal(dst.float().cpu(), expect)


def write_kv_holds(side):
    """(copy pending at return, rows intact, refill got other blocks, memory released) for
    write_kv in the control's scenario."""
    cache = kvtier.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_tokens=16,
                         budget_bytes=256 << 20, palette=["fp16"], backend="cuda")
    seq, _ = cache.add_sequence()
    slots = cache.append(seq, ROWS)
    warm = torch.zeros((ROWS, H, D), device="cuda", dtype=torch.float16)
    for _ in range(8):  # the first writes' one-time work (staging buffers), not held back
        cache.write_kv(0, slots, warm, warm)
    del warm
    torch.cuda.synchronize()
    cache.end_step()
    baseline = torch.cuda.memory_allocated()
    k, v = side_tensor(side), side_tensor(side)
    expect_k, expect_v = k.float().cpu(), v.float().cpu()
    torch.cuda._sleep(SLEEP_CYCLES)  # the cache's (blocking) stream waits for it
    cache.write_kv(0, slots, k, v)
    pending = not cache.fence_passed(cache.record_fence())
    ptrs = {k.data_ptr(), v.data_ptr()}
    del k, v
    refills = [side_tensor(side, fill=7.0) for _ in range(2)]
    torch.cuda.synchronize()
    rk, rv = cache.read_kv(seq, 0)
    intact = (torch.equal(torch.from_numpy(rk), expect_k) and
              torch.equal(torch.from_numpy(rv), expect_v))
    other_blocks = not ptrs & {r.data_ptr() for r in refills}
    del refills
    cache.end_step()  # releases the tensors whose copies are done
    torch.cuda.synchronize()
    released = torch.cuda.memory_allocated() == baseline
    return pending, intact, other_blocks, released


def write_kv_call_us(calls=200):
    """Mean host times of a one-token write_kv from torch tensors and of record_fence alone
    (the fence's share of the call), in microseconds (not asserted)."""
    cache = kvtier.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_tokens=16,
                         budget_bytes=64 << 20, palette=["fp16"], backend="cuda")
    seq, _ = cache.add_sequence()
    slots = cache.append(seq, 1)
    k = torch.randn((1, H, D), device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    for _ in range(20):
        cache.write_kv(0, slots, k, k)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        cache.write_kv(0, slots, k, k)
    write = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        cache.record_fence()
    fence = time.perf_counter() - start
    torch.cuda.synchronize()
    return write / calls * 1e6, fence / calls * 1e6


def main():
    if not torch.cuda.is_available():
        log("SKIP: no CUDA device")
        return 0
    side = torch.cuda.Stream()
    passed = failed = 0

    def check(name, ok, detail=""):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        log(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")

    sensitive = control(side)
    log(f"{'ok  ' if sensitive else 'NOTE'} control: torch's copy from a block freed early "
        f"{'reads the refill' if sensitive else 'was not caught here (the checks prove less)'}")
    pending, intact, other_blocks, released = write_kv_holds(side)
    check("write_kv returned with its copy pending (else the checks below test nothing)",
          pending)
    check("write_kv: the rows read back are the tensors' as written", intact)
    check("write_kv: the refill got other blocks while the copy was pending", other_blocks)
    check("write_kv: the tensors are released once their copy is done (memory back)", released)
    write_us, fence_us = write_kv_call_us()
    log(f"note: write_kv of one token, host time per call {write_us:.1f} us, of which its fence "
        f"(record_fence alone) {fence_us:.1f} us")
    log(f"write_kv_lifetime_cuda: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

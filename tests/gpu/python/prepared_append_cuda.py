#!/usr/bin/env python3
"""Cache.prepare_append, PreparedAppend and Cache.write_kv_layers on the CUDA backend, driven from
PyTorch as an engine drives them (run by scripts/gpu_python.sh on the H200). The CPU path has its
pytest (tests/python/test_prepared_append.py), the C++ calls under both their GPU test
(tests/gpu/prepared_append_gpu_test.cc); this checks the binding's CUDA side: torch tensors in,
torch streams, a torch CUDA graph.

Each check gives twin CUDA caches the same calls: one writes every layer with write_kv, the other
the same K/V with the prepared step; then every sequence's K/V of every layer is read back from
both and compared bit for bit.
  - one call per step: lists of per-layer tensors and stacked tensors, float16 and bfloat16
    inputs, NaN and Inf inputs (the same non-finite count), an FP16 and an FP8 hot format, rotated
    keys;
  - a torch CUDA graph captured over write_kv_layers on an engine stream (static stacked K/V
    buffers), replayed for 32 decode steps with new slots (PreparedAppend.update) and new K/V;
  - refusals (ValueError, nothing written): a tensor of other rows, a step of another cache,
    another stream than the step's.
Prints a line per check and 'prepared_append_cuda: N passed, N failed'; exits 1 on any failure.
"""
import sys
import traceback

import numpy as np
import torch

import kvtier

L, H, D, S = 4, 8, 128, 16
PROMPTS = (3, 100, 1000, 17)  # tokens per sequence before the decode steps
AMAX = [12.0] * L             # per-tensor amax of every layer's K and V
STEPS = 32                    # decode steps replayed from the graph


def log(*a):
    print(*a, flush=True)


def make_cache(palette, key_rotation):
    return kvtier.Cache(num_layers=L, num_kv_heads=H, head_dim=D, block_tokens=S,
                        budget_bytes=1 << 30, palette=list(palette), k_tensor_amax=AMAX,
                        v_tensor_amax=AMAX, backend="cuda", key_rotation=key_rotation)


def random_kv(gen, rows, dtype=torch.float16, specials=False):
    """Every layer's K and V of `rows` tokens, stacked: [L, rows, H, D] each, on the GPU; with
    specials, a NaN in K and an Inf in V. Complete when it returns."""
    k, v = (torch.randn((L, rows, H, D), generator=gen, device="cuda").mul_(2).to(dtype)
            for _ in range(2))
    if specials:
        k[1, 0, 1, 3] = float("nan")
        v[L - 1, rows - 1, 0, 0] = float("inf")
    torch.cuda.synchronize()
    return k, v


class Twins:
    """Two CUDA caches given the same prompts, K/V and appends: `per_layer` is written with
    write_kv, `prepared` (once the prompts are in) with the prepared step."""

    def __init__(self, palette, key_rotation, gen):
        self.caches = [make_cache(palette, key_rotation) for _ in range(2)]
        self.per_layer, self.prepared = self.caches
        self.seqs = [[c.add_sequence()[0] for _ in PROMPTS] for c in self.caches]
        slots = self.append(PROMPTS)
        k, v = random_kv(gen, len(slots))
        for c in self.caches:
            for layer in range(L):
                c.write_kv(layer, slots, k[layer], v[layer])
        torch.cuda.synchronize()  # write_kv reads the tensors on the cache's stream

    def append(self, counts):
        """Reserves `counts` tokens per sequence in both; returns the slots (the same in both)."""
        slots = [c.append_batch(s, np.asarray(counts, np.int64))
                 for c, s in zip(self.caches, self.seqs)]
        assert np.array_equal(slots[0], slots[1]), "the twins' slots differ"
        return slots[0]

    def write_per_layer(self, slots, k, v):
        for layer in range(L):
            self.per_layer.write_kv(layer, slots, k[layer], v[layer])
        torch.cuda.synchronize()  # before torch may reuse k and v

    def end_step(self):
        for c in self.caches:
            c.end_step()

    def contents(self, cache):
        i = self.caches.index(cache)
        return [x.view(np.uint32) for s in self.seqs[i] for layer in range(L)
                for x in cache.read_kv(s, layer)]

    def assert_same(self):
        torch.cuda.synchronize()
        a, b = self.contents(self.per_layer), self.contents(self.prepared)
        differ = sum(not np.array_equal(x, y) for x, y in zip(a, b))
        assert differ == 0, f"{differ} of {len(a)} (sequence, layer, K/V) read-backs differ"
        for stat in ("nonfinite_values", "tokens"):
            got, want = self.prepared.stats()[stat], self.per_layer.stats()[stat]
            assert got == want, f"{stat}: {got}, write_kv per layer: {want}"
        self.prepared.check_consistency()
        return f"{len(a)} read-backs equal"


def one_call(palette, key_rotation, dtype, stacked):
    """A decode step (one sequence with 3 tokens) written in one call, NaN and Inf inputs."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    twins = Twins(palette, key_rotation, gen)
    slots = twins.append([1, 1, 3, 1])
    k, v = random_kv(gen, len(slots), dtype, specials=True)
    twins.write_per_layer(slots, k, v)
    stream = torch.cuda.Stream()
    step = twins.prepared.prepare_append(8, stream.cuda_stream)
    assert (step.rows, step.max_rows) == (0, 8)
    step.update(slots)
    assert step.rows == len(slots)
    if stacked:
        twins.prepared.write_kv_layers(step, k, v, stream=stream.cuda_stream)
    else:
        twins.prepared.write_kv_layers(step, list(k), list(v), stream=stream.cuda_stream)
    note = twins.assert_same()
    assert twins.prepared.stats()["nonfinite_values"] > 0, "the NaN and Inf inputs were not counted"
    return note


def graph_replay(palette, key_rotation):
    """write_kv_layers captured once in a torch CUDA graph on an engine stream, replayed for
    STEPS decode steps, each with new slots and new K/V copied into the captured buffers."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    twins = Twins(palette, key_rotation, gen)
    rows = len(PROMPTS)
    stream = torch.cuda.Stream()
    step = twins.prepared.prepare_append(rows, stream.cuda_stream)
    k_in = torch.zeros((L, rows, H, D), dtype=torch.float16, device="cuda")
    v_in = torch.zeros_like(k_in)

    def next_step():
        """Appends a token to every sequence, writes its K/V into per_layer, and sets the step's
        slots and the captured buffers for `prepared` (on the engine stream)."""
        slots = twins.append([1] * rows)
        k, v = random_kv(gen, rows)
        twins.write_per_layer(slots, k, v)
        step.update(slots)
        with torch.cuda.stream(stream):
            k_in.copy_(k)
            v_in.copy_(v)
        k.record_stream(stream)  # freed only once the copies on the engine stream are done
        v.record_stream(stream)

    next_step()  # the first step uncaptured: one-time setup happens outside the capture
    twins.prepared.write_kv_layers(step, k_in, v_in, stream=stream.cuda_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        twins.prepared.write_kv_layers(step, k_in, v_in, stream=stream.cuda_stream,
                                       synchronize=False)
    for _ in range(STEPS):
        twins.end_step()
        next_step()
        with torch.cuda.stream(stream):
            graph.replay()
        step.after_graph_launch()
    stream.synchronize()
    return twins.assert_same() + f" after {STEPS} replays"


def expect_value_error(call, what):
    try:
        call()
    except ValueError as e:
        return str(e)
    raise AssertionError(f"{what}: no ValueError")


def refusals():
    gen = torch.Generator(device="cuda").manual_seed(9)
    twins = Twins(("fp16",), "none", gen)
    rows = len(PROMPTS)
    slots = twins.append([1] * rows)
    stream, other = torch.cuda.Stream(), torch.cuda.Stream()
    step = twins.prepared.prepare_append(rows, stream.cuda_stream)
    step.update(slots)
    before = twins.contents(twins.prepared)
    k, v = random_kv(gen, rows + 1)
    notes = [
        expect_value_error(lambda: twins.prepared.write_kv_layers(
            step, k, v, stream=stream.cuda_stream), "rows other than the step's"),
        expect_value_error(lambda: twins.per_layer.write_kv_layers(
            step, k[:, :rows].contiguous(), v[:, :rows].contiguous(), stream=stream.cuda_stream),
            "a step of another cache"),
        expect_value_error(lambda: twins.prepared.write_kv_layers(
            step, k[:, :rows].contiguous(), v[:, :rows].contiguous(), stream=other.cuda_stream),
            "another stream"),
    ]
    torch.cuda.synchronize()
    after = twins.contents(twins.prepared)
    assert all(np.array_equal(x, y) for x, y in zip(before, after)), "a refused call wrote"
    return "; ".join(notes)


def main():
    if not torch.cuda.is_available():
        log("prepared_append_cuda: no CUDA device")
        return 1
    checks = [
        ("one call, fp16, per-layer list", lambda: one_call(("fp16",), "none", torch.float16,
                                                            False)),
        ("one call, fp16, stacked", lambda: one_call(("fp16",), "none", torch.float16, True)),
        ("one call, fp16, bfloat16 inputs", lambda: one_call(("fp16",), "none", torch.bfloat16,
                                                             True)),
        ("one call, fp8_e4m3/token_head hot + nvfp4", lambda: one_call(
            ("fp8_e4m3/token_head", "nvfp4/block_head"), "none", torch.float16, False)),
        ("one call, fp16, rotated keys", lambda: one_call(("fp16",), "hadamard", torch.float16,
                                                          True)),
        ("graph replay, fp16 + fp8_e4m3/block_head", lambda: graph_replay(
            ("fp16", "fp8_e4m3/block_head"), "none")),
        ("graph replay, fp16, rotated keys", lambda: graph_replay(("fp16",), "hadamard")),
        ("refusals", refusals),
    ]
    passed = failed = 0
    for name, check in checks:
        try:
            note = check()
            passed += 1
            log(f"PASS  {name:45s} {note}")
        except Exception:  # noqa: BLE001 -- every check runs; the failure is printed
            failed += 1
            log(f"FAIL  {name}")
            traceback.print_exc()
    log(f"prepared_append_cuda: {passed} passed, {failed} failed "
        f"(torch {torch.__version__}, {torch.cuda.get_device_name()})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the engine's K/V live and which kernel attends them during decode.

`KvtierKV` is the engine's KV cache: kvtier's paged, mixed-precision cache, written through
the slot mapping of AppendTokens/AppendBatch and WriteKV, attended by kvtier's decode attention
(the fused mixed-format kernel on the CUDA backend, the CPU reference on the CPU backend), one
PreparedDecode per step for every layer, EndStep after each step (the precision policy).
`ContiguousKV` is the baseline: one dense FP16 [slots, max_context, kv_heads, head_dim] tensor
per layer, attended by PyTorch's SDPA (its fastest backend that runs, chosen by timing).
Both serve the same Engine loop.

The interface (what Engine calls), per request handle `h`:
  check(prompt_len, max_new)      raise RequestError if the request can never fit
  room_for(prompt_len, running)   whether admitting such a prompt now keeps the reserve free
  add(prompt) -> (h, cached)      admit; `cached` prompt tokens are already in the cache
  prefix_kv(h, layer, n)          the first n cached tokens' K, V [n, kv_heads, head_dim]
  append(hs, counts, tokens)      reserve the new tokens' places (all or nothing) -> slots
  write(layer, slots, k, v)       store K/V [tokens, kv_heads, head_dim] at slots
  prepare(hs)                     this decode step's page tables, once for every layer
  attend(layer, step, q)          decode attention for q [batch, q_heads, head_dim]
  end_step(); release(h)
  abandon(h)                      release a request whose K/V was not all written (a failed
                                  prefill): nothing it wrote this step may be matched later
"""
import time

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


class RequestError(ValueError):
    """A request refused at submission; the engine and the other requests are unaffected."""


def _slabs(tokens, block_tokens, page_bytes, slab_bytes):
    pages = -(-tokens // block_tokens)
    per_slab = max(1, slab_bytes // page_bytes)
    return -(-pages // per_slab)


class KvtierKV:
    """kvtier as the engine's KV cache (see the module docstring)."""

    def __init__(self, cache, model, timer, admit_reserve=0.1):
        """REQUIRES: cache matches model (layers, KV heads, head_dim), else ValueError.
        `admit_reserve`: the fraction of the budget that admission leaves free while other
        requests run. A colder format needs its own slabs, so a budget filled with hot pages
        leaves the policy nowhere to demote to. Default: 0.1; none for a one-format palette."""
        if cache.num_layers != model.num_layers:
            raise ValueError(
                f"the model has {model.num_layers} layers but the cache has {cache.num_layers}: "
                "build the cache with num_layers equal to the model's num_hidden_layers")
        if (cache.num_kv_heads, cache.head_dim) != (model.num_kv_heads, model.head_dim):
            raise ValueError(
                f"the model has {model.num_kv_heads} KV heads of dim {model.head_dim} but the "
                f"cache has {cache.num_kv_heads} of dim {cache.head_dim}")
        self.cache = cache
        self.model = model
        self.timer = timer
        self.on_cuda = model.device.type == "cuda"
        self.stream = 0  # the legacy default stream, torch's current stream (docs/gpu.md)
        stats = cache.stats()
        self._formats = stats["formats"]
        self._slab_bytes = stats["slab_bytes"]
        self._slabs_per_layer = stats["slabs_total"]  # per (format, layer) pool set
        colder = len(self._formats) > 1
        self._reserve = int(np.ceil(admit_reserve * self._slabs_per_layer)) if colder else 0

    def check(self, prompt_len, max_new):
        """RequestError when the request cannot fit even alone in an empty cache: its prompt in
        the hot format (prefill writes it hot), its whole length in the coldest format."""
        s = self.cache.block_tokens
        hot, cold = self._formats[0], self._formats[-1]
        need = max(_slabs(prompt_len, s, hot["page_bytes"], self._slab_bytes),
                   _slabs(prompt_len + max_new, s, cold["page_bytes"], self._slab_bytes))
        if need > self._slabs_per_layer:
            raise RequestError(
                f"request of {prompt_len} prompt + {max_new} new tokens needs {need} slabs of "
                f"{self._slab_bytes} bytes per layer, more than the whole budget holds "
                f"({self._slabs_per_layer} per layer)")

    def room_for(self, prompt_len, running):
        """Whether the hot pool's free pages, the free slabs beyond the reserve and the cached
        (evictable) pages hold prompt_len more tokens and a page more for each of the
        `running` requests (their next 16 tokens), so that decode does not eat the reserve.
        Pool statistics are per layer."""
        stats = self.cache.stats()
        hot = stats["formats"][0]
        spare_slabs = max(0, stats["slabs_free"] - self._reserve)
        free_pages = (hot["pages_mapped"] - hot["pages_used"] +
                      spare_slabs * (self._slab_bytes // hot["page_bytes"]) +
                      stats["cached_bytes"] // (hot["page_bytes"] * self.cache.num_layers))
        return -(-prompt_len // self.cache.block_tokens) + running <= free_pages

    def add(self, prompt):
        return self.cache.add_sequence(prompt=np.asarray(prompt, np.int32))

    def prefix_kv(self, h, layer, n):
        k, v = self.cache.read_kv(h, layer)  # decoded to float32, as the decode kernel sees it
        to = dict(device=self.model.device, dtype=self.model.dtype)
        return torch.from_numpy(k[:n]).to(**to), torch.from_numpy(v[:n]).to(**to)

    def append(self, hs, counts, tokens):
        with self.timer("append"):
            return self.cache.append_batch(hs, np.asarray(counts, np.int64),
                                           np.asarray(tokens, np.int32))

    def write(self, layer, slots, k, v):
        with self.timer("append"):
            k, v = k.to(torch.float16).contiguous(), v.to(torch.float16).contiguous()
            self.cache.write_kv(layer, slots, k, v)

    def prepare(self, hs):
        with self.timer("page_tables"):
            return self.cache.prepare_decode(hs, stream=self.stream)

    def attend(self, layer, step, q):
        with self.timer("attention"):
            q = q.float().contiguous()
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
            self.cache.decode_attention(layer, step, q, out, lse, softmax_scale=self.model.scaling,
                                        stream=self.stream, synchronize=not self.on_cuda)
            return out.to(self.model.dtype)

    def end_step(self):
        with self.timer("policy"):
            self.cache.end_step()

    def release(self, h):
        self.cache.release(h)

    def abandon(self, h):
        self.cache.abandon(h)


_SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                  "math": SDPBackend.MATH}


class ContiguousKV:
    """The baseline: dense FP16 K/V per layer [slots, max_context, kv_heads, head_dim] (each
    slot's tokens contiguous, the BSHD layout), attended by PyTorch's SDPA through the fastest
    backend that runs.

    On CUDA the backend is chosen by timing, once per batch size, on the step's own q and K/V:
    each of `SDPA_CANDIDATES` that takes the call (GQA, the strided BSHD view, a mask when the
    lengths differ) and matches the math backend is timed over three successive lengths, since
    a decode step's length is new every step (cuDNN builds a graph per new length unless
    TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1, which bench_engine.py sets). `sdpa_choice[batch]`
    names the winner ("default": torch's own dispatch, when none ran; always so on the CPU) and
    `sdpa_probe_ms[batch]` each candidate's mean ms per call, or "refused" / "wrong". Flash and
    cuDNN take no dense mask: requests of equal length (the benchmark's speed cases) get none;
    a ragged batch gets one, and so a slower kernel (torch's own dispatch, also when the batch
    size's winner was chosen on equal lengths)."""

    SDPA_CANDIDATES = ("cudnn", "flash")

    def __init__(self, model, max_batch, max_context, timer):
        self.model = model
        self.timer = timer
        self.max_context = max_context
        shape = (max_batch, max_context, model.num_kv_heads, model.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.float16, device=model.device)
                  for _ in range(model.num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.free = list(range(max_batch - 1, -1, -1))
        self.lengths = {}
        self.sdpa_choice = {}
        self.sdpa_probe_ms = {}

    def check(self, prompt_len, max_new):
        if prompt_len + max_new > self.max_context:
            raise RequestError(f"request of {prompt_len + max_new} tokens is longer than the "
                               f"contiguous cache's {self.max_context}")

    def room_for(self, prompt_len, running):
        return bool(self.free)

    def add(self, prompt):
        if not self.free:
            raise MemoryError("no free slot in the contiguous cache")
        h = self.free.pop()
        self.lengths[h] = 0
        return h, 0

    def prefix_kv(self, h, layer, n):
        raise AssertionError("the contiguous cache shares no prefix")

    def append(self, hs, counts, tokens):
        with self.timer("append"):
            rows, pos = [], []
            for h, c in zip(hs, counts):
                start = self.lengths[h]
                if start + c > self.max_context:
                    raise MemoryError("the contiguous cache is full")
                rows += [h] * c
                pos += range(start, start + c)
            for h, c in zip(hs, counts):
                self.lengths[h] += c
            dev = self.model.device
            return (torch.tensor(rows, device=dev), torch.tensor(pos, device=dev))

    def write(self, layer, slots, k, v):
        with self.timer("append"):
            rows, pos = slots
            self.k[layer][rows, pos] = k.to(torch.float16)
            self.v[layer][rows, pos] = v.to(torch.float16)

    def prepare(self, hs):
        with self.timer("page_tables"):
            lengths = [self.lengths[h] for h in hs]
            longest = max(lengths)
            rows = torch.tensor(hs, device=self.model.device)
            mask = None
            if min(lengths) != longest:
                mask = (torch.arange(longest, device=self.model.device)[None, :] <
                        torch.tensor(lengths, device=self.model.device)[:, None])[:, None, None]
            # Rows 0..B-1 in order (the benchmark's batch) are a view, not a gather.
            view = hs == list(range(len(hs)))
            return rows, longest, mask, view

    def _kv(self, layer, step, length):
        """K, V [batch, kv_heads, length, head_dim] of the step's requests' first `length`
        tokens: strided views of the BSHD buffers (a gather when the batch is not slots
        0..B-1)."""
        rows, _, _, view = step
        k, v = self.k[layer], self.v[layer]
        if view:
            k, v = k[:len(rows), :length], v[:len(rows), :length]
        else:
            k, v = k[rows, :length], v[rows, :length]
        return k.transpose(1, 2), v.transpose(1, 2)

    def _sdpa(self, backend, q, k, v, mask):
        """SDPA through `backend` (a key of _SDPA_BACKENDS, or "default": torch's dispatch)."""
        args = dict(attn_mask=mask, scale=self.model.scaling, enable_gqa=True)
        if backend == "default":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **args)
        with sdpa_kernel(_SDPA_BACKENDS[backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **args)

    def _probe(self, layer, step, q):
        """(the fastest candidate that ran and matched the math backend on the first and the
        last request, or "default"; {candidate: mean ms per call at lengths L-2, L-1, L after
        an untimed call at L-3, or "refused" / "wrong"})."""
        _, longest, mask, _ = step
        ends = [0, q.shape[0] - 1]  # the last request catches a misread batch stride
        k, v = self._kv(layer, step, longest)
        want = self._sdpa("math", q[ends], k[ends], v[ends],
                          mask[ends] if mask is not None else None).float()
        times = {}
        for name in self.SDPA_CANDIDATES:
            calls = []
            try:
                for length in range(max(1, longest - 3), longest + 1):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    out = self._sdpa(name, q, *self._kv(layer, step, length),
                                     mask[..., :length] if mask is not None else None)
                    torch.cuda.synchronize()
                    calls.append(time.perf_counter() - start)
            except RuntimeError:  # this backend does not take the call (shape, GQA, mask)
                times[name] = "refused"
                continue
            error = (out[ends].float() - want).abs().max() / want.abs().max().clamp_min(1e-6)
            if error > 2e-2:  # relative to the output's scale; FP16 rounding is ~1e-3
                times[name] = "wrong"
                continue
            timed = calls[1:] or calls
            times[name] = 1e3 * sum(timed) / len(timed)
        ran = {n: t for n, t in times.items() if not isinstance(t, str)}
        return (min(ran, key=ran.get) if ran else "default"), times

    def attend(self, layer, step, q):
        with self.timer("attention"):
            rows, longest, mask, _ = step
            q = q.to(torch.float16)[:, :, None]
            batch = len(rows)
            if batch not in self.sdpa_choice:
                choice = self._probe(layer, step, q) if q.is_cuda else ("default", {})
                self.sdpa_choice[batch], self.sdpa_probe_ms[batch] = choice
            choice = self.sdpa_choice[batch]
            if mask is not None and choice in self.SDPA_CANDIDATES:
                choice = "default"  # chosen on equal lengths; neither candidate takes a mask
            out = self._sdpa(choice, q, *self._kv(layer, step, longest), mask)
            return out[:, :, 0].to(self.model.dtype)

    def end_step(self):
        pass

    def release(self, h):
        del self.lengths[h]
        self.free.append(h)

    abandon = release  # nothing is shared between requests

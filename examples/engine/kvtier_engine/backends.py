"""Where the engine's K/V live and which kernel attends them during decode.

`KvtierKV` is the engine's KV cache: kvtier's paged, mixed-precision cache, written through
the slot mapping of AppendTokens/AppendBatch and WriteKV, attended by kvtier's decode attention
(the fused mixed-format kernel on the CUDA backend, the CPU reference on the CPU backend), one
PreparedDecode per step for every layer, EndStep after each step (the precision policy).
`ContiguousKV` is the baseline: one dense FP16 [slots, kv_heads, max_context, head_dim] tensor
per layer, attended by PyTorch's SDPA. Both serve the same Engine loop.

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
"""
import numpy as np
import torch


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


class ContiguousKV:
    """The baseline: dense FP16 K/V per layer [slots, kv_heads, max_context, head_dim], SDPA."""

    def __init__(self, model, max_batch, max_context, timer):
        self.model = model
        self.timer = timer
        self.max_context = max_context
        shape = (max_batch, model.num_kv_heads, max_context, model.head_dim)
        self.k = [torch.zeros(shape, dtype=torch.float16, device=model.device)
                  for _ in range(model.num_layers)]
        self.v = [torch.zeros_like(t) for t in self.k]
        self.free = list(range(max_batch - 1, -1, -1))
        self.lengths = {}

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
            self.k[layer][rows, :, pos] = k.to(torch.float16)
            self.v[layer][rows, :, pos] = v.to(torch.float16)

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

    def attend(self, layer, step, q):
        with self.timer("attention"):
            rows, longest, mask, view = step
            if view:
                k = self.k[layer][:len(rows), :, :longest]
                v = self.v[layer][:len(rows), :, :longest]
            else:
                k = self.k[layer][rows, :, :longest]
                v = self.v[layer][rows, :, :longest]
            out = torch.nn.functional.scaled_dot_product_attention(
                q.to(torch.float16)[:, :, None], k, v, attn_mask=mask,
                scale=self.model.scaling, enable_gqa=True)
            return out[:, :, 0].to(self.model.dtype)

    def end_step(self):
        pass

    def release(self, h):
        del self.lengths[h]
        self.free.append(h)

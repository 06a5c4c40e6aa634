"""The paged baseline: FlashInfer's decode over FP16 pages that the engine manages itself.

`FlashInferKV` serves the Engine loop as `KvtierKV` and `ContiguousKV` do (backends.py's
interface): per layer one FP16 page pool [pages, 2, kv_heads, page_tokens, head_dim] (HND,
K then V), pages taken from a free list as requests grow, a page table per request, and
FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` (tensor-core kernels, the faster of its two
decode paths for GQA with 4 query heads per KV head on the H200, docs/benchmarks.md) planned
once per step for every layer. It is what an engine gets from FlashInfer alone: paging without
prefix sharing, precision tiers or a policy. CUDA only; needs the flashinfer package.
"""
import numpy as np
import torch

from .backends import RequestError


class FlashInferKV:
    """FlashInfer paged FP16 decode (see the module docstring). Thread-safety: none."""

    def __init__(self, model, max_tokens, timer, page_tokens=16, workspace_bytes=256 << 20):
        """`max_tokens`: the pool's capacity in tokens over all requests (rounded up to pages).
        REQUIRES: model on CUDA; flashinfer importable (ImportError otherwise)."""
        import flashinfer
        self.model = model
        self.timer = timer
        self.page_tokens = page_tokens
        pages = -(-max_tokens // page_tokens)
        shape = (pages, 2, model.num_kv_heads, page_tokens, model.head_dim)
        self.pools = [torch.zeros(shape, dtype=torch.float16, device=model.device)
                      for _ in range(model.num_layers)]
        self.free = list(range(pages - 1, -1, -1))
        # Per request: its pages (an int32 array with room to grow) and token count.
        self.tables, self.counts, self.lengths = {}, {}, {}
        self._next = 0
        workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=model.device)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "HND", use_tensor_cores=True)

    def check(self, prompt_len, max_new):
        need = -(-(prompt_len + max_new) // self.page_tokens)
        total = self.pools[0].shape[0]
        if need > total:
            raise RequestError(f"request of {prompt_len + max_new} tokens needs {need} pages, "
                               f"more than the FlashInfer pool's {total}")

    def room_for(self, prompt_len, running):
        return -(-prompt_len // self.page_tokens) + running <= len(self.free)

    def add(self, prompt):
        h, self._next = self._next, self._next + 1
        self.tables[h] = np.empty(2, np.int32)
        self.counts[h], self.lengths[h] = 0, 0
        return h, 0

    def prefix_kv(self, h, layer, n):
        raise AssertionError("the FlashInfer baseline shares no prefix")

    def append(self, hs, counts, tokens):
        """Places for counts[i] new tokens of each request, all or nothing (MemoryError when
        the pool runs out): (page index, offset in page) tensors, one entry per new token."""
        with self.timer("append"):
            need = sum(-(-(self.lengths[h] + c) // self.page_tokens) - self.counts[h]
                       for h, c in zip(hs, counts))
            if need > len(self.free):
                raise MemoryError("the FlashInfer page pool is full")
            pages, offsets = [], []
            for h, c in zip(hs, counts):
                start = self.lengths[h]
                for pos in range(start, start + c):
                    if pos // self.page_tokens == self.counts[h]:
                        self._grow(h)
                    pages.append(int(self.tables[h][pos // self.page_tokens]))
                    offsets.append(pos % self.page_tokens)
                self.lengths[h] = start + c
            dev = self.model.device
            return torch.tensor(pages, device=dev), torch.tensor(offsets, device=dev)

    def write(self, layer, slots, k, v):
        with self.timer("append"):
            pages, offsets = slots
            pool = self.pools[layer]
            pool[pages, 0, :, offsets] = k.to(torch.float16)
            pool[pages, 1, :, offsets] = v.to(torch.float16)

    def prepare(self, hs):
        """Page tables in FlashInfer's CSR form and one plan() for every layer of the step."""
        with self.timer("page_tables"):
            counts = np.array([self.counts[h] for h in hs], np.int32)
            indptr = np.zeros(len(hs) + 1, np.int32)
            np.cumsum(counts, out=indptr[1:])
            indices = np.concatenate([self.tables[h][:self.counts[h]] for h in hs])
            last = np.array([self.lengths[h] for h in hs], np.int32) - self.page_tokens * (
                counts - 1)
            dev = self.model.device
            indptr, indices, last = (torch.from_numpy(a).to(dev) for a in (indptr, indices, last))
            m = self.model
            self.wrapper.plan(indptr, indices, last, m.num_q_heads,
                              m.num_kv_heads, m.head_dim, self.page_tokens,
                              pos_encoding_mode="NONE", sm_scale=m.scaling,
                              q_data_type=torch.float16, kv_data_type=torch.float16)
            return len(hs)

    def attend(self, layer, step, q):
        with self.timer("attention"):
            out = self.wrapper.run(q.to(torch.float16).contiguous(), self.pools[layer])
            return out.to(self.model.dtype)

    def end_step(self):
        pass

    def release(self, h):
        self.free += reversed(self.tables.pop(h)[:self.counts.pop(h)].tolist())
        del self.lengths[h]

    abandon = release  # nothing is shared between requests

    def _grow(self, h):
        """Gives request h one more page from the free list (REQUIRES: one is free)."""
        table, n = self.tables[h], self.counts[h]
        if n == len(table):
            table = self.tables[h] = np.concatenate([table, np.empty_like(table)])
        table[n] = self.free.pop()
        self.counts[h] = n + 1


def compile_kernels(q_heads=32, kv_heads=8, head_dim=128):
    """Runs one tiny decode so that FlashInfer JIT-compiles (and caches under
    FLASHINFER_WORKSPACE_BASE) the kernels the engine's FlashInferKV uses for this geometry."""
    import flashinfer
    dev = torch.device("cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.zeros(16 << 20, dtype=torch.uint8, device=dev), "HND", use_tensor_cores=True)
    pool = torch.randn(1, 2, kv_heads, 16, head_dim, dtype=torch.float16, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    wrapper.plan(torch.tensor([0, 1], **i32), torch.tensor([0], **i32), torch.tensor([16], **i32),
                 q_heads, kv_heads, head_dim, 16, pos_encoding_mode="NONE",
                 sm_scale=head_dim ** -0.5, q_data_type=torch.float16,
                 kv_data_type=torch.float16)
    wrapper.run(torch.randn(1, q_heads, head_dim, dtype=torch.float16, device=dev), pool)
    torch.cuda.synchronize()


if __name__ == "__main__":
    import time
    start = time.monotonic()
    compile_kernels()
    print(f"flashinfer_kv: kernels ready in {time.monotonic() - start:.1f} s")

"""The Python module on the CPU backend: sequences and data, errors, page tables and every
adapter's tables, zero-copy DLPack pool views read back through numpy, the partition-and-merge
path, and the documentation's snippets (docs/adapters.md).

Skipped when the module was not built, unless KVTIER_PYTHON_REQUIRED=1 (set by ctest and
scripts/test.sh), where a missing module is an error. Needs numpy only (no torch).
"""
import ctypes
import gc
import os
import pathlib
import re
import sys

import pytest

np = pytest.importorskip("numpy")
if os.environ.get("KVTIER_PYTHON_REQUIRED") == "1":
    import kvtier
else:
    kvtier = pytest.importorskip(
        "kvtier", reason="the kvtier module was not built (KVTIER_BUILD_PYTHON=OFF or no pybind11)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
H, D, S = 2, 32, 16
MIXED = ["fp16", "fp8_e4m3/tensor", "nvfp4/tensor"]


def make_cache(palette=("fp16",), layers=2, budget=16 << 20, same_scales=False):
    return kvtier.Cache(num_layers=layers, num_kv_heads=H, head_dim=D, block_tokens=S,
                        budget_bytes=budget, palette=list(palette),
                        k_tensor_amax=[12.0] * layers,
                        v_tensor_amax=[12.0 if same_scales else 10.0] * layers)


def add_random(cache, length, seed):
    seq, _ = cache.add_sequence()
    if length == 0:
        return seq
    slots = cache.append(seq, length)
    rng = np.random.default_rng(seed)
    for layer in range(cache.num_layers):
        k = rng.normal(0, 2, (length, H, D)).astype(np.float16)
        v = rng.normal(0, 2, (length, H, D)).astype(np.float16)
        cache.write_kv(layer, slots, k, v)
    return seq


def demote_every_third(cache, seq, which, fmt):
    chosen = []
    for i, b in enumerate(cache.sequence_blocks(seq)):
        info = cache.block_info(b)
        if i % 3 == which and info["num_tokens"] == S and info["format"] < fmt:
            chosen.append(b)
    cache.demote(chosen, fmt)


def mixed_batch(palette=MIXED, lengths=(45, 0, 1, 16, 100, 33)):
    cache = make_cache(palette)
    seqs = [add_random(cache, n, 100 + i) for i, n in enumerate(lengths)]
    for f in range(1, len(palette)):
        for s in seqs:
            demote_every_third(cache, s, f % 3, f)
    return cache, seqs, cache.build_page_tables(seqs)


# numpy decoders of the stored element types, to read the raw uint8 views.
def e4m3_table():
    out = np.zeros(256, np.float32)
    for c in range(256):
        sign = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 0xF, c & 0x7
        if e == 0xF and m == 0x7:
            out[c] = np.nan
        elif e == 0:
            out[c] = sign * (m / 8.0) * 2.0 ** -6
        else:
            out[c] = sign * (1 + m / 8.0) * 2.0 ** (e - 7)
    return out


E4M3 = e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def test_sequences_data_and_stats():
    cache = make_cache()
    seq, cached = cache.add_sequence()
    assert cached == 0
    slots = cache.append_tokens(seq, np.arange(20, dtype=np.int32))
    assert slots.dtype == np.int64 and slots.shape == (20,)
    k = np.random.default_rng(1).normal(size=(20, H, D)).astype(np.float16)
    v = np.random.default_rng(2).normal(size=(20, H, D)).astype(np.float16)
    cache.write_kv(1, slots, k, v)
    rk, rv = cache.read_kv(seq, 1)
    assert rk.dtype == np.float32 and rk.shape == (20, H, D)
    np.testing.assert_array_equal(rk, k.astype(np.float32))
    np.testing.assert_array_equal(rv, v.astype(np.float32))
    child = cache.fork(seq)
    assert cache.sequence_length(child) == 20
    assert child != seq and child == child and seq not in [None, 3, child]  # no TypeError
    more = cache.append_batch([seq, child], [1, 2])
    assert more.shape == (3,)
    stats = cache.stats()
    assert stats["sequences"] == 2 and stats["tokens"] == 21 + 22
    assert stats["formats"][0]["name"] == "fp16"
    # Every field of CacheStats is in the dict (compacted_pages was missing).
    header = (ROOT / "include/kvtier/stats.h").read_text()
    body = header[header.index("struct CacheStats {"):]
    body = body[:body.index("\n};")]
    fields = re.findall(r"^\s+[\w:<>]+\s+(\w+)(?:\s*=[^;]*)?;", body, re.M)
    assert len(fields) > 30 and "compacted_pages" in fields
    assert [f for f in fields if f not in stats] == []
    cache.release(child)
    cache.end_step()
    cache.check_consistency()
    assert cache.stats()["sequences"] == 1
    # A prompt matches the cached prefix of a released sequence.
    cache.release(seq)
    again, cached = cache.add_sequence(prompt=np.arange(20, dtype=np.int32))
    assert cached == 16
    assert cache.palette == ["fp16"]
    # A failed prefill: what it indexed this step is withdrawn, the older prefix stays.
    cache.end_step()
    cache.append_tokens(again, np.arange(16, 36, dtype=np.int32))
    assert cache.stats()["indexed_blocks"] == 2
    cache.abandon(again)
    assert cache.stats()["indexed_blocks"] == 1 and cache.stats()["abandoned_blocks"] == 1
    assert cache.add_sequence(prompt=np.arange(40, dtype=np.int32))[1] == 16
    with pytest.raises(KeyError):
        cache.abandon(again)
    cache.check_consistency()


def test_host_tier_offloads_and_a_prefix_hit_brings_blocks_back():
    slab = 2 << 20
    cache = kvtier.Cache(num_layers=2, num_kv_heads=H, head_dim=D, budget_bytes=2 * 2 * slab,
                         host_tier_bytes=2 * 2 * slab)
    prompt = np.arange(65, dtype=np.int32)
    seq, _ = cache.add_sequence()
    slots = cache.append_tokens(seq, prompt)
    k = np.random.default_rng(3).normal(size=(65, H, D)).astype(np.float16)
    for layer in range(2):
        cache.write_kv(layer, slots, k, k)
    first = cache.sequence_blocks(seq)[0]
    cache.release(seq)
    # A private sequence that needs the whole device budget pushes the cached prefix down.
    pages_per_slab = slab // cache.stats()["formats"][0]["page_bytes"]
    big, _ = cache.add_sequence()
    cache.append(big, 2 * pages_per_slab * 16)
    host = cache.stats()["host"]
    assert host["offloaded_blocks"] == 4 and host["blocks"] == 4
    assert cache.block_info(first)["state"] == "offloaded"
    cache.release(big)
    hit = cache.add_sequence(prompt=prompt)
    seq, cached = hit
    assert cached == 64 and hit.host_tokens == 64
    assert cache.fence_passed(hit.ready_fence)
    rk, _ = cache.read_kv(seq, 1)
    np.testing.assert_array_equal(rk, k[:64].astype(np.float32))
    assert cache.stats()["host"]["onloaded_blocks"] == 4
    assert "host_tokens=64" in repr(hit)
    cache.check_consistency()
    with pytest.raises(ValueError, match="host_tier"):
        kvtier.Cache(num_kv_heads=H, head_dim=D, host_tier_bytes=1)


def test_write_kv_through_dlpack(dlpack_producer):
    Producer = dlpack_producer
    cache = make_cache()
    seq, _ = cache.add_sequence()
    slots = cache.append(seq, 5)
    k = np.random.default_rng(3).normal(size=(5, H, D)).astype(np.float16)
    cache.write_kv(0, slots, Producer(k), Producer(-k))
    rk, rv = cache.read_kv(seq, 0)
    np.testing.assert_array_equal(rk, k.astype(np.float32))
    np.testing.assert_array_equal(rv, -k.astype(np.float32))
    # Other float dtypes are converted to float16 (a copy).
    cache.write_kv(0, slots, k.astype(np.float32), k.astype(np.float32))
    # A refused tensor is left to its producer, not leaked: its array's count is as before.
    strided = np.zeros((5, H, 2 * D), np.float16)[:, :, ::2]
    producer = Producer(strided)
    before = sys.getrefcount(strided)
    with pytest.raises(ValueError, match="contiguous"):
        cache.write_kv(0, slots, producer, producer)
    gc.collect()
    assert sys.getrefcount(strided) == before


def test_written_tensors_are_released_once_read(dlpack_producer):
    # The cache holds a DLPack tensor only while its device may still read it: on the CPU
    # backend the write is done on return, so an accepted tensor goes back to its producer at
    # once (on CUDA, after a fence: tests/gpu/python/write_kv_lifetime_cuda.py).
    Producer = dlpack_producer
    cache = make_cache()
    seq, _ = cache.add_sequence()
    slots = cache.append(seq, 3)
    k = np.random.default_rng(5).normal(size=(3, H, D)).astype(np.float16)
    v = -k
    before = sys.getrefcount(k), sys.getrefcount(v)
    cache.write_kv(0, slots, Producer(k), Producer(v))
    gc.collect()
    assert (sys.getrefcount(k), sys.getrefcount(v)) == before
    fence = cache.record_fence()
    assert fence > 0 and cache.fence_passed(fence)
    assert cache.record_fence() > fence


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class OnDevice:
    """A float16 numpy array handed over DLPack as if it lived on DLPack device (type, id)."""

    def __init__(self, a, device_type, device_id):
        self.a = np.ascontiguousarray(a, np.float16)
        self.shape = (ctypes.c_int64 * self.a.ndim)(*self.a.shape)
        self.released = 0

        def release(_):
            self.released += 1

        self.deleter = _DELETER(release)
        self.managed = _DLManagedTensor(
            _DLTensor(self.a.ctypes.data, _DLDevice(device_type, device_id), self.a.ndim,
                      _DLDataType(2, 16, 1), self.shape, None, 0), None, self.deleter)

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def test_dlpack_tensors_on_another_device_are_refused():
    # A tensor that says it is on another device than the cache's (host memory is device 0; a
    # CUDA cache compares with its own device) is refused before use, and left to its producer.
    cache = make_cache()
    seq, _ = cache.add_sequence()
    slots = cache.append(seq, 5)
    k = np.random.default_rng(5).normal(size=(5, H, D)).astype(np.float16)
    elsewhere = OnDevice(k, 1, 3)
    with pytest.raises(ValueError, match="on device 3"):
        cache.write_kv(0, slots, elsewhere, OnDevice(k, 1, 0))
    assert elsewhere.released == 0
    here = OnDevice(k, 1, 0)
    cache.write_kv(0, slots, here, OnDevice(-k, 1, 0))
    assert here.released == 1  # taken, and released once the call is done
    rk, rv = cache.read_kv(seq, 0)
    np.testing.assert_array_equal(rk, k.astype(np.float32))
    np.testing.assert_array_equal(rv, -k.astype(np.float32))


def test_errors_map_to_python_exceptions():
    with pytest.raises(ValueError, match="fp7"):
        kvtier.Cache(palette=["fp7"])
    cache = make_cache(budget=2 * (2 << 20), layers=2)
    seq, _ = cache.add_sequence()
    cache.release(seq)
    with pytest.raises(KeyError):
        cache.read_kv(seq, 0)
    with pytest.raises(ValueError):
        cache.append(cache.add_sequence()[0], 0)
    big, _ = cache.add_sequence()
    with pytest.raises(MemoryError):
        cache.append(big, 10 ** 6)
    tail, _ = cache.add_sequence()
    cache.append(tail, 3)
    two = make_cache(("fp16", "fp8_e4m3/block_head"))
    part, _ = two.add_sequence()
    two.append(part, 3)
    with pytest.raises(RuntimeError, match="partial"):  # FailedPrecondition
        two.demote(two.sequence_blocks(part), 1)
    # Integer arguments are integers in range, in one dimension: never truncated, wrapped or
    # flattened (2**32 + 5 as a token id was token 5, another prompt).
    with pytest.raises(TypeError, match="integers"):
        cache.append_batch([tail], np.array([1.5]))
    with pytest.raises(ValueError, match="outside"):
        cache.add_sequence(prompt=np.array([2 ** 32 + 5]))
    with pytest.raises(ValueError, match="outside"):
        cache.append_tokens(tail, np.array([2 ** 63 + 1], np.uint64))
    with pytest.raises(ValueError, match="1-D"):
        cache.add_sequence(prompt=np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match="integers"):
        cache.append_batch([tail], np.array([True]))
    assert cache.append_batch([tail], [1]).shape == (1,)  # a list of Python ints is fine
    assert cache.append_batch([tail], 1).shape == (1,)  # and one int, a list of one


def test_refusals_name_the_format_and_the_target():
    kvtier.check_readable("flashinfer", "nvfp4/tensor")
    for target, fmt in [("flashinfer", "fp8_e4m3/block_head"), ("flashinfer", "nvfp4/block_head"),
                        ("flashinfer", "nvfp4_channel/block_head"), ("vllm", "nvfp4/tensor"),
                        ("flex_attention", "fp8_e4m3/tensor"), ("flash_attention2", "fp16"),
                        ("flash_attention3", "fp8_e4m3/token_head")]:
        with pytest.raises(ValueError) as e:
            kvtier.check_readable(target, fmt)
        assert fmt in str(e.value)
    cache = make_cache(("fp16", "fp8_e4m3/block_head"))
    with pytest.raises(ValueError, match="FlashInfer cannot read format fp8_e4m3/block_head"):
        cache.flashinfer_layer(1, 0)


def test_flashinfer_parts_match_the_blocks():
    cache, seqs, tables = mixed_batch()
    assert tables.batch_size == len(seqs)
    parts = cache.flashinfer_parts(tables)
    assert [p["format_name"] for p in parts] == MIXED
    covered = np.zeros(len(seqs), np.int64)
    for p in parts:
        assert p["indptr"].dtype == np.int32 and p["indices"].dtype == np.int32
        for r, b in enumerate(p["batch_index"]):
            want = [cache.block_info(x)["page"] for x in cache.sequence_blocks(seqs[b])
                    if cache.block_info(x)["format"] == p["format"]]
            got = p["indices"][p["indptr"][r]:p["indptr"][r + 1]]
            assert list(got) == want
            assert 1 <= p["last_page_len"][r] <= S
            covered[b] += p["lengths"][r]
    assert list(covered) == [cache.sequence_length(s) for s in seqs]
    assert all(1 not in p["batch_index"] for p in parts)  # the empty sequence


def test_flashinfer_views_are_zero_copy_and_address_the_pages():
    cache, seqs, tables = mixed_batch()
    layer = 1
    for fmt in range(3):
        view = cache.flashinfer_layer(fmt, layer)
        kv = np.from_dlpack(view["kv"])
        assert kv.__array_interface__["data"][0] == view["kv"].data_ptr  # no copy
        pool = cache.pool(fmt, layer)
        assert kv.shape[0] == pool["capacity_pages"] and kv.shape[1:4] == (2, H, S)
        assert kv.strides[1] == pool["v_offset"] - pool["k_offset"]
        if fmt == 2:
            assert view["kv"].dtype == "float4_e2m1x2" and kv.dtype == np.uint8
            sf = np.from_dlpack(view["kv_cache_sf"])
            assert view["kv_cache_sf"].dtype == "float8_e4m3fn" and sf.shape[-1] == D // 16
        for b, seq in enumerate(seqs):
            rk, rv = cache.read_kv(seq, layer)
            blocks = cache.sequence_blocks(seq)
            for t in range(len(rk)):
                info = cache.block_info(blocks[t // S])
                if info["format"] != fmt:
                    continue
                for side, want, scale in ((0, rk, pool["k_tensor_scale"]),
                                          (1, rv, pool["v_tensor_scale"])):
                    row = kv[info["page"], side, :, t % S]  # [H, D or D/2]
                    if fmt == 0:
                        got = row.astype(np.float32)
                    elif fmt == 1:
                        assert view["kv"].dtype == "float8_e4m3fn" and kv.dtype == np.uint8
                        got = E4M3[row] * np.float32(scale)
                    else:
                        nib = np.stack([row & 0xF, row >> 4], axis=-1).reshape(H, D)
                        s = np.repeat(E4M3[sf[info["page"], side, :, t % S]], 16, axis=-1)
                        got = (E2M1[nib] * s) * np.float32(scale)
                    np.testing.assert_array_equal(got, want[t])


def test_block_tables_slot_mapping_and_descales():
    cache, seqs, tables = mixed_batch(("fp16", "fp8_e4m3/tensor"))
    parts = cache.block_table_parts("vllm", tables, max_blocks=10, pad_value=0)
    for p in parts:
        assert p["block_table"].shape == (len(p["batch_index"]), 10)
        view = cache.block_table_layer("vllm", p["format"], 0)
        k = np.from_dlpack(view["k"])  # [P, S, H, D] by strides over HND pages
        assert k.shape[1:] == (S, H, D)
        for r, b in enumerate(p["batch_index"]):
            rk, _ = cache.read_kv(seqs[b], 0)
            blocks = [x for x in cache.sequence_blocks(seqs[b])
                      if cache.block_info(x)["format"] == p["format"]]
            for i, blk in enumerate(blocks):
                page = p["block_table"][r, i]
                assert page == cache.block_info(blk)["page"]
    with pytest.raises(ValueError, match="FlashAttention-2"):
        cache.block_table_parts("flash_attention2", tables)
    mapping = cache.vllm_slot_mapping(np.array([5, 17], np.int64), padded_size=4)
    assert mapping.dtype == np.int64 and list(mapping) == [5, 17, -1, -1]
    kd, vd = cache.fa3_descales(1, 0, 3)
    assert kd.shape == (3, H) and np.allclose(kd, 12.0 / 448)


def test_flex_attention_gather_and_tensorrt_llm_offsets():
    cache = make_cache(same_scales=True)
    a = add_random(cache, 37, 5)
    b = cache.fork(a)
    c = add_random(cache, 16, 6)
    tables = cache.build_page_tables([a, b, c])
    (p,) = cache.flex_attention_parts(tables)
    assert p["page_table"].dtype == np.int64 and p["n_pages"] == 4  # the fork shares a's pages
    k, v = cache.gather_flex_kv(0, 1, p["source_pages"])  # a copy: (1, H, n * S, D)
    assert k.shape == (1, H, p["n_pages"] * S, D)
    for r, seq in enumerate([a, b, c]):
        rk, rv = cache.read_kv(seq, 1)
        for t in range(len(rk)):
            phys = p["page_table"][r, t // S]
            assert p["physical_to_logical"][r, phys] == t // S
            np.testing.assert_array_equal(k[0, :, phys * S + t % S].astype(np.float32), rk[t])
            np.testing.assert_array_equal(v[0, :, phys * S + t % S].astype(np.float32), rv[t])
    (trt,) = cache.tensorrt_llm_parts(tables)
    assert trt["block_offsets"].shape == (3, 2, 3)
    pool = cache.pool(0, 0)
    assert pool["device_id"] == 0  # DLPack's number for host memory
    page = cache.block_info(cache.sequence_blocks(a)[0])["page"]
    assert trt["block_offsets"][0, 0, 0] * trt["bytes_per_block"] == page * pool["page_bytes"]
    assert trt["block_offsets"][0, 1, 0] == trt["block_offsets"][0, 0, 0] + 1
    assert cache.tensorrt_llm_layer(0, 0)["pool_pointer"] == pool["base"]
    for bad in (-1, 7):
        with pytest.raises(ValueError, match="not in the palette"):
            cache.gather_flex_kv(bad, 0, p["source_pages"])


def test_partition_and_merge_equals_whole_attention():
    cache, seqs, tables = mixed_batch(("fp16", "fp8_e4m3/tensor"))
    q = np.random.default_rng(7).normal(size=(len(seqs), 4, D)).astype(np.float32)
    out, lse = cache.reference_attention(1, tables, q)
    parts = []
    for p in cache.flashinfer_parts(tables):
        po, pl, idx = cache.reference_attention_part(1, tables, p["format"], q[p["batch_index"]])
        assert list(idx) == list(p["batch_index"])
        if p["format"] == 1:  # as FlashInfer returns it
            parts.append((idx, po, kvtier.natural_to_base2_lse(pl), "base2"))
        else:
            parts.append((idx, po, pl))
    merged, merged_lse = kvtier.merge_partial_states(len(seqs), parts)
    np.testing.assert_allclose(merged, out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(merged_lse, lse, rtol=1e-5, atol=1e-6)
    assert np.isneginf(lse[1]).all() and np.isneginf(merged_lse[1]).all()  # the empty one
    with pytest.raises(ValueError):
        kvtier.merge_partial_states(len(seqs), [(np.array([0, 0]), po[:2], pl[:2])])
    with pytest.raises(TypeError):  # the base where the LSE goes
        kvtier.merge_partial_states(len(seqs), [(idx, po, "base2")])
    with pytest.raises(TypeError):  # a row index that is not an integer
        kvtier.merge_partial_states(len(seqs), [(np.array([0.9]), po[:1], pl[:1])])
    with pytest.raises(TypeError):  # a part that is not a tuple (was RuntimeError)
        kvtier.merge_partial_states(len(seqs), [[idx, po, pl]])
    with pytest.raises(TypeError):  # a base that is not a string
        kvtier.merge_partial_states(len(seqs), [(idx, po, pl, 2)])
    with pytest.raises(ValueError, match="outside"):  # sized before any check (2^40 x 4 x D)
        kvtier.merge_partial_states(1 << 40, parts)


def test_decode_attention_on_the_cpu_backend_is_the_reference():
    cache, seqs, tables = mixed_batch()
    q = np.random.default_rng(8).normal(size=(len(seqs), 4, D)).astype(np.float32)
    want, want_lse = cache.reference_attention(1, tables, q)
    out = np.zeros_like(want)
    lse = np.zeros_like(want_lse)
    cache.decode_attention(1, tables, q, out, lse)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    out2 = np.zeros_like(want)
    cache.decode_attention(1, seqs, q, out2, lse, softmax_scale=0.5)  # a list of sequences
    assert not np.array_equal(out2, want)  # the scale reached the kernel
    with pytest.raises(ValueError, match="out must have shape"):
        cache.decode_attention(1, tables, q, out[:2], lse)
    with pytest.raises(ValueError, match="float32"):
        cache.decode_attention(1, tables, q, out.astype(np.float64), lse)
    with pytest.raises(ValueError, match="multiple"):
        q3 = np.zeros((len(seqs), 3, D), np.float32)
        cache.decode_attention(1, tables, q3, np.zeros_like(q3), np.zeros((len(seqs), 3), np.float32))


def test_prepared_decode_gives_the_results_of_the_tables():
    cache, seqs, tables = mixed_batch()
    q = np.random.default_rng(10).normal(size=(len(seqs), 4, D)).astype(np.float32)
    want, want_lse = cache.reference_attention(1, tables, q)
    step = cache.prepare_decode(tables)
    assert step.batch == len(seqs)
    out, lse = np.zeros_like(want), np.zeros_like(want_lse)
    cache.decode_attention(1, step, q, out, lse)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    assert cache.prepare_decode(seqs).batch == len(seqs)  # a list of sequences
    with pytest.raises(ValueError, match="q must have shape"):  # the step has len(seqs) rows
        cache.decode_attention(1, step, q[:1], out[:1], lse[:1])
    with pytest.raises(TypeError, match="batch must be"):
        cache.prepare_decode(3)


def test_merge_states_in_place():
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(2, 5, 3, D)).astype(np.float32)
    sa, sb = rng.normal(size=(2, 5, 3)).astype(np.float32)
    sa[0, 0] = -np.inf
    m = np.maximum(sa, sb)
    wa, wb = np.exp(sa - m), np.exp(sb - m)
    want = (a * wa[..., None] + b * wb[..., None]) / (wa + wb)[..., None]
    want_lse = m + np.log(wa + wb)
    kvtier.merge_states(a, sa, b, sb, a, sa)  # in place over a
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sa, want_lse, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="lse_b must have shape"):
        kvtier.merge_states(a, sa, b, sb[:2], a, sa)


def test_views_keep_the_cache_alive():
    cache = make_cache()
    seq = add_random(cache, 3, 9)
    want, _ = cache.read_kv(seq, 0)
    page = cache.block_info(cache.sequence_blocks(seq)[0])["page"]
    kv = np.from_dlpack(cache.flashinfer_layer(0, 0)["kv"])
    del cache, seq
    gc.collect()
    np.testing.assert_array_equal(kv[page, 0, :, 0].astype(np.float32), want[0])


def doc_blocks(language):
    text = (ROOT / "docs" / "adapters.md").read_text()
    return re.findall(r"```" + language + r"\n(.*?)```", text, re.S)


def stripped_lines(text):
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_rotated_keys_read_back_attend_alike_and_adapters_refuse():
    with pytest.raises(ValueError, match="key_rotation"):
        kvtier.Cache(head_dim=48, key_rotation="hadamard")
    with pytest.raises(ValueError, match="hadamard"):
        kvtier.Cache(key_rotation="givens")
    caches = [kvtier.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_tokens=S,
                           budget_bytes=16 << 20, key_rotation=r) for r in ("none", "hadamard")]
    assert [c.key_rotation for c in caches] == ["none", "hadamard"]
    rng = np.random.default_rng(3)
    k = rng.normal(size=(20, H, D)).astype(np.float16)
    v = rng.normal(size=(20, H, D)).astype(np.float16)
    q = rng.normal(size=(1, 4, D)).astype(np.float32)
    outs = []
    for c in caches:
        seq, _ = c.add_sequence()
        c.write_kv(0, c.append(seq, 20), k, v)
        rk, rv = c.read_kv(seq, 0)
        np.testing.assert_allclose(rk, k.astype(np.float32), atol=5e-3)  # un-rotated on read
        np.testing.assert_array_equal(rv, v.astype(np.float32))
        out, lse = np.zeros((1, 4, D), np.float32), np.zeros((1, 4), np.float32)
        c.decode_attention(0, [seq], q, out, lse)  # rotates the queries
        outs.append(out)
    np.testing.assert_allclose(outs[1], outs[0], atol=2e-3)
    with pytest.raises(RuntimeError, match="rotated"):
        caches[1].flashinfer_layer(0, 0)
    # The preset meant for rotated keys turns rotation on unless told otherwise.
    assert kvtier.Cache(policy="balanced_rot").key_rotation == "hadamard"
    assert kvtier.Cache(policy="balanced_rot", key_rotation="none").key_rotation == "none"
    assert kvtier.Cache(policy="balanced").key_rotation == "none"


def test_recorded_attention_keeps_a_block_one_tier_hotter():
    cache = kvtier.Cache(num_layers=1, num_kv_heads=H, head_dim=D, block_tokens=S,
                         budget_bytes=16 << 20, policy="attentive")
    seq = cache.add_sequence().id
    cache.append(seq, 64)  # 4 blocks
    weights = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="block_weight"):
        cache.record_attention(seq, np.array([0.5, 0.5], np.float32))
    weights[1] = 1.0  # 1.0 x 4 blocks = 4: below the preset's ratio of 32
    cache.record_attention(seq, weights)
    blocks = cache.sequence_blocks(seq)
    assert cache.block_info(blocks[1])["attention"] == 4.0
    cache.append(seq, 2048 - 64)  # 128 blocks: a new report can reach 32x
    weights = np.zeros(128, np.float32)
    weights[2] = 0.25  # x 128 = 32
    cache.record_attention(seq, weights)
    cache.end_step()
    formats = [cache.block_info(b)["format"] for b in cache.sequence_blocks(seq)]
    assert formats[1] == 2 and formats[3] == 2  # older than 1024 tokens: NVFP4
    assert formats[2] == 1  # singled out: kept in FP8
    cache.check_consistency()


def test_docs_python_snippets_run():
    blocks = doc_blocks("python")
    assert blocks, "docs/adapters.md has no python snippets"
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/adapters.md", "exec"), namespace)


def test_docs_cpp_snippets_are_compiled_by_the_tests():
    source = stripped_lines((ROOT / "tests" / "adapters_test.cc").read_text())
    joined = "\n".join(source)
    blocks = doc_blocks("cpp")
    assert blocks, "docs/adapters.md has no C++ snippets"
    for block in blocks:
        assert "\n".join(stripped_lines(block)) in joined, block


def test_remote_tier_shares_a_prefix_between_two_caches():
    import shutil
    import socket
    import subprocess
    import time
    if shutil.which("redis-server") is None:
        if os.environ.get("KVTIER_PYTHON_REQUIRED") == "1":
            raise AssertionError("redis-server is not installed (scripts/setup.sh installs it)")
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while True:  # until the server answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.time() < deadline, "redis-server did not start"
                time.sleep(0.05)

        def make(url=f"redis://127.0.0.1:{port}", secret=b"a shared secret of 32 bytes....."):
            return kvtier.Cache(num_layers=2, num_kv_heads=H, head_dim=D, block_tokens=S,
                                budget_bytes=16 << 20, remote_tier_url=url,
                                remote_model_id="test-model", remote_secret=secret,
                                remote_timeout_ms=500)
        writer, reader = make(), make()
        prompt = np.arange(40, dtype=np.int32)
        seq, _ = writer.add_sequence()
        slots = writer.append_tokens(seq, prompt)
        k = np.random.default_rng(5).normal(size=(40, H, D)).astype(np.float16)
        for layer in range(2):
            writer.write_kv(layer, slots, k, -k)
        writer.end_step()  # the two full blocks are written to Redis by the cache's thread
        deadline = time.time() + 10
        while writer.stats()["remote"]["written_blocks"] < 2:
            assert time.time() < deadline, writer.stats()["remote"]
            time.sleep(0.01)
        hit = reader.add_sequence(prompt=prompt)
        assert hit.cached_tokens == 32 and hit.remote_tokens == 32
        assert "remote_tokens=32" in repr(hit)
        assert reader.fence_passed(hit.ready_fence)
        rk, rv = reader.read_kv(hit.id, 1)
        np.testing.assert_array_equal(rk, k[:32].astype(np.float32))
        np.testing.assert_array_equal(rv, -k[:32].astype(np.float32))
        remote = reader.stats()["remote"]
        assert remote["enabled"] and remote["hit_blocks"] == 2 and remote["hit_tokens"] == 32
        assert remote["lookup_seconds"]["count"] >= 1
        assert remote["unauthenticated_values"] == 0
        reader.check_consistency()
        # Another secret: other keys, where nothing was written.
        stranger = make(secret="another secret, 32 bytes long...")
        assert stranger.add_sequence(prompt=prompt).cached_tokens == 0
        assert stranger.stats()["remote"]["missed_blocks"] == 1
    finally:
        server.terminate()
        server.wait()
    with pytest.raises(ValueError, match="remote_model_id"):
        kvtier.Cache(num_kv_heads=H, head_dim=D, remote_tier_url=f"redis://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="remote_secret"):
        kvtier.Cache(num_kv_heads=H, head_dim=D, remote_tier_url=f"redis://127.0.0.1:{port}",
                     remote_model_id="m", remote_secret="too short")


def test_stale_page_tables_are_refused_not_read():
    # Tables whose pages were freed and whose slab was unmapped (the reference read it: SIGSEGV),
    # and the same tables given to another cache.
    cache = kvtier.Cache(num_layers=1, num_kv_heads=1, head_dim=64)
    seq, _ = cache.add_sequence()
    z = np.zeros((16, 1, 64), np.float16)
    cache.write_kv(0, cache.append(seq, 16), z, z)
    tables = cache.build_page_tables([seq])
    q = np.zeros((1, 1, 64), np.float32)
    other = kvtier.Cache(num_layers=1, num_kv_heads=1, head_dim=64)
    with pytest.raises(RuntimeError, match="holds no block"):
        other.reference_attention(0, tables, q)
    cache.reference_attention(0, tables, q)
    cache.release(seq)
    cache.end_step()
    cache.end_step()
    with pytest.raises(RuntimeError, match="holds no block"):
        cache.reference_attention(0, tables, q)
    with pytest.raises(RuntimeError, match="holds no block"):
        cache.decode_attention(0, tables, q, np.zeros_like(q), np.zeros((1, 1), np.float32))

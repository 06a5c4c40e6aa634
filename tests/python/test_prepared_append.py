"""The prepared append on the CPU backend: Cache.prepare_append, PreparedAppend.update and
Cache.write_kv_layers write the bytes of write_kv layer by layer (pages, K/V read back, the
reference attention, the non-finite count), from lists of per-layer tensors and from stacked
tensors, and refuse bad input with ValueError, writing nothing.

Skipped when the module was not built, unless KVTIER_PYTHON_REQUIRED=1 (set by ctest and
scripts/test.sh). Needs numpy only.
"""
import gc
import os

import pytest

np = pytest.importorskip("numpy")
if os.environ.get("KVTIER_PYTHON_REQUIRED") == "1":
    import kvtier
else:
    kvtier = pytest.importorskip(
        "kvtier", reason="the kvtier module was not built (KVTIER_BUILD_PYTHON=OFF or no pybind11)")

L, H, D, S = 3, 2, 32, 16
PROMPTS = (20, 1, 33, 15)  # tokens per sequence before the step


def make_cache(palette=("fp16",), key_rotation="none"):
    return kvtier.Cache(num_layers=L, num_kv_heads=H, head_dim=D, block_tokens=S,
                        budget_bytes=16 << 20, palette=list(palette),
                        k_tensor_amax=[12.0] * L, v_tensor_amax=[10.0] * L,
                        key_rotation=key_rotation)


def prompted(cache, rng):
    """Sequences of PROMPTS tokens, written layer by layer with write_kv."""
    seqs = [cache.add_sequence()[0] for _ in PROMPTS]
    slots = cache.append_batch(seqs, np.asarray(PROMPTS, np.int64))
    for layer in range(L):
        k, v = rng.normal(0, 2, (2, len(slots), H, D)).astype(np.float16)
        cache.write_kv(layer, slots, k, v)
    return seqs


def step_kv(rows, seed, nan=False):
    """Every layer's K and V of a step, stacked: [L, rows, H, D] float16 each."""
    k, v = np.random.default_rng(seed).normal(0, 2, (2, L, rows, H, D)).astype(np.float16)
    if nan:
        k[1, 0, 1, 3] = np.nan
        v[2, rows - 1, 0, 0] = np.inf
    return k, v


def contents(cache, seqs):
    """Every sequence's K/V of every layer read back, and the reference attention over them."""
    tables = cache.build_page_tables(seqs)
    q = np.random.default_rng(7).normal(size=(len(seqs), 4, D)).astype(np.float32)
    out = []
    for layer in range(L):
        out += [x for s in seqs for x in cache.read_kv(s, layer)]
        out += list(cache.reference_attention(layer, tables, q))
    return out


def page_bytes(cache, seqs):
    """The raw bytes of every page the sequences hold, per layer (FP16 pools)."""
    pages = [cache.block_info(b)["page"] for s in seqs for b in cache.sequence_blocks(s)]
    return [np.from_dlpack(cache.flashinfer_layer(0, layer)["kv"])[pages].view(np.uint8)
            for layer in range(L)]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def twin_caches(palette, key_rotation, counts=None):
    """Two caches with the same prompts and (unless counts is None) the same step reserved:
    (caches, seqs, slots)."""
    caches, seqs, slots = [], None, None
    for _ in range(2):
        c = make_cache(palette, key_rotation)
        seqs = prompted(c, np.random.default_rng(1))
        if counts is not None:
            slots = c.append_batch(seqs, np.asarray(counts, np.int64))
        caches.append(c)
    return caches, seqs, slots


@pytest.mark.parametrize("palette,key_rotation", [
    (("fp16", "fp8_e4m3/tensor"), "none"),
    (("fp8_e4m3/tensor",), "none"),
    (("fp16",), "hadamard"),
])
@pytest.mark.parametrize("stacked", [False, True])
def test_one_call_writes_what_write_kv_writes_per_layer(palette, key_rotation, stacked):
    counts = [1, 1, 3, 1]  # a decode step, one sequence with a few tokens more
    (per_layer, prepared), seqs, slots = twin_caches(palette, key_rotation, counts)
    k, v = step_kv(len(slots), seed=5, nan=True)
    for layer in range(L):
        per_layer.write_kv(layer, slots, k[layer], v[layer])
    step = prepared.prepare_append(max_rows=8)
    assert (step.rows, step.max_rows) == (0, 8)
    step.update(slots)
    assert step.rows == len(slots)
    if stacked:
        prepared.write_kv_layers(step, k, v)
    else:
        prepared.write_kv_layers(step, list(k), list(v))
    assert_same(contents(prepared, seqs), contents(per_layer, seqs))
    if key_rotation == "none" and palette[0] == "fp16":
        assert_same(page_bytes(prepared, seqs), page_bytes(per_layer, seqs))
    for s in ("nonfinite_values", "tokens"):
        assert prepared.stats()[s] == per_layer.stats()[s]
    assert prepared.stats()["nonfinite_values"] > 0
    prepared.check_consistency()


def test_a_step_updated_every_decode_step():
    (per_layer, prepared), seqs, _ = twin_caches(("fp16",), "none")
    step = prepared.prepare_append(max_rows=len(seqs))
    for i in range(20):  # crosses block boundaries
        slots = [c.append_batch(seqs, np.ones(len(seqs), np.int64)) for c in (per_layer, prepared)]
        np.testing.assert_array_equal(slots[0], slots[1])
        k, v = step_kv(len(seqs), seed=100 + i)
        for layer in range(L):
            per_layer.write_kv(layer, slots[0], k[layer], v[layer])
        step.update(slots[1])
        prepared.write_kv_layers(step, k, v, synchronize=False)
        prepared.end_step()
        per_layer.end_step()
    assert_same(page_bytes(prepared, seqs), page_bytes(per_layer, seqs))


def test_dlpack_inputs_and_conversion(dlpack_producer):
    Producer = dlpack_producer
    (per_layer, prepared), seqs, slots = twin_caches(("fp16",), "none", [1] * len(PROMPTS))
    k, v = step_kv(len(slots), seed=6)
    for layer in range(L):
        per_layer.write_kv(layer, slots, k[layer], v[layer])
    step = prepared.prepare_append(max_rows=len(slots))
    step.update(slots)
    prepared.write_kv_layers(step, [Producer(x) for x in k], tuple(Producer(x) for x in v))
    assert_same(page_bytes(prepared, seqs), page_bytes(per_layer, seqs))
    prepared.write_kv_layers(step, Producer(k), Producer(v))  # stacked through DLPack
    prepared.write_kv_layers(step, k.astype(np.float32), v.astype(np.float32))  # converted
    assert_same(page_bytes(prepared, seqs), page_bytes(per_layer, seqs))


def test_refusals_write_nothing():
    cache, other = make_cache(), make_cache()
    seqs = prompted(cache, np.random.default_rng(1))
    other_seqs = prompted(other, np.random.default_rng(1))
    slots = cache.append_batch(seqs, np.ones(len(seqs), np.int64))
    other.append_batch(other_seqs, np.ones(len(seqs), np.int64))
    step = cache.prepare_append(max_rows=len(seqs))
    step.update(slots)
    before = page_bytes(cache, seqs) + page_bytes(other, other_seqs)
    k, v = step_kv(len(slots), seed=8)
    bad = [
        ("2 layer inputs for a cache of 3", lambda: cache.write_kv_layers(step, k[:2], v[:2])),
        ("2 layer inputs for a cache of 3",
         lambda: cache.write_kv_layers(step, list(k[:2]), list(v[:2]))),
        ("same length", lambda: cache.write_kv_layers(step, list(k), list(v[:2]))),
        ("same length", lambda: cache.write_kv_layers(step, list(k), v)),
        ("layers\\[0\\]", lambda: cache.write_kv_layers(step, k[:, :2], v[:, :2])),  # rows
        ("shape \\[layers, tokens", lambda: cache.write_kv_layers(step, k[0], v[0])),
        ("shape \\[tokens", lambda: cache.write_kv_layers(step, list(k[:, :, :1]), list(v))),
        ("another cache", lambda: other.write_kv_layers(step, k, v)),
    ]
    for match, call in bad:
        with pytest.raises(ValueError, match=match):
            call()
    assert_same(page_bytes(cache, seqs) + page_bytes(other, other_seqs), before)


def test_layers_of_different_dtypes_are_refused():
    torch = pytest.importorskip("torch")
    cache = make_cache()
    seqs = prompted(cache, np.random.default_rng(1))
    step = cache.prepare_append(max_rows=len(seqs))
    step.update(cache.append_batch(seqs, np.ones(len(seqs), np.int64)))
    before = page_bytes(cache, seqs)
    k, v = (torch.from_numpy(x) for x in step_kv(len(seqs), seed=8))
    mixed_k = [k[0], k[1].to(torch.bfloat16), k[2]]
    mixed_v = [v[0], v[1].to(torch.bfloat16), v[2]]
    with pytest.raises(ValueError, match="another dtype"):
        cache.write_kv_layers(step, mixed_k, mixed_v)
    assert_same(page_bytes(cache, seqs), before)
    cache.write_kv_layers(step, k.to(torch.bfloat16), v.to(torch.bfloat16))  # BF16, stacked
    assert not all(np.array_equal(a, b) for a, b in zip(page_bytes(cache, seqs), before))


def test_update_refusals_leave_the_step_unchanged():
    cache = make_cache()
    seqs = prompted(cache, np.random.default_rng(1))
    slots = cache.append_batch(seqs, np.ones(len(seqs), np.int64))
    step = cache.prepare_append(max_rows=2)
    with pytest.raises(ValueError, match="at most 2"):
        step.update(slots)  # rows over max_rows
    step.update(slots[:2])
    with pytest.raises(ValueError, match="slot"):
        step.update([slots[0], 10 ** 9])  # not a reserved slot
    assert step.rows == 2
    with pytest.raises(ValueError, match="max_rows"):
        cache.prepare_append(max_rows=0)
    step.after_graph_launch()  # nothing to do on the CPU


def test_the_step_keeps_the_cache_alive():
    cache = make_cache()
    seqs = prompted(cache, np.random.default_rng(1))
    slots = cache.append_batch(seqs, np.ones(len(seqs), np.int64))
    step = cache.prepare_append(max_rows=len(slots))
    del cache
    gc.collect()
    step.update(slots)  # checks the slots against the cache it holds
    assert step.rows == len(slots)

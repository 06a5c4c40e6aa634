"""The engine example (examples/engine, docs/engine.md) on the CPU backend: a 2-layer Llama at
head_dim 128 decodes 64-token requests with kvtier as its only KV cache, and its greedy tokens
with the FP16 palette equal transformers' generate() with its own cache; continuous batching,
prefix sharing, a precision policy, seeded sampling, the K/V capture for `kvtier recall`, and
the bad-input cases.

Needs torch and transformers (scripts/setup_python.sh); skipped without them unless
KVTIER_ENGINE_REQUIRED=1 (set by scripts/test.sh), where they are required.
"""
import contextlib
import os
import pathlib
import sys
import urllib.error
import urllib.request

import pytest

np = pytest.importorskip("numpy")
ROOT = pathlib.Path(__file__).resolve().parents[2]
if os.environ.get("KVTIER_ENGINE_REQUIRED") == "1":
    import kvtier
    import torch
    import transformers  # noqa: F401
else:
    kvtier = pytest.importorskip("kvtier", reason="the kvtier module was not built")
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
from transformers import AttentionInterface  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

sys.path.insert(0, str(ROOT / "examples" / "engine"))
from kvtier_engine import (TINY, ContiguousKV, Engine, KvtierKV, LlamaCompute,  # noqa: E402
                           MetricsServer, RequestError, StepTimer, llama_config, random_llama)
from kvtier_engine.capture import capture_kv, main as capture_main, model_kv  # noqa: E402

TOTAL = 64  # tokens per request, prompt included


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return random_llama(llama_config(**TINY), seed=0)


def make_cache(m, layers=None, budget=64 << 20, policy=None):
    palette = None if policy else ["fp16"]
    return kvtier.Cache(num_layers=layers or m.config.num_hidden_layers,
                        num_kv_heads=m.config.num_key_value_heads, head_dim=128,
                        budget_bytes=budget, palette=palette, policy=policy)


def prompts(system_tokens=40, tails=(3, 9, 5), seed=1):
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(0, 512, (system_tokens,), generator=g).tolist()
    return [system + torch.randint(0, 512, (n,), generator=g).tolist() for n in tails]


def fp16_kv_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention over K/V rounded to FP16, as the FP16 palette stores them."""
    return sdpa_attention_forward(module, query, key.half().float(), value.half().float(),
                                  attention_mask, **kwargs)


AttentionInterface.register("fp16_kv_sdpa", fp16_kv_sdpa)


def reference(model, prompt, new_tokens):
    """transformers' generate() with its default cache, the float32 model attending K/V rounded
    to FP16 (what the cache stores): (tokens, logits [new_tokens, V])."""
    model.set_attn_implementation("fp16_kv_sdpa")
    try:
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    finally:
        model.set_attn_implementation("sdpa")
    return out.sequences[0, len(prompt):].tolist(), torch.stack([x[0] for x in out.logits])


@torch.inference_mode()
def no_cache_greedy(model, prompt, new_tokens):
    """Greedy tokens from a full forward over the whole sequence at every step (no cache)."""
    model.set_attn_implementation("fp16_kv_sdpa")
    ids = list(prompt)
    try:
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    finally:
        model.set_attn_implementation("sdpa")
    return ids[len(prompt):]


def test_fp16_greedy_tokens_equal_transformers_generate(model):
    cache = make_cache(model)
    engine = Engine(LlamaCompute(model), cache, max_batch=2)  # the third request waits
    ps = prompts()
    ids = [engine.submit(p, TOTAL - len(p), record_logits=True) for p in ps]
    engine.step()
    engine.step()
    late = prompts(tails=(2,), seed=5)[0][:11]  # joins mid-run
    ids.append(engine.submit(late, TOTAL - len(late), record_logits=True))
    ps.append(late)
    assert len(engine.running) == 2 and engine.waiting == ids[2:]
    engine.run()
    for rid, p in zip(ids, ps):
        want, want_logits = reference(model, p, TOTAL - len(p))
        got = engine.results[rid]
        assert got.tokens == want
        # Same K/V values; only the attention arithmetic differs (kvtier's CPU reference).
        assert float((torch.stack(got.logits) - want_logits).abs().max()) < 1e-4
    # The second and third requests found the system prompt's two full blocks in the cache.
    assert [engine.results[r].cached_tokens for r in ids] == [0, 32, 32, 0]
    stats = cache.stats()
    assert stats["prefix_hit_tokens"] == 64 and stats["sequences"] == 0
    assert stats["steps"] == engine.steps
    cache.check_consistency()


def test_policy_runs_and_stays_close_to_fp16(model):
    ps = prompts(tails=(8,))
    base = Engine(LlamaCompute(model), make_cache(model))
    rid = base.submit(ps[0], TOTAL - len(ps[0]), record_logits=True)
    base.run()
    fp16 = base.results[rid]
    cache = make_cache(model, policy="fp8")  # FP16 for 16 tokens, then FP8 per (block, head)
    engine = Engine(LlamaCompute(model), cache)
    rid = engine.submit(ps[0], TOTAL - len(ps[0]), forced=fp16.tokens, record_logits=True)
    engine.run()
    stats = cache.stats()
    assert stats["policy"] == "fp8" and sum(m["blocks"] for m in stats["migrations"]) > 0
    got = torch.stack(engine.results[rid].logits)
    want = torch.stack(fp16.logits)
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean()
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1).mean()
    assert agree >= 0.9 and float(kl) < 1e-2


def test_seeded_sampling_is_reproducible_and_batch_independent(model):
    p = prompts(tails=(4,))[0]

    def run(seed, companions):
        engine = Engine(LlamaCompute(model), make_cache(model))
        rid = engine.submit(p, 12, temperature=0.8, top_k=50, seed=seed)
        for c in companions:
            engine.submit(c, 12, temperature=1.0, seed=9)
        engine.run()
        return engine.results[rid].tokens

    alone = run(3, [])
    assert run(3, prompts(tails=(6, 2), seed=7)) == alone
    assert run(4, []) != alone


def test_bad_requests_are_refused_and_others_keep_running(model):
    m = LlamaCompute(model)
    cache = make_cache(model, budget=4 << 20)  # 2 slabs of 2 MiB: one per layer
    engine = Engine(m, cache)
    p = prompts(tails=(4,))[0]
    rid = engine.submit(p, 20)
    engine.step()
    with pytest.raises(RequestError, match="0 tokens"):
        engine.submit([], 5)
    # An FP16 page here is 16 x 2 x 2 x 128 x 2 = 16 KiB: a 2 MiB slab holds 128 pages.
    with pytest.raises(RequestError, match="more than the whole budget"):
        engine.submit(p, 128 * 16)
    with pytest.raises(RequestError, match=r"token ids must be in \[0, 512\)"):
        engine.submit([512], 5)
    # Each of these was queued: inf and nan passed `< 1` and the size check, and never finished.
    for bad in (float("inf"), float("nan"), 2.5, "3"):
        with pytest.raises(RequestError, match="max_new_tokens must be an integer >= 1"):
            engine.submit(p, bad)
    with pytest.raises(RequestError, match="prompt token ids must be integers"):
        engine.submit([1.7, 2.0], 3)  # was cut to [1, 2]
    with pytest.raises(RequestError, match="forced token ids must be integers"):
        engine.submit(p, 2, forced=[3, 4.5])
    with pytest.raises(RequestError, match="top_k must be an integer >= 0"):
        engine.submit(p, 4, temperature=1.0, top_k=-1)
    # Each of these raised in sampling, after admission: the request stayed running with no
    # token and every later step failed.
    with pytest.raises(RequestError, match="temperature must be a finite number"):
        engine.submit(p, 4, temperature=float("nan"))
    with pytest.raises(RequestError, match="top_k must be an integer"):
        engine.submit(p, 4, temperature=1.0, top_k=2.5)
    with pytest.raises(RequestError, match="seed must be an integer"):
        engine.submit(p, 4, temperature=1.0, seed=1.5)
    huge = engine.submit(p, 2, temperature=1.0, seed=1 << 62)  # past torch's seed range times 1000003
    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        Engine(m, make_cache(model), max_batch=0)
    with pytest.raises(RequestError, match=r"forced token ids must be in \[0, 512\)"):
        engine.submit(p, 2, forced=[3, 512])
    with pytest.raises(ValueError, match="the model has 2 layers but the cache has 3"):
        Engine(m, make_cache(model, layers=3))
    with pytest.raises(ValueError, match="the model has 2 layers but the cache has 1"):
        Engine(m, cache=make_cache(model, layers=1))
    assert list(engine.running) == [rid] and engine.waiting == [huge]
    engine.run()
    want, _ = reference(model, p, 20)
    assert engine.results[rid].tokens == want
    assert len(engine.results[huge].tokens) == 2


def test_cancel_frees_a_request_and_leaves_the_rest(model):
    cache = make_cache(model)
    engine = Engine(LlamaCompute(model), cache, max_batch=2)
    ps = prompts(tails=(3, 9, 5))
    ids = [engine.submit(p, 20) for p in ps]
    engine.step()
    engine.cancel(ids[0])  # running
    engine.cancel(ids[2])  # waiting
    assert list(engine.running) == [ids[1]] and not engine.waiting
    assert cache.stats()["sequences"] == 1
    engine.run()
    assert len(engine.results[ids[0]].tokens) == 2 and not engine.results[ids[2]].tokens
    assert engine.results[ids[1]].tokens == reference(model, ps[1], 20)[0]
    with pytest.raises(KeyError):
        engine.cancel(99)


def test_contiguous_baseline_decodes_generates_tokens(model):
    # The speed baseline (dense FP16 K/V in BSHD slots, SDPA): a ragged batch (a mask) whose
    # slots are not 0..B-1 (a gather) after the first request finishes early.
    m = LlamaCompute(model)
    timer = StepTimer()
    kv = ContiguousKV(m, max_batch=3, max_context=TOTAL, timer=timer)
    engine = Engine(m, backend=kv, max_batch=3, timer=timer)
    ps = prompts()
    news = [4, TOTAL - len(ps[1]), TOTAL - len(ps[2])]
    ids = [engine.submit(p, n) for p, n in zip(ps, news)]
    engine.run()
    for rid, p, n in zip(ids, ps, news):
        assert engine.results[rid].tokens == reference(model, p, n)[0]
    # On the CPU no backend is probed: torch's own dispatch, at each batch size seen.
    assert kv.sdpa_choice == {3: "default", 2: "default", 1: "default"}
    assert sorted(kv.free) == [0, 1, 2] and not kv.lengths
    with pytest.raises(RequestError, match="longer than the contiguous cache"):
        engine.submit(ps[0], TOTAL)


def test_admission_keeps_a_reserve_for_the_policy(model):
    m = LlamaCompute(model)
    ps = prompts(system_tokens=0, tails=(1500, 600))  # 94 and 38 pages; a slab holds 128
    for reserve, palette, waits in ((0.1, "fp8", True), (0.0, "fp8", False),
                                    (0.1, None, False)):  # FP16 alone needs no reserve
        cache = make_cache(model, budget=8 << 20, policy=palette)  # 2 slabs per layer
        timer = StepTimer()
        engine = Engine(m, backend=KvtierKV(cache, m, timer, admit_reserve=reserve),
                        timer=timer)
        ids = [engine.submit(p, 4) for p in ps]
        engine.step()
        assert (engine.waiting == ids[1:]) == waits
        engine.run()
        assert all(len(engine.results[r].tokens) == 4 for r in ids)


def refusing_engine(model, refuses):
    """An engine on a kvtier cache whose appends raise MemoryError when refuses(counts)."""
    class RefusingKV(KvtierKV):
        def append(self, hs, counts, tokens):
            if refuses(counts):
                raise MemoryError("the budget cannot hold the new blocks")
            return super().append(hs, counts, tokens)

    m = LlamaCompute(model)
    cache = make_cache(model)
    timer = StepTimer()
    return Engine(m, backend=RefusingKV(cache, m, timer), timer=timer), cache


def test_a_prefill_that_raises_releases_its_sequence(model):
    # Any failure in a prefill, not only MemoryError, releases the sequence it added: it stayed
    # held, half admitted, for good. It is abandoned: the prompt blocks it indexed, whose K/V
    # was never written, are not left for a later request with that prefix to match.
    class FailingKV(KvtierKV):
        def write(self, layer, slots, k, v):
            raise RuntimeError("simulated device failure")

    m = LlamaCompute(model)
    cache = make_cache(model)
    timer = StepTimer()
    engine = Engine(m, backend=FailingKV(cache, m, timer), timer=timer)
    rid = engine.submit(prompts(tails=(4,))[0], 4)
    with pytest.raises(RuntimeError, match="simulated"):
        engine.step()
    assert cache.stats()["sequences"] == 0 and not engine.running
    assert cache.stats()["indexed_blocks"] == 0
    # The request fails: it was left at the queue's head, retried first at every step.
    assert not engine.waiting and engine.results[rid].done
    assert engine.results[rid].error == "prefill failed: RuntimeError: simulated device failure"


@pytest.mark.parametrize("error", [RuntimeError, torch.OutOfMemoryError])
def test_a_request_whose_prefill_always_raises_does_not_hold_up_the_others(model, error):
    # A prefill of over 100 tokens raises: an error of its own (a kernel refusing the shape) fails
    # that request at once, a device out of memory once it is alone (as the cache's MemoryError).
    # Was: either stayed at the queue's head, every later step retried it first and raised, and
    # the running request never decoded again.
    class LongPrefillFailsKV(KvtierKV):
        def write(self, layer, slots, k, v):
            if len(slots) > 100:
                raise error("simulated failure of a long prefill")
            return super().write(layer, slots, k, v)

    m = LlamaCompute(model)
    cache = make_cache(model)
    timer = StepTimer()
    engine = Engine(m, backend=LongPrefillFailsKV(cache, m, timer), timer=timer)
    small, big = prompts(system_tokens=0, tails=(20, 150))
    a = engine.submit(small, 8)
    engine.step()
    b = engine.submit(big, 4)
    c = engine.submit(small, 3)
    for _ in range(20):
        with contextlib.suppress(error):
            engine.step()
    assert len(engine.results[a].tokens) == 8 and len(engine.results[c].tokens) == 3
    assert engine.results[b].done and not engine.results[b].tokens
    want = "prefill failed: RuntimeError" if error is RuntimeError else "does not fit the device"
    assert engine.results[b].error.startswith(want)
    assert not engine.busy() and cache.stats()["sequences"] == 0


def test_a_decode_step_that_raises_puts_its_requests_back(model):
    # A layer failing after the step's append: the blocks that token completed hold K/V of some
    # layers only. The batch's sequences are abandoned (none of those blocks stays indexed for a
    # later request to match) and its requests wait again, to resume from their tokens.
    class FailingOnceKV(KvtierKV):
        fail_at = None  # the layer whose attention raises, once

        def attend(self, layer, step, q):
            if layer == self.fail_at:
                self.fail_at = None
                raise RuntimeError("simulated device failure")
            return super().attend(layer, step, q)

    m = LlamaCompute(model)
    cache = make_cache(model)
    timer = StepTimer()
    kv = FailingOnceKV(cache, m, timer)
    engine = Engine(m, backend=kv, timer=timer)
    ps = prompts(system_tokens=0, tails=(30, 46))  # the second decode token fills a block
    ids = [engine.submit(p, 6) for p in ps]
    engine.step()  # both prefilled and decoded once: two tokens each
    indexed = cache.stats()["indexed_blocks"]
    assert indexed == 1 + 2 and len(engine.running) == 2
    kv.fail_at = 1
    with pytest.raises(RuntimeError, match="simulated"):
        engine.step()
    assert not engine.running and engine.waiting == ids
    assert cache.stats()["sequences"] == 0
    # The two blocks the failed step filled left the index; the prompts' blocks stay, cached.
    assert cache.stats()["indexed_blocks"] == indexed
    assert cache.stats()["abandoned_blocks"] == 2
    assert [len(engine.results[r].tokens) for r in ids] == [2, 2]
    engine.run()
    for rid, p in zip(ids, ps):
        req = engine.results[rid]
        assert req.preemptions == 1 and not req.error
        assert req.tokens == no_cache_greedy(model, p, 6)


def test_a_token_choice_that_raises_puts_the_batch_back(model, monkeypatch):
    # Sampling raising for the second request of a decode step, after the first request's token
    # was chosen: no request gets its token (none is one token behind its cache), the batch
    # waits again, and the tokens of a run that resumes equal those of an uninterrupted run.
    import kvtier_engine.engine as engine_module
    real_sample = engine_module.sample
    ps = prompts(system_tokens=0, tails=(30, 46))

    def run(fail_at_call):
        calls = [0]

        def flaky(logits, req, index):
            calls[0] += 1
            if calls[0] == fail_at_call:
                raise RuntimeError("simulated sampling failure")
            return real_sample(logits, req, index)

        monkeypatch.setattr(engine_module, "sample", flaky)
        m = LlamaCompute(model)
        cache = make_cache(model)
        timer = StepTimer()
        engine = Engine(m, backend=KvtierKV(cache, m, timer), timer=timer)
        ids = [engine.submit(p, 6, temperature=0.8, seed=i) for i, p in enumerate(ps)]
        if fail_at_call is not None:  # step 1: two prefills (calls 1, 2), then a decode (3, 4)
            with pytest.raises(RuntimeError, match="simulated"):
                engine.step()
            assert not engine.running and engine.waiting == ids
            assert cache.stats()["sequences"] == 0
            assert [len(engine.results[r].tokens) for r in ids] == [1, 1]
        engine.run()
        return [engine.results[r].tokens for r in ids]

    assert run(fail_at_call=4) == run(fail_at_call=None)


def test_a_request_that_fails_alone_leaves_the_queue_moving(model):
    # A cache that cannot take a prefill of over 100 tokens.
    engine, cache = refusing_engine(model, lambda counts: counts[0] > 100)
    big, small = prompts(system_tokens=0, tails=(150, 20))
    ids = [engine.submit(big, 4), engine.submit(small, 4)]
    engine.step()
    failed = engine.results[ids[0]]
    assert failed.done and "does not fit the cache" in failed.error and not failed.tokens
    assert list(engine.running) == [ids[1]]
    engine.run()
    assert len(engine.results[ids[1]].tokens) == 4 and cache.stats()["sequences"] == 0


def test_a_request_that_cannot_decode_alone_fails_and_the_step_goes_on(model):
    # A cache with no room for a decode token.
    engine, cache = refusing_engine(model, lambda counts: counts == [1])
    rid = engine.submit(prompts(tails=(4,))[0], 4)
    engine.run()  # one token from the prefill, then the decode step fails it
    req = engine.results[rid]
    assert req.done and "does not fit the cache" in req.error and len(req.tokens) == 1
    assert not engine.running and cache.stats()["sequences"] == 0


def test_a_full_cache_preempts_and_resumes(model):
    cache = make_cache(model, budget=4 << 20)
    m = LlamaCompute(model)
    timer = StepTimer()  # no reserve: both requests are admitted, and decode runs out
    engine = Engine(m, backend=KvtierKV(cache, m, timer, admit_reserve=0), timer=timer)
    ps = prompts(system_tokens=0, tails=(1008, 1008))  # 63 pages each; 65 after 17 tokens
    ids = [engine.submit(p, 18) for p in ps]
    engine.step()
    assert len(engine.running) == 2
    engine.run()
    assert sum(engine.results[r].preemptions for r in ids) == 1
    for rid, p in zip(ids, ps):
        assert engine.results[rid].tokens == no_cache_greedy(model, p, 18)


def test_capture_kv_for_kvtier_recall(model):
    m = LlamaCompute(model)
    p = prompts(system_tokens=0, tails=(48,))[0]  # three whole blocks, the last one included
    k, v = capture_kv(Engine(m, make_cache(model)), p)
    assert k.shape == v.shape == (2, 48, 2, 128) and k.dtype == np.float32
    # Layer 0's keys are the RoPE'd projections of the embeddings, as the cache stored them.
    hidden = m.embed(torch.tensor(p))
    _, want_k, _ = m.qkv(0, hidden, m.rope(hidden, torch.arange(48)))
    np.testing.assert_array_equal(k[0], want_k.detach().half().float().numpy())


def test_model_kv_reads_what_the_cache_stores(model):
    # The trained model's capture path (transformers' own cache, no kvtier) gives the K/V that
    # the engine's cache stores, up to the float32 rounding of the two implementations.
    p = prompts(system_tokens=0, tails=(40,))[0]
    k, v = capture_kv(Engine(LlamaCompute(model), make_cache(model)), p)
    hf_k, hf_v = model_kv(model, p[:32])
    assert hf_k.shape == k.shape and hf_v.shape == v.shape and hf_k.dtype == np.float32
    np.testing.assert_allclose(hf_k, k, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(hf_v, v, rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(hf_k, hf_k.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("args", [["--tokens", "0"], ["--train-steps", "-1"],
                                  ["--train-steps", "1", "--tokens", "5000"]])
def test_capture_refuses_bad_arguments(args, tmp_path):
    with pytest.raises(SystemExit):
        capture_main(["--out", str(tmp_path)] + args)
    assert not any(tmp_path.iterdir())


def test_metrics_endpoint_serves_the_engine_and_the_cache(model):
    engine = Engine(LlamaCompute(model), make_cache(model), max_batch=1)
    ps = prompts(tails=(3, 9))
    for p in ps:
        engine.submit(p, 5)
    engine.step()
    server = MetricsServer(engine)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            lines = response.read().decode().splitlines()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=10)
    finally:
        server.close()
    assert 'kvtier_engine_requests{state="running"} 1' in lines
    assert 'kvtier_engine_requests{state="waiting"} 1' in lines
    assert "kvtier_engine_steps_total 1" in lines and "kvtier_engine_tokens_total 2" in lines
    assert "kvtier_engine_cache_sequences 1.0" in lines
    assert 'kvtier_engine_cache_format_blocks_in_use{format="fp16"} 3.0' in lines
    # The nested stats too (they were dropped), and each name's lines together.
    assert any(line.startswith("kvtier_engine_cache_host_") for line in lines)
    assert any(line.startswith("kvtier_engine_cache_events_") for line in lines)
    assert any(line.startswith("kvtier_engine_cache_migration_seconds_count ") for line in lines)
    names = [line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")]
    for name in set(names):
        first, count = names.index(name), names.count(name)
        assert names[first:first + count] == [name] * count, name


def test_metrics_render_while_requests_arrive():
    # Scrapes run on the server's thread while the engine thread submits: rendering must not
    # iterate the results dict as it grows. Thread switches are forced often.
    import threading
    import types
    from kvtier_engine.metrics import render
    request = types.SimpleNamespace(tokens=[1, 2], preemptions=0)
    engine = types.SimpleNamespace(running={}, waiting=[], steps=0, results={}, tokens_total=0,
                                   preemptions_total=0, kv=types.SimpleNamespace())
    stop = threading.Event()

    def submit_forever():
        while not stop.is_set():  # from 0 to 256 requests and back, over and over
            for i in range(256):
                engine.results[i] = request
            engine.results.clear()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    submitter = threading.Thread(target=submit_forever)
    submitter.start()
    try:
        for _ in range(300):
            assert "kvtier_engine_tokens_total" in render(engine)
    finally:
        stop.set()
        submitter.join()
        sys.setswitchinterval(interval)


class FakeFlashInferDecode:
    """flashinfer.BatchDecodeWithPagedKVCacheWrapper's plan/run on the CPU: gathers each
    request's pages through the CSR page table, as FlashInfer reads them, and attends with
    SDPA. Tests the paging of FlashInferKV without FlashInfer."""

    def __init__(self, workspace, layout, use_tensor_cores=False):
        assert layout == "HND"

    def plan(self, indptr, indices, last_page_len, q_heads, kv_heads, head_dim, page_tokens,
             pos_encoding_mode, sm_scale, q_data_type, kv_data_type):
        self.tables = [indices[indptr[i]:indptr[i + 1]].long() for i in range(len(indptr) - 1)]
        self.last, self.page_tokens, self.scale = last_page_len.tolist(), page_tokens, sm_scale

    def run(self, q, pool):
        out = []
        for i, pages in enumerate(self.tables):
            n = (len(pages) - 1) * self.page_tokens + self.last[i]
            kv = pool[pages].permute(1, 2, 0, 3, 4).flatten(2, 3)[:, :, :n].float()
            out.append(torch.nn.functional.scaled_dot_product_attention(
                q[i].float()[:, None], kv[0], kv[1], scale=self.scale, enable_gqa=True)[:, 0])
        return torch.stack(out).half()


def test_flashinfer_baseline_pages_requests_as_flashinfer_reads_them(model, monkeypatch):
    import types
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=FakeFlashInferDecode))
    from kvtier_engine.flashinfer_kv import FlashInferKV
    m = LlamaCompute(model)
    timer = StepTimer()
    # 12 pages of 16 tokens: the three requests need 4 + 4 + 4; the first finishes early and
    # its pages go to the last, which joins later.
    kv = FlashInferKV(m, max_tokens=12 * 16, timer=timer)
    engine = Engine(m, backend=kv, max_batch=3, timer=timer)
    ps = prompts()
    late = prompts(tails=(2,), seed=5)[0][:11]
    news = [4, TOTAL - len(ps[1]), TOTAL - len(ps[2]), TOTAL - len(late)]
    ids = [engine.submit(p, n) for p, n in zip(ps + [late], news)]
    engine.run()
    for rid, p, n in zip(ids, ps + [late], news):
        assert engine.results[rid].tokens == reference(model, p, n)[0]
    assert sorted(kv.free) == list(range(12)) and not kv.tables and not kv.counts
    with pytest.raises(RequestError, match="more than the FlashInfer pool"):
        engine.submit(ps[0], 13 * 16)


def test_byte_llama_learns_the_standard_library():
    from kvtier_engine.train import stdlib_corpus, train_byte_llama
    corpus = stdlib_corpus(limit_bytes=1 << 20)
    assert len(corpus) == 1 << 20
    tiny = dict(layers=1, hidden=128, q_heads=1, kv_heads=1, intermediate=256, vocab=256,
                max_positions=64)
    lines = []
    trained, info = train_byte_llama(corpus, 60, device="cpu", seq=32, batch=8,
                                     geometry=tiny, log=lines.append)
    # From ln(256) = 5.55 nats per byte (uniform, the untrained start) to well below.
    assert info["steps"] == 60 and info["loss"] < 4.0
    assert lines and "step 60/60" in lines[-1]
    assert not trained.training

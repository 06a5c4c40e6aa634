"""KV events as a router consumes them (docs/events.md): a subscriber written with pyzmq and
msgpack, as Dynamo's or llm-d's would be, decodes vLLM's KVEventBatch from a cache with a host
tier through a randomized run, fills the gaps of its subscription through the replay socket, and
rebuilds the set of blocks in each tier, equal to the cache's own view at the end.

Skipped when the module, pyzmq or msgpack is missing, unless KVTIER_PYTHON_REQUIRED=1.
"""
import os
import random
import tempfile
import time

import pytest

if os.environ.get("KVTIER_PYTHON_REQUIRED") == "1":
    import kvtier
    import msgpack
    import zmq
else:
    kvtier = pytest.importorskip("kvtier")
    msgpack = pytest.importorskip("msgpack")
    zmq = pytest.importorskip("zmq")

S = 16
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def apply(batch, tiers):
    """Applies one decoded KVEventBatch [ts, events] to {medium: {hash: format or None}}."""
    ts, events = batch[0], batch[1]
    assert isinstance(ts, float) and len(batch) == 2
    for event in events:
        tag = event[0]
        if tag == "BlockStored":
            _, hashes, parent, tokens, block_size, lora_id, medium = event
            assert block_size == S and len(tokens) == S * len(hashes) and lora_id is None
            assert parent is None or isinstance(parent, int)
            for h in hashes:
                assert h not in tiers[medium], "stored twice"
                tiers[medium][h] = 0
        elif tag == "BlockRemoved":
            _, hashes, medium = event
            for h in hashes:
                del tiers[medium][h]
        elif tag == "BlockFormatChanged":  # kvtier's extension; a router may skip it
            _, hashes, medium, fmt = event
            for h in hashes:
                tiers[medium][h] = fmt
        elif tag == "AllBlocksCleared":
            for tier in tiers.values():
                tier.clear()
        else:
            raise AssertionError(f"unknown event {tag}")


def replay(context, endpoint, start):
    """The buffered batches from `start` on, as {seq: payload}, through the ROUTER socket."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    got = {}
    while True:
        _, seq, payload = dealer.recv_multipart()
        if seq == END_SEQ:
            assert payload == b""
            break
        got[int.from_bytes(seq, "big")] = payload
    dealer.close()
    return got


def random_run(cache, rng, prompts, steps):
    """`steps` steps of random admissions (sharing `prompts`), appends, releases and demotions."""
    live = []
    for step in range(steps):
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            try:
                if not live or op < 0.2:
                    prompt = rng.choice(prompts) + [rng.randint(0, 50000) for _ in range(rng.randint(0, 40))]
                    seq, cached = cache.add_sequence(prompt)
                    live.append(seq)
                    if cached < len(prompt):
                        cache.append_tokens(seq, prompt[cached:])
                elif op < 0.6:
                    cache.append_tokens(rng.choice(live), [rng.randint(0, 50000) for _ in range(rng.randint(1, 40))])
                elif op < 0.85:
                    cache.release(live.pop(rng.randrange(len(live))))
                else:
                    seq = rng.choice(live)
                    hot = [b for b in cache.sequence_blocks(seq)
                           if cache.block_info(b)["format"] == 0 and cache.block_info(b)["num_tokens"] == S]
                    if hot:
                        cache.demote(hot, 1)
            except MemoryError:
                pass  # the budget is full of blocks in use: refused, nothing changed
        cache.end_step()


def test_subscriber_rebuilds_every_tier_of_a_randomized_run():
    tmp = tempfile.mkdtemp(prefix="kvtier-events-")
    endpoint, replay_endpoint = f"ipc://{tmp}/pub", f"ipc://{tmp}/replay"
    cache = kvtier.Cache(num_layers=2, num_kv_heads=2, head_dim=64, block_tokens=S,
                         budget_bytes=8 << 20, palette=["fp16", "fp8_e4m3/block_head"],
                         host_tier_bytes=4 << 20, host_tier_format=1,
                         kv_events_endpoint=endpoint, kv_events_replay_endpoint=replay_endpoint,
                         kv_events_topic="kv-events", kv_events_format_changes=True)
    rng = random.Random(20261201)
    # Many prompts, so that some go cold enough to be offloaded and are matched again later.
    prompts = [[p * 100000 + i for i in range(rng.randint(0, 160))] for p in range(48)]
    random_run(cache, rng, prompts, steps=200)  # before the router subscribes: from the replay
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(endpoint)
    time.sleep(0.2)  # the subscription reaches the publisher
    random_run(cache, rng, prompts, steps=200)
    deadline = time.time() + 10
    while cache.stats()["events"]["queued_batches"]:
        assert time.time() < deadline
        time.sleep(0.01)

    received = {}
    while sub.poll(300):  # until the publisher has been quiet for 300 ms
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv-events" and len(seq) == 8
        received[int.from_bytes(seq, "big")] = payload
    assert received, "the subscription received nothing"
    last = max(received)
    missing = [s for s in range(last + 1) if s not in received]
    assert missing and missing[0] == 0  # what was published before the subscription
    # The router's recovery path: ask the replay socket from the first gap.
    received.update(replay(context, replay_endpoint, missing[0]))
    assert sorted(received) == list(range(last + 1))
    assert cache.stats()["events"]["replay_requests"] == 1

    tiers = {"GPU": {}, "CPU": {}}
    for seq in sorted(received):
        apply(msgpack.unpackb(received[seq], raw=False, strict_map_key=False), tiers)
    palette = cache.palette
    want = {"GPU": {}, "CPU": {}}
    for h, medium, fmt in cache.indexed_blocks():
        want[medium][h] = palette[fmt] if fmt else 0
    assert tiers == want
    s = cache.stats()
    assert s["host"]["offloaded_blocks"] > 0 and s["host"]["onloaded_blocks"] > 0
    assert len(want["GPU"]) > 0 and len(want["CPU"]) > 0
    assert s["events"]["dropped_batches"] == 0

    del cache  # closing the cache clears every block
    topic, seq, payload = sub.recv_multipart()
    assert int.from_bytes(seq, "big") == last + 1
    assert msgpack.unpackb(payload, raw=False)[1] == [["AllBlocksCleared"]]
    sub.close()
    context.term()


def test_a_refused_endpoint_is_a_value_error():
    with pytest.raises(ValueError, match="kv_events_endpoint"):
        kvtier.Cache(kv_events_endpoint="nonsense://x")


def test_the_event_queue_bounds_are_options(tmp_path):
    endpoint = f"ipc://{tmp_path}/bounds"
    for name in ("kv_events_replay_batches", "kv_events_queue_batches"):
        with pytest.raises(ValueError, match=name):
            kvtier.Cache(kv_events_endpoint=endpoint, **{name: 0})
    cache = kvtier.Cache(kv_events_endpoint=endpoint, kv_events_replay_batches=16,
                         kv_events_queue_batches=4)
    cache.append_tokens(cache.add_sequence()[0], list(range(32)))
    cache.end_step()  # one batch: two BlockStored
    for _ in range(200):
        events = cache.stats()["events"]
        if events["published_batches"] + events["dropped_batches"] == 1:
            break
        time.sleep(0.01)
    assert events["published_batches"] == 1


def test_vllm_hash_seed_names_blocks_as_vllm_would():
    # A router that hashes token blocks as vLLM does (sha256_cbor, PYTHONHASHSEED=0, int block
    # hashes) recomputes every BlockStored hash from the event's tokens and its parent's digest.
    if os.environ.get("KVTIER_PYTHON_REQUIRED") == "1":
        import cbor2
    else:
        cbor2 = pytest.importorskip("cbor2")
    import hashlib

    def sha256_cbor(x):
        return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()

    def as_int(digest):
        return int.from_bytes(digest, "big") & ((1 << 64) - 1)

    tmp = tempfile.mkdtemp(prefix="kvtier-events-")
    endpoint = f"ipc://{tmp}/pub"
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    cache = kvtier.Cache(num_layers=2, num_kv_heads=2, head_dim=64, block_tokens=S,
                         budget_bytes=8 << 20, palette=["fp16", "fp8_e4m3/block_head"],
                         host_tier_bytes=4 << 20, kv_events_endpoint=endpoint,
                         kv_events_vllm_hash_seed="0")
    sub.connect(endpoint)
    time.sleep(0.2)
    rng = random.Random(7)
    prompts = [[p * 1000 + i for i in range(rng.randint(16, 160))] for p in range(48)]
    random_run(cache, rng, prompts, steps=200)
    deadline = time.time() + 10
    while cache.stats()["events"]["queued_batches"]:
        assert time.time() < deadline
        time.sleep(0.01)
    digests = {}  # event hash -> full digest, as the router learns them
    stored = 0
    while sub.poll(300):
        _, _, payload = sub.recv_multipart()
        for event in msgpack.unpackb(payload, raw=False)[1]:
            if event[0] == "BlockRemoved":  # names a block stored before, by its vLLM hash
                assert all(h in digests for h in event[1])
            if event[0] != "BlockStored":
                continue
            _, hashes, parent, tokens, block_size, _, _ = event
            digest = sha256_cbor("0") if parent is None else digests[parent]
            for i, h in enumerate(hashes):
                digest = sha256_cbor((digest, tuple(tokens[i * S:(i + 1) * S]), None))
                assert as_int(digest) == h
                digests[h] = digest
                stored += 1
    assert stored > 50 and cache.stats()["host"]["offloaded_blocks"] > 0
    del cache
    sub.close()
    context.term()

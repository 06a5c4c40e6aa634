"""K/V of a prompt as the cache stores them, for `kvtier recall --k-npy/--v-npy` (docs/recall.md).

    python3 -m kvtier_engine.capture --out DIR [--tokens 4096] [--seed 0]

runs the fixed-seed random model (model.TINY's layers and heads, or --geometry llama8b) over a
seeded prompt on the CPU backend, then reads the prompt's cached blocks back: DIR/k.npy and
DIR/v.npy, float32 [layers, tokens, kv_heads, head_dim], keys after RoPE.
"""
import argparse
import os

import numpy as np
import torch

import kvtier

from .engine import Engine
from .model import LLAMA8B_GEOMETRY, TINY, LlamaCompute, llama_config, random_llama


def capture_kv(engine, prompt):
    """(k, v) float32 [layers, tokens, kv_heads, head_dim] of `prompt`'s whole cached blocks.

    Runs the prompt through `engine` (a kvtier-backed Engine with no other work queued) for one
    token, then attaches its cached prefix to a new sequence and reads every layer.
    """
    engine.submit(prompt, 1)
    engine.run()
    cache = engine.kv.cache
    seq, cached = cache.add_sequence(prompt=np.asarray(prompt, np.int32))
    try:
        ks, vs = zip(*(cache.read_kv(seq, layer) for layer in range(cache.num_layers)))
    finally:
        cache.release(seq)
    assert ks[0].shape[0] == cached
    return np.stack(ks), np.stack(vs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--geometry", choices=["tiny", "llama8b"], default="tiny")
    p.add_argument("--layers", type=int, default=2)
    a = p.parse_args(argv)
    geometry = dict(TINY if a.geometry == "tiny" else LLAMA8B_GEOMETRY)
    geometry.update(layers=a.layers, max_positions=max(a.tokens + 16, 512))
    model = LlamaCompute(random_llama(llama_config(**geometry), seed=a.seed))
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    cache = kvtier.Cache(num_layers=model.num_layers, num_kv_heads=model.num_kv_heads,
                         head_dim=model.head_dim, palette=["fp16"],
                         budget_bytes=max(64 << 20, 4 * per_token * (a.tokens + 64)))
    gen = torch.Generator().manual_seed(a.seed)
    prompt = torch.randint(0, model.config.vocab_size, (a.tokens,), generator=gen).tolist()
    k, v = capture_kv(Engine(model, cache, max_batch=1), prompt)
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "k.npy"), k)
    np.save(os.path.join(a.out, "v.npy"), v)
    print(f"wrote {a.out}/k.npy and v.npy: {list(k.shape)} float32 (keys after RoPE)")


if __name__ == "__main__":
    main()

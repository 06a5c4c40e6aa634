"""K/V of a prompt as the cache stores them, for `kvtier recall --k-npy/--v-npy` (docs/recall.md).

    python3 -m kvtier_engine.capture --out DIR [--tokens 4096] [--seed 0] [--float16]
    python3 -m kvtier_engine.capture --out DIR --train-steps 400 [--tokens 4096] [--float16]

The first runs the fixed-seed random model (model.TINY's layers and heads, or --geometry
llama8b) over a seeded prompt on the CPU backend, then reads the prompt's cached blocks back.
The second trains train.BYTE_LLAMA (on the GPU when there is one: 17 s on an H200) and reads
the K/V of a seeded stretch of its training text (Python's standard library) from transformers'
own cache, rounded to FP16 as the cache stores them; it needs no kvtier module, so it runs on a
GPU machine where the module is not built. Either writes DIR/k.npy and DIR/v.npy, [layers,
tokens, kv_heads, head_dim], keys after RoPE: float32, or float16 with --float16 (half the
bytes, the same values).
"""
import argparse
import os

import numpy as np
import torch

from .model import LLAMA8B_GEOMETRY, TINY, llama_config, random_llama
from .train import BYTE_LLAMA, stdlib_corpus, train_byte_llama


def capture_kv(engine, prompt):
    """(k, v) float32 [layers, tokens, kv_heads, head_dim] of `prompt`'s whole cached blocks.

    Runs the prompt through `engine` (a kvtier-backed Engine with no other work queued) for one
    token, then attaches its cached prefix to a new sequence and reads every layer.
    """
    engine.submit(prompt, 1)
    engine.run()
    cache = engine.kv.cache
    # One token more than the prompt, so that its last whole block is matched too (a match
    # leaves a prompt's last token to compute).
    seq, cached = cache.add_sequence(prompt=np.asarray(list(prompt) + [0], np.int32))
    try:
        ks, vs = zip(*(cache.read_kv(seq, layer) for layer in range(cache.num_layers)))
    finally:
        cache.release(seq)
    assert ks[0].shape[0] == cached
    return np.stack(ks), np.stack(vs)


def model_kv(model, prompt):
    """(k, v) float32 [layers, tokens, kv_heads, head_dim] of `prompt` from transformers' cache
    of one forward pass of `model` (a LlamaForCausalLM), each value rounded to FP16 as the cache
    stores it."""
    with torch.no_grad():
        ids = torch.tensor([prompt], device=model.device)
        layers = model(input_ids=ids, use_cache=True).past_key_values.layers
    # Each layer's keys and values: [1, kv_heads, tokens, head_dim].
    def stack(name):
        return np.stack([getattr(layer, name)[0].transpose(0, 1).half().float().cpu().numpy()
                         for layer in layers])
    return stack("keys"), stack("values")


def random_model_kv(a):
    """K/V of a seeded random prompt through the kvtier cache (CPU backend)."""
    import kvtier

    from .engine import Engine
    from .model import LlamaCompute
    geometry = dict(TINY if a.geometry == "tiny" else LLAMA8B_GEOMETRY)
    geometry.update(layers=a.layers, max_positions=max(a.tokens + 16, 512))
    model = LlamaCompute(random_llama(llama_config(**geometry), seed=a.seed))
    per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    cache = kvtier.Cache(num_layers=model.num_layers, num_kv_heads=model.num_kv_heads,
                         head_dim=model.head_dim, palette=["fp16"],
                         budget_bytes=max(64 << 20, 4 * per_token * (a.tokens + 64)))
    gen = torch.Generator().manual_seed(a.seed)
    prompt = torch.randint(0, model.config.vocab_size, (a.tokens,), generator=gen).tolist()
    return capture_kv(Engine(model, cache, max_batch=1), prompt)


def trained_model_kv(a):
    """K/V of a seeded stretch of the standard library's text in a BYTE_LLAMA trained for
    a.train_steps steps."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    corpus = stdlib_corpus()
    model, info = train_byte_llama(corpus, a.train_steps, seed=a.seed, device=device)
    print(f"trained BYTE_LLAMA on {device}: {info}")
    at = torch.randint(0, len(corpus) - a.tokens, (1,),
                       generator=torch.Generator().manual_seed(a.seed + 1)).item()
    return model_kv(model, list(corpus[at:at + a.tokens]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--geometry", choices=["tiny", "llama8b"], default="tiny")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--train-steps", type=int, default=0,
                   help="train BYTE_LLAMA this many steps and capture it (Default 0: the random "
                        "model)")
    p.add_argument("--float16", action="store_true", help="write float16 (Default: float32)")
    a = p.parse_args(argv)
    if a.tokens < 1:
        p.error("--tokens must be positive")
    if a.train_steps < 0:
        p.error("--train-steps must be 0 or more")
    if a.train_steps > 0 and a.tokens > BYTE_LLAMA["max_positions"]:
        p.error(f"--tokens: BYTE_LLAMA reads at most {BYTE_LLAMA['max_positions']} positions")
    k, v = trained_model_kv(a) if a.train_steps > 0 else random_model_kv(a)
    dtype = np.float16 if a.float16 else np.float32
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "k.npy"), k.astype(dtype))
    np.save(os.path.join(a.out, "v.npy"), v.astype(dtype))
    print(f"wrote {a.out}/k.npy and v.npy: {list(k.shape)} {np.dtype(dtype).name} "
          "(keys after RoPE)")


if __name__ == "__main__":
    main()

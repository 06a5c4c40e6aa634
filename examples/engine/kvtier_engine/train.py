"""A small trained Llama for the correctness run: byte-level, learned in 20 s on one H200.

No Llama-architecture checkpoint with head_dim 128 ships in a pip package small enough to carry
to the GPU machine (docs/engine.md). A random model's next-token logits are nearly flat, so an
arithmetic difference of one FP16 ulp picks another token at many positions and greedy runs of
two correct implementations part. A trained model's are peaked where the text is predictable,
as a real checkpoint's are. This trains one, from a fixed seed, on text every machine with
Python has: the standard library's own source files.

    python3 -m kvtier_engine.train --steps 400 --out model_dir   # then LlamaForCausalLM.from_pretrained

The vocabulary is the 256 byte values, so prompts and outputs are readable text.
"""
import argparse
import math
import os
import sysconfig
import time

import torch

from .model import llama_config

# 4 layers at head_dim 128 with GQA 4:2, SwiGLU, 256 byte tokens: 12.9M parameters (26 MB in
# float16), positions up to 4096.
BYTE_LLAMA = dict(layers=4, hidden=512, q_heads=4, kv_heads=2, intermediate=1536, vocab=256,
                  max_positions=4096)


def stdlib_corpus(limit_bytes=64 << 20):
    """The .py files of this Python's standard library (not site-packages), in sorted path
    order, concatenated as bytes (at most `limit_bytes`)."""
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages",
                                                        "__pycache__"))
        paths += [os.path.join(base, f) for f in files if f.endswith(".py")]
    out, size = [], 0
    for p in sorted(paths):
        with open(p, "rb") as f:
            data = f.read()
        out.append(data)
        size += len(data)
        if size >= limit_bytes:
            break
    return b"".join(out)[:limit_bytes]


def train_byte_llama(corpus, steps, seed=0, device="cuda", seq=3072, batch=16, lr=2e-3,
                     log=print, geometry=None):
    """A LlamaForCausalLM (`geometry`, Default: BYTE_LLAMA; float32 weights) trained on `corpus`
    (bytes) for `steps` steps of `batch` rows of `seq` + 1 bytes at seeded offsets: AdamW,
    100 steps of warm-up, cosine decay to a tenth, gradients clipped at 1, bf16 autocast on
    CUDA. Returns (model in eval mode, {"steps", "tokens", "loss", "seconds", ...}): `loss`
    is the mean cross-entropy (nats per byte) of the last 20 steps.
    REQUIRES: steps >= 1, len(corpus) > seq + 1."""
    # Gradients on, also when called inside torch.inference_mode() (bench_engine's sections).
    with torch.inference_mode(False), torch.enable_grad():
        return _train(corpus, steps, seed, device, seq, batch, lr, log, geometry or BYTE_LLAMA)


def _train(corpus, steps, seed, device, seq, batch, lr, log, geometry):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).to(torch.long)
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(**geometry))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16,
                              enabled=torch.device(device).type == "cuda")
    start, losses = time.monotonic(), []
    for step in range(steps):
        at = torch.randint(0, data.numel() - seq - 1, (batch,), generator=gen)
        x = torch.stack([data[i:i + seq + 1] for i in at.tolist()]).to(device)
        warm = min(1.0, (step + 1) / 100)
        decay = 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr * warm * (0.1 + 0.9 * decay)
        with autocast:
            loss = _loss(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(f"train: step {step + 1}/{steps} loss {sum(losses[-20:]) / len(losses[-20:]):.3f} "
                f"nats/byte, {time.monotonic() - start:.0f} s")
    model.eval()
    tail = losses[-20:]
    return model, {"steps": steps, "tokens": steps * batch * seq, "loss": sum(tail) / len(tail),
                   "seconds": time.monotonic() - start, "seq": seq, "batch": batch,
                   "corpus_bytes": len(corpus), "seed": seed}


def _loss(model, x):
    """Next-byte cross-entropy of a batch of byte rows x [batch, seq + 1]."""
    logits = model(input_ids=x[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             x[:, 1:].reshape(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for save_pretrained")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    model, info = train_byte_llama(stdlib_corpus(), args.steps, args.seed, args.device)
    model.save_pretrained(args.out)
    print(info)


if __name__ == "__main__":
    main()

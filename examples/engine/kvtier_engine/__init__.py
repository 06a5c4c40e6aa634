"""kvtier_engine: a reference serving loop for a Llama model with kvtier as its only KV cache.

See docs/engine.md. Modules: model (transformers' LlamaForCausalLM arithmetic, per layer),
backends (kvtier's cache and the contiguous FP16 baseline), flashinfer_kv (FlashInfer's paged
FP16 decode, a second baseline; imported on demand), train (the byte-level Llama of the
correctness run), engine (continuous batching, prefix sharing, sampling), metrics (a
Prometheus endpoint), capture (K/V for kvtier recall).
"""
from .backends import ContiguousKV, KvtierKV, RequestError
from .engine import Engine, Request, StepTimer, sample
from .metrics import MetricsServer, render
from .model import LLAMA8B_GEOMETRY, TINY, LlamaCompute, llama_config, random_llama

__all__ = ["ContiguousKV", "Engine", "KvtierKV", "LLAMA8B_GEOMETRY", "LlamaCompute",
           "MetricsServer", "Request", "RequestError", "StepTimer", "TINY", "llama_config",
           "random_llama", "render", "sample"]

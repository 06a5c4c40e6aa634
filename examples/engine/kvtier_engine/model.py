"""The Llama model's arithmetic for the engine, taken from transformers' LlamaForCausalLM.

The engine owns the KV cache and the attention; everything else (embedding, RMSNorm, RoPE, the
q/k/v/o projections, the SwiGLU MLP, the final norm and the LM head) runs through the
LlamaForCausalLM's own modules, so that the only numerical difference from transformers'
generate() is where K/V live and which kernel attends them.

`random_llama` builds the fixed-seed, randomly initialised checkpoint the example and its tests
use (docs/engine.md says why: no real Llama-architecture checkpoint with head_dim 128 ships in
a pip package under 60 MiB).
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


def llama_config(layers, hidden, q_heads, kv_heads, intermediate, vocab,
                 max_positions=32768 + 1024):
    """A LlamaConfig with head_dim = hidden / q_heads (kvtier's fused kernel needs 128)."""
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=q_heads,
                       num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
                       attn_implementation="sdpa", bos_token_id=None, eos_token_id=None,
                       pad_token_id=None)


# The CI model: 2 layers at head_dim 128, GQA 4:2, SwiGLU, a 512-token vocabulary.
TINY = dict(layers=2, hidden=512, q_heads=4, kv_heads=2, intermediate=1024, vocab=512,
            max_positions=2048)
# The H200 model: Llama-3-8B's attention and MLP geometry (32 query heads, 8 KV heads,
# head_dim 128, hidden 4096, intermediate 14336) with a few layers and Llama-2's vocabulary, so
# that batch 64 x 32K tokens fits one GPU for kvtier and the contiguous baseline in turn.
LLAMA8B_GEOMETRY = dict(hidden=4096, q_heads=32, kv_heads=8, intermediate=14336, vocab=32000)


def random_llama(config, seed=0, dtype=torch.float32, device="cpu"):
    """A LlamaForCausalLM with transformers' own initialisation under torch.manual_seed(seed).

    REQUIRES: config.head_dim == 128 for kvtier's fused kernel (the CPU reference takes any).
    """
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


class LlamaCompute:
    """The per-layer pieces of a LlamaForCausalLM for an engine that keeps its own KV cache.

    Shapes: tokens are flattened across requests, hidden states are [tokens, hidden]; q is
    [tokens, q_heads, head_dim] and k, v are [tokens, kv_heads, head_dim], in the model's dtype.
    Thread-safety: none (one engine thread).
    """

    def __init__(self, model):
        self.hf = model
        cfg = model.config
        self.config = cfg
        self.num_layers = cfg.num_hidden_layers
        self.num_q_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = self.head_dim ** -0.5
        self.dtype = model.lm_head.weight.dtype
        self.device = model.lm_head.weight.device
        self._layers = model.model.layers

    def embed(self, tokens):
        return self.hf.model.embed_tokens(tokens)

    def rope(self, hidden, positions):
        """cos, sin for `positions` ([tokens] int64), each [tokens, head_dim]."""
        cos, sin = self.hf.model.rotary_emb(hidden[None], positions[None])
        return cos[0], sin[0]

    def qkv(self, layer, hidden, rope):
        """q, k, v of `hidden` for `layer`, RoPE applied to q and k (k as the cache stores it)."""
        attn = self._layers[layer].self_attn
        x = self._layers[layer].input_layernorm(hidden)
        n = x.shape[0]
        # [1, heads, tokens, dim], as LlamaAttention lays them out for apply_rotary_pos_emb.
        q = attn.q_proj(x).view(1, n, self.num_q_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, rope[0][None], rope[1][None])
        return q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)

    def finish_layer(self, layer, hidden, attn_out):
        """The rest of a decoder layer: o_proj, residual, post-attention RMSNorm, SwiGLU MLP,
        residual. attn_out is [tokens, q_heads, head_dim] in the model's dtype."""
        mod = self._layers[layer]
        h = hidden + mod.self_attn.o_proj(attn_out.reshape(attn_out.shape[0], -1))
        return h + mod.mlp(mod.post_attention_layernorm(h))

    def logits(self, hidden):
        """float32 logits [tokens, vocab] of the final hidden states."""
        return self.hf.lm_head(self.hf.model.norm(hidden)).float()

    def prefill_attention(self, layer, q, k, v, prefix_len):
        """Causal attention of a prompt chunk, through transformers' own SDPA path.

        q: [n, Hq, D] for positions prefix_len .. prefix_len + n - 1; k, v: [prefix_len + n, Hkv,
        D] (the cached prefix, then the chunk). Returns [n, Hq, D] in the model's dtype.
        """
        n, total = q.shape[0], k.shape[0]
        mask = None
        if prefix_len:
            allowed = torch.arange(total, device=q.device)[None, :] <= (
                prefix_len + torch.arange(n, device=q.device)[:, None])
            mask = allowed[None, None]
        out, _ = sdpa_attention_forward(
            self._layers[layer].self_attn, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
            v.transpose(0, 1)[None], mask, dropout=0.0, scaling=self.scaling,
            is_causal=prefix_len == 0)
        return out[0]  # [n, Hq, D]: transformers returns [batch, tokens, heads, dim]

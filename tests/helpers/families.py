"""Small random-weight models of every supported family, built offline from configs.

Between them they cover grouped-query attention (8 query heads over 2 key/value heads),
multi-query attention (4 over 1), head_dim != d_model / n_heads (Qwen3), sliding windows shorter
than the test sequences (Mistral, Qwen2's upper layers), q/k/v biases (Qwen2), per-head q/k
norms (Qwen3), partial rotary with a parallel residual and full rotary without (GPT-NeoX), and
Gemma 3's mix: sliding-window and global layers with their own rotary bases (the global one with
linear rope scaling), (1 + w) RMSNorms on q, k and around attention and MLP, query_pre_attn_scalar
!= d_head, scaled embeddings.
Every 1-d parameter (biases, norm gains) gets noise on top of its init (zeros and ones), so a
step that skipped a bias or a gain would show.
"""

from __future__ import annotations

import torch

VOCAB = 50257  # the GPT-2 tokenizer's, so probes and text windows work unchanged
N_CTX = 64
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    max_position_embeddings=N_CTX,
    initializer_range=0.15,
)


def family_configs() -> dict:
    """name -> config; names start with the family's model_type."""
    from transformers import GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        "llama-gqa": LlamaConfig(**_COMMON, num_attention_heads=8, num_key_value_heads=2),
        "llama-mqa": LlamaConfig(**_COMMON, num_attention_heads=4, num_key_value_heads=1),
        "mistral-window": MistralConfig(**_COMMON, num_attention_heads=8, num_key_value_heads=2, sliding_window=7),
        "mistral-full": MistralConfig(**_COMMON, num_attention_heads=4, num_key_value_heads=1, sliding_window=None),
        "qwen2-window": Qwen2Config(
            **_COMMON,
            num_attention_heads=8,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=6,
            max_window_layers=1,
        ),
        "qwen3-mqa": Qwen3Config(**_COMMON, num_attention_heads=4, num_key_value_heads=1, head_dim=24),
        "gpt_neox-parallel": GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=N_CTX,
            rotary_pct=0.25,
            use_parallel_residual=True,
            initializer_range=0.15,
        ),
        "gpt_neox-sequential": GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=N_CTX,
            rotary_pct=1.0,
            use_parallel_residual=False,
            initializer_range=0.15,
        ),
        "gemma3_text-mqa": gemma3_config(),
    }


def gemma3_config():
    """Gemma 3's shape in small: 4 layers (sliding, sliding, global, sliding; window 5), 4 query heads
    over 1 key/value head, head_dim 24 != 64 / 4, Q K^T scaled by 32^-0.5, sliding layers' rotary
    base 10, global layers' 10,000 with linear scaling x4. `architectures` as a checkpoint's
    config.json names it (TransformerLens's bridge picks its adapter by that name)."""
    from transformers import Gemma3TextConfig

    sliding, full = "sliding_attention", "full_attention"
    return Gemma3TextConfig(
        **{**_COMMON, "num_hidden_layers": 4},
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=24,
        query_pre_attn_scalar=32,
        sliding_window=5,
        layer_types=[sliding, sliding, full, sliding],
        rope_parameters={
            sliding: {"rope_type": "default", "rope_theta": 10.0},
            full: {"rope_type": "linear", "factor": 4.0, "rope_theta": 10_000.0},
        },
        architectures=["Gemma3ForCausalLM"],
    )


FAMILY_NAMES = list(family_configs())


def build_family(name: str, seed: int = 0):
    """LoadedModel of the named family config, random weights (seed), noisy biases and gains."""
    from headlens.load.models import build_model

    loaded = build_model(family_configs()[name], seed=seed, name=name)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in loaded.model.parameters():
            if param.dim() == 1:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return loaded


def o_proj(model, layer: int) -> torch.nn.Module:
    """The output projection of `layer`, found from the Hugging Face module names directly
    (independent of headlens.arch)."""
    if model.config.model_type == "gpt_neox":
        return model.gpt_neox.layers[layer].attention.dense
    return model.model.layers[layer].self_attn.o_proj


def decoder_layers(model) -> torch.nn.ModuleList:
    return model.gpt_neox.layers if model.config.model_type == "gpt_neox" else model.model.layers


def padded_batch(seed: int = 0, lengths=(20, 13, 17)) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random token ids [batch, pos] and mask [batch, pos]; BOS (50256) first."""
    gen = torch.Generator().manual_seed(seed)
    pos = max(lengths)
    ids = torch.randint(1000, 10000, (len(lengths), pos), generator=gen)  # [batch, pos]
    ids[:, 0] = 50256
    mask = torch.arange(pos)[None] < torch.tensor(lengths)[:, None]  # [batch, pos]
    return ids, mask

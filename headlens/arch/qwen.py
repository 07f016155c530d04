"""Qwen2 and Qwen3 (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`): Llama's modules with their own twists.

- Qwen2: biases on q_proj, k_proj and v_proj (none on o_proj); sliding-window attention on the
  layers `config.layer_types` marks "sliding_attention" (`use_sliding_window`, from layer
  `max_window_layers` on).
- Qwen3: no q/k/v biases, but an RMSNorm over each head's query and key (`q_norm`, `k_norm`,
  applied before the rotary step), and `head_dim` set independently of hidden_size / n_heads.
Both name their layer types in `config.layer_types`, which RotaryAdapter reads.
"""

from __future__ import annotations

from headlens.arch.llama import LlamaAdapter


class Qwen2Adapter(LlamaAdapter):
    family = "qwen2"


class Qwen3Adapter(LlamaAdapter):
    family = "qwen3"
    # q and k after the per-head RMSNorm ([batch, pos, head, d_head]), as the rotary step receives them
    qkv_sites = ("q_norm", "k_norm", "v_proj")

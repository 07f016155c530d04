"""Qwen2 and Qwen3 (`Qwen2ForCausalLM`, `Qwen3ForCausalLM`): Llama's modules with their own twists.

- Qwen2: biases on q_proj, k_proj and v_proj (none on o_proj); sliding-window attention on the
  layers `config.layer_types` marks "sliding_attention" (`use_sliding_window`, from layer
  `max_window_layers` on).
- Qwen3: no q/k/v biases, but an RMSNorm over each head's query and key (`q_norm`, `k_norm`,
  applied before the rotary step): its q and k rows are read after them, per head, with their
  weights in q_proj and k_proj; `head_dim` is set independently of hidden_size / n_heads.
Both name their layer types in `config.layer_types`, which the base adapter reads.
"""

from __future__ import annotations

from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

from headlens.arch.llama import LlamaAdapter, llama_sites
from headlens.arch.sites import NORMED, Site, Split


class Qwen2Adapter(LlamaAdapter):
    family = "qwen2"
    sites = llama_sites(modeling_qwen2)


class Qwen3Adapter(LlamaAdapter):
    family = "qwen3"
    sites = llama_sites(
        modeling_qwen3,
        q=Site("self_attn.q_norm", split=Split(NORMED), weights="self_attn.q_proj"),
        k=Site("self_attn.k_norm", split=Split(NORMED, heads="n_kv_heads"), weights="self_attn.k_proj"),
    )

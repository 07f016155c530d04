"""Direct logit attribution (headlens.scores.direct_logit) against the model's own forward pass.

With the final norm's scale frozen at its clean value (Gemma 3's post-attention norm of the last layer
frozen likewise) and the last layer's MLP output held at its clean value, a head of the last layer
reaches the logits only through the direct path, so zero-ablating it moves logit(target) -
logit(foil) by exactly minus its direct effect. The test
freezes the norms itself, from each norm class's own formula (epsilon read from the module), and
ablates with a hook on the Hugging Face output projection's input: nothing of the library's
arithmetic is reused.
"""

from __future__ import annotations

import pytest
import torch

from headlens.load.models import gpt2_tokenizer
from headlens.scores.name_mover import ioi_prompts, ioi_run
from tests.helpers.families import build_family, decoder_layers, o_proj
from tests.helpers.strong import build_strong_model

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

FAMILIES = ["gpt2", "llama-gqa", "gemma3_text-mqa", "gpt_neox-sequential", "qwen2-window"]
# float32 forward passes of a 3-4 layer model with logits of a few units: the frozen-norm run and the
# float64 attribution differ by float32 rounding of the last layer's sums (~1e-6 relative): 1e-4 logits.
ATOL = 1e-4


def _frozen(norm: torch.nn.Module, x_clean: torch.Tensor):
    """The norm as a linear map with its scale fixed at x_clean's [batch, pos, d]: a forward replacement."""
    name = type(norm).__name__
    x = x_clean.double()
    if isinstance(norm, torch.nn.LayerNorm):
        scale = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # [batch, pos, 1]
        return lambda v: (v - v.mean(-1, keepdim=True)) / scale.to(v.dtype) * norm.weight + norm.bias  # [batch, pos, d]
    eps = getattr(norm, "variance_epsilon", None) or norm.eps
    rms = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()  # [batch, pos, 1]
    gain = (1.0 + norm.weight) if name.startswith("Gemma") else norm.weight  # Gemma's RMSNorm: x / rms * (1 + w)
    return lambda v: v / rms.to(v.dtype) * gain  # [batch, pos, d]


def _final_norm(model) -> torch.nn.Module:
    kind = model.config.model_type
    if kind == "gpt2":
        return model.transformer.ln_f
    return model.gpt_neox.final_layer_norm if kind == "gpt_neox" else model.model.norm


def _layers(model) -> torch.nn.ModuleList:
    return model.transformer.h if model.config.model_type == "gpt2" else decoder_layers(model)


def _o_proj(model, layer: int) -> torch.nn.Module:
    """The output projection (GPT-2's Conv1D c_proj, whose weight is [in, out])."""
    return model.transformer.h[layer].attn.c_proj if model.config.model_type == "gpt2" else o_proj(model, layer)


def _o_inputs(module: torch.nn.Module) -> int:
    return module.weight.shape[0] if type(module).__name__ == "Conv1D" else module.in_features


def _logit_diffs(model, ids, mask, last, io, s, heads_off=(), frozen=None) -> torch.Tensor:
    """logit(io) - logit(s) at each prompt's last position [batch], the last layer's `heads_off`
    zeroed at the o_proj input, the modules in `frozen` ({module: forward or fixed output}) replaced."""
    layer = len(_layers(model)) - 1
    d_head = _o_inputs(_o_proj(model, layer)) // model.config.num_attention_heads
    handles = []

    def zero(module, args):
        z = args[0].clone()  # [batch, pos, head * d_head]
        for head in heads_off:
            z[..., head * d_head : (head + 1) * d_head] = 0.0
        return (z,)

    handles.append(_o_proj(model, layer).register_forward_pre_hook(zero))
    for module, forward in (frozen or {}).items():
        fixed = (
            (lambda m, a, out, forward=forward: forward(a[0]))
            if callable(forward)
            else (lambda m, a, out, forward=forward: forward)
        )
        handles.append(module.register_forward_hook(fixed))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits.double()  # [batch, pos, vocab]
    finally:
        for handle in handles:
            handle.remove()
    rows = torch.arange(ids.shape[0])
    end = logits[rows, last]  # [batch, vocab]
    return end[rows, io] - end[rows, s]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_last_layer_heads_direct_effect_is_its_ablation_with_the_norms_frozen(name):
    loaded = build_strong_model(n_positions=64) if name == "gpt2" else build_family(name, seed=3)
    loaded.tokenizer = gpt2_tokenizer()
    model = loaded.model
    prompts = ioi_prompts(loaded.tokenizer, 50256, n=6, seed=1)
    length = max(len(p["ids"]) for p in prompts)
    ids = torch.zeros(len(prompts), length, dtype=torch.long)  # [batch, pos]
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, : len(p["ids"])], mask[row, : len(p["ids"])] = torch.tensor(p["ids"]), 1
    last = mask.sum(1) - 1  # [batch]
    io, s = torch.tensor([p["io"] for p in prompts]), torch.tensor([p["s"] for p in prompts])

    # the clean inputs of the norms to freeze: the final norm, and Gemma's post-attention norm of the last layer
    final, layer = _final_norm(model), len(_layers(model)) - 1
    norms = [final]
    post = getattr(_layers(model)[layer], "post_attention_layernorm", None)
    if model.config.model_type.startswith("gemma3"):
        norms.append(post)
    mlp = _layers(model)[layer].mlp  # its output held clean: the head's change must not pass through it
    seen, mlp_out = {}, []
    handles = [m.register_forward_hook(lambda m, a, out: seen.__setitem__(m, a[0].detach())) for m in norms]
    handles.append(mlp.register_forward_hook(lambda m, a, out: mlp_out.append(out.detach())))
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    frozen = {m: _frozen(m, seen[m]) for m in norms}
    frozen[mlp] = mlp_out[0]

    clean = _logit_diffs(model, ids, mask, last, io, s, frozen=frozen)  # [batch]
    plain = _logit_diffs(model, ids, mask, last, io, s)
    assert clean == pytest.approx(plain, abs=ATOL)  # freezing at the clean scale changes nothing on the clean run
    direct = ioi_run(loaded, prompts)
    result = direct["ioi_direct_effect"]  # [layer, head], mean over prompts
    assert direct["logit_diff"] == pytest.approx(float(plain.mean()), abs=ATOL)
    moved = []
    for head in range(model.config.num_attention_heads):
        ablated = _logit_diffs(model, ids, mask, last, io, s, heads_off=[head], frozen=frozen)
        change = float((clean - ablated).mean())  # what the head added through the direct path
        assert float(result[layer, head]) == pytest.approx(change, abs=ATOL), (name, head)
        moved.append(abs(change))
    assert max(moved) > 100 * ATOL  # the heads write something: the check is not 0 == 0

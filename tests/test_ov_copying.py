"""headlens.scores.ov_copying: the d_head x d_head route against the full [d_vocab, d_vocab] OV
circuit built from GPT-2's raw weights, and the planted induction head's sign."""

from __future__ import annotations

import pytest
import torch

from headlens.arch import adapter_for
from headlens.scores.ov_copying import _shared_read, folded_unembed, ov_copying_scores
from tests.helpers.families import build_family
from tests.helpers.planted import build_planted

# The library reads the values through the model in float32 (the test builds them in float64),
# and the full 257 x 257 matrix adds ~225 round-off eigenvalues to sum(|eig|): float32 rounding.
EIG_ATOL = 1e-5


def _full_circuit_scores(model) -> torch.Tensor:
    """sum(eig) / sum(|eig|) of W_E' W_V W_O C diag(g_f) W_U^T, written from the Conv1D weights."""
    cfg = model.config
    d, n_heads = cfg.n_embd, cfg.n_head
    d_head = d // n_heads
    w_e = model.transformer.wte.weight.double()  # [d_vocab, d_model]
    centre = torch.eye(d, dtype=torch.float64) - 1.0 / d  # [d_model, d_model] LayerNorm's mean removal
    w_u = model.lm_head.weight.double() * model.transformer.ln_f.weight.double()  # [d_vocab, d_model]
    out = torch.zeros(cfg.n_layer, n_heads, dtype=torch.float64)
    for layer, block in enumerate(model.transformer.h):
        ln = block.ln_1
        x = w_e @ centre  # [d_vocab, d_model]
        normed = x / torch.sqrt((x**2).mean(-1, keepdim=True) + ln.eps) * ln.weight.double()  # [d_vocab, d_model]
        w_qkv = block.attn.c_attn.weight.double()  # [d_model, 3 * d_model]
        w_o = block.attn.c_proj.weight.double()  # [d_model, d_model], rows head-major
        for head in range(n_heads):
            w_v = w_qkv[:, 2 * d + head * d_head : 2 * d + (head + 1) * d_head]  # [d_model, d_head]
            w_oh = w_o[head * d_head : (head + 1) * d_head]  # [d_head, d_model]
            full = normed @ w_v @ w_oh @ centre @ w_u.T  # [d_vocab, d_vocab]
            eig = torch.linalg.eigvals(full)
            out[layer, head] = eig.sum().real / eig.abs().sum()
    return out


def test_small_route_equals_the_full_circuit_on_the_shipped_model():
    from headlens.load.models import load_model

    tiny = load_model("tiny")  # a 257-token vocabulary: the full circuit fits
    with torch.no_grad():
        full = _full_circuit_scores(tiny.model)
    ours = ov_copying_scores(tiny.model)
    assert full.abs().max() > 0.5  # trained heads copy: a comparison with teeth
    assert torch.allclose(ours, full, atol=EIG_ATOL, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_planted_induction_head_copies_or_suppresses(sign):

    planted = build_planted(0, copy_sign=sign)
    scores = ov_copying_scores(planted.loaded.model)
    induction = planted.positions["induction"]
    assert scores[induction] * sign > 0.99  # the copy is the whole OV circuit: eigenvalues all of one sign
    others = [scores[layer, head] for layer in range(4) for head in range(3) if (layer, head) != induction]
    assert max(abs(float(s)) for s in others) < 0.1  # junk writes nothing the unembedding reads


def _raw_projection_scores(model) -> torch.Tensor:
    """sum(eig) / sum(|eig|) from v_proj / o_proj, each layer's RMSNorm written here with its own
    epsilon (no centring), the kv group as h // group."""
    cfg = model.config
    d_head = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    w_u = (model.lm_head.weight * model.model.norm.weight).double()  # [d_vocab, d_model]
    expected = torch.zeros(cfg.num_hidden_layers, cfg.num_attention_heads, dtype=torch.float64)
    with torch.no_grad():
        for layer, block in enumerate(model.model.layers):
            x = model.model.embed_tokens.weight.double()  # [d_vocab, d_model]
            norm = block.input_layernorm
            normed = x / torch.sqrt((x**2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight.double()
            w_v = block.self_attn.v_proj.weight.double()  # [kv_head * d_head, d_model]
            w_o = block.self_attn.o_proj.weight.double()  # [d_model, head * d_head]
            for head in range(cfg.num_attention_heads):
                kv = head // group
                values = normed @ w_v[kv * d_head : (kv + 1) * d_head].T  # [d_vocab, d_head]
                small = w_o[:, head * d_head : (head + 1) * d_head].T @ w_u.T @ values  # [d_head, d_head]
                eig = torch.linalg.eigvals(small)
                expected[layer, head] = eig.sum().real / eig.abs().sum()
    return expected


def _build_family(name: str):

    model = build_family(name).model
    torch.manual_seed(0)
    for block in model.model.layers:  # gains that differ per layer and dimension (initialised to 1)
        block.input_layernorm.weight.data = torch.rand(model.config.hidden_size) + 0.5  # [d_model]
    return model


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-window"])
def test_grouped_query_families_against_their_raw_projections(name):
    """Llama (8 query heads over 2 key/value heads) and Qwen2 (v bias), read through the shared
    product W_U N(E) g_0 that their gain-type norms allow."""
    model = _build_family(name)
    assert _shared_read(adapter_for(model), folded_unembed(adapter_for(model))) is not None
    assert torch.allclose(ov_copying_scores(model), _raw_projection_scores(model), atol=EIG_ATOL, rtol=0)


@pytest.mark.slow
def test_a_layer_whose_norm_differs_in_form_reads_the_whole_vocabulary():
    """A layer-dependent epsilon breaks norm_L(x) = N(x) g_L: the shared product is refused and
    every layer reads the vocabulary itself, with the same scores as the raw projections."""
    model = _build_family("llama-gqa")
    model.model.layers[1].input_layernorm.variance_epsilon = 0.5  # rows' mean square is ~1e-4
    adapter = adapter_for(model)
    assert _shared_read(adapter, folded_unembed(adapter)) is None
    assert torch.allclose(ov_copying_scores(model), _raw_projection_scores(model), atol=EIG_ATOL, rtol=0)


def test_the_layernorm_model_takes_the_shared_product():
    from headlens.load.models import load_model

    adapter = adapter_for(load_model("tiny").model)  # GPT-2: LayerNorm with a bias in every layer
    assert _shared_read(adapter, folded_unembed(adapter)) is not None

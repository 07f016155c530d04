"""headlens.scores.ov_rows.filtered_hits (a filter on part of the vocabulary, then whole rows through
the residual stream or, for many rows, W_O W_U on a bfloat16 screen) against every row of W_U W_OV
W_EE written out here in float64 from a Llama model's raw weights: the same hits, with the filter
deciding most rows and both whole-row scans taken."""

from __future__ import annotations

import torch

from headlens.scores import ov_rows
from headlens.scores.ov_vocab import BOTTOM_K, vocab_sample
from tests.helpers.llama_ov import manual_w_ee, rms64
from tests.test_cs_ov_vocab import PLANTED, planted_model

VOCAB = 8192  # PART_STRIDE 32: the filter reads 256 columns, enough to decide most rows
TOKENS = 200  # few undecided rows in a random head (residual route), ~all in the planted one (W_O W_U formed)


def raw_circuit(model, tokens, layer):
    """Each head's values z [n, head, d_head], W_O [head, d_head, d_model] and the folded W_U [d_model,
    d_vocab] of a LlamaForCausalLM, from its raw weights (float64)."""
    cfg, inner = model.config, model.model
    d_head, group = cfg.hidden_size // cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    attn = inner.layers[layer].self_attn
    normed = rms64(manual_w_ee(model, tokens), inner.layers[layer].input_layernorm)  # [n, d_model]
    v = (normed @ attn.v_proj.weight.double().T).view(len(tokens), -1, d_head)  # [n, kv, d_head]
    z = v.repeat_interleave(group, dim=1)  # [n, head, d_head]
    w_o = attn.o_proj.weight.double().T.reshape(cfg.num_attention_heads, d_head, -1)  # [head, d_head, d_model]
    w_u = (model.lm_head.weight.double() * inner.norm.weight.double()).T  # [d_model, d_vocab]
    return z, w_o, w_u


def full_rows(z, w_o, w_u, tokens):
    """Entries strictly below each token's own logit over the whole row, and the distance from the own
    logit to the k-th smallest other entry (the one that decides), relative to the row's largest
    magnitude: [head, n] each (float64)."""
    logits = torch.einsum("nhd,hdm->hnm", z, w_o) @ w_u  # [head, n, d_vocab]
    own = logits[:, torch.arange(len(tokens)), tokens]  # [head, n]
    others = logits.clone()
    others[:, torch.arange(len(tokens)), tokens] = torch.inf  # [head, n, d_vocab]
    kth = others.topk(BOTTOM_K, dim=-1, largest=False).values[..., -1]  # [head, n]
    return (logits < own[..., None]).sum(-1), (kth - own).abs() / logits.abs().amax(-1)


def test_filtered_hits_equal_the_whole_rows(monkeypatch):
    loaded = planted_model(VOCAB)
    tokens = vocab_sample(VOCAB, seed=1, n=TOKENS)  # [n]
    layer = PLANTED[0]
    with torch.no_grad():
        z, w_o, w_u = raw_circuit(loaded.model, tokens, layer)
        below, gap = full_rows(z, w_o, w_u, tokens)
    assert float(gap.min()) > 1e-5  # no tie within float32 rounding: the hits are fixed by the arithmetic
    decided, routes, products = [], [], []
    undecided, through_residual, product_rows = ov_rows.undecided, ov_rows.through_residual, ov_rows.product_rows

    def spy_undecided(*args):
        out = undecided(*args)
        decided.append(out[0])
        return out

    def spy_route(n, d_head, d_model):
        routes.append(through_residual(n, d_head, d_model))
        return routes[-1]

    monkeypatch.setattr(ov_rows, "undecided", spy_undecided)

    def spy_product(z, *args):
        products.append(len(z))
        return product_rows(z, *args)

    monkeypatch.setattr(ov_rows, "through_residual", spy_route)
    monkeypatch.setattr(ov_rows, "product_rows", spy_product)
    got = ov_rows.filtered_hits(z, w_o, ov_rows.prepare(w_u), tokens, BOTTOM_K)  # [head, n]
    want = below < BOTTOM_K  # [head, n]
    assert torch.equal(got, want)
    assert float(want[PLANTED[1]].double().mean()) > 0.9 and 0 < int(want.sum()) - int(want[PLANTED[1]].sum())
    open_rows = torch.cat(decided, 1)  # [head, n]
    assert float(open_rows.double().mean()) < 0.25  # the filter decides most rows
    assert bool(open_rows[want].all())  # every hit went on to its whole row
    assert set(routes) == {True, False}  # both routes ran (through the residual, W_O W_U formed)
    assert products  # a head's many open rows went to the bfloat16-screened scan of W_O W_U


def test_a_tiny_vocabulary_counts_every_token():
    gen = torch.Generator().manual_seed(0)
    z, w_o, w_u = torch.randn(5, 2, 4, generator=gen), torch.randn(2, 4, 6, generator=gen), torch.randn(6, 7)
    got = ov_rows.filtered_hits(z, w_o, ov_rows.prepare(w_u), torch.arange(5), BOTTOM_K)
    assert bool(got.all())  # 7 tokens <= k: every token is among its row's bottom k

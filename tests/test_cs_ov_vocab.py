"""The copy-suppression OV criterion over the vocabulary (headlens.scores.ov_vocab) against W_U W_OV W_EE
written out here from a Llama model's raw weights (W_EE with layer 0's attention locked on the token,
as McDougall et al.'s code): exact on a small vocabulary, the stated sample on a larger one, and on
SmolLM2 the two copy-suppression heads an independent full-vocabulary computation reports."""

from __future__ import annotations

import pytest
import torch

from headlens.load.models import build_model
from headlens.scores.ov_vocab import BOTTOM_K, CI_HALF_WIDTH, SCREEN, VOCAB_SAMPLE, cs_ov_vocab, vocab_sample
from tests.helpers.families import family_configs
from tests.helpers.llama_ov import load_smollm2, manual_below

PLANTED = (2, 1)  # layer, head planted to write minus the token it reads (negative copying)
ROUNDING = 2  # float32 here vs float64 in the test: at most this many tokens may flip at the 10th rank


def planted_model(vocab: int):
    config = family_configs()["llama-gqa"]
    config.vocab_size = vocab
    loaded = build_model(config, seed=4, name="cs-ov")
    model = loaded.model
    layer, head = PLANTED
    attn, d_head = model.model.layers[layer].self_attn, config.hidden_size // config.num_attention_heads
    kv = head // (config.num_attention_heads // config.num_key_value_heads)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w_v = attn.v_proj.weight[kv * d_head : (kv + 1) * d_head]  # [d_head, d_model]
        attn.o_proj.weight[:, head * d_head : (head + 1) * d_head] = -3.0 * w_v.T
        # Each token's value is a unit code c_t (times one positive factor per token: its norms), so
        # its own logit -3 c_t . c_s is the lowest of its column; the embeddings are large, so layer 0's
        # attention and MLP (normed inputs, bounded outputs) move them little.
        codes = torch.randn(vocab, d_head, generator=gen)  # [d_vocab, d_head]
        codes = codes / codes.norm(dim=-1, keepdim=True)
        embed = 100.0 * codes @ torch.linalg.pinv(w_v).T  # [d_vocab, d_model]: w_v @ embed_t = 100 c_t
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed)
    return loaded


def test_small_vocabulary_is_scored_exactly():
    loaded = planted_model(600)
    got = cs_ov_vocab(loaded.model)
    assert got["exact"] and (got["n"] == 600).all() and (got["se"] == 0).all()
    tokens = torch.arange(600)
    n_layers, n_heads = got["cs_ov_score"].shape
    with torch.no_grad():
        for layer in range(n_layers):
            for head in range(n_heads):
                truth = (manual_below(loaded.model, tokens, layer, head) < BOTTOM_K).double().mean()
                assert abs(float(got["cs_ov_score"][layer, head]) - float(truth)) <= ROUNDING / 600, (layer, head)
    planted = float(got["cs_ov_score"][PLANTED])
    others = got["cs_ov_score"].flatten().tolist()
    others.remove(planted)
    assert planted > 0.5 > max(others)  # the planted negative copier stands out


@pytest.mark.slow
def test_large_vocabulary_is_sampled_with_the_stated_interval():
    loaded = planted_model(5000)
    got = cs_ov_vocab(loaded.model, seed=3)
    assert not got["exact"] and got["screen"] == SCREEN and got["sample"] == VOCAB_SAMPLE
    assert float(((got["ci_high"] - got["ci_low"]) / 2).max()) <= CI_HALF_WIDTH
    tokens = vocab_sample(5000, seed=3)  # the seeded sample, the first SCREEN of it screened
    n_layers, n_heads = got["cs_ov_score"].shape
    with torch.no_grad():
        for layer in range(n_layers):
            for head in range(n_heads):
                hits = manual_below(loaded.model, tokens, layer, head) < BOTTOM_K  # [sample]
                n = int(got["n"][layer, head])
                assert n == (SCREEN if int(hits[:SCREEN].sum()) == 0 else VOCAB_SAMPLE), (layer, head)
                truth = float(hits[:n].double().mean())
                assert abs(float(got["cs_ov_score"][layer, head]) - truth) <= ROUNDING / n, (layer, head)
    assert int(got["n"][PLANTED]) == VOCAB_SAMPLE


# SmolLM2 over all 49,152 tokens, from the raw weights in float64 with no headlens score code
# (benchmarks/cs_ov_full_vocab.py --layers 23 24): 24.4 0.565, 23.3 0.552, every other head <= 0.09
PEER = {(24, 4): 0.565, (23, 3): 0.552}
CHECKED = 96  # sampled tokens whose counts are recomputed here per head (each a 49k-logit float64 pass)


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_copy_suppression_heads_match_the_full_vocabulary_figures():
    smollm2 = load_smollm2()
    got = cs_ov_vocab(smollm2.model, layers=[23, 24])
    tokens = vocab_sample(smollm2.spec.d_vocab)
    for (layer, head), peer in PEER.items():
        assert int(got["n"][layer, head]) == VOCAB_SAMPLE
        assert float(got["ci_low"][layer, head]) <= peer <= float(got["ci_high"][layer, head]), (layer, head)
        with torch.no_grad():
            truth = manual_below(smollm2.model, tokens[:CHECKED], layer, head) < BOTTOM_K
        ours = cs_ov_vocab(smollm2.model, sample=CHECKED, screen=CHECKED, layers=[layer])
        assert abs(float(ours["cs_ov_score"][layer, head]) - float(truth.double().mean())) <= ROUNDING / CHECKED
    others = got["ci_high"][23:25].clone()  # [2, head]
    others[0, 3] = others[1, 4] = 0.0
    assert float(others.max()) < min(PEER.values()) - 0.3  # the other heads of these layers are far below

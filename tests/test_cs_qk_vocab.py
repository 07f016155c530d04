"""The copy-suppression QK criterion over the vocabulary (headlens.scores.qk_vocab) against
W_U^T W_Q W_K^T W_EE^T written out here from a Llama model's raw weights (GQA; RMSNorm gains; W_EE with
layer 0's attention locked on the token, as McDougall et al.'s code): exact on a small vocabulary with
a planted copy-suppression head and two decoys, the stated sample on a larger one, the kind's rule
needing both criteria, and SmolLM2's figures."""

from __future__ import annotations

import pytest
import torch

from headlens.classify import ClassifyConfig
from headlens.classify.kinds import KINDS
from headlens.load.models import build_model
from headlens.scores.ov_vocab import CI_HALF_WIDTH, SCREEN, VOCAB_SAMPLE, cs_ov_vocab, vocab_sample
from headlens.scores.qk_vocab import TOP_K, cs_qk_vocab, own_in_top
from headlens.scores.rank_scan import BLOCK, ROWS, columns
from tests.helpers.families import build_family, family_configs
from tests.helpers.llama_ov import load_smollm2, manual_w_ee, rms64

LAYER = 2  # the layer the heads below are planted in; query heads 0-3 read key/value head 0
CS, QK_ONLY, OV_ONLY = 1, 2, 3  # copy suppression (both), attends to the prediction only, suppresses only
ROUNDING = 2  # float32 there vs float64 here: at most this many tokens may flip at the 10th rank


def manual_above(model, tokens, layer, head, w_ee=None):
    """How many vocabulary keys score above each token's own key in its row of W_U^T W_Q W_K^T W_EE^T,
    the query from the token's centred unembedding column (final-norm gain folded), unrotated: [n]."""
    cfg, inner = model.config, model.model
    d_head, group = cfg.hidden_size // cfg.num_attention_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    attn, norm = inner.layers[layer].self_attn, inner.layers[layer].input_layernorm
    w_u = model.lm_head.weight.double() * inner.norm.weight.double()  # [d_vocab, d_model]
    u = (w_u - w_u.mean(0))[tokens]  # [n, d_model]
    u = u / u.pow(2).mean(-1, keepdim=True).sqrt()
    q = rms64(u, norm) @ attn.q_proj.weight.double()[head * d_head : (head + 1) * d_head].T  # [n, d_head]
    kv = head // group
    w_ee = manual_w_ee(model, torch.arange(cfg.vocab_size)) if w_ee is None else w_ee  # [d_vocab, d_model]
    k = rms64(w_ee, norm) @ attn.k_proj.weight.double()[kv * d_head : (kv + 1) * d_head].T  # [d_vocab, d_head]
    scores = q @ k.T  # [n, d_vocab]
    return (scores > scores.gather(-1, tokens[:, None])).sum(-1)  # [n]


def planted_model(vocab: int):
    """llama-gqa with unit codes c_t planted in the value space of layer 2's key/value head 0: the
    embedding (tied unembedding) of t, of one norm for every token, reads c_t through W_V, so W_EE and
    the unembedding both carry c_t. Head CS queries and keys by W_V (q_t . k_s ~ c_t . c_s, highest at
    s = t) and writes -3 W_V^T (minus the token it reads); QK_ONLY queries the same way and writes
    what it was initialised to; OV_ONLY writes minus the token with its random query."""
    config = family_configs()["llama-gqa"]
    config.vocab_size = vocab
    loaded = build_model(config, seed=4, name="cs-qk")
    model = loaded.model
    attn, d_head = model.model.layers[LAYER].self_attn, config.hidden_size // config.num_attention_heads
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w_v = attn.v_proj.weight[:d_head]  # [d_head, d_model]: key/value head 0
        codes = torch.randn(vocab, d_head, generator=gen)  # [d_vocab, d_head]
        embed = codes @ torch.linalg.pinv(w_v).T  # [d_vocab, d_model]: w_v @ embed_t = c_t
        embed = 100.0 * embed / embed.norm(dim=-1, keepdim=True)  # one norm: w_v @ embed_t = a_t c_t, a_t > 0
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(embed)
        attn.k_proj.weight[:d_head] = w_v
        for head in (CS, QK_ONLY):
            attn.q_proj.weight[head * d_head : (head + 1) * d_head] = w_v
        for head in (CS, OV_ONLY):
            attn.o_proj.weight[:, head * d_head : (head + 1) * d_head] = -3.0 * w_v.T
    return loaded


def test_own_in_top_scans_every_key_block_as_the_whole_score_matrix_does():
    """own_in_top against every key's score written out at once, on a vocabulary of several scan blocks
    (rank_scan.BLOCK; not a multiple of it) and more than two scan passes (rank_scan.ROWS) of tokens whose
    queries lean on their own key by seeded random amounts, so that the counts of keys above fall on both
    sides of TOP_K."""
    gen = torch.Generator().manual_seed(0)
    d_vocab, d_head, n = 2 * BLOCK + 1234, 16, 2 * ROWS + 37
    keys = torch.randn(d_vocab, d_head, generator=gen, dtype=torch.float64)  # [d_vocab, d_head]
    tokens = torch.randperm(d_vocab, generator=gen)[:n]  # [n]
    lean = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 1.5  # [n, 1]
    queries = lean * keys[tokens] + torch.randn(n, d_head, generator=gen, dtype=torch.float64)  # [n, d_head]
    scores = queries @ keys.T  # [n, d_vocab]
    own = scores.gather(-1, tokens[:, None])  # [n, 1]
    above = (scores > own).sum(-1)  # [n]: the own column is never above itself
    assert (above < TOP_K).sum() >= 10 and (above >= TOP_K).sum() >= 10  # both outcomes
    assert ((above >= TOP_K - 3) & (above <= TOP_K + 3)).sum() >= 3  # some near the boundary
    assert (tokens >= 2 * BLOCK).any()  # own keys in the last, partial block too
    assert torch.equal(own_in_top(queries.float(), columns(keys.float().T), tokens), above < TOP_K)


def test_small_vocabulary_is_scored_exactly_against_the_raw_weights():
    loaded = planted_model(600)
    got = cs_qk_vocab(loaded.model)
    assert got["exact"] and (got["n"] == 600).all() and (got["se"] == 0).all()
    tokens = torch.arange(600)
    n_layers, n_heads = got["cs_qk_score"].shape
    with torch.no_grad():
        for layer in range(n_layers):
            for head in range(n_heads):
                truth = (manual_above(loaded.model, tokens, layer, head) < TOP_K).double().mean()
                assert abs(float(got["cs_qk_score"][layer, head]) - float(truth)) <= ROUNDING / 600, (layer, head)
    scores = got["cs_qk_score"]
    assert float(scores[LAYER, CS]) > 0.9 and float(scores[LAYER, QK_ONLY]) > 0.9  # both query by W_V
    rest = scores.clone()
    rest[LAYER, CS] = rest[LAYER, QK_ONLY] = 0.0
    assert float(rest.max()) < 0.1  # random queries and keys: chance is 10 / 600


def test_the_kind_needs_both_criteria():
    """Only the head that attends to the predicted token and writes it down is labelled: the decoy
    that only attends (QK_ONLY) and the one that only suppresses (OV_ONLY) are not."""
    loaded = planted_model(600)
    qk, ov = cs_qk_vocab(loaded.model)["cs_qk_score"], cs_ov_vocab(loaded.model)["cs_ov_score"]
    assert float(ov[LAYER, OV_ONLY]) > 0.9 and float(ov[LAYER, CS]) > 0.9 and float(ov[LAYER, QK_ONLY]) < 0.1
    kind, config = next(k for k in KINDS if k.label == "copy_suppression"), ClassifyConfig()
    labelled = [
        (layer, head)
        for layer in range(qk.shape[0])
        for head in range(qk.shape[1])
        if kind.rule({"cs_ov_score": float(ov[layer, head]), "cs_qk_score": float(qk[layer, head])}, config)
    ]
    assert labelled == [(LAYER, CS)]


@pytest.mark.slow
def test_large_vocabulary_is_sampled_with_the_stated_interval():
    loaded = planted_model(3000)
    got = cs_qk_vocab(loaded.model, seed=3)
    assert not got["exact"] and got["screen"] == SCREEN and got["sample"] == VOCAB_SAMPLE
    assert float(((got["ci_high"] - got["ci_low"]) / 2).max()) <= CI_HALF_WIDTH
    tokens = vocab_sample(3000, seed=3)  # the seeded sample, the first SCREEN of it screened
    with torch.no_grad():
        for head in (CS, QK_ONLY, OV_ONLY, 0):
            hits = manual_above(loaded.model, tokens, LAYER, head) < TOP_K  # [sample]
            n = int(got["n"][LAYER, head])
            assert n == (SCREEN if int(hits[:SCREEN].sum()) == 0 else VOCAB_SAMPLE), head
            truth = float(hits[:n].double().mean())
            assert abs(float(got["cs_qk_score"][LAYER, head]) - truth) <= ROUNDING / n, head
    assert int(got["n"][LAYER, CS]) == VOCAB_SAMPLE


# SmolLM2: the two heads the OV criterion singles out (24.4 0.578, 23.3 0.561 over the vocabulary);
# their QK scores over the vocabulary are in BENCHMARKS.md
OV_HEADS = ((24, 4), (23, 3))
CHECKED = 96  # sampled tokens whose ranks are recomputed here per head (each a pass over 49k keys)


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_heads_that_suppress_do_not_attend_to_the_prediction():
    """Neither OV head meets the QK criterion: each sampled score matches the raw-weights computation
    on CHECKED tokens, and its 95% interval lies below the cut-off."""
    smollm2 = load_smollm2()
    got = cs_qk_vocab(smollm2.model, layers=[23, 24])
    ours = cs_qk_vocab(smollm2.model, sample=CHECKED, screen=CHECKED, layers=[23, 24])
    tokens = vocab_sample(smollm2.spec.d_vocab)[:CHECKED]
    with torch.no_grad():
        w_ee = manual_w_ee(smollm2.model, torch.arange(smollm2.spec.d_vocab))  # [d_vocab, d_model]
        for layer, head in OV_HEADS:
            truth = (manual_above(smollm2.model, tokens, layer, head, w_ee) < TOP_K).double().mean()
            assert abs(float(ours["cs_qk_score"][layer, head]) - float(truth)) <= ROUNDING / CHECKED, (layer, head)
            assert float(got["ci_high"][layer, head]) < 0.5, (layer, head)


# Gemma 3: (1 + w) RMSNorms, the embedding scaled by sqrt(d_model), a norm on the attention output and
# around the MLP, per-head query and key norms, 4 query heads over 1 key/value head -----------------------
GEMMA_TOKENS = 200  # sampled tokens, every head scored on all of them (screen = sample)


def _gemma_rms(x, norm):
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * (1 + norm.weight.double())


def manual_gemma_w_ee(model, tokens):
    """Gemma 3's W_EE, layer 0's attention locked on the token itself, from its modules' weights: [n, d_model]."""
    cfg, block = model.config, model.model.layers[0]
    x = model.model.embed_tokens.weight[tokens].double() * cfg.hidden_size**0.5  # [n, d_model]
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    v = (_gemma_rms(x, block.input_layernorm) @ block.self_attn.v_proj.weight.double().T).view(
        len(tokens), -1, cfg.head_dim
    )
    z = v.repeat_interleave(group, dim=1).flatten(1)  # [n, heads * d_head]
    mid = x + _gemma_rms(z @ block.self_attn.o_proj.weight.double().T, block.post_attention_layernorm)
    h = _gemma_rms(mid, block.pre_feedforward_layernorm).float()
    mlp = block.mlp
    out = mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(h), approximate="tanh") * mlp.up_proj(h))
    return mid + _gemma_rms(out, block.post_feedforward_layernorm)  # [n, d_model]


def manual_gemma_above(model, tokens, layer, w_ee):
    """Keys above each token's own in its row, every head of `layer` (Gemma 3, unrotated): [head, n]."""
    cfg, inner = model.config, model.model
    attn, norm = inner.layers[layer].self_attn, inner.layers[layer].input_layernorm
    w_u = model.lm_head.weight.double() * (1 + inner.norm.weight.double())  # [d_vocab, d_model]
    u = (w_u - w_u.mean(0))[tokens]  # [n, d_model]
    u = u / u.pow(2).mean(-1, keepdim=True).sqrt()
    q = (_gemma_rms(u, norm) @ attn.q_proj.weight.double().T).view(len(tokens), -1, cfg.head_dim)  # [n, head, d]
    k = (_gemma_rms(w_ee, norm) @ attn.k_proj.weight.double().T).view(len(w_ee), -1, cfg.head_dim)  # [V, kv, d]
    q, k = _gemma_rms(q, attn.q_norm), _gemma_rms(k, attn.k_norm)
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    out = []
    for head in range(cfg.num_attention_heads):
        scores = q[:, head] @ k[:, head // group].T  # [n, d_vocab]
        out.append((scores > scores.gather(-1, tokens[:, None])).sum(-1))
    return torch.stack(out)  # [head, n]


@pytest.mark.slow
def test_gemma3_is_scored_as_its_weights_compute():
    """Every layer's key head made query head 0's projection and norm, so head 0 ranks a token's own key
    high for some of the tokens (its scores are not all 0, as a random head's are), the others stay random."""
    loaded = build_family("gemma3_text-mqa", seed=3)
    d_head = loaded.model.config.head_dim
    with torch.no_grad():
        for block in loaded.model.model.layers:
            block.self_attn.k_proj.weight.copy_(block.self_attn.q_proj.weight[:d_head])
            block.self_attn.k_norm.weight.copy_(block.self_attn.q_norm.weight)
    got = cs_qk_vocab(loaded.model, sample=GEMMA_TOKENS, screen=GEMMA_TOKENS)
    assert float(got["cs_qk_score"][:, 0].min()) > 0.05
    tokens = vocab_sample(loaded.spec.d_vocab)[:GEMMA_TOKENS]
    with torch.no_grad():
        w_ee = manual_gemma_w_ee(loaded.model, torch.arange(loaded.spec.d_vocab))  # [d_vocab, d_model]
        for layer in range(loaded.spec.n_layers):
            truth = (manual_gemma_above(loaded.model, tokens, layer, w_ee) < TOP_K).double().mean(-1)  # [head]
            assert (got["cs_qk_score"][layer] - truth).abs().max() <= ROUNDING / GEMMA_TOKENS, layer

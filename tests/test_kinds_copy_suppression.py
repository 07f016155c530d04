"""Copy-suppression heads (headlens.scores.copy_suppression): both parts on synthetic inputs, a
planted copy-suppression head recovered alone (the induction head attends the same way but
copies), and SmolLM2's OV ranks and text attention against computations written here."""

from __future__ import annotations

import pytest
import torch

from headlens.classify import ClassifyConfig, classify_heads
from headlens.classify.roles import resolve_heads
from headlens.heads import Head
from headlens.probes.inputs import default_text, text_windows
from headlens.scores.copy_suppression import (
    BOTTOM_K,
    CS_OV_MIN,
    CS_QK_MIN,
    copy_suppression_scores,
    negative_copy_share,
    predicted_attention,
)
from headlens.scores.ov_circuit import ov_logits, own_extremes, own_ranks
from tests.helpers.families import build_family
from tests.helpers.kinds_checks import check_text_attention_loop_over_positions
from tests.helpers.llama_ov import manual_ov_logits
from tests.helpers.planted import PLANTED_TEXT
from tests.helpers.planted_kinds import build_planted_kinds, kind_seeds, labelled_heads


def test_negative_copy_share_counts_the_bottom_k():
    below = torch.tensor([[0, BOTTOM_K - 1, BOTTOM_K, 500]])  # [head, n]
    assert negative_copy_share(below).tolist() == [0.5]


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3_text-mqa"])
def test_own_ranks_count_the_rest_of_the_vocabulary_as_a_float64_ranking_does(family):
    """own_ranks (float32, vocabulary blocks, the token's own column taken back out) against every
    logit of ov_logits (float64) ranked here; a 50,257-token vocabulary ends in a partial block."""
    loaded = build_family(family, seed=2)
    vocab = torch.arange(loaded.spec.d_vocab)  # [d_vocab]
    tokens = torch.tensor([0, 5, 777, 4096, loaded.spec.d_vocab - 1])  # [n]: first, inside, last block
    above, below = own_ranks(loaded.model, tokens)  # [layer, head, n]
    logits = ov_logits(loaded.model, tokens, vocab)  # [layer, head, n, d_vocab]
    own = logits[..., torch.arange(len(tokens)), tokens][..., None]  # [layer, head, n, 1]
    others = vocab != tokens[:, None]  # [n, d_vocab]
    assert int((above + below).max()) <= loaded.spec.d_vocab - 1  # the token never counts against itself
    # float32 against float64: a count moves only by logits within rounding of the token's own
    assert (above - ((logits > own) & others).sum(-1)).abs().max() <= 2
    assert (below - ((logits < own) & others).sum(-1)).abs().max() <= 2


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3_text-mqa"])
def test_own_extremes_agree_with_a_float64_ranking_of_every_logit(family):
    """own_extremes (float32, rows leaving the scan once k tokens lie above and k below) against the
    float64 logits of ov_logits ranked here, at k = 10 (random weights: no token in an extreme) and at
    k = an eighth of the vocabulary (many tokens in an extreme, many leaving early); rows that a logit
    within float32 rounding of the token's own could move across k are left out, and most rows are
    decided."""
    loaded = build_family(family, seed=3)
    vocab = torch.arange(loaded.spec.d_vocab)  # [d_vocab]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.cat(
        [torch.tensor([0, loaded.spec.d_vocab - 1]), torch.randperm(loaded.spec.d_vocab, generator=gen)[:30]]
    )
    logits = ov_logits(loaded.model, tokens, vocab)  # [layer, head, n, d_vocab] float64
    own = logits[..., torch.arange(len(tokens)), tokens][..., None]  # [layer, head, n, 1]
    others = vocab != tokens[:, None]  # [n, d_vocab]
    tol = 1e-4 * float(logits.abs().max())  # far above float32 rounding of these products
    close = (((logits - own).abs() <= tol) & others).sum(-1)  # [layer, head, n]
    for k in (10, loaded.spec.d_vocab // 8):
        top, bottom = own_extremes(loaded.model, tokens, k)  # [layer, head, n] each
        for got, count in ((top, ((logits > own) & others).sum(-1)), (bottom, ((logits < own) & others).sum(-1))):
            decided = (count + close < k) | (count - close >= k)  # [layer, head, n]
            assert decided.double().mean() > 0.9
            assert torch.equal(got[decided], (count < k)[decided])
    assert top.any() and bottom.any() and not top.all()  # at an eighth of the vocabulary: both outcomes


def test_attention_on_the_predicted_tokens_copy():
    ids = torch.tensor([[0, 7, 8, 9]])  # [batch, pos]: BOS then three tokens
    predicted = torch.tensor([[-1, -1, -1, 7]])  # position 3 predicts 7, which sits at position 1
    pattern = torch.zeros(1, 2, 4, 4)  # [batch, head, q_pos, k_pos]
    pattern[0, 0, :, 0] = 1.0  # head 0: the BOS sink, not a copy
    pattern[0, 1, 3, 1] = 1.0  # head 1: the copy
    mass, count = predicted_attention(pattern, ids, predicted, torch.ones(1, 4, dtype=torch.bool))
    assert count == 1 and mass.tolist() == [0.0, 1.0]


@pytest.fixture(scope="module", params=kind_seeds(2))
def planted(request):
    planted = build_planted_kinds(request.param)
    return planted, copy_suppression_scores(planted.loaded, PLANTED_TEXT)


@pytest.mark.slow
def test_planted_copy_suppression_head_is_the_only_one(planted):
    planted, scores = planted
    cs = planted.positions["copy_suppression"]
    found = [tuple(x) for x in scores["copy_suppression"].nonzero().tolist()]
    assert found == [cs]
    assert float(scores["cs_ov_score"][cs]) == 1.0  # OV writes minus exactly the attended token
    assert float(scores["cs_qk_score"][cs]) == 1.0  # its query reads the prediction, its key the token
    induction = planted.positions["induction"]
    # The induction head attends to the predicted token's copy on text too (a third of its attention,
    # where an even spread over a 64-token window puts ~1/64 on a copy), but by neither weight criterion:
    # its query reads the previous token, and it copies.
    assert float(scores["predicted_attention"][induction]) >= 0.3
    assert float(scores["cs_ov_score"][induction]) < CS_OV_MIN and float(scores["cs_qk_score"][induction]) < CS_QK_MIN


# SmolLM2 ------------------------------------------------------------------------------------------------------

N_CHECK = 8  # tokens whose full-vocabulary ranks are recomputed by hand (each is a pass over 49k logits)


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model("smollm2")


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.usefixtures("one_thread")  # own_ranks is thousands of small matmuls, which a second thread slows
def test_smollm2_own_ranks_match_a_hand_computed_ov_circuit(smollm2):
    windows = text_windows(smollm2.tokenizer, default_text(), 64, smollm2.bos_token_id, max_windows=2)
    tokens = torch.tensor(sorted({t for w in windows for t in w[1:]}))[:N_CHECK]
    above, below = own_ranks(smollm2.model, tokens)  # [layer, head, n]
    vocab = torch.arange(smollm2.spec.d_vocab)
    with torch.no_grad():
        for layer in (23, 24):  # the heads with the most negative copying here (BENCHMARKS.md)
            logits = manual_ov_logits(smollm2.model, tokens, vocab, layer)  # [head, n, d_vocab]
            own = logits.gather(-1, tokens.expand(logits.shape[0], -1)[..., None])  # [head, n, 1]
            # float32 ranking vs float64 here: a rank may move by the few logits within rounding
            assert (below[layer] - (logits < own).sum(-1)).abs().max() <= 2, layer
            assert (above[layer] - (logits > own).sum(-1)).abs().max() <= 2, layer


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_text_attention_matches_a_loop_over_positions(smollm2):
    windows = text_windows(smollm2.tokenizer, default_text(), 32, smollm2.bos_token_id, max_windows=2)
    check_text_attention_loop_over_positions(smollm2, windows)


# Through the registry: classify labels it, ablate selects it ---------------------------------------------------


@pytest.mark.slow
def test_classify_labels_the_planted_copy_suppression_head_alone_and_ablate_selects_it(planted):
    planted, scores = planted
    frame = classify_heads(planted.loaded, text=PLANTED_TEXT, config=ClassifyConfig(n_seq=4, seed=0)).frame
    assert labelled_heads(frame, "copy_suppression") == [planted.positions["copy_suppression"]]
    # classify scores the QK half only in layers with a head at the OV cut-off; there it equals the
    # every-layer scoring of copy_suppression_scores, elsewhere it is NaN (not scored)
    qk = torch.tensor(frame.pivot(index="layer", columns="head", values="cs_qk_score").to_numpy())  # [layer, head]
    gated = (scores["cs_ov_score"] >= CS_OV_MIN).any(-1)  # [layer]
    assert gated.any() and not gated.all()
    assert torch.isnan(qk[~gated]).all()
    assert torch.equal(qk[gated], scores["cs_qk_score"][gated].to(qk.dtype))
    # no IOI circuit is planted here: no head moves names
    assert labelled_heads(frame, "name_mover") == labelled_heads(frame, "negative_name_mover") == []
    labels = {Head(int(r.layer), int(r.head)): list(r.labels) for r in frame.itertuples()}
    heads, chosen_by = resolve_heads(planted.loaded, "copy_suppression", labels)
    assert heads == [Head(*planted.positions["copy_suppression"])] and "copy_suppression" in chosen_by

"""The head kinds' scores on the real Gemma 3 270M (18 layers x 4 query heads over 1 key/value head, head_dim
256, a 262,144-token vocabulary) against computations written here: successor, copy-suppression and
name-mover copy scores against the OV circuit written from the Hugging Face modules (tests/helpers/gemma_ov.py), and
the attention parts of copy suppression, name movers, rare-word and syntactic heads against the model's own
eager attention, one sequence at a time. The SmolLM2 tests of each kind (tests/test_kinds_*.py) check the
same on a Llama model; what Gemma 3 270M has of each kind is in BENCHMARKS.md."""

from __future__ import annotations

import pytest
import torch

from headlens.probes.inputs import default_text, text_windows
from headlens.scores import syntactic
from headlens.scores.copy_suppression import BOTTOM_K
from headlens.scores.name_mover import COPY_TOP_K, name_mover_scores, name_tokens
from headlens.scores.ov_circuit import ov_logits, own_ranks
from headlens.scores.rare_word import rare_sentences, rare_word_scores
from headlens.scores.successor import successor_scores, successor_tasks
from tests.helpers.gemma_ov import REL_TOL, manual_gemma_ov_logits
from tests.helpers.kinds_checks import (
    SMOL_TEXT,
    check_ioi_run_one_prompt_at_a_time,
    check_text_attention_loop_over_positions,
    eager_rare_scores,
    eager_relation_accuracy,
    small_sample,
)

pytestmark = [pytest.mark.slow, pytest.mark.real]

N_CHECK = 8  # tokens whose full-vocabulary ranks are recomputed by hand (each a pass over 262k logits per head)


@pytest.fixture(scope="module")
def gemma(real_model):
    return real_model("gemma3-270m")


def _ranks_match(ranks: torch.Tensor, logits: torch.Tensor, own: torch.Tensor, larger: bool) -> bool:
    """float32 ranking (ours) vs float64 (here): a rank may move by the few logits within rounding."""
    counted = (logits > own).sum(-1) if larger else (logits < own).sum(-1)  # [head, n]
    return bool((ranks - counted).abs().max() <= 2)


def test_successor_scores_match_the_hand_written_ov_circuit(gemma):
    tasks = successor_tasks(gemma.tokenizer)
    assert len(tasks) >= 3, [t.name for t in tasks]
    tokens = torch.cat([t.tokens for t in tasks])
    ours = ov_logits(gemma.model, tokens, tokens)  # [layer, head, n, n]
    scores = successor_scores(gemma.model, tasks)  # [layer, head]
    with torch.no_grad():
        for layer in (0, 9, 17):
            manual = manual_gemma_ov_logits(gemma.model, tokens, tokens, layer)  # [head, n, n]
            assert (ours[layer] - manual).abs().max() <= REL_TOL * manual.abs().max(), layer
            hits, start = [], 0
            for task in tasks:
                part = slice(start, start + len(task.tokens))
                best = manual[:, part, part][:, task.pairs[:, 0]].argmax(-1)  # [head, p]
                hits.append((best == task.pairs[:, 1]).double())
                start = part.stop
            assert torch.allclose(scores[layer], torch.cat(hits, -1).mean(-1)), layer


def test_copy_suppression_ranks_and_attention_match_hand_computations(gemma):
    windows = text_windows(gemma.tokenizer, default_text(), 64, gemma.bos_token_id, max_windows=2)
    tokens = torch.tensor(sorted({t for w in windows for t in w[1:]}))[:N_CHECK]
    above, below = own_ranks(gemma.model, tokens)  # [layer, head, n]
    vocab = torch.arange(gemma.spec.d_vocab)
    most_negative = int((below < BOTTOM_K).double().mean((1, 2)).argmax())  # the layer that copies most negatively
    with torch.no_grad():
        for layer in sorted({most_negative, 17}):
            logits = manual_gemma_ov_logits(gemma.model, tokens, vocab, layer)  # [head, n, d_vocab]
            own = logits.gather(-1, tokens.expand(logits.shape[0], -1)[..., None])  # [head, n, 1]
            assert _ranks_match(below[layer], logits, own, larger=False), layer
            assert _ranks_match(above[layer], logits, own, larger=True), layer
    short = text_windows(gemma.tokenizer, default_text(), 32, gemma.bos_token_id, max_windows=2)
    check_text_attention_loop_over_positions(gemma, short)


def test_name_mover_attention_logit_diff_and_copy_scores_match_hand_computations(gemma):
    scores = name_mover_scores(gemma)
    check_ioi_run_one_prompt_at_a_time(gemma, scores["prompts"][:6])
    names = torch.tensor(sorted(set(name_tokens(gemma.tokenizer).values())))
    vocab = torch.arange(gemma.spec.d_vocab)
    best = int(scores["name_copy_score"].flatten().argmax()) // gemma.spec.n_heads
    with torch.no_grad():
        for layer in sorted({best, 17}):
            logits = manual_gemma_ov_logits(gemma.model, names, vocab, layer)  # [head, n, d_vocab]
            own = logits.gather(-1, names.expand(logits.shape[0], -1)[..., None])  # [head, n, 1]
            copy = ((logits > own).sum(-1) < COPY_TOP_K).double().mean(-1)  # [head]
            negative = ((logits < own).sum(-1) < COPY_TOP_K).double().mean(-1)
            # float32 ranks vs float64 here: at most one name may sit on the top-5 boundary
            assert (scores["name_copy_score"][layer] - copy).abs().max() <= 1 / len(names), layer
            assert (scores["name_negative_copy_score"][layer] - negative).abs().max() <= 1 / len(names), layer


def test_rare_word_scores_match_its_eager_attention(gemma):
    sentences, _ = rare_sentences(gemma.tokenizer, [SMOL_TEXT], gemma.bos_token_id, 256, 10_000)
    assert len(sentences) >= 5
    ours = rare_word_scores(gemma, sentences, batch_size=3)  # batched, padded, lean capture
    assert torch.equal(ours, eager_rare_scores(gemma, sentences))


def test_syntactic_accuracy_matches_its_eager_attention(gemma, monkeypatch):
    sample = small_sample(gemma, monkeypatch)
    ours = syntactic.relation_accuracy(gemma, sample, batch_size=4)  # [relation, layer, head]
    assert torch.equal(ours, eager_relation_accuracy(gemma, sample))

"""Successor heads (headlens.scores.successor): the score on synthetic logits, the probe for two
tokenizers, a planted successor head recovered alone, and SmolLM2's scores against an
OV circuit computed here from the raw weights."""

from __future__ import annotations

import pytest
import torch

from headlens.errors import ConfigError
from headlens.load.models import gpt2_tokenizer
from headlens.scores.successor import SUCCESSOR_MIN, succession_hits, successor_heads, successor_scores, successor_tasks
from tests.helpers.llama_ov import REL_TOL, manual_ov_logits
from tests.helpers.planted import N_HEADS, N_LAYERS, PLANTED_TEXT
from tests.helpers.planted_kinds import build_planted_kinds, kind_seeds


def test_perfect_successor_logits_score_one():
    c = 5
    logits = torch.eye(c).roll(1, dims=1)  # [c, c]: source k puts its largest logit on k + 1
    pairs = torch.tensor([[k, k + 1] for k in range(c - 1)])  # [p, 2]
    assert succession_hits(logits, pairs).tolist() == [1.0] * (c - 1)


def test_copying_logits_score_zero_and_ties_do_not_count():
    pairs = torch.tensor([[0, 1], [1, 2]])
    assert succession_hits(torch.eye(3), pairs).tolist() == [0.0, 0.0]  # each token ranks itself first
    assert succession_hits(torch.zeros(3, 3), pairs).tolist() == [0.0, 0.0]  # a tie is no success


def test_gpt2_spells_every_task_with_single_tokens():
    tasks = {t.name: t for t in successor_tasks(gpt2_tokenizer())}
    assert len(tasks["days"].tokens) == 7 and len(tasks["months"].tokens) == 12
    assert len(tasks["letters"].pairs) == 25
    assert len(tasks["numbers"].tokens) > 150  # " 1" .. " 200" are mostly single GPT-2 tokens


# Errors
def test_no_task_is_a_config_error():
    with pytest.raises(ConfigError, match="single tokens"):
        successor_scores(None, [])


@pytest.fixture(scope="module", params=kind_seeds(2))
def planted(request):
    return build_planted_kinds(request.param)


@pytest.mark.slow
def test_planted_successor_head_is_the_only_one(planted):
    tasks = successor_tasks(planted.loaded.tokenizer)
    scores = successor_scores(planted.loaded.model, tasks)  # [layer, head]
    assert scores.shape == (N_LAYERS, N_HEADS)
    assert successor_heads(scores) == [planted.positions["successor"]]
    assert float(scores[planted.positions["successor"]]) == 1.0  # the rotation is exact on every pair
    # The induction head copies: its OV names the token itself, not its successor.
    assert float(scores[planted.positions["induction"]]) < SUCCESSOR_MIN


# SmolLM2 against an OV circuit computed here from the Llama weights -------------------------------------------


@pytest.fixture(scope="module")
def smollm2(real_model):
    return real_model("smollm2")


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_scores_match_a_hand_computed_ov_circuit(smollm2):
    from headlens.scores.ov_circuit import ov_logits

    tasks = successor_tasks(smollm2.tokenizer)
    assert {"days", "months", "letters"} <= {t.name for t in tasks}
    tokens = torch.cat([t.tokens for t in tasks])
    ours = ov_logits(smollm2.model, tokens, tokens)  # [layer, head, n, n]
    scores = successor_scores(smollm2.model, tasks)
    with torch.no_grad():
        for layer in (0, 13, 29):
            manual = manual_ov_logits(smollm2.model, tokens, tokens, layer)  # [head, n, n]
            spread = manual.abs().max()
            assert (ours[layer] - manual).abs().max() <= REL_TOL * spread, layer
            hits, start = [], 0
            for task in tasks:
                part = slice(start, start + len(task.tokens))
                rows = manual[:, part, part][:, task.pairs[:, 0]]  # [head, p, c]
                best = rows.argmax(-1)  # [head, p]
                hits.append((best == task.pairs[:, 1]).double())
                start = part.stop
            assert torch.allclose(scores[layer], torch.cat(hits, -1).mean(-1)), layer


# Through the registry: classify labels it, ablate selects it ---------------------------------------------------


@pytest.mark.slow
def test_classify_labels_the_planted_successor_head_and_ablate_selects_it(planted):

    from headlens.classify import ClassifyConfig, classify_heads
    from headlens.classify.roles import resolve_heads
    from headlens.heads import Head

    frame = classify_heads(planted.loaded, text=PLANTED_TEXT, config=ClassifyConfig(n_seq=4, seed=0)).frame
    labelled = [(r.layer, r.head) for r in frame.itertuples() if "successor" in r.labels]
    assert labelled == [planted.positions["successor"]]
    labels = {Head(int(r.layer), int(r.head)): list(r.labels) for r in frame.itertuples()}
    heads, chosen_by = resolve_heads(planted.loaded, "successor", labels)
    assert heads == [Head(*planted.positions["successor"])] and "successor" in chosen_by

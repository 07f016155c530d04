"""Rare-word heads (headlens.scores.rare_word): the hit rule, sentences and their rarest word, a planted
rare-word head recovered by classify alone, and SmolLM2's scores against attention read here from the
model's own eager patterns with the rarest word's tokens found by decoding."""

from __future__ import annotations

import pytest
import torch
from wordfreq import word_frequency

from headlens.load.models import gpt2_tokenizer
from headlens.scores.rare_word import (
    RARE_WORD_MIN,
    rare_hits,
    rare_sentence,
    rare_sentences,
    rare_word_heads,
    rare_word_scores,
)
from tests.helpers.kinds_checks import SMOL_TEXT, decoded_targets, eager_rare_scores
from tests.helpers.planted import N_HEADS, N_LAYERS
from tests.helpers.planted_kinds import build_planted_rare_word, rare_text

BOS = 50256


def test_a_hit_is_the_largest_weight_past_bos_on_a_target():
    row = torch.tensor([[0.6, 0.1, 0.3, 0.0], [0.1, 0.5, 0.2, 0.2]])  # [head, k_pos]: head 0's BOS weight is ignored
    targets = torch.tensor([False, False, True, False])
    assert rare_hits(row, targets).tolist() == [1.0, 0.0]


def test_the_rarest_word_is_all_of_its_subword_tokens():
    tok = gpt2_tokenizer()
    text = "The aardvark ate the grass near the river."
    sentence, why = rare_sentence(tok, text, BOS, 64)
    assert why == "" and sentence.rarest == "aardvark"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(decoded_targets(tok, ids, "aardvark")) > 1  # GPT-2 splits it
    assert sentence.targets == [1 + i for i in decoded_targets(tok, ids, "aardvark")]
    assert sentence.ids == [BOS, *ids] and sentence.query == len(ids) and not sentence.last_word
    assert word_frequency("aardvark", "en") < min(word_frequency(w, "en") for w in ("grass", "river", "near"))


def test_skipped_sentences_say_why():
    tok = gpt2_tokenizer()
    assert rare_sentence(tok, "Zorbly and Quaffin wept.", BOS, 64) == (None, "tied")  # both unknown to wordfreq
    assert rare_sentence(tok, "Go home.", BOS, 64) == (None, "short")
    assert rare_sentence(tok, "The walrus slept on the warm rocks.", BOS, 4) == (None, "long")
    kept, skipped = rare_sentences(tok, ["The walrus slept. Go home! The cat sat on the mat."], BOS, 64, 10_000)
    assert [s.rarest for s in kept] == ["walrus", "mat"] and skipped["short"] == 1
    assert kept[0].ids[1] == tok(" The")["input_ids"][0]  # each sentence as it runs in the text, after a space


@pytest.fixture(scope="module", params=[0, 3])
def planted(request):
    return build_planted_rare_word(request.param)


@pytest.mark.slow
def test_planted_rare_word_head_is_the_only_one_and_matches_eager_attention(planted):
    loaded = planted.loaded
    sentences, skipped = rare_sentences(loaded.tokenizer, [rare_text(loaded.tokenizer, 0)], BOS, 64, 10_000)
    assert len(sentences) >= 40 and skipped["tied"] == 0  # the pool's frequencies are distinct
    scores = rare_word_scores(loaded, sentences)  # [layer, head]
    assert scores.shape == (N_LAYERS, N_HEADS)
    assert torch.equal(scores, eager_rare_scores(loaded, sentences))
    slot = planted.positions["rare_word"]
    assert rare_word_heads(scores) == [slot] and float(scores[slot]) == 1.0
    # The previous-token head hits only where the last word is the rarest.
    last_word = sum(s.last_word for s in sentences) / len(sentences)
    assert float(scores[planted.positions["previous_token"]]) == pytest.approx(last_word)
    assert last_word < RARE_WORD_MIN


@pytest.fixture(scope="module")
def planted_seed_3(planted):
    return planted if planted.positions["rare_word"] == (0, 1) else build_planted_rare_word(3)


@pytest.mark.slow
def test_classify_labels_the_planted_rare_word_head_alone(planted_seed_3):
    from headlens.classify import ClassifyConfig, classify_heads

    planted = planted_seed_3
    heads = classify_heads(planted.loaded, text=rare_text(planted.loaded.tokenizer, 0), config=ClassifyConfig(n_seq=4))
    frame = heads.frame
    labelled = [(r.layer, r.head) for r in frame.itertuples() if "rare_word" in r.labels]
    assert labelled == [planted.positions["rare_word"]]
    assert (frame["n_rare_sentences"] > 0).all()
    assert heads.meta["probes"]["rare_word"]["n_sentences"] == int(frame["n_rare_sentences"].iloc[0])


# SmolLM2 against its own eager attention -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.real
def test_smollm2_scores_match_its_eager_attention(real_model):
    loaded = real_model("smollm2")
    sentences, _ = rare_sentences(loaded.tokenizer, [SMOL_TEXT], loaded.bos_token_id, 256, 10_000)
    assert len(sentences) == 6
    assert [s.rarest for s in sentences][:3] == ["ledger", "staircase", "spyglass"]
    ours = rare_word_scores(loaded, sentences, batch_size=3)  # batched, padded, lean capture
    assert torch.equal(ours, eager_rare_scores(loaded, sentences))


def test_classify_says_why_a_rare_word_or_syntactic_head_is_absent(capsys):
    import pandas as pd

    from headlens.classify import ClassifyConfig
    from headlens.cli.commands_classify import _kind_notes
    from headlens.results import Result

    frame = pd.DataFrame(
        {
            "layer": [0, 1],
            "head": [0, 1],
            "labels": [["rare_word"], []],
            "rare_word_score": [0.7, 0.1],
            "syntactic_score": [0.02, 0.08],
            "syntactic_accuracy": [0.3, 0.5],
        }
    )
    config = {"rare_word_min": ClassifyConfig().rare_word_min, "syntactic_min": 0.1}
    probes = {"rare_word": {"n_sentences": 12}, "syntactic": {"relations": [{"relation": "det"}]}}
    _kind_notes(Result("heads", frame, {"config": config, "probes": probes}))
    assert capsys.readouterr().err.splitlines() == [
        "headlens: note: no syntactic heads: highest syntactic_score at 1.1: syntactic_score 0.08 (cut-off 0.1), "
        "syntactic_accuracy 0.50"
    ]
    nothing = frame.assign(labels=[[], []], rare_word_score=float("nan"), syntactic_score=float("nan"))
    probes = {"rare_word": {"n_sentences": 0}, "syntactic": {"relations": []}}
    _kind_notes(Result("heads", nothing, {"config": config, "probes": probes}))
    assert capsys.readouterr().err.splitlines() == [
        "headlens: note: no rare_word heads: the probe found no sentences to score",
        "headlens: note: no syntactic heads: the probe found no relations to score",
    ]
    probes = {"syntactic_missing": "not asked for", "rare_word": {"n_sentences": 0}}
    _kind_notes(
        Result("heads", nothing, {"config": config, "probes": probes})
    )  # the probe that did not run has its own note (commands_classify._notes)
    assert capsys.readouterr().err.splitlines() == [
        "headlens: note: no rare_word heads: the probe found no sentences to score"
    ]

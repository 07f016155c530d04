"""The viewer's repeated sample: the text's start only when the heads labelled induction prefix-match on it,
else the random-token probe they were found on, with the caption saying why."""

from __future__ import annotations

import pytest
import torch

from headlens.classify import samples
from headlens.heads import Head, all_heads
from headlens.reports.viewer import repeated_caption
from tests.helpers.browser import induction_target_attention

TEXT = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"


def test_text_set_aside_when_the_induction_heads_do_not_prefix_match_on_it(small_model, monkeypatch):
    """A random-weights model's heads spread their attention: with the copy test passed by force, the text's
    start is still set aside, and the scores that decided it equal an independent count on the model's own
    attentions (headlens-free: output_attentions)."""
    monkeypatch.setattr(samples, "COPY_LOSS_RATIO", float("inf"))  # as if the model copied the text
    heads = all_heads(small_model.spec.n_layers, small_model.spec.n_heads)
    sample = samples.sample_patterns(small_model, TEXT, 17, repeat=True, induction_heads=heads)
    facts, sample_ids = sample.meta, list(sample.frame["id"])
    assert facts["sample"] == samples.SAMPLE_RANDOM
    body = small_model.tokenizer(TEXT, add_special_tokens=False)["input_ids"][:8]
    text_ids = [small_model.bos_token_id] + body * 2
    for ids, key in [(text_ids, "text_prefix_matching"), (sample_ids, "prefix_matching")]:
        with torch.no_grad():
            attentions = small_model.model(torch.tensor([ids]), output_attentions=True).attentions
        expected = induction_target_attention(attentions, ids, heads)["attention"]
        for head in heads:
            assert facts[key][str(head)] == pytest.approx(expected[head], abs=1e-5), (key, head)
    assert min(facts["text_prefix_matching"].values()) < samples.PREFIX_MATCHING_MIN
    low_head = min(facts["text_prefix_matching"], key=facts["text_prefix_matching"].get)
    for lang in ("en", "es"):
        caption = repeated_caption(sample, 17, lang)
        assert low_head in caption and "0.4" in caption.replace(",", ".")


def test_text_kept_when_the_induction_heads_prefix_match_on_it(small_model, monkeypatch):
    monkeypatch.setattr(samples, "COPY_LOSS_RATIO", float("inf"))
    monkeypatch.setattr(samples, "PREFIX_MATCHING_MIN", 0.0)  # every head reaches a threshold of 0
    sample = samples.sample_patterns(small_model, TEXT, 17, repeat=True, induction_heads=[Head(0, 1)])
    ids = list(sample.frame["id"])
    assert sample.meta["sample"] == samples.SAMPLE_TEXT and "text_prefix_matching" not in sample.meta
    assert list(sample.meta["prefix_matching"]) == ["0.1"]
    assert ids[1:9] == ids[9:17]

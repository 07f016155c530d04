"""Needle decoding with the key/value cache equals decoding by full forwards, step for step.

The reference is the uncached decoder (one whole forward per generated token, the pattern read
from Hugging Face eager attention): the cached decoder must produce the same greedy tokens and
the same argmax key for every head at every step, hence the same copy-paste hits.
"""

from __future__ import annotations

import pytest
import torch

from headlens.probes import inputs as probes
from headlens.scores.retrieval import (
    _next_tokens,
    retrieval_scores,
)
from tests.helpers.decoding import assert_same_steps, cache_prompts
from tests.helpers.families import FAMILY_NAMES, build_family
from tests.helpers.planted import PLANTED_TEXT, build_planted
from tests.helpers.strong import sample_text

# The planted induction head puts e^40 more weight on its target than elsewhere (tests/helpers/planted.py).
PLANTED_MASS_MIN = 0.98


def _same_scores(a, b):
    assert (a["n_tests"], a["n_retrieved"], a["n_tokens"]) == (b["n_tests"], b["n_retrieved"], b["n_tokens"])
    assert torch.equal(a["score"].nan_to_num(-1.0), b["score"].nan_to_num(-1.0))
    assert torch.equal(a["std"].nan_to_num(-1.0), b["std"].nan_to_num(-1.0))


@pytest.mark.slow
def test_cached_decoding_equals_uncached_on_the_planted_model(one_thread):
    planted = build_planted(0)
    model, prompts = planted.loaded.model, cache_prompts(planted.loaded, PLANTED_TEXT)
    assert_same_steps(model, prompts)
    cached, uncached = retrieval_scores(model, prompts, cache=True), retrieval_scores(model, prompts, cache=False)
    _same_scores(cached, uncached)
    # the construction: the induction head copies every needle token, so every test is retrieved
    assert cached["n_retrieved"] == len(prompts)
    assert cached["score"][planted.positions["induction"]] > PLANTED_MASS_MIN


def test_cached_decoding_equals_uncached_on_a_small_random_gpt2(small_model, one_thread):
    prompts = cache_prompts(small_model, sample_text(1500))
    assert_same_steps(small_model.model, prompts)
    _same_scores(
        retrieval_scores(small_model.model, prompts, cache=True),
        retrieval_scores(small_model.model, prompts, cache=False),
    )


@pytest.mark.slow
def test_cached_decoding_equals_uncached_on_the_tiny_model():
    from headlens.load.models import load_model

    loaded = load_model("tiny")
    prompts = cache_prompts(loaded, probes.default_text())
    assert_same_steps(loaded.model, prompts)


@pytest.mark.slow
def test_cached_decoding_equals_uncached_on_a_gpt2_small_shaped_model(gpt2_shaped_model):
    # GPT-2 small's 12 x 12 heads and vocabulary; haystacks sized for a 256-token context keep
    # the uncached reference (12 full forwards per group) to seconds
    prompts = cache_prompts(gpt2_shaped_model, sample_text(3000), n_ctx=256)
    assert_same_steps(gpt2_shaped_model.model, prompts)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_cached_decoding_equals_uncached_on_every_family(name, one_thread):
    """GQA/MQA, rotary (full and partial), q/k norms, and sliding windows shorter than the
    prompts (Mistral, Qwen2): the cache keeps every key, the model's own mask applies the window."""
    loaded = build_family(name)
    assert_same_steps(loaded.model, cache_prompts(loaded, sample_text(1500)))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_greedy_tokens_are_the_argmax_of_the_models_own_logits(family):
    """The decoders' next tokens (the trunk, then the LM head applied as W_U @ h^T at the last
    position) are the argmax of the model's own forward's last logits, on right-sized random rows."""
    loaded = build_family(family, seed=4)
    ids = torch.randint(0, loaded.spec.d_vocab, (5, 12), generator=torch.Generator().manual_seed(4))  # [batch, pos]
    with torch.no_grad():
        expected = loaded.model(input_ids=ids).logits[:, -1].argmax(-1)  # [batch]
        assert _next_tokens(loaded.model, input_ids=ids).tolist() == expected.tolist()

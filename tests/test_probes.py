"""Probe inputs: random-token ranges, repeated random tokens, text windows, needles."""

from __future__ import annotations

import pytest
import torch

from headlens.errors import ConfigError, InputTextError
from headlens.load.models import gpt2_tokenizer
from headlens.probes.inputs import (
    NEEDLE_LENGTHS,
    even_depths,
    fit_repeats,
    needle_prompts,
    needle_size,
    random_token_range,
    repeated_random_tokens,
    text_windows,
)

TEXT = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the field. " * 12


def test_random_token_range_for_byte_and_bpe_vocabularies():
    assert random_token_range(257) == (32, 127)  # printable ASCII bytes
    assert random_token_range(50257) == (1005, 10051)  # the middle band [V/50, V/5)
    assert random_token_range(50257, low=2000, high=3000) == (2000, 3000)


def test_repeated_random_tokens_have_period_bos_and_range():
    tokens = repeated_random_tokens(5, 7, 3, 100, 200, bos_id=9, seed=4)
    assert tokens.shape == (5, 1 + 7 * 3)
    assert (tokens[:, 0] == 9).all()
    body = tokens[:, 1:]
    assert torch.equal(body[:, :7], body[:, 7:14]) and torch.equal(body[:, :7], body[:, 14:])
    assert ((body >= 100) & (body < 200)).all()
    assert torch.equal(tokens, repeated_random_tokens(5, 7, 3, 100, 200, bos_id=9, seed=4))  # seeded
    assert not torch.equal(tokens, repeated_random_tokens(5, 7, 3, 100, 200, bos_id=9, seed=5))


def test_fit_repeats_shrinks_to_the_context():
    assert fit_repeats(25, 4, 1024) == 4
    assert fit_repeats(25, 4, 64) == 2  # 1 + 2 * 25 <= 64 < 1 + 3 * 25


def test_text_windows_cover_every_token_and_respect_the_cap():
    tok = gpt2_tokenizer()
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    windows = text_windows(tok, TEXT, 32, bos_id=50256)
    assert all(w[0] == 50256 and len(w) <= 32 for w in windows)
    assert [t for w in windows for t in w[1:]] == ids  # nothing dropped, nothing reordered
    assert len(text_windows(tok, TEXT, 32, bos_id=50256, max_windows=2)) == 2


@pytest.mark.parametrize(
    "context, asked, expected",
    [
        (1024, (16, 4), (16, 4)),  # room for the full needle
        (64, (16, 4), (8, 4)),  # context // 8
        (24, (16, 4), (3, 2)),  # context // 8 = 3: one token left to generate
        (8, (16, 4), (2, 1)),  # never below 2 tokens (one restated, one generated)
    ],
)
def test_needle_size_shrinks_to_an_eighth_of_the_context(context, asked, expected):
    assert needle_size(context, *asked) == expected


def test_needle_prompts_place_and_restate_the_needle():
    tok = gpt2_tokenizer()
    hay = tok(TEXT * 3, add_special_tokens=False)["input_ids"]
    prompts = needle_prompts(hay, 128, 50256, (1005, 10051), needle_len=10, restate=3, seed=0)
    assert len(prompts) == 15  # 3 lengths x 5 depths
    for p in prompts:
        assert p.prompt[0] == 50256
        assert p.prompt[p.needle_start : p.needle_start + 10] == p.needle
        assert p.prompt[-3:] == p.needle[:3]
        assert len(p.prompt) + (10 - 3) == p.context <= 128  # the generated tail fits the context
        assert all(1005 <= t < 10051 for t in p.needle)
    assert sorted({p.depth for p in prompts}) == [0.1, 0.3, 0.5, 0.7, 0.9]
    again = needle_prompts(hay, 128, 50256, (1005, 10051), needle_len=10, restate=3, seed=0)
    assert again == prompts


@pytest.mark.parametrize("n", [1, 5, 10, 20])
def test_even_depths_split_the_haystack_into_equal_shares(n):
    depths = even_depths(n)
    assert len(depths) == n
    assert depths == pytest.approx([(2 * i + 1) / (2 * n) for i in range(n)])  # the middle of each 1/n share
    tok = gpt2_tokenizer()
    hay = tok(TEXT * 3, add_special_tokens=False)["input_ids"]
    prompts = needle_prompts(hay, 128, 50256, (1005, 10051), needle_len=10, restate=3, depths=depths, seed=0)
    assert len(prompts) == n * len(NEEDLE_LENGTHS)  # one needle per depth and test length


# Errors ---------------------------------------------------------------------------------------


def test_bad_ranges_and_contexts_raise_config_errors():
    with pytest.raises(ConfigError, match=r"\[500, 400\)"):
        random_token_range(50257, low=500, high=400)
    with pytest.raises(ConfigError, match="60000"):
        random_token_range(50257, high=60000)
    with pytest.raises(ConfigError, match="seq_len 40 is too long .* 64 tokens"):
        fit_repeats(40, 4, 64)
    with pytest.raises(ConfigError, match="restate"):
        needle_prompts(list(range(500)), 128, 0, (10, 20), needle_len=4, restate=4)


def test_short_text_is_an_input_error():
    tok = gpt2_tokenizer()
    with pytest.raises(InputTextError, match="too short"):
        text_windows(tok, "Hi", 32, bos_id=50256, min_tokens=3)
    with pytest.raises(InputTextError, match="too short for the needle"):
        needle_prompts(list(range(1000, 1020)), 128, 50256, (1005, 10051))

"""The training evaluation (headlens.training.evaluate, the library's scorers) against an independent
computation written here: Hugging Face eager attention's own `output_attentions=True` patterns and plain
arithmetic, on both shipped models with their training recipe. This cross-check is kept on purpose: it
shares no code with headlens.capture or headlens.scores."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from headlens.files import shipped_path
from headlens.training import TrainConfig, byte_tokenizer
from headlens.training.evaluate import arena_len, build_probes, evaluate
from tests.helpers.eager_roles import (
    arena_induction_scores,
    eager_patterns,
    needle_retrieval,
    prev_token_scores,
    second_copy_induction_scores,
)

# Scores are means of float32 attention weights in [0, 1] (summed in float64). The eager patterns here and
# the capture path's differ by float32 rounding of each weight, a few ulp (float32 eps 1.2e-7).
SCORE_TOL = 1e-6


def _by_head(heads: list[dict], column: str, n_layers: int, n_heads: int) -> torch.Tensor:
    grid = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for row in heads:
        grid[row["layer"], row["head"]] = row[column]
    return grid


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny", "tiny-gqa"])
def test_evaluation_matches_eager_attention_arithmetic(name):
    from transformers import AutoModelForCausalLM

    path = shipped_path(name)
    recipe = TrainConfig(**json.loads((path / "train_config.json").read_text()))
    config = replace(recipe, eval_windows=4, probe_seqs=4)  # fewer probe sequences: seconds, not minutes
    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").eval()
    probes = build_probes(byte_tokenizer(), config)
    row, heads = evaluate(model, probes, config)
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads

    expected = {
        "prev_token_score": prev_token_scores(eager_patterns(model, probes["windows"])),
        "prefix_matching_score": second_copy_induction_scores(
            eager_patterns(model, probes["repeat"]), probes["repeat"], config.probe_seq_len
        ),
        "arena_induction_score": arena_induction_scores(eager_patterns(model, probes["arena"]), arena_len(config)),
    }
    retrieved, expected["retrieval_score"] = needle_retrieval(model, probes["needles"])
    for column, want in expected.items():
        got = _by_head(heads, column, n_layers, n_heads)
        assert torch.allclose(got, want, atol=SCORE_TOL, rtol=0), (column, (got - want).abs().max())
    assert row["needles_retrieved"] == retrieved > 0  # the shipped models retrieve needles (their cards)
    assert row["best_prev_token_score"] == pytest.approx(float(expected["prev_token_score"].max()), abs=SCORE_TOL)

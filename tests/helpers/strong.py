"""Test helpers for the ablation tests: a random model whose heads matter, and word-list text."""

from __future__ import annotations

import torch

WORDS = (
    "the of and to in is was that for on as with by he at from his it an were are which this be "
    "time river city king water light house people small great old new world night year"
).split()


def build_strong_model(n_positions: int):
    """2 layers x 4 heads with a larger init (std 0.2), so each head moves the loss by 1e-2..1
    nats and agreement checks are not trivially met (GPT-2's std 0.02 gives deltas ~1e-4)."""
    from transformers import GPT2Config

    from headlens.load.models import build_model

    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=n_positions, initializer_range=0.2)
    return build_model(config, seed=1, name="strong-random")


def sample_text(n_words: int, seed: int = 0) -> str:
    """Pseudo-English from a fixed word list (independent of the shipped held-out text)."""
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (n_words,), generator=gen).tolist()
    return " ".join(WORDS[i] for i in picks) + "."

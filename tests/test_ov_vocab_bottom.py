"""bottom_hits (one top-k pass per row) against a count of the entries strictly below each token's own
logit, written here from the definition, on integer-valued weights so that many logits tie."""

from __future__ import annotations

import pytest
import torch

from headlens.scores.ov_vocab import BOTTOM_K, TOKEN_CHUNK, bottom_hits


def counted(z: torch.Tensor, unembed: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Fewer than k vocabulary entries strictly below the token's own logit: [head, n] bool."""
    logits = torch.einsum("nhd,hdv->hnv", z.float(), unembed)  # [head, n, d_vocab]
    own = logits[:, torch.arange(len(tokens)), tokens]  # [head, n]
    return (logits < own[..., None]).sum(-1) < k  # [head, n]


@pytest.mark.parametrize("d_vocab", [7, 300])  # at most k tokens (every token counts), and more
def test_bottom_hits_equal_the_count_below_the_own_logit(d_vocab):
    gen = torch.Generator().manual_seed(0)
    n, heads, d_head = TOKEN_CHUNK + 9, 3, 4  # two token chunks
    z = torch.randint(-2, 3, (n, heads, d_head), generator=gen).double()  # [n, head, d_head]
    unembed = torch.randint(-2, 3, (heads, d_head, d_vocab), generator=gen).float()  # [head, d_head, d_vocab]
    tokens = torch.randint(0, d_vocab, (n,), generator=gen)  # [n]
    got = bottom_hits(z, unembed, tokens)  # [head, n]
    want = counted(z, unembed, tokens, BOTTOM_K)
    assert torch.equal(got, want)
    assert 0 < int(want.sum()) < want.numel() or d_vocab <= BOTTOM_K  # both outcomes occur

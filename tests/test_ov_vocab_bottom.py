"""headlens.scores.ov_rows.filtered_hits (the filter, then whole rows block by block) against a count of
the entries strictly below each token's own logit, written here from the definition, on integer-valued
weights so that many logits tie (integer products are exact in float32)."""

from __future__ import annotations

import pytest
import torch

from headlens.scores import ov_rows
from headlens.scores.ov_vocab import BOTTOM_K


def counted(z: torch.Tensor, unembed: torch.Tensor, tokens: torch.Tensor, k: int) -> torch.Tensor:
    """Fewer than k vocabulary entries strictly below the token's own logit: [head, n] bool."""
    logits = torch.einsum("nhd,hdv->hnv", z.float(), unembed)  # [head, n, d_vocab]
    own = logits[:, torch.arange(len(tokens)), tokens]  # [head, n]
    return (logits < own[..., None]).sum(-1) < k  # [head, n]


@pytest.mark.parametrize("block", [64, ov_rows.BLOCK])  # several blocks per row (rows leave the scan), and one
@pytest.mark.parametrize("d_vocab", [7, 300, 1000])  # at most k tokens (every token counts), and more
def test_filtered_hits_equal_the_count_below_the_own_logit(d_vocab, block, monkeypatch):
    monkeypatch.setattr(ov_rows, "BLOCK", block)
    gen = torch.Generator().manual_seed(0)
    n, heads, d_head = 73, 3, 4
    z = torch.randint(-2, 3, (n, heads, d_head), generator=gen).double()  # [n, head, d_head]
    unembed = torch.randint(-2, 3, (heads, d_head, d_vocab), generator=gen).float()  # [head, d_head, d_vocab]
    # W_U stacks the heads' unembeds, each head's W_O selects its own slice: z W_O W_U = z unembed[h]
    w_u = unembed.flatten(0, 1)  # [head * d_head, d_vocab]
    w_o = torch.eye(heads * d_head).view(heads, d_head, heads * d_head)  # [head, d_head, d_model]
    tokens = torch.randint(0, d_vocab, (n,), generator=gen)  # [n]
    got = ov_rows.filtered_hits(z, w_o, ov_rows.prepare(w_u), tokens, BOTTOM_K)  # [head, n]
    want = counted(z, unembed, tokens, BOTTOM_K)
    assert torch.equal(got, want)
    assert 0 < int(want.sum()) < want.numel() or d_vocab <= BOTTOM_K  # both outcomes occur

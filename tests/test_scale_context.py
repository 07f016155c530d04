"""Long contexts at linear memory: the positional reducers never build [batch, q_pos, k_pos]
targets, and their scored queries equal the ones the targets define."""

from __future__ import annotations

import torch

from headlens.capture import Batch
from headlens.scores.common import TargetMassReducer
from headlens.scores.positional import current_token_reducer, first_token_reducer, prev_token_reducer


def _padded_batch() -> Batch:
    ids = torch.randint(10, 100, (3, 9))  # [batch, pos]
    mask = torch.zeros(3, 9, dtype=torch.bool)  # [batch, pos]
    for row, length in enumerate((9, 5, 1)):
        mask[row, :length] = True
    return Batch(ids, mask)


def test_scored_queries_equal_the_ones_the_targets_define():
    batch = _padded_batch()
    for make in (prev_token_reducer, current_token_reducer, first_token_reducer):
        reducer = make(2, 3)
        assert reducer.scored_fn is not None
        from_targets = (reducer.targets_fn(batch) & batch.mask[:, None, :]).any(-1) & batch.mask  # [batch, q_pos]
        assert torch.equal(reducer.scored_fn(batch) & batch.mask, from_targets), make.__name__


def test_scores_are_the_same_without_the_targets_tensor():
    batch = _padded_batch()
    pattern = torch.rand(3, 3, 9, 9).tril()  # [batch, head, q_pos, k_pos]
    pattern = pattern / pattern.sum(-1, keepdim=True)
    for make in (prev_token_reducer, current_token_reducer, first_token_reducer):
        lean = make(1, 3)
        full = TargetMassReducer(1, 3, lean.targets_fn, query_fn=lean.query_fn, mass_fn=lean.mass_fn)
        calls = []
        lean.targets_fn = lambda b, f=lean.targets_fn, calls=calls: calls.append(1) or f(b)
        for reducer in (lean, full):
            reducer.update(0, batch, pattern=pattern[:, :, :4], q_start=0)  # two blocks of query rows
            reducer.update(0, batch, pattern=pattern[:, :, 4:], q_start=4)
        assert calls == []  # the [batch, q_pos, k_pos] targets were never built
        for name in lean.totals:
            assert torch.equal(getattr(lean, name), getattr(full, name)), (make.__name__, name)

"""The sweep's stacked passes (several heads' ablations as batch copies) equal one hooked full forward
pass per head, written here on the shipped tiny GPT-2 without headlens's adapter."""

from __future__ import annotations

import pytest
import torch

from headlens.heads import Head, all_heads
from headlens.intervene.evalset import BATCH_TOKENS, repeat_evalset
from headlens.intervene.sums import head_groups, stack_count, sweep_sums
from headlens.load.models import load_model

# Mean change of the loss per scored token: float32 logits of a 2-layer model round at ~1e-6 nats per
# position; the sweep runs sdpa attention, the reference eager attention.
ATOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def _hooked_loss_sum(model, evalset, head: Head | None) -> float:
    """Summed next-token loss over the scored positions of one full forward pass, `head`'s slice of the
    output projection's input (its z) zeroed by a forward pre-hook (None: the clean model)."""
    d_head = model.config.n_embd // model.config.n_head

    def zero_head(module, args):
        z = args[0].clone()  # [batch, pos, head * d_head]
        z[..., head.head * d_head : (head.head + 1) * d_head] = 0.0
        return (z, *args[1:])

    handle = None if head is None else model.transformer.h[head.layer].attn.c_proj.register_forward_pre_hook(zero_head)
    try:
        with torch.no_grad():
            logits = model(input_ids=evalset.input_ids, attention_mask=evalset.mask.long()).logits  # [seq, pos, vocab]
    finally:
        if handle is not None:
            handle.remove()
    targets = evalset.input_ids[:, 1:]  # [seq, pos-1]
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].double().transpose(1, 2), targets, reduction="none")
    return float(losses[evalset.counted].sum())  # losses [seq, pos-1]


def test_stacked_sweep_equals_one_hooked_forward_per_head(tiny):
    evalset = repeat_evalset(tiny, seed=7, n_seq=6, seq_len=20)  # passes of 4 and 2 sequences x 41 positions
    heads = all_heads(tiny.spec.n_layers, tiny.spec.n_heads)
    assert stack_count(evalset, 4) >= tiny.spec.n_heads  # every layer's heads in one stacked pass
    clean = _hooked_loss_sum(tiny.model, evalset, None)
    reference = {h: (_hooked_loss_sum(tiny.model, evalset, h) - clean) / evalset.n_tokens for h in heads}
    assert max(abs(d) for d in reference.values()) > 1000 * ATOL  # non-trivial effects
    for per_pass in (None, 1, 3):  # the default (all of a layer), one at a time, groups of 3 and 1
        found = {}
        sweep_sums(
            tiny.model,
            evalset,
            heads,
            [None] * tiny.spec.n_layers,
            found.__setitem__,
            batch_size=4,
            heads_per_pass=per_pass,
        )
        for head in heads:
            delta = (float(found[head].sum()) - clean) / evalset.n_tokens
            assert abs(delta - reference[head]) < ATOL, (per_pass, head)


def test_stack_count_fills_the_row_budget(tiny):
    evalset = repeat_evalset(tiny, seed=0, n_seq=6, seq_len=20)  # 41 positions a sequence
    assert stack_count(evalset, 4) == BATCH_TOKENS // (4 * 41)
    assert stack_count(evalset, 1) == BATCH_TOKENS // 41
    wide = repeat_evalset(tiny, seed=0, n_seq=30, seq_len=20)
    assert stack_count(wide, 30) == 1  # a pass over the budget: one head at a time


def test_head_groups_stay_within_a_layer():
    heads = [Head(1, 0), Head(0, 3), Head(0, 1), Head(1, 2), Head(0, 0)]
    assert head_groups(heads, 2) == [[Head(0, 0), Head(0, 1)], [Head(0, 3)], [Head(1, 0), Head(1, 2)]]
    assert head_groups(heads, 1) == [[h] for h in sorted(heads)]
    nine = [Head(3, h) for h in range(9)]
    assert [len(g) for g in head_groups(nine, 8)] == [5, 4]  # two passes, as even as can be
    assert [len(g) for g in head_groups(nine, 9)] == [9]

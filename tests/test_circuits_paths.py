"""Path patching (headlens.circuits.paths) against:
1. an independent computation in this file on a small random-weight GPT-2: the Hugging Face model run
   whole, its modules hooked by their own names; the receiver head's attention written out here
   (LayerNorm, fused Conv1D projections, causal softmax), the sender's change read from c_proj's
   weights; for every edge, zero and mean ablation;
2. the planted induction circuit with a decoy (tests/helpers/planted_circuits.py): cutting the source's path
   into the induction head's keys costs the loss, the decoy's path costs nothing.
"""

from __future__ import annotations

import math

import pytest
import torch

from headlens.circuits.paths import path_patch
from headlens.errors import ConfigError
from headlens.heads import Head
from headlens.intervene.evalset import EvalSet, repeat_evalset
from tests.helpers.planted_circuits import build_planted_decoy, decoy_seeds

VOCAB = 1000  # a small vocabulary keeps the unembedding cheap; the ids are built here
# Both sides are float32 means of ~40 losses of ~7 nats, summed in different orders: rounding ~1e-6
# relative per loss; 2e-5 nats covers it and sits far below the effects compared (checked below).
EFFECT_ATOL = 2e-5
DECOY_SHARE = 0.01  # the decoy's key path moves the loss by under 1% of the source's


@pytest.fixture(scope="module")
def small():
    from transformers import GPT2Config

    from headlens.load.models import build_model

    config = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=VOCAB, initializer_range=0.2)
    loaded = build_model(config, seed=0, name="small-gpt2")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in loaded.model.parameters():
            if param.dim() == 1:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    half = torch.randint(10, VOCAB, (4, 10), generator=gen)  # [seq, 10] random tokens, repeated
    ids = torch.cat([torch.zeros(4, 1, dtype=torch.long), half, half], 1)  # [seq, 21]
    counted = torch.zeros(4, 20, dtype=torch.bool)
    counted[:, 11:] = True  # the second copy's predictions
    evalset = EvalSet(ids, torch.ones_like(ids, dtype=torch.bool), counted, "repeat", "test", "repeated tokens")
    return loaded, evalset


def _loss(model, ids, counted) -> float:
    logits = model(ids).logits[:, :-1]  # [seq, pos - 1, vocab]
    return float(torch.nn.functional.cross_entropy(logits[counted], ids[:, 1:][counted]))


def _independent(model, evalset, method: str) -> dict[tuple[str, str, str], float]:
    """Every edge's effect, computed with the model's own modules (module docstring)."""
    ids, counted = evalset.input_ids, evalset.counted
    blocks, n_heads = model.transformer.h, model.config.n_head
    d_model = model.config.n_embd
    d_head = d_model // n_heads
    zs, hidden = [], []
    with torch.no_grad():
        handles = [b.attn.c_proj.register_forward_pre_hook(lambda m, a: zs.append(a[0])) for b in blocks]
        handles += [b.register_forward_pre_hook(lambda m, a: hidden.append(a[0])) for b in blocks]
        base = _loss(model, ids, counted)
        for h in handles:
            h.remove()
        out = {}
        for sl, z in enumerate(zs):  # z [seq, pos, d_model]: heads concatenated
            w_o = blocks[sl].attn.c_proj.weight  # [d_model (head-major rows), d_model]
            for sh in range(n_heads):
                cols = slice(sh * d_head, (sh + 1) * d_head)
                new = (
                    torch.zeros_like(z[..., cols])
                    if method == "zero"
                    else z[..., cols].mean((0, 1)).expand_as(z[..., cols])
                )
                delta = (new - z[..., cols]) @ w_o[cols]  # [seq, pos, d_model]
                hook = model.transformer.ln_f.register_forward_pre_hook(lambda m, a, d=delta: (a[0] + d,))
                out[(f"{sl}.{sh}", "logits", "direct")] = _loss(model, ids, counted) - base
                hook.remove()
                for rl in range(sl + 1, len(blocks)):
                    for rh in range(n_heads):
                        for via in ("q", "k", "v"):
                            z_r = _head_z(blocks[rl], hidden[rl], delta, rh, via, n_heads)
                            rc = slice(rh * d_head, (rh + 1) * d_head)

                            def swap(m, a, z_r=z_r, rc=rc):
                                new_z = a[0].clone()
                                new_z[..., rc] = z_r
                                return (new_z,)

                            hook = blocks[rl].attn.c_proj.register_forward_pre_hook(swap)
                            out[(f"{sl}.{sh}", f"{rl}.{rh}", via)] = _loss(model, ids, counted) - base
                            hook.remove()
    return out


def _head_z(block, resid, delta, head: int, via: str, n_heads: int) -> torch.Tensor:
    """Head `head`'s z [seq, pos, d_head] with its `via` input read from resid + delta, GPT-2's attention
    written out: x = ln_1(.), [q | k | v] = x W + b (Conv1D), softmax(q k^T / sqrt(d_head)) causal, times v."""
    d_model = resid.shape[-1]
    d_head = d_model // n_heads
    w, b = block.attn.c_attn.weight, block.attn.c_attn.bias  # [d_model, 3 d_model], [3 d_model]
    clean, moved = block.ln_1(resid), block.ln_1(resid + delta)
    parts = {}
    for index, name in enumerate("qkv"):
        cols = slice(index * d_model + head * d_head, index * d_model + (head + 1) * d_head)
        parts[name] = (moved if name == via else clean) @ w[:, cols] + b[cols]  # [seq, pos, d_head]
    scores = parts["q"] @ parts["k"].transpose(1, 2) / math.sqrt(d_head)  # [seq, q_pos, k_pos]
    pos = scores.shape[-1]
    scores = scores.masked_fill(~torch.ones(pos, pos, dtype=torch.bool).tril(), float("-inf"))
    return scores.softmax(-1) @ parts["v"]  # [seq, pos, d_head]


@pytest.mark.parametrize("method", ["zero", "mean"])
def test_path_patching_equals_the_independent_computation(small, method):
    loaded, evalset = small
    frame = path_patch(loaded, evalset, method=method).frame
    expected = _independent(loaded.model, evalset, method)
    got = {(r.sender, r.receiver, r.via): r.effect for r in frame.itertuples()}
    assert got.keys() == expected.keys()
    worst = max(abs(got[key] - expected[key]) for key in expected)
    assert worst < EFFECT_ATOL, worst
    # not a vacuous match: edges through every input move the loss far beyond the tolerance
    for via in ("q", "k", "v", "direct"):
        assert max(abs(v) for key, v in expected.items() if key[2] == via) > 20 * EFFECT_ATOL, via


@pytest.mark.slow
def test_planted_source_feeds_the_induction_keys_and_the_decoy_does_not():
    planted = build_planted_decoy(decoy_seeds(1)[0])
    ind = Head(*planted.positions["induction"])
    source, decoy = ("{}.{}".format(*planted.positions[role]) for role in ("previous_token", "decoy"))
    evalset = repeat_evalset(planted.loaded, n_seq=2, seq_len=20)
    frame = path_patch(planted.loaded, evalset, receivers=[ind], via=("k",)).frame
    effect = dict(zip(frame["sender"], frame["effect"], strict=True))
    assert effect[source] == max(effect.values()) and effect[source] > 1.0  # nats lost without the source
    assert abs(effect[decoy]) < DECOY_SHARE * effect[source]


def test_unknown_input_is_refused(small):
    loaded, evalset = small
    with pytest.raises(ConfigError, match="unknown edge input 'o'"):
        path_patch(loaded, evalset, via=("q", "o"))

"""Independent computations of head-kind scores (eager attention, loops over positions and prompts) that the
kind tests run on SmolLM2 and on Gemma 3."""

from __future__ import annotations

import pytest
import torch

from headlens.scores import syntactic
from headlens.scores.copy_suppression import text_attention
from headlens.scores.name_mover import ioi_run
from headlens.scores.syntactic import (
    load_treebank,
    syntax_sample,
)


def check_text_attention_loop_over_positions(loaded, windows: list[list[int]]) -> None:
    """text_attention (batched) against a loop over every position of an eager run: the mean attention each head
    puts on earlier copies of the token the model correctly predicts next."""
    ours = text_attention(loaded, windows)  # [layer, head]
    ids = torch.tensor(windows)
    with torch.no_grad():
        out = loaded.model(input_ids=ids, output_attentions=True)
    top1 = out.logits.argmax(-1)  # [batch, pos]
    total, count = torch.zeros_like(ours), 0
    for b in range(ids.shape[0]):
        for q in range(ids.shape[1] - 1):
            p = int(top1[b, q])
            keys = [j for j in range(1, q + 1) if int(ids[b, j]) == p]
            if p != int(ids[b, q + 1]) or not keys:
                continue
            count += 1
            for layer, pattern in enumerate(out.attentions):  # [batch, head, q, k]
                total[layer] += pattern[b, :, q, keys].double().sum(-1)
    assert count > 0
    assert torch.allclose(ours, total / count, atol=1e-6)


def check_ioi_run_one_prompt_at_a_time(loaded, prompts: list[dict]) -> dict:
    """ioi_run on `prompts` (batched, padded) against the model run on each prompt alone: END -> IO attention
    [n_layers, n_heads] and the mean logit difference. Returns the batched run."""
    batched = ioi_run(loaded, prompts)
    io = torch.zeros_like(batched["io_attention"])  # [layer, head]
    diffs = []
    with torch.no_grad():
        for p in prompts:
            out = loaded.model(input_ids=torch.tensor([p["ids"]]), output_attentions=True)
            io += torch.stack([a[0, :, -1, p["io_pos"]].double() for a in out.attentions]) / len(prompts)
            diffs.append(float(out.logits[0, -1, p["io"]] - out.logits[0, -1, p["s"]]))
    assert torch.allclose(batched["io_attention"], io, atol=1e-5)  # float32 softmax, padded vs unpadded
    assert batched["logit_diff"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-3)
    return batched


def eager_rare_scores(loaded, sentences) -> torch.Tensor:
    """rare_word_score computed here: each sentence alone through the model's eager attention, the
    argmax of the last row over keys 1.. against the rarest word's decoded token positions."""
    tok, hits = loaded.tokenizer, torch.zeros(loaded.spec.n_layers, loaded.spec.n_heads, dtype=torch.float64)
    with torch.no_grad():
        for sentence in sentences:
            ids = torch.tensor([sentence.ids])  # [1, pos]
            attentions = loaded.model(input_ids=ids, output_attentions=True).attentions  # per layer [1, head, q, k]
            targets = {1 + i for i in decoded_targets(tok, sentence.ids[1:], sentence.rarest)}
            for layer, pattern in enumerate(attentions):
                best = pattern[0, :, -1, 1:].argmax(-1) + 1  # [head]
                hits[layer] += torch.tensor([float(int(b) in targets) for b in best], dtype=torch.float64)
    return hits / len(sentences)


SMOL_TEXT = (
    "The old lighthouse keeper wrote in his ledger every night. A narrow staircase led to the lantern room. "
    "Visitors admired the brass spyglass in the museum. The fishermen mended their nets beside the harbour. "
    "Her grandmother kept a tortoise in the garden. The children watched the blacksmith shoe a horse."
)


def eager_relation_accuracy(loaded, sample) -> torch.Tensor:
    """relation_accuracy computed here: each sentence alone through the model's eager attention; a word's
    attention to an earlier word is its tokens' mass on that word's tokens, averaged over its query tokens,
    and a hit is the dependency's other end being the argmax: [relation, layer, head] (float64)."""
    relations = list(sample.relations["relation"])
    hits = torch.zeros(len(relations), loaded.spec.n_layers, loaded.spec.n_heads, dtype=torch.float64)
    with torch.no_grad():
        for sentence in sample.sentences:
            attentions = loaded.model(input_ids=torch.tensor([sentence.ids]), output_attentions=True).attentions
            for layer, pattern in enumerate(attentions):  # [1, head, q, k]
                p = pattern[0].double()
                for later, earlier, rel, _ in sentence.instances:
                    if rel not in relations:
                        continue
                    queries = [q for q, w in enumerate(sentence.word_of) if w == later]
                    to_word = [
                        p[:, queries][:, :, [k for k, w in enumerate(sentence.word_of) if w == j]].sum(-1).mean(-1)
                        for j in range(later)
                    ]  # each [head]
                    best = torch.stack(to_word, -1).argmax(-1)  # [head]
                    hits[relations.index(rel), layer] += (best == earlier).double()
    n = torch.tensor(sample.relations["n"].tolist(), dtype=torch.float64)
    return hits / n[:, None, None]


def small_sample(loaded, monkeypatch):
    """The shipped parsed sample, 12 sentences, relations with >= 3 cases, tokenized for `loaded`."""
    monkeypatch.setattr(syntactic, "MIN_CASES", 3)
    monkeypatch.setattr(syntactic, "MAX_SENTENCES", 12)
    return syntax_sample(loaded.tokenizer, load_treebank(), loaded.bos_token_id, 256, 10**9)


def decoded_targets(tokenizer, ids: list[int], word: str) -> list[int]:
    """Positions of the tokens whose decoded characters overlap `word`'s occurrences (found by decoding
    prefixes, not by the tokenizer's offsets)."""
    text = tokenizer.decode(ids)
    ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    starts = [0] + ends[:-1]
    spans, at = [], text.lower().find(word)
    while at >= 0:
        spans.append((at, at + len(word)))
        at = text.lower().find(word, at + 1)
    return [i for i in range(len(ids)) if any(starts[i] < e and ends[i] > s for s, e in spans)]

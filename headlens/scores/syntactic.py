"""Syntactic heads: per dependency relation, the head's most-attended earlier word is the other end of
the relation more often than any fixed offset predicts.

Clark et al. 2019 ("What Does BERT Look At?", arXiv 1906.04341) and Voita et al. 2019 (arXiv
1905.09418), for a causal model:
- Parses come from CoNLL-U (headlens.probes.treebank): `--syntax sample` (the sample shipped with headlens)
  or `--syntax FILE`. Without either the probe does not run (headlens.classify.kind_runs.NOT_RUN says why):
  it is the costliest probe (a whole pattern per layer over TOKEN_SHARE of the text probe's tokens; ~175 CPU s on
  SmolLM2-135M, BENCHMARKS.md).
  Each sentence is scored alone, BOS + its tokens (tokenized after a space, as in running text);
  a sentence whose words do not each start a token of their own is skipped. The first sentences
  are scored, up to TOKEN_SHARE (as many) of the tokens the natural-text probe scores.
- Word-level attention as Clark et al. build it: a word's attention to another is the sum over the
  other's subword keys, averaged over the word's own subword queries (BOS, position 0, is no word).
- A causal model only sees earlier words, so each instance (dependent, head) is measured from the
  later of the two words to the earlier one. A relation is measured in the direction most of its
  instances take: "dependent->head" when the head comes first (obj: the object looks back at its
  verb), "head->dependent" when the dependent does (det, amod, nsubj: the noun or verb looks back),
  and its instances the other way round are left out (facts: `direction`, `n`, `n_other_way`).
- The head's prediction is its most-attended word among the words before the query word;
  accuracy = share of the relation's instances where that word is the earlier end of the relation.
- Baseline (Voita et al.): the best fixed offset, the share of instances whose earlier end sits
  exactly k words back, for the k (1..MAX_OFFSET) that scores best.
A head is syntactic for a relation when accuracy - baseline >= SYNTACTIC_MIN = 0.10 (Voita et al.'s
rule: 10 points above the best fixed-offset baseline). `syntactic_score` is a head's best margin
over the relations with at least MIN_CASES instances; the per-relation table is `syntactic_frame`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch

from headlens.probes.tokenize import encode_offsets
from headlens.probes.treebank import TreeSentence, read_conllu, relation_of, sample_path
from headlens.scores.rare_word import stream_sentences

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

SYNTACTIC_MIN = 0.10  # accuracy over the best fixed-offset baseline (Voita et al. 2019)
MIN_CASES = 50  # a relation is scored on at least this many instances: an accuracy's standard error is then <= 0.07
MAX_OFFSET = 8  # fixed offsets 1..MAX_OFFSET words back form the baseline
MAX_SENTENCES = 400  # sentences scored at most (the token cap binds first)
# Tokens in all, as a share of the natural-text probe's max_windows x window: as many (16 x 256 = 4,096 tokens on
# a real model; 1,024 on tiny, where half of that leaves no relation MIN_CASES instances).
TOKEN_SHARE = 1.0
SKIP_RELATIONS = frozenset({"punct", "root", "dep"})  # no syntax to find, or no label to read
DEP_TO_HEAD, HEAD_TO_DEP = "dependent->head", "head->dependent"


@dataclass(frozen=True)
class ParsedSentence:
    """One sentence ready to score: token ids, each token's word, and its instances."""

    ids: list[int]  # BOS + the sentence's tokens
    word_of: list[int]  # per token, its word's index (-1: BOS, or a token of no word)
    n_words: int
    instances: list[tuple[int, int, str, str]]  # (later word, earlier word, relation, direction)


def align(tokenizer, sentence: TreeSentence, bos: int | None) -> ParsedSentence | None:
    """Token ids and each token's word; None when some word starts no token of its own."""
    text, spans = " ", []
    for word in sentence.words:
        spans.append((len(text), len(text) + len(word.form)))
        text += word.form + ("" if word.no_space else " ")
    ids, offsets = encode_offsets(tokenizer, text.rstrip())
    lead = [bos] if bos is not None else []
    word_of = [-1] * len(lead)
    for start, end in offsets:
        hit = [w for w, (s, e) in enumerate(spans) if start < e and end > s]
        word_of.append(hit[0] if hit else -1)
    if set(range(len(spans))) - set(word_of):
        return None
    instances = []
    for w, word in enumerate(sentence.words):
        head = word.head - 1
        if head >= 0:
            way = DEP_TO_HEAD if head < w else HEAD_TO_DEP
            instances.append((max(w, head), min(w, head), relation_of(word.deprel), way))
    return ParsedSentence(lead + ids, word_of, len(spans), instances)


def pooled_words(pattern: torch.Tensor, word_of: torch.Tensor, n_words: int) -> torch.Tensor:
    """Clark et al.'s word-level attention: pattern [batch, head, q_pos, k_pos] rows (all of a sequence)
    and word_of [batch, pos] (-1: no word) -> [batch, head, word, word]: the sum over the key word's
    tokens, averaged over the query word's tokens."""
    onehot = torch.nn.functional.one_hot((word_of + 1).clamp(min=0), n_words + 1)[..., 1:].to(pattern.dtype)
    keys = pattern @ onehot[:, None]  # [batch, head, q_pos, word]
    per_query = onehot / onehot.sum(1, keepdim=True).clamp(min=1)  # [batch, q_pos, word]
    return per_query.transpose(1, 2)[:, None] @ keys  # [batch, head, word, word]


def predictions(words: torch.Tensor) -> torch.Tensor:
    """Most-attended earlier word of each query word: words [..., word, word] -> [..., word]; -1 where
    no earlier word gets any attention (word 0 has none; a head all on BOS predicts nothing)."""
    n = words.shape[-1]
    earlier = torch.ones(n, n, dtype=torch.bool, device=words.device).tril(-1)  # [q_word, k_word]: k < q
    masked = words.masked_fill(~earlier, float("-inf"))  # [..., word, word]
    top = masked.max(-1)  # [..., word]
    return torch.where(top.values > 0, top.indices, -1)


class SyntacticReducer:
    """Hits of every head per relation (batch.offset indexes `sentences`); patterns whole per layer."""

    wants = frozenset({"pattern"})
    row_blocks = True
    totals = ("hits",)

    def __init__(self, n_layers: int, n_heads: int, sentences: list[ParsedSentence], relations: list[str]):
        self.layers = None
        self.sentences, self.relations = sentences, {rel: r for r, rel in enumerate(relations)}
        self.hits = torch.zeros(len(relations), n_layers, n_heads, dtype=torch.float64)  # [relation, layer, head]
        self._rows: dict[int, list[torch.Tensor]] = {}

    def update(self, layer, batch, pattern=None, z=None, q_start: int = 0):
        self._rows.setdefault(layer, []).append(pattern.detach().float().cpu())
        if q_start + pattern.shape[-2] < pattern.shape[-1]:
            return
        whole = torch.cat(self._rows.pop(layer), dim=-2)  # [batch, head, q_pos, k_pos]
        chosen = self.sentences[batch.offset : batch.offset + whole.shape[0]]
        word_of = torch.full(batch.input_ids.shape, -1, dtype=torch.long)  # [batch, pos]
        for b, sentence in enumerate(chosen):
            word_of[b, : len(sentence.word_of)] = torch.tensor(sentence.word_of)
        best = predictions(pooled_words(whole, word_of, max(s.n_words for s in chosen)))  # [batch, head, word]
        cases = [
            (b, later, earlier, self.relations[rel])
            for b, sentence in enumerate(chosen)
            for later, earlier, rel, _ in sentence.instances
            if rel in self.relations
        ]
        if cases:
            b, later, earlier, rel = torch.tensor(cases).T  # each [case]
            hit = (best[b, :, later] == earlier[:, None]).double()  # [case, head]
            self.hits[:, layer].index_add_(0, rel, hit)


@dataclass(frozen=True)
class SyntaxSample:
    """The sentences and relations of one treebank, ready to score."""

    sentences: list[ParsedSentence]
    relations: pd.DataFrame  # relation, direction, n, n_other_way, offset, baseline
    n_skipped: int  # sentences whose words do not each start a token


def syntax_sample(tokenizer, treebank: list[TreeSentence], bos, max_len: int, max_tokens: int) -> SyntaxSample:
    """The first sentences that fit (MAX_SENTENCES, max_len tokens each, max_tokens in all), each
    relation's instances in its measured direction, and each relation's fixed-offset baseline."""
    kept, skipped, total = [], 0, 0
    for tree in treebank:
        sentence = align(tokenizer, tree, bos)
        if sentence is None or len(sentence.ids) > max_len:
            skipped += 1
            continue
        total += len(sentence.ids)
        if len(kept) == MAX_SENTENCES or total > max_tokens:
            break
        kept.append(sentence)
    ways: dict[str, dict[str, int]] = {}
    for sentence in kept:
        for *_, rel, way in sentence.instances:
            ways.setdefault(rel, {DEP_TO_HEAD: 0, HEAD_TO_DEP: 0})[way] += 1
    way_of = {rel: max(n, key=n.get) for rel, n in ways.items() if rel not in SKIP_RELATIONS}
    measured = [
        ParsedSentence(s.ids, s.word_of, s.n_words, [i for i in s.instances if way_of.get(i[2]) == i[3]]) for s in kept
    ]
    table = []
    for rel, way in sorted(way_of.items()):
        gaps = [later - earlier for s in measured for later, earlier, r, _ in s.instances if r == rel]
        if len(gaps) < MIN_CASES:
            continue
        share = {k: sum(g == k for g in gaps) / len(gaps) for k in range(1, MAX_OFFSET + 1)}
        best = max(share, key=share.get)
        table.append(
            {
                "relation": rel,
                "direction": way,
                "n": len(gaps),
                "n_other_way": sum(ways[rel].values()) - len(gaps),
                "offset": -best,
                "baseline": share[best],
            }
        )
    return SyntaxSample(measured, pd.DataFrame(table), skipped)


def relation_accuracy(loaded: LoadedModel, sample: SyntaxSample, batch_size: int = 8) -> torch.Tensor:
    """Accuracy of every head on each relation of sample.relations: [relation, n_layers, n_heads] float64."""
    relations = list(sample.relations["relation"])
    sentences = sorted(sample.sentences, key=lambda s: len(s.ids))  # batches of like lengths: little padding
    reducer = SyntacticReducer(loaded.spec.n_layers, loaded.spec.n_heads, sentences, relations)
    stream_sentences(loaded, sentences, reducer, batch_size)
    n = torch.tensor(sample.relations["n"].tolist(), dtype=torch.float64)  # [relation]
    return reducer.hits / n[:, None, None]


def syntactic_frame(accuracy: torch.Tensor, relations: pd.DataFrame, threshold: float = SYNTACTIC_MIN) -> pd.DataFrame:
    """One row per (head, relation): layer, head, relation, direction, n, accuracy, baseline, offset,
    margin (accuracy - baseline) and `syntactic` (margin >= threshold)."""
    rows = []
    for r, rel in enumerate(relations.to_dict("records")):
        for (layer, head), value in zip(_heads(accuracy.shape[1:]), accuracy[r].flatten().tolist(), strict=True):
            margin = value - rel["baseline"]
            rows.append({"layer": layer, "head": head, **rel, "accuracy": value, "margin": margin})
    frame = pd.DataFrame(rows)
    frame["syntactic"] = frame["margin"] >= threshold
    return frame


def _heads(shape) -> list[tuple[int, int]]:
    return [(layer, head) for layer in range(shape[0]) for head in range(shape[1])]


def load_treebank(path=None) -> list[TreeSentence]:
    """The CoNLL-U at `path`, or the English sample shipped with headlens."""
    return read_conllu(path or sample_path())

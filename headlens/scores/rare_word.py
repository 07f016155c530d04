"""Rare-word heads: the head's maximum attention falls on the sentence's least frequent word.

Voita et al. 2019 ("Analyzing Multi-Head Self-Attention", ACL, arXiv 1905.09418) found, in the first
encoder layer of their NMT models, a head whose maximum attention points to the least frequent token
of the sentence (66% of sentences for their head). Here, for a causal model:
- Sentences are cut from the natural text ([^.!?]+ ending in . ! or ?), each scored alone as BOS +
  its tokens (tokenized after a space, as the sentence runs in the text: " The", not "The"), no
  longer than the probe window (min(token_budget, n_ctx)); at most MAX_SENTENCES and no more
  tokens in all than TOKEN_SHARE of what the natural-text probe scores (max_windows x window), so
  the probe costs at most a quarter of that one.
- Words are runs of letters (apostrophes inside kept: "Naomi's"); their frequencies come from the
  `wordfreq` package (`word_frequency(word, "en")`, its blend of Wikipedia, subtitles, news, books,
  web text, Twitter and Reddit). A word maps to every subword token whose character span overlaps
  it (the tokenizer's offsets), so "Elimelech" is all of its pieces.
- The query is the sentence's last token, its final punctuation: the one position whose prefix holds
  the whole sentence. A sentence counts when that token is not part of a word and exactly one word
  type holds the lowest frequency (ties, common among words wordfreq does not know, are skipped and
  counted in the facts).
- The head's maximum weight from that query, over keys 1..q (position 0, BOS, is left out: real
  models park spare attention there, Xiao et al. 2023), is a hit when it lands on a token of the
  rarest word. `rare_word_score` = share of counted sentences that are hits.
Cut-off: Voita et al. report their head's share, not a cut-off. RARE_WORD_MIN = 0.5: the rarest word
holds the head's maximum in most sentences. A head attending to a random key hits with the share of
keys the rarest word covers (`chance` in attrs["probes"]["rare_word"], a few percent at these lengths); a
previous-token head hits when the sentence's last word is its rarest (`last_word`, the positional
baseline), which is recorded beside the score so a reader can tell the two apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from wordfreq import word_frequency

from headlens import distributed
from headlens.capture import Batch, pad_batch, run_capture
from headlens.probes.corpus import chunks
from headlens.probes.tokenize import encode_offsets

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

RARE_WORD_MIN = 0.5  # share of sentences (ours; Voita et al.'s head: 0.66)
MAX_SENTENCES = 64  # sentences scored at most (the rest is counted in the facts)
TOKEN_SHARE = 0.25  # tokens in all, as a share of the natural-text probe's max_windows x window
MIN_WORDS = 3  # a sentence needs at least this many words to have a rarest one worth the name
LANGUAGE = "en"  # wordfreq's language code for the shipped English text
SENTENCE = re.compile(r"[^.!?]+[.!?]")  # a sentence: what sentence_spans yields
TERMINATOR = re.compile(r"[.!?]")
MAX_TOKEN_CHARS = 64  # characters one token spans at most, white space collapsed (longer sentences are "long")
WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


@dataclass(frozen=True)
class RareSentence:
    """One scored sentence: its token ids (BOS first), the query and the rarest word's tokens."""

    ids: list[int]  # BOS + the sentence's tokens
    targets: list[int]  # positions (in `ids`) of the rarest word's tokens
    rarest: str  # the rarest word
    last_word: bool  # the rarest word is the last word before the query (the previous-token baseline)

    @property
    def query(self) -> int:
        return len(self.ids) - 1


def sentence_spans(document: str):
    """The matches of SENTENCE in `document`, found in one pass (SENTENCE.finditer retries from every
    position of a text without a sentence end: time that grows with the square of its length)."""
    start = 0
    for end in TERMINATOR.finditer(document):
        if end.start() > start:  # at least one character before the end mark
            yield document[start : end.end()]
        start = end.end()


def word_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, word) of every word of `text` (runs of letters, inner apostrophes kept)."""
    return [(m.start(), m.end(), m.group()) for m in WORD.finditer(text)]


def rare_sentence(tokenizer, text: str, bos: int | None, max_len: int) -> tuple[RareSentence | None, str]:
    """The RareSentence of one sentence, or (None, why it is skipped: "short", "long", "tied", "open")."""
    words = word_spans(text)
    if len({w.lower() for *_, w in words}) < MIN_WORDS:
        return None, "short"
    ids, offsets = encode_offsets(tokenizer, text)
    lead = [bos] if bos is not None else []
    if len(lead) + len(ids) > max_len:
        return None, "long"
    freq = {w.lower(): word_frequency(w, LANGUAGE) for *_, w in words}
    lowest = min(freq.values())
    rarest = [w for w, f in freq.items() if f == lowest]
    if len(rarest) > 1:
        return None, "tied"
    spans = [(s, e) for s, e, w in words if w.lower() == rarest[0]]
    overlaps = lambda tok, span: tok[0] < span[1] and tok[1] > span[0]
    if any(overlaps(offsets[-1], (s, e)) for s, e, _ in words):
        return None, "open"  # the last token is part of a word: no punctuation to query from
    targets = [len(lead) + i for i, tok in enumerate(offsets) if any(overlaps(tok, span) for span in spans)]
    last = words[-1][2].lower() == rarest[0]
    return RareSentence(lead + list(ids), targets, rarest[0], last), ""


def rare_sentences(
    tokenizer, documents, bos: int | None, max_len: int, max_tokens: int, max_sentences: int = MAX_SENTENCES
):
    """The documents' first scored sentences, at most max_sentences of at most max_tokens tokens in
    all, and counts of what was skipped (the sentences beyond the caps are not read)."""
    kept, skipped, total = [], {"short": 0, "long": 0, "tied": 0, "open": 0}, 0
    for document in documents:
        for found in sentence_spans(document):
            if len(found) > MAX_TOKEN_CHARS * max_len:  # more tokens than max_len whatever the tokenizer
                skipped["long"] += 1
                continue
            text = " " + " ".join(found.split())  # as it runs in the text: after a space
            sentence, why = rare_sentence(tokenizer, text, bos, max_len)
            if sentence is None:
                skipped[why] += 1
                continue
            total += len(sentence.ids)
            if len(kept) == max_sentences or total > max_tokens:
                return kept, skipped
            kept.append(sentence)
    return kept, skipped


def rare_hits(row: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """1.0 where the largest weight of keys 1.. falls on a target: row [..., k_pos] (one query's
    weights), targets [k_pos] bool -> [...] (float64)."""
    best = row[..., 1:].argmax(-1) + 1  # [...]: key 0 (BOS) left out
    return targets[best].double()


class RareWordReducer:
    """Hits of every head on the sentences of a run (batch.offset indexes `sentences`)."""

    wants = frozenset({"pattern"})
    row_blocks = True
    totals = ("hits", "n_scored")

    def __init__(self, n_layers: int, n_heads: int, sentences: list[RareSentence]):
        self.layers = None
        self.sentences = sentences
        self.hits = torch.zeros(n_layers, n_heads, dtype=torch.float64)  # [layer, head]
        self.n_scored = torch.zeros(n_layers, dtype=torch.long)  # [layer]

    def update(self, layer, batch, pattern=None, z=None, q_start: int = 0):
        rows, n = pattern.shape[-2], pattern.shape[-1]
        for b in range(pattern.shape[0]):
            sentence = self.sentences[batch.offset + b]
            if not q_start <= sentence.query < q_start + rows:
                continue
            targets = torch.zeros(n, dtype=torch.bool)  # [k_pos]
            targets[sentence.targets] = True
            self.hits[layer] += rare_hits(pattern[b, :, sentence.query - q_start].cpu(), targets)  # [head]
            self.n_scored[layer] += 1

    def result(self) -> torch.Tensor:
        return self.hits / self.n_scored[:, None].clamp(min=1)  # [layer, head]


def rare_word_scores(loaded: LoadedModel, sentences: list[RareSentence], batch_size: int = 8) -> torch.Tensor:
    """rare_word_score of every head over `sentences`: [n_layers, n_heads] float64."""
    sentences = sorted(sentences, key=lambda s: len(s.ids))  # batches of like lengths: little padding
    reducer = RareWordReducer(loaded.spec.n_layers, loaded.spec.n_heads, sentences)
    stream_sentences(loaded, sentences, reducer, batch_size)
    return reducer.result()


def stream_sentences(loaded: LoadedModel, sentences, reducer, batch_size: int) -> None:
    """One streamed pass over sentences (each with `.ids`), right-padded with BOS, batch.offset the
    index of a batch's first sentence in `sentences`; the reducer's totals summed over processes."""
    batches = (
        Batch(*pad_batch([s.ids for s in chunk], pad_id=loaded.bos_token_id), index=i, offset=i * batch_size)
        for i, chunk in enumerate(chunks(sentences, batch_size))
    )
    run_capture(loaded.model, distributed.shard(batches), [reducer])
    distributed.all_reduce_totals([reducer])


def rare_word_heads(scores: torch.Tensor, threshold: float = RARE_WORD_MIN) -> list[tuple[int, int]]:
    """(layer, head) of the heads scoring at least `threshold`, sorted."""
    return [(int(l_), int(h)) for l_, h in (scores >= threshold).nonzero().tolist()]

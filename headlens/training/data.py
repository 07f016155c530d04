"""Training data of the tiny models: a byte-level tokenizer, the corpus, and the batches.

A batch mixes three kinds of rows after BOS (Olsson et al. 2022 grew induction heads on text;
the synthetic rows give them more to copy):
1. text: a random window of the training text;
2. repeat episode: a short text prefix, then one random segment repeated to the end (the
   [BOS, c, c] probe of TransformerLens / ARENA is this with two copies);
3. needle episode: text, a random printable needle, more text, the needle again, then text —
   the shape of the needle-in-a-haystack probe (`headlens.probes.inputs.needle_prompts`, after Wu et
   al. 2024), so that copying a needle out of text is a task the model has seen.
"""

from __future__ import annotations

import gzip

import torch

from headlens.files import shipped_path
from headlens.training.config import TrainConfig

CORPUS_FILE = "kjv_train.txt.gz"  # training text, held out books removed (data/tiny/CORPUS.md)
BOS_TOKEN = "<|endoftext|>"  # id 256, after the 256 byte tokens
PRINTABLE = (32, 127)  # printable ASCII byte ids [low, high): "looks like text" random segments
NEEDLE_GAP_MIN = 4  # fewest text tokens between a needle and its second occurrence


# 1) tokenizer and corpus ----------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-unicode map (Radford et al. 2019), as the ByteLevel alphabet."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A byte-level tokenizer in Hugging Face format: token id = UTF-8 byte value, BOS = 256.

    No merges: 257 tokens keep the unembedding small (the GPT-2 vocabulary would dominate CPU
    time), and every byte string round-trips.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    vocab[BOS_TOKEN] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS_TOKEN, eos_token=BOS_TOKEN, unk_token=BOS_TOKEN)


def load_corpus() -> torch.Tensor:
    """The training text as byte ids: [n_tokens] uint8 (the byte tokenizer's ids)."""
    raw = gzip.decompress((shipped_path("tiny") / CORPUS_FILE).read_bytes())
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


# 2) batches -----------------------------------------------------------------------------


def _randint(low: int, high: int, gen: torch.Generator) -> int:
    """One integer in [low, high]."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _repeat_episode(row: torch.Tensor, config: TrainConfig, gen: torch.Generator) -> None:
    """Overwrite row [body] in place: a text prefix of 0..body/4 tokens, then one random segment
    repeated to the end."""
    body = row.shape[0]
    length = _randint(config.segment_min, config.segment_max, gen)
    prefix = _randint(0, body // 4, gen)
    low, high = PRINTABLE if torch.rand(1, generator=gen).item() < config.printable_share else (0, 256)
    segment = torch.randint(low, high, (length,), generator=gen)  # [length]
    reps = -(-(body - prefix) // length)
    row[prefix:] = segment.repeat(reps)[: body - prefix]


def _needle_episode(row: torch.Tensor, config: TrainConfig, gen: torch.Generator) -> None:
    """Overwrite row [body] (a text window) in place with text, needle, text, needle, text: the
    text stays consecutive around both needles, as in a haystack with the needle inserted."""
    body = row.shape[0]
    length = _randint(config.needle_min, config.needle_max, gen)
    needle = torch.randint(*PRINTABLE, (length,), generator=gen)  # [length]
    gap = _randint(NEEDLE_GAP_MIN, body - 2 * length, gen)
    pre = _randint(0, body - 2 * length - gap, gen)
    text = row.clone()  # [body]
    pieces = [text[:pre], needle, text[pre : pre + gap], needle, text[pre + gap :]]
    row[:] = torch.cat(pieces)[:body]


def sample_batch(corpus: torch.Tensor, config: TrainConfig, gen: torch.Generator, bos_id: int = 256) -> torch.Tensor:
    """[batch, n_ctx] ids: BOS + a random text window, which a `repeat_share` of rows replace by a
    repeat episode and a `needle_share` of rows turn into a needle episode."""
    body = config.n_ctx - 1
    starts = torch.randint(0, len(corpus) - body, (config.batch_size,), generator=gen)  # [batch]
    rows = torch.stack([corpus[s : s + body].long() for s in starts.tolist()])  # [batch, body]
    kind = torch.rand(config.batch_size, generator=gen)  # [batch]: < repeat_share -> repeat, then needle
    for row in range(config.batch_size):
        if kind[row] < config.repeat_share:
            _repeat_episode(rows[row], config, gen)
        elif kind[row] < config.repeat_share + config.needle_share:
            _needle_episode(rows[row], config, gen)
    bos = torch.full((config.batch_size, 1), bos_id, dtype=torch.long)  # [batch, 1]
    return torch.cat([bos, rows], dim=1)  # [batch, n_ctx]


def lr_at(step: int, config: TrainConfig) -> float:
    """Warmup, hold at the peak, then linear decay over the last `decay_share` of steps."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    decay_start = config.steps * (1 - config.decay_share)
    if step < decay_start or config.decay_share == 0:
        return config.lr
    frac = (step - decay_start) / max(1.0, config.steps - decay_start)
    return config.lr * (1 - frac * (1 - config.final_lr_share))

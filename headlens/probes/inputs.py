"""Probe inputs: repeated random tokens (Olsson et al.), natural-text windows, needles."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import torch

from headlens.errors import ConfigError, InputTextError
from headlens.files import shipped_path
from headlens.probes.tokenize import token_ids


def repeated_random_tokens(
    n_seq: int, seq_len: int, repeats: int, low: int, high: int, bos_id: int | None, seed: int = 0
) -> torch.Tensor:
    """Random token ids in [low, high) of period `seq_len`, repeated `repeats` times, BOS prepended.

    Olsson et al. 2022: 25 random tokens (most and least common excluded), repeated 4 times,
    BOS prepended. The id range [low, high) is how the caller excludes rare and common
    tokens. Returns [n_seq, 1 + seq_len * repeats] (without BOS when bos_id is None).
    """
    gen = torch.Generator().manual_seed(seed)
    period = torch.randint(low, high, (n_seq, seq_len), generator=gen)  # [n_seq, seq_len]
    body = period.repeat(1, repeats)  # [n_seq, seq_len * repeats]
    if bos_id is None:
        return body
    bos = torch.full((n_seq, 1), bos_id, dtype=torch.long)  # [n_seq, 1]
    return torch.cat([bos, body], dim=1)  # [n_seq, 1 + seq_len * repeats]


# Natural text ---------------------------------------------------------------------------


def n_tokens(n: int) -> str:
    """ "1 token", "2 tokens": a count of tokens in a message."""
    return f"{n} token" if n == 1 else f"{n} tokens"


# Share of NUL / control bytes above which a file is taken for binary, not text.
_BINARY_CONTROL_SHARE = 0.01
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f]")  # below 32, other than \t \n \f \r
DEFAULT_TEXT_NAME = "heldout.txt"  # held-out evaluation text shipped beside the tiny model
# Shortest text the natural-text probe scores: one query with one earlier text token to look at.
MIN_TEXT_TOKENS = 2


def read_text(path) -> str:
    """Read a UTF-8 text file; InputTextError for missing, empty, binary or non-UTF-8 files."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise InputTextError(f"text file not found: {path}")
    raw = path.read_bytes()
    return check_text(raw, str(path))


def check_text(raw: bytes | str, where: str = "text") -> str:
    """Validate text given as bytes or str: non-empty, UTF-8, not binary."""

    if isinstance(raw, bytes):
        if b"\x00" in raw:
            raise InputTextError(f"{where} looks binary (contains NUL bytes): give a UTF-8 text file")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputTextError(f"{where} is not valid UTF-8 (byte {exc.start}): give a UTF-8 text file") from None
    else:
        text = raw
    if not text:
        raise InputTextError(f"{where} is empty")
    if not text.strip():
        raise InputTextError(f"{where} holds only white space: give some text")
    control = len(_CONTROL.findall(text))
    if control > _BINARY_CONTROL_SHARE * len(text):
        raise InputTextError(f"{where} looks binary ({control} control characters): give a UTF-8 text file")
    return text


def default_text() -> str:
    """The held-out evaluation text shipped with the embedded model."""

    return read_text(shipped_path("tiny") / DEFAULT_TEXT_NAME)


def text_windows(
    tokenizer,
    text: str | Sequence[int],
    window: int,
    bos_id: int | None,
    min_tokens: int = 2,
    max_windows: int | None = None,
) -> list[list[int]]:
    """Tokenize `text` (or take its token ids) and cut it into consecutive windows of at most `window` tokens, each with
    BOS prepended (BOS counts towards `window`). Never truncates silently: every token lands in
    a window (up to `max_windows`, which the caller states; a text is tokenized only as far as those
    hold). The last window may be shorter; it is dropped only if it has fewer than `min_tokens` text tokens.
    """

    body = window - (1 if bos_id is not None else 0)
    if body < 1:
        raise InputTextError(f"window of {window} tokens leaves no room for text")
    limit = None if max_windows is None else body * max_windows  # tokens the windows can hold
    ids = token_ids(tokenizer, text, limit)[0] if isinstance(text, str) else list(text)
    windows = []
    for start in range(0, len(ids), body):
        chunk = ids[start : start + body]
        if len(chunk) < min_tokens:
            continue
        windows.append(([bos_id] if bos_id is not None else []) + chunk)
        if max_windows is not None and len(windows) >= max_windows:
            break
    if not windows:
        raise InputTextError(f"text is too short: {n_tokens(len(ids))}, need at least {min_tokens}")
    return windows


# Random-token id ranges ---------------------------------------------------------------------

# A vocabulary this small is byte-level (256 bytes + a few specials): draw printable ASCII.
BYTE_VOCAB_MAX = 300
PRINTABLE_BYTES = (32, 127)  # [low, high): space .. '~'


def random_token_range(d_vocab: int, low: int | None = None, high: int | None = None) -> tuple[int, int]:
    """The id range [low, high) random probe tokens are drawn from, for any vocabulary.

    Olsson et al. 2022 drew random tokens excluding the most and least frequent ones. Without
    corpus counts we use what the vocabulary's construction implies:
    - byte-level vocabularies (d_vocab <= 300): printable ASCII bytes [32, 127), so segments
      look like text and avoid control bytes;
    - BPE vocabularies: merges are learned in order of frequency, so the lowest ids (bytes,
      first merges) are the most common and the highest the rarest; keep the middle band
      [d_vocab // 50, d_vocab // 5) (GPT-2: [1005, 10051), close to TransformerLens's 1000-10000).
    Explicit `low` / `high` override either end. Raises ConfigError for an empty or out-of-range band.
    """

    if d_vocab <= BYTE_VOCAB_MAX:
        auto = (PRINTABLE_BYTES[0], min(PRINTABLE_BYTES[1], d_vocab))
    else:
        auto = (d_vocab // 50, d_vocab // 5)
    lo = auto[0] if low is None else low
    hi = auto[1] if high is None else high
    if not 0 <= lo < hi <= d_vocab or hi - lo < 2:
        raise ConfigError(
            f"random-token id range [{lo}, {hi}) is invalid: need 0 <= low < high <= {d_vocab} "
            "(the vocabulary size) with at least 2 ids"
        )
    return lo, hi


def fit_repeats(seq_len: int, repeats: int, n_ctx: int) -> int:
    """How many copies of a period-`seq_len` segment fit after BOS in `n_ctx`: min(repeats, (n_ctx-1)//seq_len).

    Raises ConfigError when fewer than 2 copies fit (no second copy, no induction to see).
    """

    fit = min(repeats, (n_ctx - 1) // seq_len)
    if fit < 2:
        raise ConfigError(
            f"seq_len {seq_len} is too long for probe sequences of {n_ctx} tokens (the token budget "
            f"or the model's context, whichever is shorter): "
            f"two copies plus BOS need 1 + 2 * seq_len <= {n_ctx}, so seq_len <= {(n_ctx - 1) // 2}"
        )
    return fit


# Needle in a haystack ------------------------------------------------------------------------


def even_depths(n: int) -> tuple[float, ...]:
    """`n` needle depths spread evenly through the haystack, each at the middle of its 1/n share:
    (i + 0.5) / n; 5 gives 0.1, 0.3, 0.5, 0.7, 0.9."""
    return tuple((i + 0.5) / n for i in range(n))


NEEDLE_DEPTHS = even_depths(5)  # where the needle sits in the haystack (Wu et al. use 10 depths)
NEEDLE_LENGTHS = (0.25, 0.5, 1.0)  # total test lengths, as shares of the context
MIN_HAYSTACK = 8  # haystack tokens a test needs at least


def _haystack_lengths(
    n_ctx: int, bos_id: int | None, needle_len: int, restate: int, lengths: Sequence[float]
) -> list[tuple[int, int]]:
    """(context, haystack length) of each test length that leaves at least MIN_HAYSTACK haystack tokens."""
    fixed = needle_len + restate + (needle_len - restate) + (1 if bos_id is not None else 0)
    sizes = [(int(round(share * n_ctx)), int(round(share * n_ctx)) - fixed) for share in lengths]
    return [(context, hay) for context, hay in sizes if hay >= MIN_HAYSTACK]


def needle_haystack_min(
    n_ctx: int, bos_id: int | None, needle_len: int = 16, restate: int = 4, lengths: Sequence[float] = NEEDLE_LENGTHS
) -> int:
    """Text tokens the shortest needle test needs (needle_prompts refuses a shorter haystack text)."""
    sizes = _haystack_lengths(n_ctx, bos_id, needle_len, restate, lengths)
    return min((hay for _, hay in sizes), default=MIN_HAYSTACK)


class NeedlePrompt(NamedTuple):
    """One needle-in-a-haystack test (Wu et al. 2024, adapted; see needle_prompts)."""

    prompt: list[int]  # BOS + haystack[:depth] + needle + haystack[depth:] + needle[:restate]
    needle_start: int  # position of the needle's first token in `prompt`
    needle: list[int]  # the needle's token ids
    restate: int  # how many of the needle's first tokens are restated at the end
    context: int  # total length the test was sized for: len(prompt) + tokens to generate
    depth: float  # where the needle sits in the haystack, 0..1


def needle_size(context: int, needle_len: int, restate: int) -> tuple[int, int]:
    """(needle_len, restate) of needle tests `context` tokens long: the needle shrinks to context // 8
    tokens (at least 2) so that the haystack keeps most of the context, and restates at most
    needle_len - 1 of them (one is left to generate)."""
    needle_len = min(needle_len, max(2, context // 8))
    return needle_len, min(restate, needle_len - 1)


def needle_prompts(
    haystack_ids: Sequence[int],
    n_ctx: int,
    bos_id: int | None,
    token_range: tuple[int, int],
    needle_len: int = 16,
    restate: int = 4,
    depths: Sequence[float] = NEEDLE_DEPTHS,
    lengths: Sequence[float] = NEEDLE_LENGTHS,
    seed: int = 0,
) -> list[NeedlePrompt]:
    """Needle-in-a-haystack prompts for retrieval heads, adapted from Wu et al. 2024 (arXiv 2404.15574).

    Wu et al. insert a needle sentence into 1K-50K-token haystacks at 10 depths and ask a chat
    model for it. Small base models (GPT-2 small's 1024-token context, the tiny model's 256) cannot
    answer questions, so the test shrinks into a copy task: a needle of `needle_len` random
    tokens (drawn from `token_range`, the random-probe band) goes into natural-text haystack
    at each depth, for total lengths of each share in `lengths` of the context; the prompt
    ends by restating the needle's first `restate` tokens, and the model must continue it for
    `needle_len - restate` greedy tokens, all inside `n_ctx`. Haystacks are consecutive slices of
    `haystack_ids` (never cycled: repeating text would plant induction targets); a length
    the text cannot fill is skipped. Raises InputTextError if no length fits.
    """

    if not 1 <= restate < needle_len:
        raise ConfigError(f"needle restate {restate} is out of range: need 1 <= restate < needle_len ({needle_len})")
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for context, hay_len in _haystack_lengths(n_ctx, bos_id, needle_len, restate, lengths):
        if hay_len > len(haystack_ids):
            continue
        for depth in depths:
            needle = torch.randint(token_range[0], token_range[1], (needle_len,), generator=gen).tolist()
            start = int(torch.randint(0, len(haystack_ids) - hay_len + 1, (1,), generator=gen))
            hay = list(haystack_ids[start : start + hay_len])
            cut = int(round(depth * hay_len))
            head = ([bos_id] if bos_id is not None else []) + hay[:cut]
            prompt = head + needle + hay[cut:] + needle[:restate]
            prompts.append(NeedlePrompt(prompt, len(head), needle, restate, context, float(depth)))
    if not prompts:
        need = needle_haystack_min(n_ctx, bos_id, needle_len, restate, lengths)
        raise InputTextError(
            f"text is too short for the needle-in-a-haystack probe: {n_tokens(len(haystack_ids))}, "
            f"need at least {need} for the shortest haystack"
        )
    return prompts

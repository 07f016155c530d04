"""Scores -> labelled DataFrame: what does each head do?

Three probes, one streaming pass each (never a full activation cache):
1. natural text windows (`--text` of any length >= 2 tokens, else the held-out text shipped with
   the tiny model): prev/current/first-token scores and the Voita argmax offset;
2. repeated random tokens (Olsson et al. 2022): duplicate-token, prefix matching, copying;
3. needle-in-a-haystack tests (Wu et al. 2024, adapted): retrieval, by greedy decoding. The haystack
   is the given text when it is long enough, else the shipped held-out text.
Where each probe's input came from is recorded (`attrs["sources"]` and the `*_source` columns).
Labels follow the published definitions (headlens.labels); every threshold is a ClassifyConfig field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields

import pandas as pd
import torch

from headlens import distributed, probes
from headlens.arch import adapter_for
from headlens.capture import Batch, iter_batches, pad_batch, run_capture
from headlens.corpus import chunks, document_windows
from headlens.errors import InputTextError
from headlens.labels import ClassifyConfig, label_head
from headlens.probes import fit_repeats, random_token_range, repeated_random_tokens
from headlens.scores.copying import CopyingReducer
from headlens.scores.duplicate import duplicate_token_reducer
from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
from headlens.scores.ov_copying import ov_copying_scores, sign_disagreements
from headlens.scores.positional import (
    ArgmaxOffsetReducer,
    current_token_reducer,
    first_token_reducer,
    prev_token_reducer,
)
from headlens.scores.retrieval import retrieval_scores

# Where a probe's input came from (values of attrs["sources"] and of the SOURCE_COLUMNS).
SOURCE_GIVEN = "given_text"  # the text passed to classify_heads (--text)
SOURCE_DEFAULT = "default_text"  # the held-out text shipped with headlens (headlens.probes.default_text)
SOURCE_RANDOM = "random_tokens"  # seeded random token ids (probes.repeated_random_tokens)
SOURCE_OFF = "not_run"  # the probe was switched off (needles=False)
# Probe -> the frame column naming its input's source (same value on every row, so CSV and JSON carry it).
SOURCE_COLUMNS = {"text": "text_source", "repeats": "repeats_source", "needles": "needles_source"}
SCORE_COLUMNS = ["prev_token_score", "current_token_score", "first_token_score", "positional_offset",
                 "positional_share", "duplicate_token_score", "prefix_matching_score", "copying_score",
                 "retrieval_score"]


def classify_heads(loaded, text: str | Iterable[str] | None = None, config: ClassifyConfig | None = None,
                   progress: bool = False) -> pd.DataFrame:
    """Score and label every head of `loaded` (a headlens LoadedModel).

    `text`: one text, or documents (any iterable of str, e.g. a headlens.corpus.Corpus), read
    one at a time: text windows never span two documents, and the needle haystacks come from
    the first documents (whole, until n_ctx tokens are reached).

    Returns one row per head, sorted by (layer, head): `layer`, `head`, `labels` (list[str] from
    LABELS), `kv_group` (the key/value head the query head reads: heads that share it form a
    grouped-query group), the SCORE_COLUMNS, then evidence (`n_positions`, `n_repeat_positions`,
    `n_needle_tests` run, `n_needle_retrieved`, `n_needle_tokens`, and `<score>_std` spreads across
    sequences / tests; `ov_copying_score`, from the weights, right after `copying_score`, from the
    data), then the SOURCE_COLUMNS. `df.attrs["probes"]` says what was run (windows
    used of windows available, repeats, ...); `df.attrs["sources"]` maps each probe ("text",
    "repeats", "needles") to where its input came from (SOURCE_GIVEN, SOURCE_DEFAULT, ...);
    `df.attrs["probes"]["copying_sign_disagreements"]` lists the heads whose two copying scores
    differ in sign.
    Any text of at least MIN_TEXT_TOKENS tokens is scored as given; the needle probe takes its
    haystack from the shipped held-out text when the given text is too short for one.
    """

    config = config or ClassifyConfig()
    given = text is not None
    documents = [_resolve_text(text)] if text is None or isinstance(text, str) else text
    spec = loaded.spec
    sources = {"text": SOURCE_GIVEN if given else SOURCE_DEFAULT, "repeats": SOURCE_RANDOM, "needles": SOURCE_OFF}
    rows: dict[str, torch.Tensor] = {}
    text_ids: list[int] = []  # the needle haystack
    info = _score_text(loaded, documents, config, progress, rows, text_ids)
    info.update(_score_repeats(loaded, config, progress, rows))
    rows["retrieval_score"] = rows["retrieval_std"] = torch.full((spec.n_layers, spec.n_heads), float("nan"))
    info.update(n_needle_tests=0, n_needle_retrieved=0, n_needle_tokens=0)
    if config.needles:
        sources["needles"] = _score_needles(loaded, text_ids, sources["text"], config, progress, rows, info)
    frame = _to_frame(rows, info, spec)
    frame.insert(2, "labels", [label_head(row, config) for row in frame.to_dict("records")])
    # Weight-based copying beside the data-based score (Elhage et al. 2021; headlens.scores.ov_copying).
    frame.insert(frame.columns.get_loc("copying_score") + 1, "ov_copying_score",
                 ov_copying_scores(loaded.model).flatten().tolist())
    info["copying_sign_disagreements"] = sign_disagreements(frame)
    info["sliding_window"] = window_reach(loaded, info)
    for probe, column in SOURCE_COLUMNS.items():
        frame[column] = sources[probe]
    frame.attrs["probes"] = info
    frame.attrs["sources"] = sources
    frame.attrs["config"] = {f.name: getattr(config, f.name) for f in fields(config)}
    return frame


def window_reach(loaded, info: dict) -> dict | None:
    """Sliding-window attention against the probes: the narrowest window, the layers that have it,
    and the longest probe sequence run. Keys beyond a layer's window get no attention (the patterns
    respect it), so a probe longer than the window measures those heads only inside it. None on
    models without a window."""
    adapter = adapter_for(loaded.model)
    windows = {layer: adapter.sliding_window(layer) for layer in range(adapter.n_layers)}
    windows = {layer: window for layer, window in windows.items() if window is not None}
    if not windows:
        return None
    narrowest = min(windows.values())
    longest = max(info.get("longest_window", 0), 1 + info["seq_len"] * info["repeats"],
                  info.get("longest_needle_prompt", 0))
    return {"window": narrowest, "layers": sorted(windows), "longest_probe": longest,
            "probes_inside": longest <= narrowest}


def stream_heads(model, batches, reducers, progress: bool = False, desc: str = "capture") -> None:
    """One streamed scoring pass: capture.run_capture (the trunk only, no logits, no cache)."""

    run_capture(model, batches, reducers, progress=progress, desc=desc)


def _resolve_text(text: str | None) -> str:
    if text is not None:
        return probes.check_text(text)
    try:
        return probes.default_text()
    except InputTextError as exc:
        raise InputTextError(f"no --text given and the default evaluation text is unavailable ({exc}): "
                             "pass --text FILE") from None


def _token_range(loaded, config: ClassifyConfig) -> tuple[int, int]:
    return random_token_range(loaded.spec.d_vocab, config.token_low, config.token_high)


def _score_text(loaded, documents: Iterable[str], config, progress, rows, haystack: list[int]) -> dict:
    """Natural-text windows of every document -> positional scores (into `rows`); the first
    documents' tokens go into `haystack`; returns probe facts."""

    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    prev, cur, first = prev_token_reducer(n, h), current_token_reducer(n, h), first_token_reducer(n, h)
    argmax = ArgmaxOffsetReducer(n, h, max_offset=config.max_offset)
    facts = {"n_windows": 0, "n_windows_available": 0, "n_text_tokens": 0, "n_documents": 0}
    windows = document_windows(loaded.tokenizer, documents, loaded.spec.n_ctx, loaded.bos_token_id,
                               config.max_windows, facts, haystack, progress)
    batches = (Batch(*pad_batch(chunk, pad_id=loaded.bos_token_id), index=i, offset=i * config.batch_size)
               for i, chunk in enumerate(chunks(windows, config.batch_size)))
    stream_heads(loaded.model, distributed.shard(batches), [prev, cur, first, argmax])
    distributed.all_reduce_totals([prev, cur, first, argmax])
    if facts["n_windows"] == 0:
        raise InputTextError(f"text is too short: {facts['n_text_tokens']} tokens, need at least "
                             f"{probes.MIN_TEXT_TOKENS} in one document")
    offset, share = argmax.result()
    rows.update(prev_token_score=prev.result(), prev_token_std=prev.seq_std(), current_token_score=cur.result(),
                current_token_std=cur.seq_std(), first_token_score=first.result(),
                first_token_std=first.seq_std(), positional_offset=offset, positional_share=share)
    return {**facts, "n_positions": int(argmax.n_scored[0]),
            "windows_capped": facts["n_windows"] < facts["n_windows_available"]}


def _score_needles(loaded, text_ids, text_source, config, progress, rows, info) -> str:
    """Needle-in-a-haystack tests -> retrieval scores (into `rows`, facts into `info`); returns the
    haystack's source. A text too short for the shortest haystack hands over to the shipped held-out
    text (only its haystack: the natural-text scores keep the given text)."""
    spec, bos = loaded.spec, loaded.bos_token_id
    needle_len = min(config.needle_len, max(2, spec.n_ctx // 8))
    restate = min(config.needle_restate, needle_len - 1)

    def prompts_from(ids):
        return probes.needle_prompts(ids, spec.n_ctx, bos, _token_range(loaded, config), needle_len=needle_len,
                                     restate=restate, seed=config.seed)

    source = text_source
    if len(text_ids) < probes.needle_haystack_min(spec.n_ctx, bos, needle_len, restate) and source != SOURCE_DEFAULT:
        source, text_ids = SOURCE_DEFAULT, _default_ids(loaded)
    prompts = prompts_from(text_ids)
    result = retrieval_scores(loaded.model, prompts, progress=progress)
    rows["retrieval_score"], rows["retrieval_std"] = result["score"], result["std"]
    info.update(n_needle_tests=result["n_tests"], n_needle_retrieved=result["n_retrieved"],
                n_needle_tokens=result["n_tokens"], needle_len=needle_len, needle_restate=restate,
                longest_needle_prompt=max((len(test.prompt) for test in prompts), default=0))
    return source


def _default_ids(loaded) -> list[int]:
    return loaded.tokenizer(_resolve_text(None), add_special_tokens=False)["input_ids"]


def _score_repeats(loaded, config, progress, rows) -> dict:
    """Repeated random tokens -> duplicate-token, prefix-matching, copying scores (into `rows`)."""

    spec = loaded.spec
    repeats = fit_repeats(config.seq_len, config.repeats, spec.n_ctx)
    low, high = _token_range(loaded, config)
    tokens = repeated_random_tokens(config.n_seq, config.seq_len, repeats, low, high, loaded.bos_token_id,
                                    seed=config.seed)  # [n_seq, 1 + seq_len * repeats]
    n, h = spec.n_layers, spec.n_heads
    dup, prefix = duplicate_token_reducer(n, h), prefix_matching_reducer(n, h)
    copying = CopyingReducer(loaded.model, lambda b: prefix_matching_targets(b.input_ids).any(-1))
    stream_heads(loaded.model, distributed.shard(iter_batches(tokens, config.batch_size)), [dup, prefix, copying],
                 progress=progress, desc="repeats")
    distributed.all_reduce_totals([dup, prefix, copying])
    rows.update(duplicate_token_score=dup.result(), duplicate_token_std=dup.seq_std(),
                prefix_matching_score=prefix.result(), prefix_matching_std=prefix.seq_std(),
                copying_score=copying.result(), copying_std=copying.std())
    return {"repeats": repeats, "seq_len": config.seq_len, "n_seq": config.n_seq, "token_range": [low, high],
            "n_repeat_positions": int(prefix.counts[0])}


def _to_frame(rows: dict, info: dict, spec) -> pd.DataFrame:
    layer, head = torch.meshgrid(torch.arange(spec.n_layers), torch.arange(spec.n_heads), indexing="ij")
    data = {"layer": layer.flatten().tolist(), "head": head.flatten().tolist()}
    data["kv_group"] = [spec.kv_group(h) for h in data["head"]]  # the key/value head each query head reads
    for column in SCORE_COLUMNS:
        values = rows[column].flatten()
        data[column] = values.tolist() if column != "positional_offset" else values.long().tolist()
    data["n_positions"] = info["n_positions"]
    data["n_repeat_positions"] = info["n_repeat_positions"]
    data["n_needle_tests"] = info["n_needle_tests"]
    data["n_needle_retrieved"] = info["n_needle_retrieved"]
    data["n_needle_tokens"] = info["n_needle_tokens"]
    for name in ("prev_token", "current_token", "first_token", "duplicate_token", "prefix_matching", "copying",
                 "retrieval"):
        data[f"{name}_std"] = rows[f"{name}_std"].flatten().tolist()
    return pd.DataFrame(data).sort_values(["layer", "head"], ignore_index=True)


def head_records(frame: pd.DataFrame) -> list[dict]:
    """The frame as JSON-ready objects: layer, head, labels (list), every score and evidence column;
    NaN becomes None (JSON null)."""
    import math

    records = []
    for row in frame.to_dict("records"):
        records.append({key: (None if isinstance(value, float) and math.isnan(value) else value)
                        for key, value in row.items()})
    return records

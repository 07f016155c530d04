"""The probes classify runs, each one streamed pass returning a small ProbeResult.

A probe takes the shared ProbeRun (the model, the config, the documents, the probe sizes) and returns
its score tensors ({column: [n_layers, n_heads]}, the `<score>_std` spreads included), the counts it
scored (the same on every row of the frame), facts for `attrs["probes"]` and where its input came
from. The registry of head kinds (headlens.classify.kinds) names the probe each score comes from.

Probe sizes come from a token budget, not the model's context (`probe_sizes`): text windows and the
repeated random tokens fit in min(token_budget, n_ctx) tokens, needle tests in min(needle_budget,
n_ctx), so an 8,192-token model is probed at the cost of a 512-token one unless asked otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from headlens import distributed
from headlens.capture import Batch, iter_batches, pad_batch, run_capture
from headlens.classify import kinds
from headlens.classify.stability import Units, from_reducer, per_unit
from headlens.errors import InputTextError
from headlens.probes import inputs as probes
from headlens.probes.corpus import chunks, document_windows
from headlens.probes.inputs import fit_repeats, random_token_range, repeated_random_tokens
from headlens.probes.tokenize import encode
from headlens.scores.copying import CopyingReducer
from headlens.scores.duplicate import duplicate_token_reducer
from headlens.scores.induction import prefix_matching_reducer, prefix_matching_targets
from headlens.scores.ov_copying import ov_copying_scores
from headlens.scores.positional import (
    ArgmaxOffsetReducer,
    current_token_reducer,
    first_token_reducer,
    prev_token_reducer,
)
from headlens.scores.retrieval import retrieval_scores

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

# Where a probe's input came from (values of attrs["sources"] and of the `*_source` columns).
SOURCE_GIVEN = "given_text"  # the text passed to classify_heads (--text)
SOURCE_DEFAULT = "default_text"  # the held-out text shipped with headlens (headlens.probes.inputs.default_text)
SOURCE_RANDOM = "random_tokens"  # seeded random token ids (probes.repeated_random_tokens)
SOURCE_WEIGHTS = "weights"  # read from the weights, no input
SOURCE_OFF = kinds.SOURCE_NOT_RUN  # the probe was switched off (needles=False)


@dataclass
class ProbeRun:
    """What every probe of one classify run shares."""

    loaded: object  # a headlens LoadedModel
    config: object  # headlens.classify.labels.ClassifyConfig
    documents: Iterable[str]  # the natural text, one document at a time
    text_source: str  # SOURCE_GIVEN or SOURCE_DEFAULT
    sizes: dict  # probe_sizes(): window, repeat_context, needle_context, n_ctx
    progress: bool = False
    haystack: list[int] = field(default_factory=list)  # needle haystack, filled by the text probe


@dataclass
class ProbeResult:
    """One probe's output: scores {column: [n_layers, n_heads]}, counts {column: int}, facts, source."""

    scores: dict[str, torch.Tensor]
    counts: dict[str, int] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    source: str | None = None  # None: the probe has no input worth naming (it reads the weights)
    units: Units | None = None  # per-unit sums for the bootstrap (headlens.classify.stability); None: none kept


def probe_sizes(n_ctx: int, config) -> dict:
    """Longest sequence of each probe: min(budget, n_ctx) tokens; `capped` when a budget cut the context."""
    window = min(n_ctx, config.token_budget)
    needle = min(n_ctx, config.needle_budget or config.token_budget)
    return {
        "n_ctx": n_ctx,
        "token_budget": config.token_budget,
        "window": window,
        "repeat_context": window,
        "needle_context": needle,
        "capped": min(window, needle) < n_ctx,
    }


def stream_heads(model, batches, reducers, progress: bool = False, desc: str = "capture") -> None:
    """One streamed scoring pass: capture.run_capture (the trunk only, no logits, no cache)."""
    run_capture(model, batches, reducers, progress=progress, desc=desc)


def token_range(run: ProbeRun) -> tuple[int, int]:
    return random_token_range(run.loaded.spec.d_vocab, run.config.token_low, run.config.token_high)


def score_text(run: ProbeRun) -> ProbeResult:
    """Natural-text windows of every document -> positional scores; the first documents' tokens, up to
    the needle context, go into `run.haystack`."""
    loaded, config = run.loaded, run.config
    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    units = config.max_windows  # at most this many windows: the bootstrap's units, rows by window
    prev, cur = prev_token_reducer(n, h, n_units=units), current_token_reducer(n, h, n_units=units)
    first = first_token_reducer(n, h, n_units=units)
    argmax = ArgmaxOffsetReducer(n, h, max_offset=config.max_offset, n_units=units)
    facts = {"n_windows": 0, "n_windows_available": 0, "n_text_tokens": 0, "n_documents": 0}
    windows = document_windows(
        loaded.tokenizer,
        run.documents,
        run.sizes["window"],
        loaded.bos_token_id,
        config.max_windows,
        facts,
        run.haystack,
        run.progress,
        haystack_len=run.sizes["needle_context"],
    )
    batches = (
        Batch(*pad_batch(chunk, pad_id=loaded.bos_token_id), index=i, offset=i * config.batch_size)
        for i, chunk in enumerate(chunks(windows, config.batch_size))
    )
    stream_heads(loaded.model, distributed.shard(batches), [prev, cur, first, argmax])
    distributed.all_reduce_totals([prev, cur, first, argmax])
    if facts["n_windows"] == 0:
        raise InputTextError(
            f"text is too short: {probes.n_tokens(facts['n_text_tokens'])}, need at least "
            f"{probes.MIN_TEXT_TOKENS} in one document"
        )
    offset, share = argmax.result()
    scores = {
        "prev_token_score": prev.result(),
        "prev_token_std": prev.seq_std(),
        "current_token_score": cur.result(),
        "current_token_std": cur.seq_std(),
        "first_token_score": first.result(),
        "first_token_std": first.seq_std(),
        "positional_offset": offset,
        "positional_share": share,
    }
    n_positions = int(argmax.n_scored[0])
    facts.update(
        n_positions=n_positions,
        windows_capped=facts["n_windows"] < facts["n_windows_available"] or facts.get("text_partly_read", False),
    )
    used = facts["n_windows"]
    kept = Units(
        {
            "prev_token_score": from_reducer(prev.unit_mass, prev.unit_n, used),
            "current_token_score": from_reducer(cur.unit_mass, cur.unit_n, used),
            "first_token_score": from_reducer(first.unit_mass, first.unit_n, used),
        },
        argmax=(
            argmax.unit_counts.double().permute(1, 0, 2, 3).numpy()[:used],
            argmax.unit_n.T.double().numpy()[:used],
        ),
    )
    return ProbeResult(scores, {"n_positions": n_positions}, facts, run.text_source, kept)


def score_repeats(run: ProbeRun) -> ProbeResult:
    """Repeated random tokens -> duplicate-token, prefix-matching and copying scores."""
    loaded, config = run.loaded, run.config
    repeats = fit_repeats(config.seq_len, config.repeats, run.sizes["repeat_context"])
    low, high = token_range(run)
    tokens = repeated_random_tokens(
        config.n_seq, config.seq_len, repeats, low, high, loaded.bos_token_id, seed=config.seed
    )  # [n_seq, 1 + seq_len * repeats]
    n, h = loaded.spec.n_layers, loaded.spec.n_heads
    units = len(tokens)  # one unit per sequence
    dup, prefix = duplicate_token_reducer(n, h, n_units=units), prefix_matching_reducer(n, h, n_units=units)
    copying = CopyingReducer(loaded.model, lambda b: prefix_matching_targets(b.input_ids).any(-1), n_units=units)
    stream_heads(
        loaded.model,
        distributed.shard(iter_batches(tokens, config.batch_size)),
        [dup, prefix, copying],
        progress=run.progress,
        desc="repeats",
    )
    distributed.all_reduce_totals([dup, prefix, copying])
    scores = {
        "duplicate_token_score": dup.result(),
        "duplicate_token_std": dup.seq_std(),
        "prefix_matching_score": prefix.result(),
        "prefix_matching_std": prefix.seq_std(),
        "copying_score": copying.result(),
        "copying_std": copying.std(),
    }
    n_repeat = int(prefix.counts[0])
    facts = {
        "repeats": repeats,
        "seq_len": config.seq_len,
        "n_seq": config.n_seq,
        "token_range": [low, high],
        "n_repeat_positions": n_repeat,
    }
    kept = Units(
        {
            "duplicate_token_score": from_reducer(dup.unit_mass, dup.unit_n),
            "prefix_matching_score": from_reducer(prefix.unit_mass, prefix.unit_n),
            "copying_score": from_reducer(copying.unit_sums, copying.unit_n),
        }
    )
    return ProbeResult(scores, {"n_repeat_positions": n_repeat}, facts, SOURCE_RANDOM, kept)


def score_needles(run: ProbeRun) -> ProbeResult:
    """Needle-in-a-haystack tests -> retrieval scores. A text too short for the shortest haystack hands
    over to the shipped held-out text (only its haystack: the natural-text scores keep the given text).
    Off (`config.needles` False): NaN scores and source SOURCE_OFF."""
    loaded, config = run.loaded, run.config
    spec, bos = loaded.spec, loaded.bos_token_id
    counts = {"n_needle_tests": 0, "n_needle_retrieved": 0, "n_needle_tokens": 0}
    if not config.needles:
        nan = torch.full((spec.n_layers, spec.n_heads), float("nan"))
        return ProbeResult({"retrieval_score": nan, "retrieval_std": nan.clone()}, counts, dict(counts), SOURCE_OFF)
    context = run.sizes["needle_context"]
    needle_len, restate = probes.needle_size(context, config.needle_len, config.needle_restate)
    source, ids = run.text_source, run.haystack
    if len(ids) < probes.needle_haystack_min(context, bos, needle_len, restate) and source != SOURCE_DEFAULT:
        source, ids = SOURCE_DEFAULT, default_ids(loaded)
    prompts = probes.needle_prompts(
        ids,
        context,
        bos,
        token_range(run),
        needle_len=needle_len,
        restate=restate,
        depths=probes.even_depths(config.needle_depths),
        seed=config.seed,
    )
    result = retrieval_scores(loaded.model, prompts, progress=run.progress)
    counts = {
        "n_needle_tests": result["n_tests"],
        "n_needle_retrieved": result["n_retrieved"],
        "n_needle_tokens": result["n_tokens"],
    }
    facts = {
        **counts,
        "needle_len": needle_len,
        "needle_restate": restate,
        "needle_depths": config.needle_depths,
        "longest_needle_prompt": max((len(test.prompt) for test in prompts), default=0),
    }
    kept = Units({"retrieval_score": per_unit(result["per_test"])}) if result["n_retrieved"] else None
    scores = {"retrieval_score": result["score"], "retrieval_std": result["std"]}
    return ProbeResult(scores, counts, facts, source, kept)


def score_weights(run: ProbeRun) -> ProbeResult:
    """Weight-based copying (Elhage et al. 2021; headlens.scores.ov_copying): no input."""
    return ProbeResult({"ov_copying_score": ov_copying_scores(run.loaded.model)})


def resolve_text(text: str | None) -> str:
    """`text` checked, or the shipped held-out text when None."""
    if text is not None:
        return probes.check_text(text)
    try:
        return probes.default_text()
    except InputTextError as exc:
        raise InputTextError(
            f"no --text given and the default evaluation text is unavailable ({exc}): pass --text FILE"
        ) from None


def default_ids(loaded: LoadedModel) -> list[int]:
    return encode(loaded.tokenizer, resolve_text(None))

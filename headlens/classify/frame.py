"""Scores -> labelled DataFrame: what does each head do?

The probes of the registry (headlens.classify.kinds.PROBES, headlens.classify.runs), one streaming pass each
(never a full activation cache), each sized by a token budget rather than the model's context:
1. natural text windows (`--text` of any length >= 2 tokens, else the held-out text shipped with
   the tiny model): prev/current/first-token scores and the Voita argmax offset;
2. repeated random tokens (Olsson et al. 2022): duplicate-token, prefix matching, copying;
3. needle-in-a-haystack tests (Wu et al. 2024, adapted): retrieval, by greedy decoding. The haystack
   is the given text when it is long enough, else the shipped held-out text;
4. the weights: OV-circuit copying (Elhage et al. 2021).
Where each probe's input came from is recorded (`meta["sources"]` and the `*_source` columns), and
the probe sizes in `meta["probes"]["sizes"]`. Labels follow the published definitions
(headlens.classify.labels); every threshold is a ClassifyConfig field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import TYPE_CHECKING

import pandas as pd
import torch
from tqdm.auto import tqdm

from headlens.classify import kinds
from headlens.classify.labels import ClassifyConfig, label_head
from headlens.classify.runs import (
    SOURCE_DEFAULT,
    SOURCE_GIVEN,
    SOURCE_OFF,
    SOURCE_RANDOM,
    ProbeRun,
    probe_sizes,
    resolve_text,
)
from headlens.classify.stability import add_columns
from headlens.results import Result
from headlens.scores.ov_copying import folding_once, sign_disagreements

if TYPE_CHECKING:
    from headlens.load.models import LoadedModel

__all__ = [
    "SCORE_COLUMNS",
    "SOURCE_COLUMNS",
    "SOURCE_DEFAULT",
    "SOURCE_GIVEN",
    "SOURCE_OFF",
    "SOURCE_RANDOM",
    "ClassifyConfig",
    "classify_heads",
    "head_records",
    "window_reach",
]
SOURCE_COLUMNS = kinds.SOURCE_COLUMNS  # probe -> the frame column naming its input's source
SCORE_COLUMNS = kinds.SCORE_COLUMNS


def classify_heads(
    loaded: LoadedModel,
    text: str | Iterable[str] | None = None,
    config: ClassifyConfig | None = None,
    progress: bool = False,
) -> Result:
    """Score and label every head of `loaded` (a headlens LoadedModel).

    `text`: one text, or documents (any iterable of str, e.g. a headlens.probes.corpus.Corpus), read
    one at a time: text windows never span two documents, and the needle haystacks come from
    the first documents (whole, until the needle context is reached). Several probes read the
    documents, so a one-shot iterator is read into a list first (a Corpus streams each time).

    Returns a Result (headlens.results) of kind "heads". Its frame: one row per head, sorted by (layer,
    head): `layer`, `head`, `labels` (list[str] from
    LABELS), `kv_group` (the key/value head the query head reads: heads that share it form a
    grouped-query group), the SCORE_COLUMNS (registry order), then evidence (`n_positions`,
    `n_repeat_positions`, `n_needle_tests` run, `n_needle_retrieved`, `n_needle_tokens`), the
    `<score>_std` spreads across sequences / tests, then the SOURCE_COLUMNS; with `config.resamples` (the
    default) the bootstrap's `<score>_lo` and `<score>_hi` (95% interval over the probe's units),
    `<label>_stability` (share of resamples earning the label) and `borderline` (labels below
    headlens.classify.stability.STABLE_MIN; dropped from `labels` with `config.strict`), described in
    `meta["probes"]["stability"]` (headlens.classify.stability). Its meta: `model` (the
    model's name), `config` (the ClassifyConfig's fields, the thresholds the labels were given under), `probes`
    says what was run (windows used of windows available, repeats, ...) and `["sizes"]` the longest
    sequence of each probe under the token budget (headlens.classify.runs.probe_sizes);
    `sources` maps each probe ("text", "repeats", "needles") to where its input came
    from (SOURCE_GIVEN, SOURCE_DEFAULT, ...); `probes["copying_sign_disagreements"]`
    lists the heads whose two copying scores differ in sign.
    Any text of at least MIN_TEXT_TOKENS tokens is scored as given; the needle probe takes its
    haystack from the shipped held-out text when the given text is too short for one.
    """
    return classify_run(loaded, text, config, progress)[0]


def classify_run(
    loaded: LoadedModel, text=None, config: ClassifyConfig | None = None, progress: bool = False, reuse=None
):
    """classify_heads, also returning each probe's ProbeResult: (Result, {probe: ProbeResult}). `reuse`: such
    results of an earlier run of the same model and config, taken as they are for the probes that do not
    read the text (kinds.Probe.reads_text) instead of run again."""
    config = config or ClassifyConfig()
    documents = [resolve_text(text)] if text is None or isinstance(text, str) else text
    if iter(documents) is documents:  # a one-shot iterator: the later probes read the documents again
        documents = list(documents)
    run = ProbeRun(
        loaded,
        config,
        documents,
        SOURCE_GIVEN if text is not None else SOURCE_DEFAULT,
        probe_sizes(loaded.spec.n_ctx, config),
        progress,
    )
    results = run_probes(run, reuse or {})
    info = {key: value for result in results.values() for key, value in result.facts.items()}
    info["sizes"] = run.sizes
    frame = _to_frame(results, loaded.spec)
    frame.insert(2, "labels", [label_head(row, config) for row in frame.to_dict("records")])
    if config.resamples:
        units = {name: result.units for name, result in results.items() if result.units is not None}
        info["stability"] = add_columns(frame, units, config)
    info["copying_sign_disagreements"] = sign_disagreements(frame)
    info["sliding_window"] = window_reach(loaded, info)
    sources = {name: results[name].source for name in SOURCE_COLUMNS}
    for probe, column in SOURCE_COLUMNS.items():
        frame[column] = sources[probe]
    meta = {
        "model": str(loaded.name),
        "probes": info,
        "sources": sources,
        "config": {f.name: getattr(config, f.name) for f in fields(config)},
    }
    return Result("heads", frame, meta), results


def run_probes(run: ProbeRun, reuse: dict) -> dict:
    """Every probe of the registry in its order -> {probe: ProbeResult}. With `run.progress`, a bar on
    stderr counts the probes and names the one running; a probe's own passes (windows, batches,
    layers) show beneath it with tqdm's estimate of their time left."""
    results = {}
    bar = tqdm(kinds.PROBES.items(), desc="classify", unit="probe", total=len(kinds.PROBES), disable=not run.progress)
    with folding_once():  # the weights are fixed for the run: the folded unembedding is made once
        for name, probe in bar:
            bar.set_postfix_str(name)
            results[name] = reuse[name] if name in reuse and not probe.reads_text else probe.run(run)
    return results


def window_reach(loaded: LoadedModel, info: dict) -> dict | None:
    """Sliding-window attention against the probes: the narrowest window, the layers that have it,
    and the longest probe sequence run. Keys beyond a layer's window get no attention (the patterns
    respect it), so a probe longer than the window measures those heads only inside it. None on
    models without a window."""
    adapter = loaded.adapter
    windows = {
        layer: window for layer in range(adapter.n_layers) if (window := adapter.sliding_window(layer)) is not None
    }
    if not windows:
        return None
    narrowest = min(windows.values())
    longest = max(
        info.get("longest_window", 0), 1 + info["seq_len"] * info["repeats"], info.get("longest_needle_prompt", 0)
    )
    return {
        "window": narrowest,
        "layers": sorted(windows),
        "longest_probe": longest,
        "probes_inside": longest <= narrowest,
    }


def _to_frame(results: dict, spec) -> pd.DataFrame:
    """Score columns (registry order), counts, std columns: one row per head."""
    layer, head = torch.meshgrid(torch.arange(spec.n_layers), torch.arange(spec.n_heads), indexing="ij")
    data = {"layer": layer.flatten().tolist(), "head": head.flatten().tolist()}
    data["kv_group"] = [spec.kv_group(h) for h in data["head"]]  # the key/value head each query head reads
    scores = {column: values for result in results.values() for column, values in result.scores.items()}
    for score in kinds.SCORES:
        values = scores[score.column].flatten()
        data[score.column] = values.long().tolist() if score.integer else values.tolist()
    for result in results.values():
        data.update(result.counts)
    for column in kinds.STD_COLUMNS:
        data[column] = scores[column].flatten().tolist()
    return pd.DataFrame(data).sort_values(["layer", "head"], ignore_index=True)


def head_records(frame: pd.DataFrame) -> list[dict]:
    """The frame as JSON-ready objects: layer, head, labels (list), every score and evidence column;
    NaN becomes None (JSON null)."""
    import math

    records = []
    for row in frame.to_dict("records"):
        records.append(
            {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in row.items()}
        )
    return records

"""The evaluation set of a metric, and its reference set.

- `loss` (alias `text`): the text's windows (headlens.ablation.evalset.text_evalset), or the
  targets of a prompts file; `repeat`: repeated random tokens; `logit-diff` and `prob`: a prompts
  file (headlens.ablation.prompts); `needle`: needle tests in the text.
- Reference set (mean and resample ablation draw z from it): by default the evaluation set itself,
  every real position; or the windows of a separate reference text (`reference`), kept apart from
  the evaluation as Wang et al. 2022 do for mean ablation.
"""

from __future__ import annotations

import hashlib

from headlens.ablation.evalset import MAX_TEXT_WINDOWS, EvalSet, pad, repeat_evalset, text_evalset
from headlens.ablation.metrics import PROMPT_METRICS, canonical_metric
from headlens.ablation.prompts import needle_evalset, prompt_evalset
from headlens.errors import ConfigError
from headlens.probes import check_text, text_windows


def build_evalset(loaded, metric: str, text: str | None = None, seed: int = 0, prompts: list[dict] | None = None,
                  reference: str | None = None, bos: bool = True) -> EvalSet:
    """The evaluation set of `metric` (see the module docstring); `prompts` from
    headlens.ablation.prompts.read_prompts; `reference` a text for mean / resample ablation."""
    metric = canonical_metric(metric)
    if text is not None and not isinstance(text, str) and metric == "needle":
        raise ConfigError("metric needle reads one text: give --text a text file (a folder or JSON Lines "
                          "file of documents goes with the loss metric)")
    if prompts is not None:
        if metric not in PROMPT_METRICS:
            raise ConfigError(f"metric {metric} does not score prompts: with --prompts choose one of "
                              f"{', '.join(PROMPT_METRICS)}")
        evalset = prompt_evalset(loaded, prompts, metric)
    elif metric in ("logit-diff", "prob"):
        raise ConfigError(f"metric {metric} scores prompts: give --prompts FILE.jsonl "
                          "(lines of {\"prompt\": ..., \"target\": ..., \"foil\": ...})")
    elif metric == "loss":
        evalset = text_evalset(loaded, text, bos=bos)
    elif metric == "repeat":
        evalset = repeat_evalset(loaded, seed=seed)
    else:
        evalset = needle_evalset(loaded, text, seed=seed)
    if reference is not None:
        with_reference(loaded, evalset, reference)
    return evalset


def with_reference(loaded, evalset: EvalSet, text: str, label: str = "the reference text") -> EvalSet:
    """Attach the windows of `text` (BOS first, at most MAX_TEXT_WINDOWS) as the reference set."""
    text = check_text(text, label)
    bos = loaded.bos_token_id
    windows = text_windows(loaded.tokenizer, text, loaded.spec.n_ctx, bos, max_windows=MAX_TEXT_WINDOWS)
    evalset.reference_ids, evalset.reference_mask = pad(windows, bos)
    n_pos = int(evalset.reference_mask.sum())
    evalset.reference_label = f"{label} ({len(windows)} windows, {n_pos} positions)"
    evalset.data_hash = hashlib.sha256(evalset.data_hash.encode() + b"|ref|" + text.encode("utf-8")).hexdigest()
    return evalset

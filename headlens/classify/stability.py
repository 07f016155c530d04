"""How sure each label is: bootstrap intervals of the scores and the stability of the labels.

Every probe that averages over units (text windows, repeated sequences, retrieved needle tests, IOI
prompts) keeps each unit's sums as it runs (`Units`); nothing is run again here. One resample draws
as many units as the probe has, with replacement (Efron & Tibshirani 1993), independently per probe,
and recomputes every score from the drawn units' sums: a ratio score as the drawn numerators' sum over
the drawn denominators' sum, which on the original units is the score itself; the positional offset
and share from the drawn windows' argmax counts. Scores estimated over a random sample of the
vocabulary (copy suppression's OV and QK criteria) are redrawn from a normal with their sampling
standard error, as their probe keeps no per-token values. Scores read from the weights (successor,
the OV copying and name-copy scores) and the rare-word and syntactic scores are held at their value.

- `<score>_lo`, `<score>_hi`: the 95% percentile interval of the resampled score (np.percentile,
  linear interpolation, at 2.5 and 97.5).
- `<label>_stability`: the share of resamples in which the head earns the label, its kind's rule
  (headlens.classify.kinds) applied to the resampled scores, so rules reading several scores see them
  resampled together (the units of one probe are drawn once per resample for all its scores).
- `borderline`: the head's labels whose stability is below STABLE_MIN.

Resample b of the probe numbered i (PROBES order) draws `numpy.random.default_rng([seed, i])
.integers(0, n_units, size=(n_resamples, n_units))[b]`, so the same seed gives the same intervals.
N_RESAMPLES: a stability p estimated from B resamples has standard error sqrt(p (1 - p) / B), at most
0.5 / sqrt(B) (p = 0.5); B = 2500 keeps it at 0.01, so the 95% margin 1.96 x 0.01 stays within +-0.02.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from headlens.classify import kinds

N_RESAMPLES = 2500  # stability to +-0.02 at 95% (module docstring)
STABLE_MIN = 0.9  # a label kept in fewer resamples than this is borderline
CHUNK = 250  # resamples evaluated at a time (bounds the [chunk, layer, head, bucket] counts)
LEVEL = (2.5, 97.5)  # percentiles of the 95% interval


@dataclass
class Units:
    """One probe's per-unit sums. `ratios`: score column -> (numerator [unit, layer, head], denominator
    [unit, layer, head] or [unit, layer, 1]); `argmax`: (bucket counts [unit, layer, head, bucket],
    scored queries [unit, layer]) of the positional offset and share; `normal`: score column -> (score,
    standard error) [layer, head] for scores sampled from the vocabulary."""

    ratios: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    argmax: tuple[np.ndarray, np.ndarray] | None = None
    normal: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        arrays = [num for num, _ in self.ratios.values()] + ([self.argmax[0]] if self.argmax else [])
        return len(arrays[0]) if arrays else 0


def from_reducer(sums: torch.Tensor, n: torch.Tensor, n_units: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A reducer's per-unit totals ([layer, unit, head] sums, [layer, unit] counts) -> (numerator [unit, layer,
    head], denominator [unit, layer, 1]), the first `n_units` units kept."""
    num = sums.double().permute(1, 0, 2).numpy()  # [unit, layer, head]
    den = n.double().T[..., None].numpy()  # [unit, layer, 1]
    return (num, den) if n_units is None else (num[:n_units], den[:n_units])


def per_unit(values: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit scores [unit, layer, head] -> a ratio whose denominators are 1: the mean over units."""
    num = values.double().numpy()  # [unit, layer, head]
    return num, np.ones((len(num), num.shape[1], 1))


def draws(seed: int, probe: int, n_units: int, n_resamples: int) -> np.ndarray:
    """How often each unit is drawn in each resample: [n_resamples, n_units] (module docstring's recipe)."""
    picks = np.random.default_rng([seed, probe]).integers(0, n_units, size=(n_resamples, n_units))
    counts = np.zeros((n_resamples, n_units))
    np.add.at(counts, (np.repeat(np.arange(n_resamples), n_units), picks.ravel()), 1.0)
    return counts


def _ratio(counts: np.ndarray, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Resampled ratio scores [resample, layer, head] from draw counts [resample, unit]."""
    top = np.einsum("bu,ulh->blh", counts, num)  # [resample, layer, head]
    bottom = np.einsum("bu,ulh->blh", counts, den)  # [resample, layer, head or 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1.0), np.nan)


def _resampled(units: Units, counts: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One chunk of resamples of one probe: score column -> [resample, layer, head]."""
    out = {column: _ratio(counts, num, den) for column, (num, den) in units.ratios.items()}
    if units.argmax is not None:
        buckets, n = units.argmax
        summed = np.einsum("bu,ulhk->blhk", counts, buckets)  # [resample, layer, head, bucket]
        best = summed[..., :-1].argmax(-1)  # [resample, layer, head]; the last bucket is "further back"
        scored = np.einsum("bu,ul->bl", counts, n)[..., None]  # [resample, layer, 1]
        share = np.take_along_axis(summed, best[..., None], -1)[..., 0] / np.maximum(scored, 1.0)
        out.update(positional_offset=-best, positional_share=share)
    for column, (score, se) in units.normal.items():
        noise = rng.standard_normal((len(counts), *score.shape))  # [resample, layer, head]
        out[column] = score[None] + se[None] * noise
    return out


def bootstrap(units: dict[str, Units], fixed: dict[str, np.ndarray], config, n_resamples: int) -> dict:
    """Every probe's units resampled `n_resamples` times (`units`: probe -> Units; `fixed`: score column ->
    [layer, head], the frame's values). Returns {"samples": column -> [resample, layer, head] of the
    resampled columns, "earned": label -> [layer, head] resamples earning it}."""
    order = {name: index for index, name in enumerate(kinds.PROBES)}
    draw = {name: draws(config.seed, order[name], u.n_units, n_resamples) for name, u in units.items() if u.n_units}
    rngs = {name: np.random.default_rng([config.seed, len(order) + order[name]]) for name in units}
    samples: dict[str, list[np.ndarray]] = {}
    earned = {kind.label: 0 for kind in kinds.KINDS}
    for start in range(0, n_resamples, CHUNK):
        size = min(CHUNK, n_resamples - start)
        scores = {column: value[None] for column, value in fixed.items()}  # [1, layer, head]
        for name, probe_units in units.items():
            counts = draw[name][start : start + size] if name in draw else np.zeros((size, 0))  # [resample, unit]
            for column, value in _resampled(probe_units, counts, rngs[name]).items():
                scores[column] = value
                samples.setdefault(column, []).append(value.astype(np.float32))
        shape = (size, *next(iter(fixed.values())).shape)  # [resample, layer, head]
        for kind in kinds.KINDS:
            earned[kind.label] = earned[kind.label] + np.broadcast_to(kind.rule(scores, config), shape).sum(0)
    return {"samples": {c: np.concatenate(v) for c, v in samples.items()}, "earned": earned}


def interval(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile interval of resampled scores [resample, ...] -> (low, high) [...]; NaN resamples
    (a draw with nothing scored) left out."""
    if not np.isnan(samples).any():
        low, high = np.percentile(samples, LEVEL, axis=0)
        return low, high
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # heads with no score at all: NaN, said by the frame
        low, high = np.nanpercentile(samples, LEVEL, axis=0)
    return low, high


def add_columns(frame: pd.DataFrame, units: dict[str, Units], config) -> dict:
    """`frame` (one row per head, sorted by layer and head) gains `<score>_lo`, `<score>_hi`, `<label>_stability`
    and `borderline`; with `config.strict` its labels keep only the stable ones. Returns the facts for meta."""
    n_layers, n_heads = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
    n_resamples = config.resamples
    fixed = {s.column: frame[s.column].to_numpy(dtype=float).reshape(n_layers, n_heads) for s in kinds.SCORES}
    found = bootstrap(units, fixed, config, n_resamples)
    for column, samples in found["samples"].items():
        if kinds.BY_COLUMN[column].integer:
            continue
        low, high = interval(samples)
        frame[f"{column}_lo"], frame[f"{column}_hi"] = low.ravel(), high.ravel()
    for label, earned in found["earned"].items():
        frame[f"{label}_stability"] = (np.broadcast_to(earned, (n_layers, n_heads)) / n_resamples).ravel()
    frame["borderline"] = [
        [label for label in labels if row[f"{label}_stability"] < STABLE_MIN]
        for labels, row in zip(frame["labels"], frame.to_dict("records"), strict=True)
    ]
    if config.strict:
        frame["labels"] = [
            [label for label in labels if label not in weak]
            for labels, weak in zip(frame["labels"], frame["borderline"], strict=True)
        ]
    return {
        "resamples": n_resamples,
        "stable_min": STABLE_MIN,
        "units": {name: u.n_units for name, u in units.items() if u.n_units},
        "sampled": {name: sorted(u.normal) for name, u in units.items() if u.normal},
        "strict": bool(config.strict),
    }

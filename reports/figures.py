"""Static figures as PNG data URIs: matplotlib's Agg canvas directly (no pyplot, no global backend).

Every figure is readable without JavaScript. Colour scales are fixed per quantity so two reports
can be compared by eye.
"""

from __future__ import annotations

import base64
import io
import multiprocessing
import os

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter
from PIL import Image

from headlens.classify.labels import label_list
from headlens.reports.i18n import DEFAULT_LANG, number, short_number, t

# Dots per inch of embedded figures: sharp on screen, small enough for the 5 MB cap. Figures are built at
# the dpi they are saved at, so text is laid out once: heatmaps come out byte for byte as when built at
# matplotlib's default 100 and saved at 80 (line plots move by sub-pixel rounding), and faster.
FIGURE_DPI = 80
# Score heatmaps are drawn in worker processes forked from this one, at most this many at once (one per CPU
# this process may use): each is single-threaded matplotlib, and a large model's report has many.
MAX_FIGURE_WORKERS = 8
# Colour map of signed scores and deltas (blue below 0, red above, white at 0)
SIGNED_CMAP = "RdBu_r"
# Every cell gets its number up to this many cells (GPT-2 small has 144); a larger grid's numbers are in the
# label table (on SmolLM2's 270 cells they would also make each heatmap's PNG four times larger).
MAX_ANNOTATED_CELLS = 150
# A heatmap cell and its number: 0.75 in x 80 dpi = 60 px wide, numbers of 10 pt = 11 px (tiny's 2 x 4 map
# comes out about 460 x 240 px, readable without zooming).
CELL_INCHES, CELL_FONT_POINTS = 0.75, 10
# Models deeper than DEEP_LAYERS get heatmap rows of DEEP_ROW_INCHES (a 10 pt number and its margin), so a
# 30-layer map is ~750 px tall, not ~1,100.
DEEP_LAYERS, DEEP_ROW_INCHES = 16, 0.3
# Colours of a figure's palette PNG (median cut): gradients of the colour maps stay smooth at this many.
PALETTE_COLOURS = 256
# A rise of the best prefix-matching score (range 0..1) between two checkpoints that counts as a phase
# change (Olsson et al. 2022 see induction heads form within a small share of training); a run with no
# induction head drifts by ~0.001.
PHASE_LOW, PHASE_HIGH, PHASE_WINDOW_SHARE = 0.2, 0.5, 0.2  # < 0.2 -> > 0.5 within 1/5 of training


def png_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def figure_uri(fig: Figure) -> str:
    """Render a Figure on the Agg canvas and return it as a PNG data URI: a palette PNG of at most
    PALETTE_COLOURS colours (a third of the RGBA file's bytes for a heatmap, the colours indistinguishable)."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT).save(buffer, format="PNG", optimize=True)
    return png_uri(buffer.getvalue())


def row_inches(n_layers: int) -> float:
    """Height of a heatmap row: 0.7 of a cell's width, down to a line of its number for a deep model."""
    return 0.7 * CELL_INCHES if n_layers <= DEEP_LAYERS else DEEP_ROW_INCHES


def pivot_heads(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """Long (layer, head, value) -> wide [layer x head]; missing heads stay NaN."""
    return frame.pivot_table(index="layer", columns="head", values=column, aggfunc="first", dropna=False)


def _heatmap(
    grid: pd.DataFrame, *, cmap: str, vmin: float, vmax: float, label: str, lang: str
) -> tuple[Figure, object]:
    import seaborn as sns

    n_layers, n_heads = grid.shape
    fig = Figure(
        figsize=(max(5.0, CELL_INCHES * n_heads + 2.0), max(3.0, row_inches(n_layers) * n_layers + 1.4)), dpi=FIGURE_DPI
    )
    ax = fig.add_subplot()
    values = grid.to_numpy(dtype=float)  # [layer, head]
    annot = (
        np.vectorize(lambda v: "" if np.isnan(v) else number(v, lang))(values)
        if grid.size <= MAX_ANNOTATED_CELLS
        else False
    )  # numbers in the report's language
    sns.heatmap(
        grid,
        ax=ax,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        annot=annot,
        fmt="",
        annot_kws={"fontsize": CELL_FONT_POINTS},
        linewidths=0.5,
        linecolor="white",
        cbar_kws={"label": label},
    )
    ax.collections[0].colorbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: short_number(v, lang)))
    ax.set_xlabel(t("fig.head", lang))
    ax.set_ylabel(t("fig.layer", lang))
    return fig, ax


def score_heatmap_uri(
    frame: pd.DataFrame,
    column: str,
    *,
    vmin: float,
    vmax: float,
    threshold: float | None,
    lang: str = DEFAULT_LANG,
    label: str | None = None,
) -> str:
    """Layer x head heatmap of one score; cells at or above `threshold` are outlined in black. A score whose
    label rests on another score (`label`, with `threshold` None) outlines the heads carrying that label
    instead (frame's `labels`). A signed score (vmin < 0 < vmax: a direct effect in logits) is drawn in a
    diverging map, white at 0."""
    grid = pivot_heads(frame, column)
    cmap = SIGNED_CMAP if vmin < 0 < vmax else "viridis"
    fig, ax = _heatmap(grid, cmap=cmap, vmin=vmin, vmax=vmax, label=column, lang=lang)
    if label is not None and "labels" in frame:
        for row in frame.itertuples():
            if label in label_list(row.labels):
                ax.add_patch(Rectangle((int(row.head), int(row.layer)), 1, 1, fill=False, edgecolor="black", lw=2))
        ax.set_title(t("fig.outlined_label", lang, label=label), fontsize=8)
    if threshold is not None:
        values = grid.to_numpy(dtype=float)  # [layer, head]
        for row, col in zip(*np.nonzero(np.nan_to_num(values, nan=-np.inf) >= threshold), strict=True):
            ax.add_patch(Rectangle((col, row), 1, 1, fill=False, edgecolor="black", linewidth=2))
        colorbar = ax.collections[0].colorbar
        if vmin <= threshold <= vmax:
            colorbar.ax.axhline(threshold, color="red", linewidth=2)
        ax.set_title(t("fig.outlined", lang, threshold=short_number(threshold, lang)), fontsize=8)
    return figure_uri(fig)


def score_heatmap_uris(frame: pd.DataFrame, jobs: list[dict], lang: str = DEFAULT_LANG) -> list[str]:
    """score_heatmap_uri(frame, **job, lang=lang) for each job (its `column`, `vmin`, `vmax`, `threshold`), in
    order, the same PNG bytes as one at a time. Several go to worker processes forked from this one (fork:
    the workers start without importing anything again); where fork is not available, or with one CPU,
    they are drawn here one after another. The workers draw only: they never touch the model or torch."""
    workers = min(len(jobs), MAX_FIGURE_WORKERS, len(os.sched_getaffinity(0)))
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [_heatmap_job(frame, job, lang) for job in jobs]
    tasks = [(frame[columns(frame, job)], job, lang) for job in jobs]  # a worker gets its columns only
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.starmap(_heatmap_job, tasks, chunksize=1)


def columns(frame: pd.DataFrame, job: dict) -> list[str]:
    """The columns of `frame` a heatmap job reads: the head, its score, and the labels when it outlines a label."""
    return ["layer", "head", job["column"]] + (["labels"] if job.get("label") and "labels" in frame else [])


def _heatmap_job(frame: pd.DataFrame, job: dict, lang: str) -> str:
    return score_heatmap_uri(frame, lang=lang, **job)


def plain_text(text: str) -> str:
    """`text` as matplotlib draws it literally: a `$` would start mathtext."""
    return text.replace("$", r"\$")


def delta_heatmap_uri(
    sweep: pd.DataFrame, lang: str = DEFAULT_LANG, column: str = "delta_loss", label: str | None = None
) -> str:
    """Layer x head heatmap of one metric's change (`column`, its axis `label`: default delta loss),
    diverging around 0 (red: the metric rose)."""
    grid = pivot_heads(sweep, column)
    bound = float(np.nanmax(np.abs(grid.to_numpy(dtype=float)))) or 1.0
    label = plain_text(label or t("fig.delta_loss", lang))
    fig, _ = _heatmap(grid, cmap=SIGNED_CMAP, vmin=-bound, vmax=bound, label=label, lang=lang)
    return figure_uri(fig)


def ablation_bars_uri(rows: list[dict], lang: str = DEFAULT_LANG, label: str | None = None) -> str:
    """Bar chart of one metric's change with 95% confidence intervals; rows have label, delta, low,
    high; `label` names the axis (default: delta loss). Rows of two metrics never share a chart."""
    fig = Figure(figsize=(max(3.5, 0.6 * len(rows) + 1.5), 2.8), dpi=FIGURE_DPI)
    ax = fig.add_subplot()
    deltas = np.array([row["delta"] for row in rows], dtype=float)
    low = np.array([row["low"] for row in rows], dtype=float)
    high = np.array([row["high"] for row in rows], dtype=float)
    errors = np.vstack([np.clip(deltas - low, 0, None), np.clip(high - deltas, 0, None)])  # [2, bars]
    ax.bar(range(len(rows)), deltas, yerr=np.nan_to_num(errors), capsize=4, color="#c0504d")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [row["label"] for row in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(plain_text(label or t("fig.delta_loss", lang)))
    return figure_uri(fig)


def pruning_curve_uri(pruning: pd.DataFrame, lang: str = DEFAULT_LANG) -> str:
    """Loss against the fraction of heads removed (Michel et al. 2019 iterative pruning)."""
    fig = Figure(figsize=(4.5, 2.8), dpi=FIGURE_DPI)
    ax = fig.add_subplot()
    ax.plot(pruning["fraction_removed"], pruning["loss"], marker="o")
    ax.set_xlabel(t("fig.fraction_removed", lang))
    ax.set_ylabel(t("fig.loss", lang))
    ax.grid(alpha=0.3)
    return figure_uri(fig)


def training_uri(log: pd.DataFrame, heads: pd.DataFrame | None, lang: str = DEFAULT_LANG) -> str:
    """Loss curves and induction / ICL scores per checkpoint, the phase change marked."""
    fig = Figure(figsize=(13, 3.6), dpi=FIGURE_DPI)
    loss_ax, score_ax, head_ax = fig.subplots(1, 3)
    for column in ("train_loss", "heldout_loss", "repeat_loss_first", "repeat_loss_second"):
        if column in log:
            loss_ax.plot(log["step"], log[column], label=column)
    loss_ax.set(xlabel=t("fig.step", lang), ylabel=t("fig.loss", lang), title=t("fig.loss_title", lang))
    for column in ("best_induction_score", "best_prev_token_score", "icl_score"):
        if column in log:
            score_ax.plot(log["step"], log[column], label=column)
    score_ax.set(xlabel=t("fig.step", lang), title=t("fig.scores_title", lang))
    if heads is not None and len(heads) and "prefix_matching_score" in heads:
        for (layer, head), rows in heads.groupby(["layer", "head"]):
            head_ax.plot(rows["step"], rows["prefix_matching_score"], linewidth=1, label=f"{layer}.{head}")
    head_ax.set(xlabel=t("fig.step", lang), title=t("fig.heads_title", lang))
    change = phase_change_step(log)
    for ax in (loss_ax, score_ax, head_ax):
        if change is not None:
            ax.axvline(change, color="grey", linestyle="--", linewidth=1)
        if ax.lines:
            ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return figure_uri(fig)


def phase_change_step(log: pd.DataFrame) -> int | None:
    """The first checkpoint whose best induction score exceeds PHASE_HIGH after one below PHASE_LOW at
    most PHASE_WINDOW_SHARE of the run earlier (our reading of Olsson et al. 2022: induction heads
    form abruptly); None when no such rise exists."""
    if "best_induction_score" not in log or len(log) < 2:
        return None
    steps = log["step"].to_numpy(dtype=float)
    scores = log["best_induction_score"].to_numpy(dtype=float)
    window = PHASE_WINDOW_SHARE * (steps.max() - steps.min())
    for index in np.flatnonzero(scores > PHASE_HIGH):
        earlier = (steps < steps[index]) & (steps >= steps[index] - window)
        if (scores[earlier] < PHASE_LOW).any():
            return int(steps[index])
    return None


# Thumbnails: weights outside the first column in viridis, scaled per head to their THUMB_QUANTILE
# quantile (the few larger weights show at the brightest colour, so one outlier cannot darken the rest); the first
# column (the first token, where attention sinks park) in white -> red on a fixed 0..1 scale; the
# causal mask (key after query) in light grey, so "masked" never reads as "zero attention".
THUMB_CMAP, SINK_CMAP, MASKED_RGB = "viridis", "Reds", (0.88, 0.88, 0.88)
THUMB_QUANTILE = 0.99


def pattern_image_uri(pattern: np.ndarray) -> tuple[str, float]:
    """One head's pattern [q_pos, k_pos] as a PNG data URI, one pixel per weight (the page scales it up
    with `image-rendering: pixelated`), and the weight the brightest colour stands for."""
    import matplotlib.image

    n = pattern.shape[-1]
    weights = np.clip(np.asarray(pattern, dtype=np.float64), 0.0, 1.0)  # [q_pos, k_pos]
    causal = np.tril(np.ones((n, n), dtype=bool))  # [q_pos, k_pos]
    rest = weights[:, 1:][causal[:, 1:]]  # weights outside the first column
    vmax = float(np.quantile(rest, THUMB_QUANTILE)) if rest.size else 0.0
    if vmax <= 0:  # almost every weight is 0: scale to the largest instead (1 for an all-zero pattern)
        vmax = float(rest.max()) if rest.size and rest.max() > 0 else 1.0
    rgb = matplotlib.colormaps[THUMB_CMAP](np.clip(weights / vmax, 0.0, 1.0))[..., :3]  # [q_pos, k_pos, 3]
    rgb[:, 0] = matplotlib.colormaps[SINK_CMAP](weights[:, 0])[..., :3]  # [q_pos, 3]
    rgb[~causal] = MASKED_RGB
    buffer = io.BytesIO()
    matplotlib.image.imsave(buffer, rgb, format="png")
    return png_uri(buffer.getvalue()), vmax

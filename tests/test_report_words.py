"""The report's own record of a run, in words: the sample text quoted once, the pruning page named and
summarised as the CLI prints it."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pandas as pd

from headlens.reports import render
from headlens.results import Result
from tests.helpers.report_inputs import MODEL_INFO, training_pair


def _page(**results) -> str:
    return render.build_page(
        model_info=MODEL_INFO,
        command="headlens x",
        text_label="t.txt",
        lang="en",
        **{
            name: results.get(name)
            for name in ("heads", "sweep", "ablation", "pruning", "validation", "training", "viewer")
        },
    )


def test_repeated_sample_is_quoted_once():
    assert render.once("abcabc", True) == "abc" and render.once("abcabd", True) == "abcabd"
    assert render.once("abcabc", False) == "abcabc"


def test_pruning_page_is_titled_pruning_and_summarised():
    curve = pd.DataFrame(
        {
            "step": [0, 1, 2],
            "n_removed": [0, 2, 4],
            "fraction_removed": [0.0, 0.25, 0.5],
            "heads_removed": ["", "0.1,1.2", "0.1,1.2,0.0,1.1"],
            "loss": [3.0, 3.1, 3.6],
        }
    )
    order = {
        "n_labelled": 2,
        "n_unlabelled": 6,
        "mean_rank_labelled": 6.5,
        "mean_rank_unlabelled": 3.5,
        "p_value": 0.04,
    }
    meta = {"heads_within": 2, "n_heads": 8, "tolerance": 0.05, "removal_by_role": order}
    page = _page(pruning=Result("pruning", curve, meta))
    assert "<title>headlens report: hand-made</title>" in page or "hand-made" in page
    assert '<a href="#ablation">Pruning</a>' in page
    assert "2 of 8 heads can go within +5% loss" in page
    assert "p = 0.04" in page


def test_score_heatmaps_are_drawn_large_enough_to_read():
    """A cell of at least 50 px (numbers of 10 pt = 11 px at the figures' 80 dpi), for tiny's 2 x 4 heads."""
    import base64
    import io

    from PIL import Image

    from headlens.reports import figures

    heads = pd.DataFrame(
        [{"layer": layer, "head": head, "prev_token_score": 0.1 * head} for layer in range(2) for head in range(4)]
    )
    uri = figures.score_heatmap_uri(heads, "prev_token_score", vmin=0, vmax=1, threshold=0.4, lang="es")
    width, height = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).size
    assert width >= 4 * 50 + 150 and height >= 2 * 40 + 80, (width, height)
    assert figures.CELL_FONT_POINTS * figures.FIGURE_DPI / 72 >= 10  # cell numbers of 10 px or more


def test_the_training_note_says_the_last_icl_scores_sign_in_words():
    """The plot's y axis says "more negative is better"; the note beside it says which side the last
    checkpoint is on, in each language, so a positive score is not read as a gain."""

    from headlens.reports import sections

    training = training_pair()

    def with_icl(training, last):
        """The training log with its last ICL score set to `last`."""
        log = training.frame
        return Result("training", log.assign(icl_score=[*log["icl_score"][:-1], last]), tables=training.tables)

    for last, words in (
        (-0.4, "-0.400 nats on the logged windows: late tokens are predicted better"),
        (0.136, "+0.136 nats on the logged windows: late tokens are not predicted better"),
    ):
        html = sections.training_section(with_icl(training, last))
        assert words in html, html
    spanish = sections.training_section(with_icl(training, 0.136), lang="es")
    assert "+0,136" in spanish


def test_score_heatmaps_drawn_in_worker_processes_are_the_ones_drawn_here(monkeypatch):
    """score_heatmap_uris forks workers for several heatmaps (here with two CPUs allowed, whatever the machine
    has); each PNG is byte for byte the one score_heatmap_uri draws in this process, in the jobs' order.
    Without fork (not Linux) it draws them here, the same bytes."""
    from headlens.reports import figures

    rng = np.random.default_rng(0)
    heads = pd.DataFrame([{"layer": layer, "head": head} for layer in range(3) for head in range(4)])
    jobs = []
    for n, (vmin, vmax, threshold) in enumerate([(0, 1, 0.4), (-2, 2, None), (0, 1, None)]):
        heads[f"score_{n}"] = rng.uniform(vmin, vmax, len(heads))
        jobs.append({"column": f"score_{n}", "vmin": vmin, "vmax": vmax, "threshold": threshold})
    pools = []
    real = multiprocessing.get_context

    def counting(method=None):
        pools.append(method)
        return real(method)

    monkeypatch.setattr(figures.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(figures.multiprocessing, "get_context", counting)
    drawn = figures.score_heatmap_uris(heads, jobs, lang="es")
    forks = "fork" in multiprocessing.get_all_start_methods()
    assert pools == (["fork"] if forks else [])  # drawn by workers where fork exists
    here = [figures.score_heatmap_uri(heads, lang="es", **job) for job in jobs]
    assert drawn == here and len(set(drawn)) == 3

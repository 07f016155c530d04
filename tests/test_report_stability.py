"""The report's "How stable are these labels" section (reports/stability.py) against the classification it
reads: its borderline rows are the frame's borderline labels, and each role's plotted count at the chosen
cut-off is the number of heads carrying the label."""

from __future__ import annotations

import numpy as np
import pytest

from headlens.classify import ClassifyConfig, classify_heads, kinds
from headlens.classify.labels import config_with_thresholds
from headlens.load.models import load_model
from headlens.reports.i18n import t
from headlens.reports.stability import _config, borderline_rows, labelled_counts, stability_section

# A sink cut-off inside the tiny model's first-token scores (0.2: head 1.2 scores 0.205 on the shipped text)
CONFIG = config_with_thresholds(ClassifyConfig(n_seq=4, max_windows=8), ["first_token=0.2"])


@pytest.fixture(scope="module")
def heads():
    return classify_heads(load_model("tiny"), config=CONFIG)


def test_borderline_rows_are_the_frames_borderline_labels(heads):
    frame = heads.frame
    expected = {(f"{r.layer}.{r.head}", label) for r in frame.itertuples() for label in r.borderline}
    rows = borderline_rows(frame, heads.meta)
    assert set(zip(rows["head"], rows["label"], strict=True)) == expected
    for row in rows.itertuples():
        assert row.stability < 0.9 and row.low <= row.value <= row.high


def test_the_plot_counts_at_the_chosen_cut_off_are_the_labelled_heads(heads):
    frame, config = heads.frame, _config(heads.meta)
    for kind in kinds.KINDS:
        th = kinds.THRESHOLD_OF.get(kind.score)
        if th is None:
            continue
        (count,) = labelled_counts(frame, kind.label, config, np.array([getattr(config, th.field)]))
        assert count == sum(kind.label in labels for labels in frame["labels"]), kind.label


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_section_is_written_in_the_pages_language(heads, lang):
    html = stability_section(heads, lang)
    assert t("stability.title", lang) in html and "<img" in html
    if len(borderline_rows(heads.frame, heads.meta)):
        assert t("stability.table_intro", lang) in html

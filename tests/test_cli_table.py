"""`headlens classify`'s default table fits the terminal (COLUMNS fixes its width here): the labelled heads, each
with the scores that earned it, short and left-aligned; `--format full` keeps every head and score column."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from headlens.classify.kinds import BY_LABEL, LABELS
from headlens.cli.commands_classify import _labelled_table
from headlens.cli.main import cli
from headlens.reports.i18n import significant

ARGS = ["classify", "tiny", "--n-seq", "2", "--max-windows", "2", "--no-needles", "--no-progress"]


def every_evidence_row(layer: int, head: int, labels: list[str]) -> dict:
    """A head carrying `labels`, each evidence column set to a value with more digits than the table shows."""
    row = {"layer": layer, "head": head, "labels": labels}
    for label in labels:
        for column in BY_LABEL[label].evidence:
            row[column] = 0.123456 + layer / 100
    return row


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_the_table_fits_the_width_and_keeps_every_label_and_score_whole(width):
    """The worst case: heads that carry every label, so their evidence is every score column."""
    frame = pd.DataFrame(
        [every_evidence_row(layer, 0, list(LABELS)) for layer in range(12)] + [{"layer": 12, "head": 0, "labels": []}]
    )
    text = _labelled_table(frame, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert "12 of 13 heads carry a label" in text
    for label in LABELS:
        assert text.count(label) >= 12  # whole, never split across lines
    value = "0.223"  # layer 10's 0.223456 to 3 significant figures
    assert all(f"{column.removesuffix('_score')} {value}" in text for column in BY_LABEL["induction"].evidence)


def test_the_scores_are_left_aligned_under_their_heading():
    frame = pd.DataFrame([every_evidence_row(0, 1, ["induction"]), every_evidence_row(3, 10, ["first_token"])])
    lines = _labelled_table(frame, 100).splitlines()
    start = lines[0].index("scores")
    assert lines[1][start:].startswith("prefix_matching 0.123, copying 0.123")
    assert lines[2][start:].startswith("first_token 0.153")
    assert lines[2][: start - 1].rstrip() == "3.10  first_token"


@pytest.mark.slow
def test_classify_prints_a_table_that_fits_100_columns():
    runner = CliRunner(env={"COLUMNS": "100"})
    heads = json.loads(runner.invoke(cli, [*ARGS, "--format", "json"]).stdout)
    result = runner.invoke(cli, ARGS)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, result.stdout
    labelled = [head for head in heads if head["labels"]]
    assert lines[-1].startswith(f"{len(labelled)} of {len(heads)} heads carry a label")
    first_lines = {line.split()[0]: line for line in lines[1:-1] if not line.startswith(" ")}
    for head in labelled:
        line = first_lines[f"{head['layer']}.{head['head']}"]
        column = BY_LABEL[head["labels"][0]].evidence[0]
        value = head[column]
        shown = int(value) if column == "positional_offset" else significant(value, "en", 3)  # the report's style
        assert f"{column.removesuffix('_score')} {shown}" in result.stdout
        assert line.split()[1].rstrip(",") == head["labels"][0]
    full = runner.invoke(cli, [*ARGS, "--format", "full"]).stdout.splitlines()
    assert len(full) == len(heads) + 1 and "prefix_matching_score" in full[0]

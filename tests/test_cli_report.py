"""`headlens report` through click's CliRunner: end to end on a small model, and every bad input."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

from headlens.cli.main import cli

EXIT_BAD_INPUT = 2


def run(*args: str):
    return CliRunner().invoke(cli, ["report", *args])


def test_reproduce_command_is_the_command_as_typed_and_names_the_page():
    """The page's command: every option typed (the placement options too), in shell quoting, and the file
    written even when --out was left at its default; nothing the user did not type."""
    import click

    from headlens.cli.commands_report import report_command
    from headlens.cli.options import command_line

    seen = {}

    def record(ctx, **kwargs):
        seen["line"] = command_line(ctx, keep=("out",))

    spy = click.Command("report", params=report_command.params, callback=click.pass_context(record))
    CliRunner().invoke(spy, ["my model", "--text", "a b.txt", "--heads", "0.1,1.2", "--sweep", "--seed", "3"])
    assert shlex.split(seen["line"]) == [
        *("headlens", "report", "my model", "--text", "a b.txt", "--heads", "0.1,1.2", "--sweep", "--out"),
        *("out/report.html", "--seed", "3"),
    ]
    CliRunner().invoke(spy, ["tiny", "--lang", "es", "--dtype", "bfloat16", "--out", "r.html"])
    assert shlex.split(seen["line"]) == [
        *("headlens", "report", "tiny", "--out", "r.html", "--lang", "es", "--dtype", "bfloat16"),
    ]


@pytest.fixture(scope="module")
def small_report(small_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "sub" / "report.html"  # a missing folder is created
    result = run(str(small_model_dir), "--heads", "0.1,1.2", "--sweep", "--out", str(out), "--dtype", "float32")
    return result, out


@pytest.mark.slow
def test_report_end_to_end_on_a_small_model(small_report, small_model_dir):
    result, out = small_report
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"wrote {out}"
    html = out.read_text(encoding="utf-8")
    for section_id in ("summary", "scores", "thumbnails", "viewer", "ablation", "validation"):
        assert f'<section id="{section_id}">' in html
    assert "0.1,1.2" in html  # the two chosen heads ablated together
    assert "Every head alone" in html and "Pruning curve" not in html  # --prune not asked for
    command = re.search(r'<pre class="command">(.*?)</pre>', html).group(1)
    assert "--heads 0.1,1.2 --sweep --out" in command and str(small_model_dir) in command
    assert command.endswith("--dtype float32")  # a placement option typed is a placement option recorded


def test_chosen_heads_with_a_sweep_are_ablated_together_only(monkeypatch):
    """With a sweep, each chosen head alone is the sweep's row: build_report ablates them together once, and
    never re-encodes a sweep row as an ablation record."""
    from headlens.heads import Head
    from headlens.reports import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "ablate_heads", lambda loaded, heads, **kw: calls.append(heads) or {"heads": heads})
    heads = [Head(1, 2), Head(0, 1)]
    assert pipeline.chosen_ablations(None, heads, None, 0, False, alone=False) == [{"heads": heads}]
    assert calls == [heads]
    calls.clear()
    pipeline.chosen_ablations(None, heads, None, 0, False, alone=True)
    assert calls == [[Head(1, 2)], [Head(0, 1)], heads]


def test_two_languages_are_drawn_from_one_run(monkeypatch, tmp_path):
    """`--lang en,es`: build_report runs once; the English page goes to --out, the Spanish one beside it."""
    import pandas as pd

    from headlens.reports import pipeline
    from headlens.results import Result

    runs = []
    validation = pd.DataFrame(
        {"layer": [0], "quantity": ["z"], "reference": ["sdpa"], "max_abs_error": [1e-7], "tolerance": [1e-5],
         "passed": [True]}
    )  # fmt: skip

    def fake_build(loaded, **kwargs):
        runs.append(kwargs)
        checks = Result("validation", validation)
        return pipeline.ReportResults(model_info={"name": "fake"}, validation=checks, command=kwargs["command"])

    monkeypatch.setattr(pipeline, "build_report", fake_build)
    monkeypatch.setattr("headlens.load.models.load_model", lambda name, **placement: None)
    out = tmp_path / "r.html"
    result = run("tiny", "--lang", "en,es", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert len(runs) == 1
    assert result.stdout.split() == ["wrote", str(out), "wrote", str(tmp_path / "r.es.html")]
    assert '<html lang="en">' in out.read_text() and '<html lang="es">' in (tmp_path / "r.es.html").read_text()
    bad = run("tiny", "--lang", "en,de", "--out", str(out))
    assert bad.exit_code == EXIT_BAD_INPUT and "unknown report language 'de'" in bad.stderr


# Errors: one line on stderr, exit 2, nothing half-written


def assert_one_line_error(result, *fragments: str):
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error:"), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_output_path_that_is_a_directory(tmp_path):
    assert_one_line_error(run("tiny", "--out", str(tmp_path)), "is a directory")


def test_output_path_below_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(run("tiny", "--out", str(blocker / "r.html")), "cannot create the folder")
    assert blocker.read_text() == "x"


def test_missing_text_file(tmp_path):
    assert_one_line_error(
        run("tiny", "--text", str(tmp_path / "none.txt"), "--out", str(tmp_path / "r.html")), "not found"
    )
    assert not (tmp_path / "r.html").exists()


def test_empty_text_file(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert_one_line_error(run("tiny", "--text", str(empty), "--out", str(tmp_path / "r.html")), "empty")


def test_bad_head_spec_fails_before_the_work(small_model_dir, tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old report")
    assert_one_line_error(run(str(small_model_dir), "--heads", "7.0", "--out", str(out)), "7.0")
    assert out.read_text() == "old report"


def test_unknown_language(tmp_path):
    assert_one_line_error(
        run("tiny", "--lang", "fr", "--out", str(tmp_path / "r.html")),
        "unknown report language 'fr': choose one of en, es",
    )
    assert not (tmp_path / "r.html").exists()


def test_report_errors_in_the_chosen_language(tmp_path):
    assert_one_line_error(run("tiny", "--lang", "es", "--out", str(tmp_path)), "es una carpeta")


@pytest.mark.slow
def test_spanish_report_end_to_end(small_model_dir, tmp_path):
    out = tmp_path / "es.html"
    result = run(str(small_model_dir), "--heads", "0.1", "--lang", "es", "--out", str(out))
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    assert '<html lang="es">' in html and "Qué hacen las cabezas" in html and "Cabezas elegidas" in html
    assert "--lang es" in re.search(r'<pre class="command">(.*?)</pre>', html).group(1)


def test_unknown_model(tmp_path):
    assert_one_line_error(run(str(tmp_path / "no-such-model"), "--out", str(tmp_path / "r.html")))


@pytest.mark.slow
def test_report_sets_role_heads_against_random_controls(tmp_path):
    """On the shipped model the report ablates its induction heads on `repeat` and its retrieval heads
    on `needle`, each against random head sets; with --controls 0 it skips them."""
    out = tmp_path / "r.html"
    result = run("tiny", "--controls", "4", "--no-progress", "--out", str(out))
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")
    assert "heads labelled induction" in html and "heads labelled retrieval" in html
    assert "--controls 4" in re.search(r'<pre class="command">(.*?)</pre>', html).group(1)
    skipped = tmp_path / "none.html"
    assert run("tiny", "--controls", "0", "--no-progress", "--out", str(skipped)).exit_code == 0
    assert "heads labelled induction" not in skipped.read_text(encoding="utf-8")

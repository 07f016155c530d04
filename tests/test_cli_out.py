"""`--out FILE` on every command: one file, its format from its suffix (.csv, .json, .html), never a folder;
a bad path or suffix is one line naming --out and exit 2 before any work; with --out, stdout gets a short
summary naming the file instead of the table. `--out-dir DIR` is the folder of the commands that write
several files."""

from __future__ import annotations

import json
import os
from io import StringIO

import pandas as pd
import pytest
from click.testing import CliRunner

import headlens.load.models
from headlens.cli.main import cli

# command line up to --out, the suffixes it takes, one it does not
COMMANDS = {
    "classify": (["classify", "tiny"], (".csv", ".json", ".html")),
    "ablate": (["ablate", "tiny", "--heads", "0.0"], (".csv", ".json", ".html")),
    "prune": (["prune", "tiny"], (".csv", ".json", ".html")),
    "circuit": (["circuit", "tiny"], (".json", ".html")),
    "validate": (["validate", "tiny"], (".csv", ".json")),
    "report": (["report", "tiny"], (".html",)),
}


def run(*args):
    return CliRunner().invoke(cli, [str(arg) for arg in args])


def one_line_error(result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("headlens: error: --out "), result.stderr
    assert result.stdout == ""
    return lines[0]


@pytest.fixture
def no_work(monkeypatch):
    """A refusal must come before the model is loaded."""

    def never(*args, **kwargs):
        raise AssertionError("the work started before --out was checked")

    monkeypatch.setattr(headlens.load.models, "load_model", never)


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("name", COMMANDS)
def test_an_unknown_suffix_is_one_line_naming_the_suffixes_taken(tmp_path, name):
    command, suffixes = COMMANDS[name]
    for target in (tmp_path / "x.txt", tmp_path / "no-suffix"):
        line = one_line_error(run(*command, "--out", target))
        assert str(target) in line and " or ".join(suffixes) in line
        assert not target.exists()  # no folder made in its place


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("name", COMMANDS)
def test_an_existing_folder_named_like_a_file_is_refused(tmp_path, name):
    command, suffixes = COMMANDS[name]
    folder = tmp_path / f"results{suffixes[0]}"
    folder.mkdir()
    (folder / "keep").write_text("kept")
    line = one_line_error(run(*command, "--out", folder))
    assert "is a directory" in line and "report.html" not in line
    assert (folder / "keep").read_text() == "kept" and sorted(os.listdir(folder)) == ["keep"]


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("name", COMMANDS)
def test_a_device_is_one_line_naming_out(name):
    """/dev/full is only looked at (lstat) and refused; it is never opened."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    line = one_line_error(run(*COMMANDS[name][0], "--out", "/dev/full"))
    assert "--out /dev/full is a character device" in line and "--out-dir" not in line


@pytest.mark.usefixtures("no_work")
def test_train_tiny_takes_a_folder_only_as_out_dir(tmp_path):
    result = run("train-tiny", "--out", tmp_path / "run")
    assert result.exit_code == 2 and "--out-dir" in result.stderr
    assert not (tmp_path / "run").exists()


def summary(result, path) -> str:
    """The one line stdout holds with --out FILE; it names the file."""
    assert result.exit_code == 0, (result.output, result.exception)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"wrote {path}"), result.stdout
    return lines[0]


@pytest.mark.slow
def test_classify_out_files_hold_what_the_formats_print(tmp_path):
    args = ["classify", "tiny", "--n-seq", "2", "--max-windows", "2", "--no-needles", "--no-progress"]
    printed = json.loads(run(*args, "--format", "json").stdout)
    as_json, as_csv = tmp_path / "heads.json", tmp_path / "heads.csv"
    line = summary(run(*args, "--out", as_json), as_json)
    key = lambda head: (head["layer"], head["head"])  # noqa: E731 - the printed table is ranked, the file in order
    printed.sort(key=key)
    assert sorted(json.loads(as_json.read_text()), key=key) == printed
    labelled = sum(1 for head in printed if head["labels"])
    assert line.startswith(f"{len(printed)} heads, {labelled} with a label")
    for role in {label for head in printed for label in head["labels"]}:
        assert f"{role} {sum(role in head['labels'] for head in printed)}" in line  # heads per role
    summary(run(*args, "--out", as_csv), as_csv)
    table = pd.read_csv(as_csv, keep_default_na=False)
    assert [f"{r.layer}.{r.head}" for r in table.itertuples()] == [f"{h['layer']}.{h['head']}" for h in printed]
    assert list(table["labels"]) == [";".join(head["labels"]) for head in printed]
    page = tmp_path / "page.html"
    summary(run(*args, "--out", page), page)
    assert page.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.slow
def test_ablate_out_is_a_file_and_out_dir_a_folder(tmp_path):
    args = ["ablate", "tiny", "--heads", "0.0", "--tokens", "256", "--no-progress"]
    printed = json.loads(run(*args, "--format", "json").stdout)
    out = tmp_path / "abl.json"
    line = summary(run(*args, "--out", out), out)
    assert out.is_file() and json.loads(out.read_text()) == printed
    assert f"delta {printed['delta']:+.3g}" in line
    as_csv = tmp_path / "abl.csv"
    summary(run(*args, "--out", as_csv), as_csv)
    row = pd.read_csv(as_csv, dtype={"heads": str}).iloc[0]
    assert row["heads"] == "0.0" and row["delta"] == pytest.approx(printed["delta"], rel=1e-12)
    folder = tmp_path / "runs"
    assert run(*args, "--out-dir", folder).exit_code == 0
    assert json.loads((folder / "ablation.json").read_text())["delta"] == pytest.approx(printed["delta"])


@pytest.mark.slow
def test_validate_and_circuit_write_their_documents(tmp_path):
    printed = json.loads(run("validate", "tiny", "--format", "json").stdout)
    out = tmp_path / "v.csv"
    line = summary(run("validate", "tiny", "--out", out), out)
    table = pd.read_csv(out)
    assert len(table) == len(printed["rows"]) and line.startswith(f"{len(table)} comparisons")
    assert list(table.columns) == list(printed["rows"][0])
    doc = tmp_path / "c.json"
    line = summary(run("circuit", "tiny", "--no-progress", "--out", doc), doc)
    written = json.loads(doc.read_text())
    assert {"heads", "edges", "task"} <= set(written)
    assert line.startswith(f"task induction: {len(written['heads'])} heads, {len(written['edges'])} edges")


@pytest.mark.slow
def test_prune_writes_its_curve(tmp_path):
    args = ["prune", "tiny", "--tokens", "all", "--no-roles", "--no-progress"]
    printed = json.loads(run(*args, "--format", "json").stdout)
    out = tmp_path / "curve.csv"
    line = summary(run(*args, "--out", out), out)
    curve = pd.read_csv(StringIO(out.read_text()))
    assert len(curve) == len(printed["curve"])
    assert line.startswith(f"{printed['heads_within_tolerance']} of {printed['n_heads']} heads can go")

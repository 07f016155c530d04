"""What the command line says on bad input and where it wrote: one line on stderr, exit status 2, before
any work is done, in the user's words (options, not internal field names)."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from headlens.classify import request
from headlens.cli import commands_classify
from headlens.cli.main import cli
from headlens.files import shipped_path


def _one_line_error(result, fragment: str) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    return lines[0]


@pytest.mark.parametrize("seq_len", ["1", "2", str(commands_classify.MIN_SEQ_LEN - 1)])
def test_periods_below_the_minimum_are_refused_with_the_reason(seq_len):
    line = _one_line_error(
        CliRunner().invoke(cli, ["classify", "tiny", "--seq-len", seq_len]),
        f"{seq_len} is below {commands_classify.MIN_SEQ_LEN}",
    )
    assert "induction" in line


def test_threshold_out_of_range_names_the_option_not_the_field():
    line = _one_line_error(
        CliRunner().invoke(cli, ["classify", "tiny", "--threshold", "prefix_matching=7"]),
        "--threshold prefix_matching=7.0 is out of range: a number in [0, 1]",
    )
    assert "prefix_matching_min" not in line


def test_work_larger_than_the_memory_is_refused_before_it_starts(monkeypatch):
    """The repeat probe's tokens alone: 8 bytes x n_seq x (1 + 25 x 4) > half the memory free."""
    import os

    page, free_pages = os.sysconf("SC_PAGE_SIZE"), 2**20  # 4 GiB free with 4 KiB pages
    monkeypatch.setattr(os, "sysconf", lambda name: free_pages if name == "SC_AVPHYS_PAGES" else page)
    free = free_pages * page
    n_seq = int(request.MAX_MEMORY_SHARE * free / (8 * 101)) + 1  # just past the limit
    line = _one_line_error(
        CliRunner().invoke(cli, ["classify", "tiny", "--n-seq", str(n_seq)]), f"--n-seq {n_seq} is too large"
    )
    assert "GiB" in line
    request.check_work_size(commands_classify_config(n_seq - 2))  # just under: accepted


def commands_classify_config(n_seq: int):
    from headlens.classify import ClassifyConfig

    return ClassifyConfig(n_seq=n_seq)


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:121] data. "
            "DefaultCPUAllocator: can't allocate memory: you "
            "tried to allocate 80800000000 bytes."
        ),
    ],
)
def test_out_of_memory_is_one_line(monkeypatch, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(request, "classify_heads", fail)  # the command's one call runs classify_heads
    _one_line_error(CliRunner().invoke(cli, ["classify", "tiny", "--no-progress"]), "out of memory")


def test_other_runtime_errors_are_not_called_out_of_memory(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(request, "classify_heads", fail)
    result = CliRunner().invoke(cli, ["classify", "tiny", "--no-progress"])
    # The top-level guard names the error as what it is: one line, never an out-of-memory diagnosis.
    assert result.exit_code == 2 and "out of memory" not in result.stderr
    assert "unexpected RuntimeError: a bug" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_model_folder_without_tokenizer_names_the_missing_files(tmp_path):
    tiny = shipped_path("tiny")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny / name, tmp_path / name)
    line = _one_line_error(CliRunner().invoke(cli, ["heads", "0.0", "--model", str(tmp_path)]), "has no tokenizer")
    assert "tokenizer.json" in line and "tokenizer_config.json" in line


@pytest.mark.parametrize("spec", ["induction", "label:retrieval"])
def test_heads_given_a_role_points_to_ablate(spec):
    line = _one_line_error(CliRunner().invoke(cli, ["heads", spec, "tiny"]), "is a role, not a list of heads")
    assert f"headlens ablate tiny --heads {spec}" in line and "malformed" not in line


def test_validate_defaults_to_tiny(monkeypatch):
    import headlens.load.models
    from headlens.errors import ModelLoadError

    asked = []

    def load(name, **kwargs):
        asked.append(name)
        raise ModelLoadError("stop here")

    monkeypatch.setattr(headlens.load.models, "load_model", load)
    _one_line_error(CliRunner().invoke(cli, ["validate"]), "stop here")
    assert asked == ["tiny"]


def test_unwritable_report_fails_once_before_the_work(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the work started before the output was checked")

    monkeypatch.setattr(request, "classify_heads", never)
    blocker = tmp_path / "file"
    blocker.write_text("keep me")
    line = _one_line_error(
        CliRunner().invoke(cli, ["classify", "tiny", "--report", str(blocker / "r.html")]), str(blocker)
    )
    assert line.count("cannot") <= 1 and blocker.read_text() == "keep me"


def test_report_write_failure_is_reported_once(tmp_path, monkeypatch):
    from headlens import files
    from headlens.errors import OutputPathError
    from headlens.reports import render

    def refuse(path, text):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files, "_write", refuse)
    with pytest.raises(OutputPathError) as caught:
        render.write_atomic(tmp_path / "r.html", "x")
    assert str(caught.value) == f"cannot write {tmp_path / 'r.html'}: Permission denied"


@pytest.mark.slow
def test_classify_says_where_it_wrote(tmp_path):
    out, report = tmp_path / "out", tmp_path / "r.html"
    result = CliRunner().invoke(
        cli,
        [
            "classify",
            "tiny",
            "--n-seq",
            "2",
            "--max-windows",
            "2",
            "--no-needles",
            "--no-progress",
            "--out-dir",
            str(out),
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"headlens: wrote {out / 'heads.csv'} and {out / 'heads.json'}" in result.stderr
    assert f"headlens: wrote {report}" in result.stderr and report.is_file()


def test_command_line_records_every_option_given_and_nothing_else():
    import click

    from headlens.cli.options import command_line

    seen = {}

    @click.command("demo")
    @click.argument("model", required=False)
    @click.option("--bos/--no-bos", default=True)
    @click.option("--sweep", is_flag=True)
    @click.option("--batch-size", default=None)
    @click.option("--seed", default=0, type=int)
    @click.option("--threshold", multiple=True)
    @click.pass_context
    def demo(ctx, **kwargs):
        seen["line"] = command_line(ctx)

    CliRunner().invoke(demo, ["tiny", "--no-bos", "--seed", "0", "--threshold", "a=1", "--threshold", "b=2"])
    # --no-bos kept, --seed 0 kept although it is the default (it was typed), nothing invented
    assert seen["line"] == "headlens demo tiny --no-bos --seed 0 --threshold a=1 --threshold b=2"
    CliRunner().invoke(demo, [])
    assert seen["line"] == "headlens demo"


def test_a_whitespace_only_file_is_called_white_space_and_one_token_is_singular(tmp_path):
    from headlens.errors import InputTextError
    from headlens.probes.inputs import check_text, n_tokens

    with pytest.raises(InputTextError, match="only white space"):
        check_text(b" \n\t ", "blank.txt")
    with pytest.raises(InputTextError, match="is empty"):
        check_text(b"", "empty.txt")
    assert (n_tokens(1), n_tokens(2)) == ("1 token", "2 tokens")


def test_ablate_text_output_prints_each_figure_once():
    result = CliRunner().invoke(cli, ["ablate", "tiny", "--heads", "1.0", "--no-progress"])
    assert result.exit_code == 0, result.output
    names = [line.split()[0] for line in result.output.splitlines() if line.strip()]
    for alias in ("n_tokens", "loss", "loss_ablated", "delta_loss", "resampled"):
        assert alias not in names, result.output
    assert "delta" in names and "bootstrap" in names

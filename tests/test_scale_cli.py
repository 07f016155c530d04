"""The scale options on the command line: one set of --device/--dtype/--device-map options on
every command that loads a model, corpora on `classify --text`, one-line errors with exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from headlens.cli.main import cli
from tests.helpers.strong import sample_text

PLACEMENT = ("--device", "--dtype", "--device-map", "--max-memory", "--offload-folder")
FAST = ["--n-seq", "2", "--no-needles", "--format", "json", "--no-progress"]


@pytest.fixture
def runner():
    return CliRunner()


@pytest.mark.parametrize("command", ["classify", "ablate", "prune", "report", "validate"])
def test_every_model_command_has_the_same_placement_options(runner, command):
    result = runner.invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    for option in PLACEMENT:
        assert option in result.output, (command, option)


@pytest.mark.slow
def test_classify_reads_a_folder_and_a_jsonl_alike(runner, small_model_dir, tmp_path):
    docs = [sample_text(200, seed=1), sample_text(500, seed=2)]
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, doc in enumerate(docs):
        (folder / f"{i}.txt").write_text(doc, encoding="utf-8")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs), encoding="utf-8")
    outputs = []
    for source in (folder, jsonl):
        result = runner.invoke(cli, ["classify", str(small_model_dir), "--text", str(source), *FAST])
        assert result.exit_code == 0, result.output
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1] and len(outputs[0]) == 8


def test_validate_in_bfloat16_says_how_the_tolerance_scales(runner, small_model_dir):
    result = runner.invoke(cli, ["validate", str(small_model_dir), "--dtype", "bfloat16", "--format", "json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["passed"] and payload["dtype"] == "bfloat16"
    assert "tolerance scaled to bfloat16" in payload["tolerance_rule"]


# Errors -----------------------------------------------------------------------------------


def _one_line_error(result, message):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--dtype", "float64"], "unknown dtype 'float64'"),
        (["--device-map", "everywhere"], "unknown device_map 'everywhere'"),
        (["--max-memory", "0=1GiB"], "max_memory and offload_folder need a device_map"),
        (["--device-map", "auto", "--max-memory", "gpu0"], "--max-memory 'gpu0' is malformed"),
    ],
)
def test_bad_placement_is_one_line(runner, small_model_dir, args, message):
    _one_line_error(runner.invoke(cli, ["classify", str(small_model_dir), *args, *FAST]), message)


def test_malformed_jsonl_is_one_line(runner, small_model_dir, tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "ok"}\n{"text": oops}\n', encoding="utf-8")
    _one_line_error(
        runner.invoke(cli, ["classify", str(small_model_dir), "--text", str(path), *FAST]),
        "docs.jsonl:2 is not valid JSON",
    )


def test_non_utf8_file_is_one_line(runner, small_model_dir, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_bytes(b"caf\xe9")
    _one_line_error(
        runner.invoke(cli, ["classify", str(small_model_dir), "--text", str(tmp_path / "docs"), *FAST]),
        "is not valid UTF-8",
    )


def test_empty_folder_is_one_line(runner, small_model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    _one_line_error(
        runner.invoke(cli, ["classify", str(small_model_dir), "--text", str(tmp_path / "empty"), *FAST]),
        "holds no .txt files",
    )


def test_largest_batch_halves_on_out_of_memory():
    from headlens.load.devices import with_largest_batch

    tried = []

    def run(size):
        tried.append(size)
        if size > 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return size * 10

    assert with_largest_batch(run, start=64) == (80, 8)
    assert tried == [64, 32, 16, 8]


@pytest.mark.slow
def test_batch_size_auto_reports_its_choice(runner, small_model_dir, monkeypatch):
    """A forward pass of more than 4 sequences 'runs out of memory': auto settles on 4."""
    import headlens.classify.runs

    real = headlens.classify.runs.run_capture

    def capped(model, batches, reducers, **kwargs):
        def checked():
            for batch in batches:
                if batch.input_ids.shape[0] > 4:
                    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB")
                yield batch

        real(model, checked(), reducers, **kwargs)

    monkeypatch.setattr(headlens.classify.runs, "run_capture", capped)
    args = ["classify", str(small_model_dir), "--n-seq", "8", "--no-needles", "--format", "json", "--no-progress"]
    auto = runner.invoke(cli, [*args, "--batch-size", "auto"])
    assert auto.exit_code == 0, auto.output
    assert "--batch-size auto chose 4" in auto.stderr
    fixed = runner.invoke(cli, [*args, "--batch-size", "4"])
    assert json.loads(fixed.stdout) == json.loads(auto.stdout)


def test_bad_batch_size_is_one_line(runner, small_model_dir):
    _one_line_error(
        runner.invoke(cli, ["classify", str(small_model_dir), "--batch-size", "0", *FAST]),
        "--batch-size '0' is invalid",
    )


@pytest.mark.slow
def test_ablate_and_prune_take_a_batch_size(runner, small_model_dir, one_thread):
    """The batch size changes how sequences are grouped, not the results (float32 forward passes,
    float64 sums: equal to rounding). The prune reads 1,024 tokens (8 windows of 128: batches of 3, 3, 2
    against 4, 4), the sweep its default 512 (4 windows: 2, 2 against 4)."""
    args = ["ablate", str(small_model_dir), "--heads", "each", "--format", "json", "--no-progress"]
    sweeps = [json.loads(runner.invoke(cli, [*args, "--batch-size", size]).stdout)["rows"] for size in ("2", "4")]
    assert len(sweeps[0]) == 8 and [r["heads"] for r in sweeps[0]] == [r["heads"] for r in sweeps[1]]
    assert max(abs(a["delta"] - b["delta"]) for a, b in zip(*sweeps, strict=True)) < 1e-6
    prunes = [
        json.loads(
            runner.invoke(
                cli,
                [
                    "prune",
                    str(small_model_dir),
                    "--no-roles",
                    "--format",
                    "json",
                    "--tokens",
                    "1024",
                    "--batch-size",
                    size,
                    "--no-progress",
                ],
            ).stdout
        )
        for size in ("3", "4")
    ]
    steps = [doc["curve"] for doc in prunes]
    assert [r["heads_removed"] for r in steps[0]] == [r["heads_removed"] for r in steps[1]]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(*steps, strict=True)) < 1e-6


@pytest.mark.slow
def test_ablate_batch_size_auto_reports_its_choice(runner, small_model_dir, monkeypatch):
    """A forward pass of more than 4 sequences 'runs out of memory': auto settles on 4."""
    import headlens.ablation.ablate as ablate

    real = ablate.run_sets  # every forward pass of a set ablation, its clean run included

    def capped(loaded, evalset, sets, reps, batch_size, *args, **kwargs):
        if batch_size is not None and batch_size > 4:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 GB")
        return real(loaded, evalset, sets, reps, batch_size, *args, **kwargs)

    monkeypatch.setattr(ablate, "run_sets", capped)
    args = ["ablate", str(small_model_dir), "--heads", "0.1,1.2", "--format", "json", "--no-progress"]
    auto = runner.invoke(cli, [*args, "--batch-size", "auto"])
    assert auto.exit_code == 0, auto.output
    assert "--batch-size auto chose 4" in auto.stderr
    fixed = runner.invoke(cli, [*args, "--batch-size", "4"])
    assert json.loads(fixed.stdout) == json.loads(auto.stdout)


def test_batch_size_with_approx_is_one_line(runner, small_model_dir):
    _one_line_error(
        runner.invoke(cli, ["ablate", str(small_model_dir), "--heads", "all", "--approx", "--batch-size", "8"]),
        "--batch-size sets the exact ablation's batches",
    )


def test_batch_size_defaults_in_the_help_are_the_librarys():
    from headlens.classify import ClassifyConfig
    from headlens.intervene.evalset import BATCH_SIZE as BATCH
    from headlens.intervene.evalset import BATCH_TOKENS

    runner = CliRunner()
    ablate = f"{BATCH}, or up to {BATCH_TOKENS} tokens of shorter sequences"
    for command, default in (("classify", ClassifyConfig.batch_size), ("ablate", ablate), ("prune", BATCH)):
        text = " ".join(runner.invoke(cli, [command, "--help"]).output.split())
        assert f"(the choice is reported) [default: {default}]" in text, command

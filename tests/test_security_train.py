"""`train-tiny --out-dir` never loses a folder's files: a folder that holds anything but an earlier run is
refused (one line, exit 2, nothing changed) unless --force; a run is written beside its target and moved
into place only when complete; `ablate --out-dir` given a link is refused like every other output."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from headlens.errors import OutputPathError
from headlens.training import train_tiny
from headlens.training.outdir import MARKER
from tests.helpers.hostile import make_sentinel, refused
from tests.test_train import MICRO

NANO = replace(MICRO, steps=2, n_layers=1, d_mlp=64, batch_size=2, checkpoint_every=2, eval_windows=1, probe_seqs=2)


def another_model(folder):
    """A folder holding another model's files, as save_pretrained would delete or overwrite them."""
    folder.mkdir()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"]
    for name in shards:
        (folder / name).write_text(f"the other model's {name}\n")
    return {name: (folder / name).read_text() for name in shards}


def test_folder_of_another_model_is_refused(tmp_path):
    sentinel = make_sentinel(tmp_path / "sentinel")
    before = another_model(tmp_path / "other")
    line = refused("train-tiny", "--steps", "2", "--out-dir", tmp_path / "other", sentinel=sentinel)
    assert "not an earlier train-tiny run" in line and "--force" in line
    assert {name: (tmp_path / "other" / name).read_text() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "sentinel"]  # no staging folder left


def test_home_is_refused(tmp_path, monkeypatch):
    home = make_sentinel(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    assert "not an earlier train-tiny run" in refused("train-tiny", "--out-dir", os.path.expanduser("~"), sentinel=home)
    monkeypatch.chdir(tmp_path)  # a literal ~ (quoted, or from a program) is the home folder too, never ./~
    assert "not an earlier train-tiny run" in refused("train-tiny", "--out-dir", "~", sentinel=home)
    assert not (tmp_path / "~").exists()


def test_link_is_refused(tmp_path):
    sentinel = make_sentinel(tmp_path / "sentinel")
    (tmp_path / "link").symlink_to(sentinel, target_is_directory=True)
    assert "symlink" in refused("train-tiny", "--out-dir", tmp_path / "link", sentinel=sentinel)


def test_ablate_out_dir_link_is_refused(tmp_path):
    sentinel = make_sentinel(tmp_path / "sentinel")
    (tmp_path / "link").symlink_to(sentinel, target_is_directory=True)
    line = refused("ablate", "tiny", "--heads", "each", "--out-dir", tmp_path / "link", sentinel=sentinel)
    assert "symlink" in line
    assert sorted(p.name for p in sentinel.iterdir()) == ["keep.txt"]


@pytest.mark.slow
def test_force_keeps_other_files_and_a_run_replaces_an_earlier_run(tmp_path):
    before = another_model(tmp_path / "other")
    train_tiny(tmp_path / "other", config=NANO, force=True)
    assert (tmp_path / "other" / MARKER).is_file() and (tmp_path / "other" / "training_log.csv").is_file()
    kept = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert all((tmp_path / "other" / name).read_text() == before[name] for name in kept)  # not the run's names
    run = tmp_path / "run"
    train_tiny(run, config=NANO)
    (run / "stale.txt").write_text("from the earlier run\n")
    train_tiny(run, config=replace(NANO, seed=1))  # an earlier run: replaced whole, no --force needed
    assert (run / MARKER).is_file() and not (run / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "run"]


def test_failed_run_leaves_the_target_as_it_was(tmp_path, monkeypatch):
    import headlens.training.loop as loop

    run = tmp_path / "run"
    run.mkdir()
    (run / MARKER).write_text("earlier run\n")
    (run / "training_log.csv").write_text("step\n0\n")

    def crash(self, progress):
        (self.out_dir / "training_log.csv").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(loop._TrainingRun, "__init__", lambda self, out_dir, *args: setattr(self, "out_dir", out_dir))
    monkeypatch.setattr(loop._TrainingRun, "run", crash)
    with pytest.raises(KeyboardInterrupt):
        train_tiny(run, config=NANO)
    assert (run / "training_log.csv").read_text() == "step\n0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_library_refuses_like_the_cli(tmp_path):
    another_model(tmp_path / "other")
    with pytest.raises(OutputPathError, match="not an earlier train-tiny run"):
        train_tiny(tmp_path / "other", config=NANO)

"""Output paths: a result is written only where a regular file is or none is. A device, FIFO, socket,
folder or symbolic link at an output path (`--report`, `--out`, the files an `--out-dir` folder receives)
is refused with one line and exit 2 before any work starts, and is left as it was."""

from __future__ import annotations

import os
import socket
import stat

import pytest

import headlens.load.models
from headlens import files
from headlens.errors import OutputPathError
from tests.helpers.hostile import make_sentinel, refused


@pytest.fixture(autouse=True)
def no_work(monkeypatch):
    """Every refusal here must come before the model is loaded."""

    def never(*args, **kwargs):
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(headlens.load.models, "load_model", never)


@pytest.fixture
def sentinel(tmp_path):
    return make_sentinel(tmp_path / "sentinel")


def fifo(path):
    os.mkfifo(path)
    return path


def unix_socket(path):
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays
    return path


MAKERS = {
    "FIFO": (fifo, stat.S_ISFIFO),
    "socket": (unix_socket, stat.S_ISSOCK),
    "directory": (lambda path: path.mkdir() or path, stat.S_ISDIR),
    "symlink": (lambda path: path.symlink_to(path.with_name("real.html")) or path, stat.S_ISLNK),
}


def special_target(path, kind: str):
    """A `kind` at `path` (a link points at real.html beside it) and the st_mode test it keeps passing."""
    path.with_name("real.html").write_text("the link's target")
    make, still = MAKERS[kind]
    return make(path), still


@pytest.mark.parametrize("kind", ["FIFO", "socket", "directory", "symlink"])
@pytest.mark.parametrize(
    "command",
    [
        ["classify", "tiny", "--report"],
        ["report", "tiny", "--out"],
        ["ablate", "tiny", "--heads", "0.0", "--report"],
        ["prune", "tiny", "--report"],
    ],
)
def test_report_paths_that_are_not_regular_files(tmp_path, sentinel, kind, command):
    path, still = special_target(tmp_path / "target", kind)
    line = refused(*command, path, sentinel=sentinel)
    assert str(path) in line
    assert still(os.lstat(path).st_mode)
    assert (tmp_path / "real.html").read_text() == "the link's target"


@pytest.mark.parametrize("kind", ["FIFO", "socket", "directory", "symlink"])
def test_files_an_out_folder_receives(tmp_path, sentinel, kind):
    """classify --out-dir DIR writes DIR/heads.csv; ablate --heads each --out-dir DIR appends DIR/rows.jsonl."""
    for command, name in ((["classify", "tiny"], "heads.csv"), (["ablate", "tiny", "--heads", "each"], "rows.jsonl")):
        out = tmp_path / f"out-{name}"
        out.mkdir()
        path, still = special_target(out / name, kind)
        assert name in refused(*command, "--out-dir", out, sentinel=sentinel)
        assert still(os.lstat(path).st_mode)


def test_character_device_is_refused_without_touching_one(tmp_path, monkeypatch):
    """A character device (as /dev/null or /dev/full are) at the path, seen through a faked lstat: no
    real device node is ever written to by this test."""
    target = tmp_path / "fake-dev-full"
    real_lstat = os.lstat

    def device_lstat(path, *args, **kwargs):
        if os.fspath(path) == os.fspath(target):
            return os.stat_result((stat.S_IFCHR | 0o666, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", device_lstat)
    assert files.special_kind(target) == "character device"
    with pytest.raises(OutputPathError, match="character device"):
        files.write_atomic(target, "x")
    assert not target.exists()  # nothing was written in its place
    assert "character device" in refused("classify", "tiny", "--report", target)


def test_real_device_is_recognised_by_lstat_alone():
    """/dev/null is only looked at (lstat), never opened or written."""
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    assert files.special_kind("/dev/null") == "character device"


@pytest.mark.parametrize("kind", ["FIFO", "socket", "directory", "symlink"])
def test_write_atomic_leaves_special_files_alone(tmp_path, kind):
    path, still = special_target(tmp_path / "target", kind)
    with pytest.raises(OutputPathError, match="not a regular file"):
        files.write_atomic(path, "x")
    assert still(os.lstat(path).st_mode)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_regular_files_are_still_replaced(tmp_path):
    path = tmp_path / "r.html"
    path.write_text("old")
    files.write_atomic(path, "new")
    assert path.read_text() == "new"


@pytest.mark.parametrize("kind", ["FIFO", "socket", "symlink"])
def test_train_tiny_out_folder_holding_special_files(tmp_path, sentinel, kind):
    out = tmp_path / "run"
    out.mkdir()
    path, still = special_target(out / "config.json", kind)
    line = refused("train-tiny", "--out-dir", out, "--steps", "2", sentinel=sentinel)
    assert "not an earlier train-tiny run" in line  # a folder holding anything else is never written into
    assert still(os.lstat(path).st_mode)

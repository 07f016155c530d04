"""What every try of the security battery (tests/test_security_*.py) checks: the CLI refused the input with
exit status 2, at most one line on stderr and no traceback, and a sentinel folder outside the cache and
the store still holds its file."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from headlens.cli.main import cli

SENTINEL_TEXT = "headlens must never remove this\n"


def make_sentinel(folder: Path) -> Path:
    """A folder holding one file, outside the cache and the store, that every try must leave alone."""
    folder.mkdir(parents=True)
    (folder / "keep.txt").write_text(SENTINEL_TEXT)
    return folder


@pytest.fixture
def sentinel(tmp_path):
    """A fixture: the sentinel folder of a test (make_sentinel)."""
    return make_sentinel(tmp_path / "sentinel")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A fixture: headlens's cache and the Ollama store in the test's own folder."""
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "store"))


def assert_intact(sentinel: Path) -> None:
    assert (sentinel / "keep.txt").read_text() == SENTINEL_TEXT, f"{sentinel} was damaged"


def refused(*args: str, sentinel: Path | None = None) -> str:
    """Run `headlens ARGS` in process; assert exit 2, one stderr line at most (of at most 300 characters), no
    traceback, sentinel intact. The stderr line."""
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 1, result.stderr
    assert "Traceback" not in result.output, result.output
    assert all(len(line) <= 300 for line in lines), lines  # one line of at most 300 characters
    if sentinel is not None:
        assert_intact(sentinel)
    return lines[0] if lines else ""

"""Nothing outside the named outputs and headlens's cache changes: a library headlens uses must not write its
own cache into the home folder either. Matplotlib, on its first import in a home folder, writes
~/.cache/matplotlib (its font list) and ~/.config/matplotlib; so commands that draw nothing must not import it,
and where headlens draws, matplotlib's folder (MPLCONFIGDIR) is a folder of headlens's cache unless the user
chose one (headlens.reports.keep_matplotlib_in_cache).

Each command runs as a fresh process in a fresh home folder (one that already holds a file), with headlens's cache
in the test's folder and none of the variables that move a library's folders (MPLCONFIGDIR, XDG_*) set."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Variables that would move a library's folders out of the home folder and so hide a write into it.
MOVERS = ("MPLCONFIGDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "HF_HOME", "TORCH_HOME")
DRAWING = ("matplotlib", "seaborn")  # libraries only the report's drawing modules may import


def fresh_env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a headlens process with a fresh home folder (holding one file) and its own cache."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("# a home folder holds files\n")
    env = {key: value for key, value in os.environ.items() if key not in MOVERS}
    return {**env, "HOME": str(home), "HEADLENS_CACHE": str(tmp_path / "cache"), "HEADLENS_DEBUG": "", **extra}


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime)} of everything under `folder` ({} when it does not exist)."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


def headlens(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "headlens.cli.main", *args], env=env, cwd=ROOT, capture_output=True, text=True
    )


def test_validate_with_a_bad_text_path_writes_nothing_anywhere(tmp_path):
    """The error path of a command that draws nothing: one line, exit 2, the home folder as it was, and no cache
    folder at all (an import of matplotlib would have made its folder there)."""
    env = fresh_env(tmp_path)
    home = tree(tmp_path / "home")
    done = headlens(env, "validate", "tiny", "--text", "/" + "a" * 4000)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert tree(tmp_path / "home") == home
    assert not (tmp_path / "cache").exists(), tree(tmp_path / "cache")


def test_commands_that_draw_nothing_load_no_drawing_code(tmp_path):
    """validate (refused and run, table and JSON) and heads, in one process: no matplotlib or seaborn module
    loaded, whatever the home folder holds."""
    code = (
        "import sys\n"
        "from headlens.cli.main import cli\n"
        "for args in (['validate', 'tiny', '--text', '/' + 'a' * 4000], ['validate', 'tiny'],\n"
        "             ['validate', 'tiny', '--format', 'json'], ['heads', '0.0', 'tiny']):\n"
        "    try:\n"
        "        cli.main(args, standalone_mode=False)\n"
        "        print('@@ exit 0')\n"
        "    except SystemExit as exc:\n"
        "        print('@@ exit', exc.code)\n"
        f"print('@@', sorted(m for m in sys.modules if m.split('.')[0] in {DRAWING!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=fresh_env(tmp_path), cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("@@ ")]
    assert said == ["@@ exit 2", "@@ exit 0", "@@ exit 0", "@@ exit 0", "@@ []"], (said, done.stderr[-2000:])


@pytest.mark.slow  # a fresh process ablates a head of tiny and draws its report
def test_a_report_leaves_the_home_folder_alone(tmp_path):
    """A command that draws (ablate --report): the page is written, the home folder is as it was, and
    matplotlib's font list is in headlens's cache, where MPLCONFIGDIR pointed it."""
    env = fresh_env(tmp_path)
    home = tree(tmp_path / "home")
    page = tmp_path / "out" / "page.html"
    done = headlens(env, "ablate", "tiny", "--heads", "0.0", "--report", str(page))
    assert done.returncode == 0, done.stderr
    assert page.is_file()
    assert tree(tmp_path / "home") == home
    assert list((tmp_path / "cache" / "matplotlib").glob("fontlist-*.json")), tree(tmp_path / "cache")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "home", "out"]


@pytest.mark.parametrize("chosen", [False, True], ids=["default", "user-set"])
def test_matplotlib_folder_is_in_the_cache_unless_the_user_chose_one(tmp_path, chosen):
    """matplotlib's config and cache folders as matplotlib itself reports them after a drawing module is
    imported: headlens's cache's matplotlib folder, or the user's MPLCONFIGDIR untouched."""
    mine = tmp_path / "my-matplotlib"
    env = fresh_env(tmp_path, **({"MPLCONFIGDIR": str(mine)} if chosen else {}))
    code = "import headlens.reports.figures, matplotlib as m; print(m.get_configdir()); print(m.get_cachedir())"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = mine if chosen else tmp_path / "cache" / "matplotlib"
    assert [Path(line) for line in done.stdout.split()] == [expected, expected]
    assert tree(tmp_path / "home") == {".profile": tree(tmp_path / "home")[".profile"]}


def test_only_report_modules_import_drawing_libraries():
    """matplotlib and seaborn are imported only by modules of headlens.reports, whose package runs
    keep_matplotlib_in_cache before any of its modules: one place sets the folder for every figure."""
    importers = []
    for folder in ("headlens", "cli", "reports"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(name.split(".")[0] in DRAWING for name in names):
                    importers.append(path.relative_to(ROOT).parts[0])
    assert importers and set(importers) == {"reports"}, importers

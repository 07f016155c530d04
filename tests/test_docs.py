"""The documents a newcomer reads hold: the README's library example names columns that exist, the
notebooks' install line installs what they are opened with, and comments and docstrings point only at
files the repository has and speak of the code as it is."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from headlens.classify import kinds

ROOT = Path(__file__).resolve().parents[1]
# Where comments, docstrings and the shipped model cards live.
SOURCE_DIRS = ("headlens", "cli", "reports", "benchmarks")
SOURCE_SUFFIXES = {".py", ".md", ".js", ".css", ".sh"}
# Words that point at documents the repository does not have, or tell history instead of the code: each was
# found in a comment once (REFERENCES.md and notes/contracts are not in the repository; six families are
# supported, not only GPT-2's).
STALE_WORDS = ("REFERENCES", "notes/contracts", "pitfalls", "GPT-2-family", "this session", "last session")


def _sources():
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and "gpt2-tokenizer" not in path.parts and path.is_file():
                yield path


def test_comments_point_at_no_missing_document_and_tell_no_history():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {word}"
        for path in _sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for word in STALE_WORDS
        if word in line
    ]
    assert found == []


def test_markdown_files_named_in_the_sources_exist():
    missing = []
    for path in _sources():
        for name in set(re.findall(r"(?<![\w./:-])([\w./-]+\.md)\b", path.read_text(encoding="utf-8"))):
            candidates = [ROOT / name, ROOT / "headlens" / name, path.parent / name]  # repo, package, here
            if not any(candidate.is_file() for candidate in candidates):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


def test_the_notebooks_install_line_installs_jupyterlab():
    readme = (ROOT / "notebooks" / "README.md").read_text(encoding="utf-8")
    extra = re.search(r'pip install -e "\.\[(\w+)\]"', readme).group(1)
    assert "jupyter lab" in readme
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # tomllib is Python 3.11+
    packages = re.findall(r'"([\w-]+)', re.search(rf"^{extra} = \[(.*?)\]", pyproject, re.M).group(1))
    assert {"jupyterlab", "ipywidgets"} <= set(packages)  # ipywidgets: tqdm's bars, no "IProgress" warning


def _library_example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Library") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_the_readme_library_example_runs_and_names_real_columns(tmp_path, monkeypatch):
    """Run the README's library example as written (in a scratch folder: it writes its page); every column its
    comment promises is in the frame, and the page it renders holds the findings."""
    example = _library_example()
    assert example.startswith("import headlens\n")  # the front door, not the stages' module paths
    promised = re.search(r"heads = headlens.classify_heads\(loaded\) +# .frame: (.+)", example).group(1)
    scope: dict = {}
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), scope)
    columns = list(scope["heads"].frame.columns)
    for pattern in (name.strip() for name in promised.split(",")):
        assert fnmatch.filter(columns, pattern), (pattern, columns)
    assert {"layer", "head", "delta_loss"} <= set(scope["sweep"].frame.columns)
    assert {"delta", "ci95", "clean", "ablated"} <= set(scope["result"].meta)
    assert {"layer", "quantity", "reference", "max_abs_error", "passed"} <= set(scope["checks"].frame.columns)
    assert scope["report"].heads.frame["labels"].equals(scope["heads"].frame["labels"])  # deterministic probes
    assert 'id="findings"' in (tmp_path / "report.html").read_text(encoding="utf-8")


def test_the_readme_cites_every_paper_of_the_registry_of_head_kinds():
    sources = (ROOT / "README.md").read_text(encoding="utf-8").split("## Sources", 1)[1]
    papers = {cite.split(",")[0].strip() for kind in kinds.KINDS for cite in kind.citation.split(";")}
    assert sorted(paper for paper in papers if paper not in sources) == []


def test_benchmarks_open_with_one_table_of_the_current_figures():
    """BENCHMARKS.md: the first section is one table (what, ours, the peer's figure, ratio, command, date and
    load); history and method follow by topic, with no heading named after an issue."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#{2,3} (.+)$", text, re.M)
    assert headings[0] == "Current figures"
    first = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in first.splitlines() if line.startswith("|"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    for wanted in ("what", "ours", "peer", "ratio", "command", "date"):
        assert any(column.startswith(wanted) for column in columns), (wanted, columns)
    assert sum(line.startswith("|---") for line in first.splitlines()) == 1  # one table
    assert [h for h in headings if re.search(r"#\d+|\bissue\b", h, re.I)] == []

"""The tutorial notebooks in notebooks/: committed without outputs, English and Spanish in step, and each one
executed top to bottom in a fresh kernel (nbclient), its own asserts checking its numbers.

The kernel is the "python3" kernel of the interpreter running the tests (ipykernel, from the `dev` extra),
pinned through a kernel spec in a temporary JUPYTER_PATH so that a user-wide "python3" spec pointing at
another Python cannot take its place.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.notebooks import execute

nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
LANGUAGES = ("en", "es")


def stems() -> list[str]:
    return sorted({path.name.split(".")[0] for path in PATHS})


def read(path: Path):
    return nbformat.read(path, as_version=4)


def test_there_are_tutorials():
    assert {"01_attention_by_hand", "02_what_do_the_heads_do", "03_grouped_query_attention"} <= set(stems())


# Committed files


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_committed_notebooks_have_no_outputs(path):
    nb = read(path)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
        assert "execution" not in cell.get("metadata", {})
    assert "widgets" not in nb.metadata
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("stem", stems())
def test_both_languages_run_the_same_code(stem):
    """The Spanish notebook is the English one with its prose translated: same code, same asserts; only the
    `LANG = "..."` line that sets the language of headlens.show differs."""
    english, spanish = (read(NOTEBOOKS / f"{stem}.{lang}.ipynb") for lang in LANGUAGES)
    assert [c.cell_type for c in english.cells] == [c.cell_type for c in spanish.cells]

    def code(nb, lang: str) -> list[str]:
        sources = [c.source for c in nb.cells if c.cell_type == "code"]
        assert sum(f'LANG = "{lang}"' in source for source in sources) == 1
        return [source.replace(f'LANG = "{lang}"', "LANG = ...") for source in sources]

    assert code(english, "en") == code(spanish, "es")
    prose = [
        (a.source, b.source) for a, b in zip(english.cells, spanish.cells, strict=True) if a.cell_type == "markdown"
    ]
    assert prose and all(a != b for a, b in prose)  # every text cell is translated, none copied


# What the prose says about the viewer's sample
# Each induction head's mean attention on the induction target, against uniform attention over the visible keys.
UNIFORM_FACTOR = 5.0
RANDOM_SAMPLE_WORDS = {
    "en": "random bytes, then the same bytes again",
    "es": "bytes aleatorios y luego los mismos bytes",
}


def induction_target_attention(attentions, ids: list[int], head: tuple[int, int]) -> tuple[float, float]:
    """(mean attention on the induction targets, what uniform attention would put there) over the queries
    that have a target (key k with ids[k - 1] == ids[q], k - 1 < q), from transformers' own attentions."""
    targets = [[k for k in range(1, q + 1) if ids[k - 1] == ids[q]] for q in range(len(ids))]
    queries = [q for q in range(len(ids)) if targets[q]]
    pattern = attentions[head[0]][0, head[1]].double()  # [q_pos, k_pos]
    shown = sum(float(pattern[q, targets[q]].sum()) for q in queries) / len(queries)
    uniform = sum(len(targets[q]) / (q + 1) for q in queries) / len(queries)
    return shown, uniform


@pytest.mark.slow
def test_the_viewer_caption_says_what_the_heads_do_on_the_sample_shown():
    """Notebook 02 shows `show_attention(loaded, verse, repeat=True)` on tiny: the caption says the sample is
    random bytes twice (tiny does not copy the verse), and on that sample the card's induction heads do attend
    to the induction target, measured on the shown ids with transformers directly."""
    import torch
    from transformers import AutoModelForCausalLM

    from headlens.classify.samples import SAMPLE_RANDOM
    from headlens.files import shipped_path
    from headlens.load.models import load_model
    from headlens.reports.inline import attention_sample

    english = read(NOTEBOOKS / "02_what_do_the_heads_do.en.ipynb")
    call = next(c.source for c in english.cells if c.cell_type == "code" and "show_attention" in c.source)
    assert "repeat=True" in call
    verse = re.search(r'^verse = "(.+)"$', call, re.M).group(1)
    sample = attention_sample(load_model("tiny"), verse, repeat=True)  # what show_attention displays
    assert sample.meta["sample"] == SAMPLE_RANDOM
    ids = list(sample.frame["id"])
    for lang, words in RANDOM_SAMPLE_WORDS.items():
        nb = read(NOTEBOOKS / f"02_what_do_the_heads_do.{lang}.ipynb")
        caption = " ".join(c.source for c in nb.cells if c.cell_type == "markdown" and "repeat=True" in c.source)
        assert words in " ".join(caption.split()), lang
    card = (shipped_path("tiny") / "README.md").read_text(encoding="utf-8")
    heads = re.search(r"^induction: (.+)$", card, re.M).group(1).split(",")
    model = AutoModelForCausalLM.from_pretrained(str(shipped_path("tiny")), attn_implementation="eager")
    with torch.no_grad():
        attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    for head in heads:
        shown, uniform = induction_target_attention(attentions, ids, tuple(map(int, head.split("."))))
        assert shown > UNIFORM_FACTOR * uniform, (head, shown, uniform)


# Execution


def inline_views(nb) -> list[tuple[str, str]]:
    """(kind, language) of each headlens inline view the executed notebook displayed, in order."""
    views = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            if 'class="headlens-inline"' in html:
                root = re.search(r'<div class="headlens-inline" data-kind="(\w+)" lang="(\w+)"', html)
                views.append((root.group(1), root.group(2)))
    return views


# What each notebook must have shown inline (headlens.show / show_attention), checked on its outputs.
SHOWN = {
    "01_attention_by_hand": ["validation"],
    "02_what_do_the_heads_do": ["heads", "attention", "ablation", "sweep", "training", "pruning"],
    "03_grouped_query_attention": ["validation", "heads", "attention"],
}


@pytest.mark.notebook
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_runs_top_to_bottom(path, jupyter_path, tmp_path, monkeypatch):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = read(path)
    execute(nb, jupyter_path, tmp_path, monkeypatch)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    stem, lang = path.name.split(".")[:2]
    assert inline_views(nb) == [(kind, lang) for kind in SHOWN[stem]]

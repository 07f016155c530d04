"""headlens.reports.inline and headlens.show: each result type as a self-contained, escaped HTML fragment.

The fragments are checked as text here (no network reference, no `<script src>`, hostile text escaped, element
ids unique within and across fragments); tests/test_inline_browser.py runs them in a browser inside a
notebook exported with nbconvert.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
import torch

import headlens
from headlens.classify.samples import patterns_of, sample_result
from headlens.reports import inline
from headlens.results import Result

NASTY_TEXT = (
    'Hello <script>alert(1)</script> and "><img src=x onerror=alert(1)> then </script> '
    "with {{ 7*7 }} and ${7*7} and `${x}` & done.\n"
)
N_LAYERS, N_HEADS, POS = 2, 3, 6


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of each script element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def parse(html: str) -> Elements:
    parser = Elements()
    parser.feed(html)
    parser.close()
    return parser


def heads_frame(label: str = "previous_token") -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [
        {
            "layer": layer,
            "head": head,
            "labels": [label] if (layer, head) == (0, 1) else [],
            "prev_token_score": float(rng.uniform()),
            "first_token_score": float(rng.uniform()),
        }
        for layer in range(N_LAYERS)
        for head in range(N_HEADS)
    ]
    return pd.DataFrame(rows)


def sweep_frame() -> pd.DataFrame:
    rows = [
        {
            "layer": layer,
            "head": head,
            "n_tokens": 100,
            "loss": 2.0,
            "loss_ablated": 2.0 + 0.1 * head,
            "delta_loss": 0.1 * head,
            "ci95_low": 0.1 * head - 0.01,
            "ci95_high": 0.1 * head + 0.01,
        }
        for layer in range(N_LAYERS)
        for head in range(N_HEADS)
    ]
    return pd.DataFrame(rows)


def ablation_result(heads=("1.0", "1.2")) -> Result:
    return Result(
        "ablation",
        rows=[],
        meta={
            "model": "m",
            "heads": list(heads),
            "method": "zero",
            "metric": "repeat",
            "n_tokens": 384,
            "loss": 2.945,
            "loss_ablated": 4.612,
            "delta_loss": 1.667,
            "ci95": [1.529, 1.802],
        },
    )


def pruning_frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step": [0, 1, 2],
            "n_removed": [0, 3, 6],
            "fraction_removed": [0.0, 0.5, 1.0],
            "heads_removed": ["", "0.0,0.1,0.2", "0.0,0.1,0.2,1.0,1.1,1.2"],
            "loss": [1.7, 1.9, 3.3],
        }
    )


def validation_frame(passed: bool = True) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "layer": [0, 0],
            "quantity": ["z", "pattern"],
            "reference": ["hf_eager", "sdpa"],
            "max_abs_error": [1e-7, 2e-7],
            "tolerance": [1e-5, 1e-5],
            "passed": [True, passed],
        }
    )


def training_pair():
    steps = np.arange(0, 1000, 50)
    log = pd.DataFrame(
        {"step": steps, "train_loss": 3 - steps / 1000, "best_induction_score": np.where(steps < 600, 0.05, 0.7)}
    )
    head_log = pd.DataFrame(
        {
            "step": np.repeat(steps, 2),
            "layer": 1,
            "head": np.tile([0, 1], len(steps)),
            "prefix_matching_score": np.tile([0.1, 0.5], len(steps)),
        }
    )
    return Result("training", log, {"folder": None}, tables={"heads": head_log})


def sample(tokens=None) -> Result:
    tokens = tokens or [f"t{i}" for i in range(POS)]
    pos = len(tokens)
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(N_LAYERS, N_HEADS, pos, pos, generator=gen)  # [layer, head, q_pos, k_pos]
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()  # [q_pos, k_pos]
    patterns = scores.masked_fill(~causal, float("-inf")).softmax(-1)  # [layer, head, q_pos, k_pos]
    return sample_result(tokens, patterns, n_tokens_total=pos, text="".join(tokens), repeated=False)


RESULTS = {
    "heads": lambda: Result("heads", heads_frame()),
    "sweep": lambda: Result("sweep", sweep_frame()),
    "ablation": lambda: [ablation_result(["1.0"]), ablation_result()],
    "pruning": lambda: Result("pruning", pruning_frame()),
    "validation": lambda: Result("validation", validation_frame()),
    "training": training_pair,
    "attention": sample,
}


@pytest.mark.parametrize("kind", sorted(RESULTS))
def test_each_result_is_recognised_and_self_contained(kind):
    result = RESULTS[kind]()
    view = inline.view(result)
    assert view.kind == kind
    html = view._repr_html_()
    elements = parse(html)
    for tag, attrs in elements.tags:
        assert tag not in ("link", "iframe", "object", "embed", "base", "meta"), tag
        for name in ("src", "href", "action", "data", "poster"):
            if name in attrs:
                assert tag == "img" and name == "src" and attrs[name].startswith("data:image/png;base64,"), (tag, attrs)
        assert not (tag == "script" and "src" in attrs)
    assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html, re.I)  # no URL anywhere, not even in text
    assert "@import" not in html and "url(" not in html
    assert html.count("<img ") >= (0 if kind == "validation" else 1)  # every kind but validation draws a figure


def test_a_single_ablation_and_a_list_both_show_their_ci():
    for result in (ablation_result(), [ablation_result()]):
        html = inline.view(result).html()
        assert "1.529" in html and "1.802" in html and "1.667" in html
        assert "95%" in html


def test_the_label_table_names_each_heads_key_value_group_under_gqa():
    frame = heads_frame()
    frame["kv_group"] = frame["head"] // N_HEADS  # one key/value head per layer
    assert re.search(r'<th [^>]*(title="kv_group"|>kv_group</th>)', inline.view(Result("heads", frame)).html())
    frame["kv_group"] = frame["head"]  # plain multi-head attention: the column would say nothing
    assert "kv_group" not in inline.view(Result("heads", frame)).html()


def test_validation_states_its_verdict():
    assert "passed" in inline.view(Result("validation", validation_frame())).html()
    assert "1 comparison(s)" in inline.view(Result("validation", validation_frame(passed=False))).html()


def test_training_marks_the_phase_change():
    assert "step 600" in inline.view(training_pair()).html()


def test_unknown_results_are_refused():
    for value in (pd.DataFrame({"x": [1]}), {"a": 1}, [], 3, "text", (pd.DataFrame(),)):
        with pytest.raises(TypeError, match="cannot display"):
            inline.view(value)


# Hostile text is escaped


def test_hostile_labels_and_values_are_escaped():
    html = inline.view(Result("heads", heads_frame(label=NASTY_TEXT))).html()
    assert "<script>alert(1)</script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    result = ablation_result()  # heads are "L.H" strings from parse_heads; the free text is elsewhere
    result.meta["method"] = result.meta["metric"] = NASTY_TEXT
    html = inline.view(result).html()
    assert "<script" not in html and "onerror=alert" not in html.replace("onerror=alert(1)&gt;", "")


def test_hostile_tokens_cannot_end_the_data_element_or_the_script():
    tokens = ["<|endoftext|>", *NASTY_TEXT.split(" ")]
    html = inline.view(sample(tokens), heads=Result("heads", heads_frame(label=NASTY_TEXT))).html()
    elements = parse(html)
    scripts = [attrs for tag, attrs in elements.tags if tag == "script"]
    assert len(scripts) == 2  # the viewer's JSON data and its code, nothing injected
    assert html.count("</script>") == 2
    data = json.loads(elements.scripts[0])
    assert data["tokens"] == tokens  # the tokens survive intact, as data
    assert NASTY_TEXT in data["labels"]["0.1"]
    assert not any("onerror" in attrs for _, attrs in elements.tags)


def test_the_embedded_patterns_are_the_sample_to_one_step_in_255():
    s = sample()
    data = json.loads(parse(inline.view(s).html()).scripts[0])
    raw = np.frombuffer(base64.b64decode(data["patterns_b64"]), dtype=np.uint8)
    shown = raw.reshape(N_LAYERS, N_HEADS, POS, POS) / 255  # [layer, head, q_pos, k_pos]
    assert np.abs(shown - patterns_of(s).numpy()).max() <= 0.5 / 255 + 1e-6


# Several viewers on one page


def element_ids(html: str) -> list[str]:
    return [attrs["id"] for _, attrs in parse(html).tags if "id" in attrs]


def test_element_ids_are_unique_within_and_across_fragments():
    s = sample()
    first, second = inline.view(s).html(), inline.view(s).html()
    ids_first, ids_second = element_ids(first), element_ids(second)
    assert len(ids_first) == len(set(ids_first)) >= 7  # root, static, app, head menu, status, tokens, grid, data
    assert not set(ids_first) & set(ids_second)
    # The script drives exactly the elements of its own fragment.
    suffix = re.search(r'id="viewer-app(-hl[0-9a-f]+)"', first).group(1)
    assert f'attentionViewer("{suffix}")' in first
    assert all(i.endswith(suffix) for i in ids_first)


# The entry points


def test_show_outside_a_notebook_says_where_it_works():
    with pytest.raises(RuntimeError, match="notebook"):
        headlens.show(Result("sweep", sweep_frame()))


def test_show_refuses_unknown_results_before_anything_else():
    with pytest.raises(TypeError):
        headlens.show({"not": "a result"})


def test_importing_headlens_does_not_import_the_reports():
    code = "import sys, headlens; assert 'headlens.reports' not in sys.modules; assert callable(headlens.show)"
    subprocess.run([sys.executable, "-c", code], check=True)


# Languages: the prose comes from the reports' catalogue


@pytest.mark.parametrize("kind", sorted(RESULTS))
def test_spanish_views_hold_no_english_sentence(kind):
    from headlens.reports.i18n import catalogue

    html = inline.view(RESULTS[kind](), lang="es").html()
    assert 'lang="es"' in html
    english = {text for text in catalogue("en").values() if len(text.split()) >= 4 and "{" not in text}
    spanish = set(catalogue("es").values())
    leftovers = [text for text in english - spanish if sections_text(text) in html]
    assert leftovers == []
    assert "Static picture" not in html


def sections_text(text: str) -> str:
    from headlens.reports.sections import esc

    return esc(text)


def test_the_spanish_viewer_script_speaks_spanish():
    from headlens.reports.i18n import js_messages

    html = inline.view(sample(), lang="es").html()
    code = parse(html).scripts[1]
    assert json.dumps(js_messages("es")["status"], ensure_ascii=False) in code
    assert "Imagen fija" in html


def test_an_unknown_language_is_refused():
    from headlens.errors import ConfigError

    with pytest.raises(ConfigError, match="language"):
        inline.view(Result("sweep", sweep_frame()), lang="fr")

"""The report's message catalogue (headlens.reports.i18n): both languages complete, and a Spanish
report free of English prose, hard-coded or from the catalogue."""

from __future__ import annotations

import html as html_lib
import re
import string
from html.parser import HTMLParser
from importlib import resources

import pytest

from headlens.errors import ConfigError, OutputPathError
from headlens.reports import EmptyReportError, i18n, render_report
from headlens.results import Result
from tests.helpers.report_inputs import (
    MODEL_INFO,
    heads_frame,
    sweep_frame,
    training_pair,
    validation_frame,
    viewer_dict,
    words,
)

# English function words that are not Spanish words: a sentence left in English carries some of them.
ENGLISH_WORDS = {
    "the",
    "and",
    "of",
    "with",
    "is",
    "are",
    "from",
    "this",
    "that",
    "each",
    "every",
    "which",
    "to",
    "on",
    "by",
    "when",
    "than",
    "its",
    "it",
    "at",
    "or",
    "be",
    "not",
    "all",
    "only",
    "shows",
    "click",
    "needs",
    "here",
    "there",
    "more",
    "less",
    "has",
    "have",
    "was",
    "were",
    "into",
    "after",
    "before",
}
# Fragments of English messages shorter than this many words may legitimately recur in Spanish ("d_model / ").
MIN_FRAGMENT_WORDS = 3


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def test_every_key_is_in_both_catalogues_with_the_same_placeholders():
    english, spanish = i18n.catalogue("en"), i18n.catalogue("es")
    assert set(english) == set(spanish)
    for key in english:
        assert placeholders(english[key]) == placeholders(spanish[key]), key
        assert spanish[key].strip(), key


def test_t_fills_placeholders_and_unknown_language_is_refused():
    assert i18n.t("viewer.cut", "es", total=300, shown=64).startswith("La muestra tiene 300 tokens")
    assert i18n.t("viewer.cut", "en", total=300, shown=64).startswith("The sample has 300 tokens")
    assert i18n.number(0.875, "es") == "0,88" and i18n.number(0.875, "en") == "0.88"
    assert i18n.column_heading("delta_loss", "es") == "delta de pérdida"
    assert i18n.column_heading("unknown_column", "es") == "unknown_column"  # identifiers stay as they are
    with pytest.raises(ConfigError, match="unknown report language 'fr': choose one of en, es"):
        i18n.t("page.title", "fr", name="x")


def test_scientific_names_stay_recognisable_in_spanish():
    assert i18n.t("role.induction", "es") == "Cabezas de inducción (induction heads)"
    assert "(retrieval heads)" in i18n.t("role.retrieval", "es")


class VisibleText(HTMLParser):
    """Text a reader sees (and alt texts), leaving out user data: <pre> (command, sample text), <cite>
    (paper titles), scripts, styles and the token ticks."""

    SKIP = {"pre", "cite", "script", "style"}
    VOID = {"img", "input", "br", "meta", "link", "hr", "col", "wbr"}  # no end tag: never nest

    def __init__(self):
        super().__init__()
        self.parts, self.skipping = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in self.VOID and self.skipping:
            return
        if self.skipping or tag in self.SKIP or attrs.get("class") in ("xticks", "yticks"):
            self.skipping.append(tag)  # inside a skipped element every tag nests until its end tag
        elif attrs.get("alt") and not self.skipping:
            self.parts.append(attrs["alt"])

    def handle_endtag(self, tag):
        if self.skipping:
            self.skipping.pop()

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def visible_text(page: str) -> str:
    parser = VisibleText()
    parser.feed(page)
    return " ".join(" ".join(parser.parts).split())


@pytest.fixture(scope="module")
def spanish_page(tmp_path_factory):
    """Every section: findings with ablation evidence and sources, key/value groups, scores, thumbnails,
    viewer, ablation, validation, training."""
    sources = {"text": "given_text", "repeats": "random_tokens", "needles": "default_text"}
    config = {"positional_min": 0.9, "needles": True, "token_low": None, "token_range": [32, 127]}
    heads = Result("heads", heads_frame().assign(kv_group=[0, 0, 1, 0, 0, 1]), {"sources": sources, "config": config})
    one = {"heads": ["0.1"], "method": "zero", "metric": "text", "n_tokens": 200, "delta_loss": 0.2, "ci95": [0.1, 0.3]}
    controlled = {
        "heads": ["1.0", "1.2"],
        "method": "zero",
        "metric": "repeat",
        "n_tokens": 300,
        "delta": 3.21,
        "delta_loss": 3.21,
        "ci95": [3.1, 3.3],
        "chosen_by": "heads labelled induction by the labels given",
        "control": {"k": 20, "deltas": [1.7, 2.7, 3.21], "rank": 7, "p_value": 0.333, "seed": 0},
    }
    import pandas as pd

    pruning = pd.DataFrame(
        {
            "step": [0, 1],
            "n_removed": [0, 1],
            "fraction_removed": [0.0, 1 / 6],
            "heads_removed": ["", "0.1"],
            "loss": [3.0, 3.1],
        }
    )
    validation = Result("validation", validation_frame(fail_layer=1), {"text_source": "texto-dado", "n_tokens": 42})
    path = render_report(
        tmp_path_factory.mktemp("es") / "es.html",
        model_info={**MODEL_INFO, "name": "modelo", "n_params": 462464},
        heads=heads,
        sweep=Result("sweep", sweep_frame()),
        ablation=[Result("ablation", meta=one, rows=[]), Result("ablation", meta=controlled, rows=[])],
        pruning=Result("pruning", pruning),
        validation=validation,
        training=training_pair(),
        viewer=viewer_dict(),
        command="headlens report modelo",
        text_label="texto.txt",
        lang="es",
    )
    return path.read_text(encoding="utf-8")


def test_spanish_report_has_every_section_in_spanish(spanish_page):
    assert '<html lang="es">' in spanish_page
    for section_id in (
        "findings",
        "summary",
        "kv-groups",
        "scores",
        "thumbnails",
        "viewer",
        "ablation",
        "validation",
        "training",
    ):
        assert f'<section id="{section_id}">' in spanish_page
    assert "Qué hacen las cabezas" in spanish_page and "con un papel (" in spanish_page


def test_spanish_report_contains_no_sentence_of_the_english_catalogue(spanish_page):
    shown = html_lib.unescape(spanish_page)
    english, spanish = i18n.catalogue("en"), i18n.catalogue("es")
    checked = 0
    for key, text in english.items():
        if text == spanish[key]:
            continue  # the same in both languages (an identifier, a number format)
        for fragment in re.split(r"\{\w+\}", text):
            if sum(1 for word in fragment.split() if re.search(r"[A-Za-z]{2,}", word)) >= MIN_FRAGMENT_WORDS:
                checked += 1
                assert fragment.strip() not in shown, (key, fragment)
    assert checked > 100  # the catalogue's prose, not a handful of words


def test_spanish_report_has_no_english_words_outside_data_and_citations(spanish_page):
    words = set(re.findall(r"[a-z']+", visible_text(spanish_page).lower()))
    assert words & ENGLISH_WORDS == set()
    english = f"<p>{i18n.t('thumbs.scale', 'en')}</p>"  # the detector itself: an English sentence is caught
    assert set(re.findall(r"[a-z']+", visible_text(english).lower())) & ENGLISH_WORDS


def table_text(page: str) -> str:
    """What every table of the page shows, cells and headings, leaving out <code> (names from the code)."""
    tables = " ".join(re.findall(r"<table.*?</table>", page, flags=re.S))
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<code>.*?</code>", " ", tables, flags=re.S)))


def test_spanish_tables_hold_no_english_word_of_the_catalogue(spanish_page):
    english, spanish = i18n.catalogue("en"), i18n.catalogue("es")
    strip = re.compile(r"\{\w+\}")
    english_only = words(strip.sub(" ", " ".join(english.values()))) - words(strip.sub(" ", " ".join(spanish.values())))
    shown = table_text(spanish_page)
    assert "Roles frente a cabezas al azar" in spanish_page and "7 de 21" in shown  # the controls table is there
    assert words(shown) & english_only == set()
    # the detector itself: the English page's tables are caught
    assert words(table_text(spanish_page.replace("cabezas etiquetadas", "heads labelled"))) & english_only


def test_spanish_numbers_use_one_convention(spanish_page):
    """Decimal comma, and a thousands separator that cannot be read as a decimal (462 464, not 462,464)."""
    shown = html_lib.unescape(spanish_page)
    assert "462\u00a0464" in shown and "462,464" not in shown and "462.464" not in shown
    assert "Umbral: 0,9" in shown and "Umbral: 0.9" not in shown  # thresholds too
    settings = table_text(spanish_page.split('id="scores"')[1].split("</section>")[0].split("<details>")[-1])
    assert "0,9" in settings and "True" not in settings and "None" not in settings
    assert "sí" in settings and "sin fijar" in settings


def test_page_script_has_no_prose_of_its_own():
    script = (resources.files("headlens.reports") / "report.js").read_text(encoding="utf-8")
    code = re.sub(r"^\s*//.*$", "", script, flags=re.M)  # comments are not shown
    selectors = set(re.findall(r'querySelector(?:All)?\("([^"]*)"', code))
    literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', code)) - selectors - {"use strict"}
    prose = [text for text in literals if re.search(r"[A-Za-z]{2,} [A-Za-z]{2,}", text)]
    assert prose == []  # every message reaches the page through the catalogue's JSON block
    assert "sort_title" in i18n.js_messages("es") and "status" in i18n.js_messages("es")


def test_report_errors_in_spanish(tmp_path):
    with pytest.raises(EmptyReportError, match="nada que informar"):
        render_report(tmp_path / "r.html", model_info=MODEL_INFO, lang="es")
    with pytest.raises(OutputPathError, match="es una carpeta"):
        render_report(tmp_path, model_info=MODEL_INFO, validation=validation_frame(), lang="es")
    with pytest.raises(ConfigError, match="unknown report language"):
        render_report(tmp_path / "r.html", model_info=MODEL_INFO, validation=validation_frame(), lang="de")

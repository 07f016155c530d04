"""The report in a real browser: headless Chromium (Debian's package) driven by Selenium.

Opened from a file:// path with the flags a user's browser has; console and network events come from the
Chrome DevTools Protocol performance log. CI installs chromium and chromium-driver (.ci/run);
elsewhere the tests skip when no browser is installed, but never under CI=true.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from headlens.classify.kinds import BY_LABEL, ROLES
from headlens.classify.labels import LABELS, roles_of
from headlens.reports.explain import score_thresholds
from headlens.reports.i18n import short_number, t
from headlens.results import Result
from tests.helpers.browser import (
    ALPHA_ATOL,
    MIN_PIXEL_STD,
    NASTY_TEXT,
    check_viewer_shows_induction,
    embedded_patterns,
    leaving_requests,
    no_alert,
    open_page,
    page_events,
    pixel_std,
    start_chromium,
    token_alphas,
    viewer_data,
)
from tests.helpers.planted import EXPECTED_LABELS, PLANTED_TEXT, build_planted
from tests.helpers.report_inputs import words

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module", params=["en", "es"])
def embedded_report(request, tmp_path_factory):
    """`headlens report tiny` (the embedded model) through the CLI, as `make demo` runs it, in English
    and in Spanish (every browser test runs on both)."""
    from click.testing import CliRunner

    from headlens.cli.main import cli

    out = tmp_path_factory.mktemp(f"browser-{request.param}") / "report.html"
    result = CliRunner().invoke(cli, ["report", "tiny", "--heads", "0.0", "--lang", request.param, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def page_lang(driver) -> str:
    return driver.find_element("tag name", "html").get_attribute("lang")


# The detectors themselves: a page that does request the network and logs an error is caught.


def test_detectors_catch_a_network_request_and_a_console_error(driver, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<img src="http://127.0.0.1:9/x.png"><script>console.error("boom")</script>')
    events = open_page(driver, page)
    assert leaving_requests(events["urls"], page) == ["http://127.0.0.1:9/x.png"]
    assert any("boom" in error for error in events["errors"])


# The embedded model's report


def test_report_loads_offline_without_errors(driver, embedded_report, tmp_path):
    events = open_page(driver, embedded_report)
    assert events["errors"] == []
    assert leaving_requests(events["urls"], embedded_report) == []
    assert any(url == embedded_report.resolve().as_uri() for url in events["urls"])  # the log is live
    driver.save_screenshot(str(tmp_path / "report.png"))
    assert pixel_std((tmp_path / "report.png").read_bytes()) > MIN_PIXEL_STD


def test_figures_are_visible(driver, embedded_report):
    open_page(driver, embedded_report)
    images = driver.find_elements("css selector", "section img")
    assert len(images) >= 3  # score heatmaps, thumbnails, ablation bars, training curves
    broken = driver.execute_script("return [...document.images].filter(i => !i.complete || !i.naturalWidth).length")
    assert broken == 0
    selectors = ["#scores img", "#ablation img", "#viewer-grid", "#training img"]  # tiny ships its training log
    for selector in selectors:
        element = driver.find_element("css selector", selector)
        driver.execute_script("arguments[0].scrollIntoView()", element)
        assert element.size["width"] > 50 and element.size["height"] > 20, selector
        assert pixel_std(element.screenshot_as_png) > MIN_PIXEL_STD, selector


def test_clicking_a_token_changes_the_attention_shown(driver, embedded_report):
    open_page(driver, embedded_report)
    data, patterns = embedded_patterns(embedded_report.read_text(encoding="utf-8"))
    layer, head = (int(x) for x in driver.find_element("id", "viewer-head").get_attribute("value").split("."))
    tokens = driver.find_elements("css selector", "#viewer-tokens .tok")
    assert len(tokens) == data["pos"]
    status_before = driver.find_element("id", "viewer-status").text
    strip = driver.find_element("css selector", "#viewer-grid canvas")
    strip_before = driver.execute_script("return arguments[0].toDataURL()", strip)
    query = data["pos"] // 2
    driver.execute_script("arguments[0].scrollIntoView()", tokens[query])
    tokens[query].click()
    alphas = token_alphas(driver)
    # What the page shows is the model's attention from the clicked token, for the chosen head.
    expected = np.where(np.arange(data["pos"]) <= query, patterns[layer, head, query], 0.0)
    assert np.allclose(alphas, expected, atol=ALPHA_ATOL)
    assert driver.find_element("id", "viewer-status").text != status_before
    status_start = t("js.status", page_lang(driver)).split("{query}")[0]  # "from token " / "desde el token "
    assert f"{status_start}{query} " in driver.find_element("id", "viewer-status").text
    assert driver.execute_script("return arguments[0].toDataURL()", strip) != strip_before
    assert page_events(driver)["errors"] == []


# The viewer's sample: the heads labelled induction do induction on it, measured with transformers directly
# on the token ids the page shows.


def test_viewer_sample_shows_the_labelled_induction_heads(embedded_report):
    from transformers import AutoModelForCausalLM

    from headlens.files import shipped_path

    model = AutoModelForCausalLM.from_pretrained(
        str(shipped_path("tiny")), attn_implementation="eager", dtype=torch.float32
    )
    measured = check_viewer_shows_induction(embedded_report.read_text(encoding="utf-8"), model)
    assert measured["n_queries"] > 10


# tiny's card: heads per layer, and the heads it labels induction (and retrieval), all in layer 1.
TINY_HEADS_PER_LAYER, TINY_ROLE_HEADS = 4, ("1.0", "1.2", "1.3")


def test_each_ablation_chart_shows_one_metric_in_its_unit(driver, embedded_report):
    """The page ablates 0.0 on the text and the role sets on repeat and needle: three charts, each under its
    own metric and unit, its picture's description naming that metric's axis."""
    from headlens.reports.sections import delta_axis, metric_heading

    open_page(driver, embedded_report)
    lang = page_lang(driver)
    charts = driver.execute_script(
        "return [...document.querySelectorAll('#ablation figure')].filter(f => f.querySelector('img[src^=\"data:\"]'))"
        ".map(f => [f.previousElementSibling?.textContent, f.querySelector('img').alt])"
    )
    charts = [chart for chart in charts if chart[0]]  # the chosen heads' charts (the pruning curve has none)
    metrics = ["loss", "repeat", "needle"]
    assert charts == [
        [metric_heading(m, lang), t("ablation.bars_alt", lang, axis=delta_axis(m, lang))] for m in metrics
    ]


def control_rows(driver) -> list[dict]:
    """The rows of the roles-against-random-heads table, keyed by column (data-column), as sorted (data-sort)."""
    return driver.execute_script(
        "const table = [...document.querySelectorAll('#ablation table')].find(t => t.querySelector("
        "'th[data-column=possible_sets]'));"
        "const names = [...table.querySelectorAll('th')].map(th => th.dataset.column);"
        "return [...table.querySelectorAll('tbody tr')].map(r => Object.fromEntries("
        "[...r.cells].map((c, i) => [names[i], c.dataset.sort])));"
    )


def test_controls_draw_only_other_sets_and_say_how_many_exist(driver, embedded_report):
    """tiny's role sets are 3 of layer 1's 4 heads: C(4, 3) - 1 = 3 other sets exist, so the 20 asked for
    become an exact test over those 3, rank out of 4 and smallest p 1/4 (Phipson & Smyth 2010)."""
    open_page(driver, embedded_report)
    rows = control_rows(driver)
    assert [row["metric"] for row in rows] == ["repeat", "needle"]
    others = math.comb(TINY_HEADS_PER_LAYER, len(TINY_ROLE_HEADS)) - 1
    for row in rows:
        assert row["chosen"] == ",".join(TINY_ROLE_HEADS)
        assert int(row["random_sets"]) == int(row["possible_sets"]) == others and row["exact"] == "1"
        assert float(row["smallest_p"]) == pytest.approx(1 / (others + 1))
        assert float(row["p_value"]) >= float(row["smallest_p"])


def test_role_summaries_cite_their_ablation_and_control(driver, embedded_report):
    """Each role's block in "What the heads do" cites the experiment run for that role, with its control, in
    the page's language and number convention, and not the other role's."""
    open_page(driver, embedded_report)
    lang = page_lang(driver)
    deltas = {row["metric"]: abs(float(row["delta"])) for row in control_rows(driver)}
    for role, metric, other in (("induction", "repeat", "needle"), ("retrieval", "needle", "repeat")):
        text = driver.find_element("id", f"role-{role}").text
        assert short_number(deltas[metric], lang, ".2f") in text, (role, text)
        assert short_number(deltas[other], lang, ".2f") not in text, (role, text)
        assert t("ablation.rank", lang, rank=1, n=4) in text


def test_tables_show_no_word_only_the_other_language_has(driver, embedded_report):
    """Every table of the page as the browser shows it (code names left out): no word that only the other
    language's catalogue has (no English left on the Spanish page, no Spanish on the English one)."""

    from headlens.reports import i18n

    open_page(driver, embedded_report)
    lang = page_lang(driver)
    other = {"en": "es", "es": "en"}[lang]
    strip = re.compile(r"\{\w+\}")
    own, foreign = (" ".join(i18n.catalogue(name).values()) for name in (lang, other))
    foreign_only = words(strip.sub(" ", foreign)) - words(strip.sub(" ", own))
    shown = driver.execute_script(
        "return [...document.querySelectorAll('table')].map(t => { const c = t.cloneNode(true);"
        " c.querySelectorAll('code').forEach(e => e.remove()); return c.textContent; }).join(' ')"
    )
    chosen = i18n.catalogue(lang)["ablation.chosen_role"].split("{role}")[0].strip()
    assert chosen in shown  # the controls table is among them ("heads labelled", "cabezas etiquetadas")
    assert words(shown) & foreign_only == set()


def test_label_table_sorts_on_click(driver, embedded_report):
    open_page(driver, embedded_report)
    table = driver.find_element("css selector", "#scores table.sortable")
    column = [th.get_attribute("data-column") for th in table.find_elements("css selector", "thead th")].index(
        "first_token_score"
    )
    header = table.find_elements("css selector", "thead th")[column]
    driver.execute_script("arguments[0].scrollIntoView()", header)
    header.click()
    values = driver.execute_script(
        "return [...arguments[0].tBodies[0].rows].map(r => parseFloat(r.cells[arguments[1]].dataset.sort))",
        table,
        column,
    )
    assert values == sorted(values) and len(values) > 1


# The label table: labelled heads first, a switch to hide the others


def visible_rows(driver) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#label-table tbody tr')].filter(r => r.offsetParent !== null)"
        ".map(r => [r.cells[0].textContent, r.cells[1].textContent, r.className])"
    )


def all_rows(driver) -> list[list[str]]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#label-table tbody tr')]"
        ".map(r => [r.cells[0].textContent, r.cells[1].textContent, r.className])"
    )


def test_labelled_heads_come_first_and_the_switch_hides_roleless_rows(driver, embedded_report):
    open_page(driver, embedded_report)
    rows = all_rows(driver)
    kinds = [cls for _, _, cls in rows]
    n_labelled, n_property = kinds.count("labelled"), kinds.count("property")
    # heads with a role, then heads that are only first-token sinks (a property), then the rest
    assert n_labelled > 0 and kinds == (
        ["labelled"] * n_labelled + ["property"] * n_property + ["unlabelled"] * (len(rows) - n_labelled - n_property)
    )
    roles = [LABELS.index(roles_of(labels.split(", "))[0]) for _, labels, cls in rows if cls == "labelled"]
    assert roles == sorted(roles)  # grouped by role (LABELS order)
    switch = driver.find_element("id", "label-switch")
    assert switch.is_displayed()
    assert visible_rows(driver) == rows[:n_labelled]  # labelled only, by default
    everything = switch.find_element("css selector", "input[value=all]")
    driver.execute_script("arguments[0].scrollIntoView()", everything)
    everything.click()
    assert visible_rows(driver) == rows
    switch.find_element("css selector", "input[value=labelled]").click()
    assert visible_rows(driver) == rows[:n_labelled]
    assert page_events(driver)["errors"] == []


def test_clicking_a_pattern_enlarges_it(driver, embedded_report):
    open_page(driver, embedded_report)
    image = driver.find_element("css selector", "#thumbnails .thumb img")
    driver.execute_script("arguments[0].scrollIntoView()", image)
    before = image.size["width"]
    assert before >= 200  # large enough to see a diagonal
    image.click()
    assert image.size["width"] > 1.5 * before
    image.click()
    assert image.size["width"] == before


def test_an_enlarged_pattern_closes_on_escape_and_on_a_click_elsewhere(driver, embedded_report):
    from selenium.webdriver.common.keys import Keys

    open_page(driver, embedded_report)
    image = driver.find_element("css selector", "#thumbnails .thumb img")
    driver.execute_script("arguments[0].scrollIntoView()", image)
    before = image.size["width"]
    image.click()
    assert image.size["width"] > 1.5 * before
    driver.find_element("css selector", "body").send_keys(Keys.ESCAPE)
    assert image.size["width"] == before
    image.click()
    assert image.size["width"] > 1.5 * before
    driver.execute_script("document.querySelector('h1').click()")  # anywhere outside the pattern
    assert image.size["width"] == before


@pytest.fixture(scope="module")
def gqa_report(tmp_path_factory):
    """`headlens report tiny-gqa`: 8 heads a layer, whose strips in one row would be 1,600 px wide."""
    from click.testing import CliRunner

    from headlens.cli.main import cli

    out = tmp_path_factory.mktemp("browser-gqa") / "report.html"
    result = CliRunner().invoke(cli, ["report", "tiny-gqa", "--controls", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_head_strips_wrap_inside_the_page(driver, gqa_report):
    """Every head's strip is there, and none reaches past the page's 1,200 px column."""
    open_page(driver, gqa_report)
    canvases = driver.find_elements("css selector", "#viewer-grid canvas")
    assert len(canvases) == 2 * 8  # tiny-gqa: 2 layers x 8 heads
    right = driver.execute_script("return document.body.getBoundingClientRect().right")
    for canvas in canvases:
        assert driver.execute_script("return arguments[0].getBoundingClientRect().right", canvas) <= right + 1


@pytest.fixture(scope="module")
def planted_report(tmp_path_factory):
    """The planted model (tests/helpers/planted.py, seed 0) classified and reported: its labelled heads are known
    by construction."""

    from headlens.classify import ClassifyConfig, classify_heads
    from headlens.classify.samples import sample_patterns
    from headlens.reports import render_report

    planted = build_planted(0)
    heads = classify_heads(planted.loaded, text=PLANTED_TEXT, config=ClassifyConfig(n_seq=4, seed=0))
    out = tmp_path_factory.mktemp("planted") / "planted.html"
    render_report(
        out,
        model_info={"name": "planted-0"},
        heads=heads,
        viewer=sample_patterns(planted.loaded, PLANTED_TEXT, 32, repeat=True),
    )
    return out, {role: f"{layer}.{head}" for role, (layer, head) in planted.positions.items()}


def test_summary_lists_every_planted_role_head_and_no_other(driver, planted_report):
    """Every planted head whose expected labels hold a role is listed under its role, and no other head; the
    planted first-token head earns only first_token, a property (a sink, not a role), so it is named in the
    sinks' summary and not in the role lists or the switch's "labelled only" view."""

    path, positions = planted_report
    with_role = {head for role, head in positions.items() if roles_of(EXPECTED_LABELS[role])}
    (sink,) = (head for role, head in positions.items() if not roles_of(EXPECTED_LABELS[role]))
    open_page(driver, path)
    findings = driver.find_element("id", "findings")
    assert driver.execute_script("return document.querySelector('section').id") == "findings"  # at the top
    listed = {
        re.match(r"(\d+\.\d+) ", item.text).group(1) for item in findings.find_elements("css selector", "li[data-head]")
    }
    assert listed == with_role
    assert f"Strongest: {sink} (" in driver.find_element("id", "role-first_token").text
    assert {head for head, _, _ in visible_rows(driver)} == with_role  # the switch's "labelled only" view


# Escaping: user text shows literally, runs nothing, injects nothing


@pytest.fixture(scope="module")
def nasty_report(small_model, tmp_path_factory):
    from headlens.classify.samples import sample_patterns
    from headlens.reports import render_report

    spec = small_model.spec
    heads = pd.DataFrame(
        [
            {"layer": layer, "head": head, "labels": ["first_token"], "first_token_score": 0.5}
            for layer in range(spec.n_layers)
            for head in range(spec.n_heads)
        ]
    )
    out = tmp_path_factory.mktemp("nasty") / "nasty.html"
    return render_report(
        out,
        model_info={"name": NASTY_TEXT, **{k: v for k, v in spec.__dict__.items()}},
        heads=Result("heads", heads),
        viewer=sample_patterns(small_model, NASTY_TEXT, max_tokens=64),
        command=f"headlens report {NASTY_TEXT}",
        text_label=NASTY_TEXT,
    )


def test_hostile_text_is_shown_literally_and_never_runs(driver, nasty_report):
    events = open_page(driver, nasty_report)
    assert no_alert(driver)
    assert events["errors"] == [] and leaving_requests(events["urls"], nasty_report) == []
    # Only our four script elements (the viewer's data, the head map's facts, the messages, the page script), no
    # image without a data: URI.
    assert len(driver.find_elements("css selector", "script")) == 4
    assert driver.find_elements("css selector", 'img:not([src^="data:"])') == []
    assert driver.execute_script("return document.querySelectorAll('[onerror]').length") == 0
    summary = driver.find_element("id", "summary").text
    for piece in (
        "<script>alert(1)</script>",
        '"><img src=x onerror=alert(1)>',
        "</script>",
        "{{ 7*7 }}",
        "${7*7}",
        "`${x}`",
    ):
        assert piece in summary, piece
    undated = re.sub(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}", "", summary)  # the page's own date may hold a 49
    assert "49" not in undated  # no template engine evaluated {{ 7*7 }} or ${7*7}
    tokens = "".join(t.get_attribute("textContent") for t in driver.find_elements("css selector", ".tok"))
    assert "<script>alert(1)</script>" in tokens and '"><img src=x onerror=alert(1)>' in tokens
    driver.find_elements("css selector", ".tok")[3].click()
    assert no_alert(driver)


# Without JavaScript: static figures and plain tables, and a note where the viewer would be


def test_report_reads_without_javascript(embedded_report):
    browser = start_chromium(javascript=False)
    try:
        browser.get(embedded_report.resolve().as_uri())
        assert browser.find_element("css selector", "#viewer noscript p").is_displayed()
        assert not browser.find_element("id", "viewer-app").is_displayed()
        assert browser.find_elements("css selector", "#viewer-tokens .tok") == []  # proof the script did not run
        image = browser.find_element("css selector", "#scores img")
        browser.execute_script("arguments[0].scrollIntoView()", image)
        assert pixel_std(image.screenshot_as_png) > MIN_PIXEL_STD
        rows = browser.find_elements("css selector", "#scores table.sortable tbody tr")
        data = embedded_patterns(embedded_report.read_text(encoding="utf-8"))[0]
        assert len(rows) == data["n_layers"] * data["n_heads"]  # one row per head
        assert all(row.is_displayed() for row in rows)  # the full table, labelled heads first
        assert not browser.find_element("id", "label-switch").is_displayed()
        kinds = [row.get_attribute("class") for row in rows]
        assert kinds == sorted(kinds)  # "labelled" rows before "unlabelled" ones
    finally:
        browser.quit()


# The SmolLM2 page as a reader meets it (270 heads): built once by the library's report pipeline, drawn in
# English and in Spanish from the same results (conftest's smollm2_pages), read in Chromium at 1400 x 900 px.

READER_WINDOW = (1400, 900)
# The page opens at under this many bytes, and at most this many screens tall before its folded parts.
MAX_PAGE_BYTES = 1_500_000
MAX_SCREENS = 10
# A role's stripe in a head-map cell is at least this many CSS pixels wide: visible without zooming.
MIN_STRIPE_PX = 4.0
# Legend text at least this many CSS pixels (the page's body text is 16 px).
MIN_LEGEND_PX = 12.0


@pytest.fixture(scope="module")
def reader():
    browser = start_chromium()
    browser.set_window_size(*READER_WINDOW)
    yield browser
    browser.quit()


@pytest.fixture(params=["en", "es"])
def smollm2_page(request, smollm2_pages, reader):
    """The SmolLM2 page in one language, open in the reader's window (its folded parts closed)."""
    path = smollm2_pages[request.param]
    events = open_page(reader, path)
    assert events["errors"] == [] and leaving_requests(events["urls"], path) == []
    return path, request.param


def label_table_roles(driver) -> dict[str, list[str]]:
    """Head -> its roles, from the label table (every row, hidden or folded), in the registry's order."""
    rows = driver.execute_script(
        "return [...document.querySelectorAll('#label-table tbody tr')].map(r => [r.cells[0].textContent, "
        "r.cells[1].textContent])"
    )
    found = {head: [role for role in ROLES if role in labels.split(", ")] for head, labels in rows}
    return {head: roles for head, roles in found.items() if roles}


@pytest.mark.real
def test_smollm2_head_map_shows_every_role_of_every_head(reader, smollm2_page):
    """Item 1: each role a head carries (label table) is a visible stripe of that head's cell, in the role's
    colour; the legend names every role shown, positional heads too, with its head count, in readable text."""
    _, lang = smollm2_page
    roles = label_table_roles(reader)
    assert len(roles) > 10  # SmolLM2 has dozens of heads with a role
    stripes = reader.execute_script(
        "const out = {}; document.querySelectorAll('#head-map g[data-head]').forEach(g => { out[g.dataset.head] ="
        " [...g.querySelectorAll('rect[data-role]')].map(r => [r.dataset.role, r.getBoundingClientRect().width,"
        " getComputedStyle(r).fill]); }); return out;"
    )
    assert len(stripes) == 270
    for head, expected in roles.items():
        assert [role for role, _, _ in stripes[head]] == expected, head
        for role, width, fill in stripes[head]:
            assert width >= MIN_STRIPE_PX, (head, role, width)
            assert fill == "rgb({}, {}, {})".format(*(int(BY_LABEL[role].colour[i : i + 2], 16) for i in (1, 3, 5)))
    assert not any(stripes[head] for head in set(stripes) - set(roles))  # no role drawn that the table lacks
    legend = reader.execute_script(
        "return [...document.querySelectorAll('#head-map .map-legend li[data-role]')].map(li => [li.dataset.role,"
        " li.textContent, parseFloat(getComputedStyle(li).fontSize)])"
    )
    counts = {role: sum(role in found for found in roles.values()) for role in BY_LABEL}
    assert [role for role, _, _ in legend] == [role for role in counts if counts[role]]
    for role, text, size in legend:
        assert text == f"{t(BY_LABEL[role].name_key, lang)} ({counts[role]})" and size >= MIN_LEGEND_PX
    assert "positional" in counts and counts["positional"] > 0  # the role the old legend left out


@pytest.mark.real
def test_smollm2_counts_add_up(reader, smollm2_page):
    """Item 2: the intro's count of heads with a role, each role's heading, the legend and the label table
    agree; where heads carry several roles the intro says the role counts add up to more, and by how much."""
    _, lang = smollm2_page
    roles = label_table_roles(reader)
    counts = {role: sum(role in found for found in roles.values()) for role in BY_LABEL}
    intro = reader.find_element("css selector", "#findings p").text
    n_heads = 270
    assert (
        t("findings.intro", lang, n_labelled=len(roles), n_heads=n_heads, n_none=n_heads - len(roles), top=10) in intro
    )
    n_multi = sum(len(found) > 1 for found in roles.values())
    assert n_multi > 0  # SmolLM2's positional heads are its previous- and current-token heads
    overlap = t("findings.overlap", lang).split("{combos}")[0]
    assert overlap.format(n_multi=n_multi, n_pairs=sum(counts.values()), n_labelled=len(roles)) in intro
    for role, n in counts.items():
        if n:
            heading = reader.find_element("css selector", f"#role-{role} h3").text
            assert heading == t("findings.role_heading", lang, role=t(BY_LABEL[role].name_key, lang), n=n)


@pytest.mark.real
def test_smollm2_retrieval_evidence_is_per_head_or_said_once(reader, smollm2_page):
    """Item 3: the model-wide needle count is said once in the retrieval block, never on a head's line."""
    _, lang = smollm2_page
    block = reader.find_element("id", "role-retrieval")
    needle_words = t("findings.retrieved_model", lang).split("{n_retrieved}")[0]
    assert block.get_attribute("textContent").count(needle_words) == 1
    lines = [item.get_attribute("textContent") for item in block.find_elements("css selector", "li[data-head]")]
    assert lines and not any(needle_words in line for line in lines)
    scores = reader.execute_script(
        "const t = document.getElementById('label-table'); const names = [...t.querySelectorAll('thead th')]"
        ".map(th => th.dataset.column); const i = names.indexOf('retrieval_score'); return Object.fromEntries("
        "[...t.tBodies[0].rows].map(r => [r.cells[0].textContent, parseFloat(r.cells[i].dataset.sort)]))"
    )
    for line in lines:  # each head's line gives that head's own score (the label table's), to 2 decimals
        head, shown = re.match(r"(\d+\.\d+) .*?(\d+[.,]\d+)$", line).groups()
        assert float(shown.replace(",", ".")) == pytest.approx(scores[head], abs=0.005), line


def open_details(driver, selector: str = "details") -> None:
    driver.execute_script(f"document.querySelectorAll({selector!r}).forEach(d => d.open = true)")


@pytest.mark.real
def test_smollm2_previous_token_rule_is_under_its_heatmap(reader, smollm2_page):
    """Item 4: the previous-token heatmap says, under itself, that its label rests on the positional share."""
    _, lang = smollm2_page
    open_details(reader, "#scores details")
    text = reader.find_element("id", "score-prev_token_score").text
    threshold = score_thresholds({}).get("positional_share")
    assert t("scores.rule.prev_token_score", lang, threshold=short_number(threshold, lang)) in text
    image = reader.find_element("css selector", "#score-prev_token_score img")
    reader.execute_script("arguments[0].scrollIntoView()", image)
    assert pixel_std(image.screenshot_as_png) > MIN_PIXEL_STD


@pytest.mark.real
def test_smollm2_summary_says_what_the_viewer_shows(reader, smollm2_page):
    """Item 5: the summary's words on the sample match the viewer: the text twice, or random tokens."""
    path, lang = smollm2_page
    data = viewer_data(path.read_text(encoding="utf-8"))
    half = (data["pos"] - 1) // 2
    assert data["ids"][1 : 1 + half] == data["ids"][1 + half : 1 + 2 * half]  # a repeated sample
    sample = reader.find_element("css selector", "#summary pre.sample-text").get_attribute("textContent")
    from_text = "".join(data["tokens"][1 : 1 + half]).strip()[:40] in sample
    summary = reader.find_element("id", "summary").text
    key = "summary.sample_repeated" if from_text else "summary.sample_random"
    assert t(key, lang) in summary
    assert t("summary.sample_random" if from_text else "summary.sample_repeated", lang) not in summary


@pytest.mark.real
def test_smollm2_key_columns_and_long_tables(reader, smollm2_page):
    """Item 6: rank and p of the roles-against-random-heads table inside the window; thumbnails of heads with
    a role only, in a regular grid with token labels; long tables (key/value groups, validation) folded."""
    _, lang = smollm2_page
    table = reader.find_element("id", "control-table")
    reader.execute_script("arguments[0].scrollIntoView(); window.scrollTo(0, window.scrollY)", table)
    width = reader.execute_script("return document.documentElement.clientWidth")
    for column in ("rank", "p_value", "delta"):
        right = reader.execute_script(
            f"return arguments[0].querySelector('th[data-column={column}]').getBoundingClientRect().right", table
        )
        assert right <= width, (column, right, width)
    open_details(reader, "#thumbnails details")
    roles = label_table_roles(reader)
    thumbs = reader.execute_script(
        "return [...document.querySelectorAll('#thumbnails figure.thumb')].map(f => [f.dataset.head,"
        " Math.round(f.getBoundingClientRect().width), f.querySelectorAll('.xticks span:not(:empty)').length])"
    )
    assert {head for head, _, _ in thumbs} == set(roles)  # every head with a role, no sink-only head
    assert len({w for _, w, _ in thumbs}) == 1  # one column width
    assert all(n >= 2 for _, _, n in thumbs)  # tokens named on the axes
    shown_rows = reader.execute_script(
        "return [...document.querySelectorAll('#validation table, #kv-groups table')]"
        ".filter(t => !t.closest('details')).map(t => t.tBodies[0].rows.length)"
    )
    assert shown_rows and max(shown_rows) <= 30, shown_rows


FLOAT_CELL = {
    "en": re.compile(r"^-?\d{1,3}(,\d{3})*(\.\d+)?( × 10[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)?$"),
    "es": re.compile(r"^-?\d{1,3}(\u00a0\d{3})*(,\d+)?( × 10[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)?$|^-?\d{1,4}(,\d+)?$"),
}


@pytest.mark.real
def test_smollm2_numbers_in_one_style(reader, smollm2_page):
    """Item 7: every decimal cell of every table in the language's one style (no e-notation; Spanish decimal
    comma and grouping), and no long run of digits in the prose."""
    _, lang = smollm2_page
    cells = reader.execute_script(
        "const skip = new Set(['head', 'heads', 'chosen', 'query_heads', 'labels', 'value', 'sender', 'receiver']);"
        "const out = [];"
        "document.querySelectorAll('table').forEach(t => { const names = [...t.querySelectorAll('thead th')]"
        ".map(th => th.dataset.column); t.querySelectorAll('tbody tr').forEach(r => [...r.cells].forEach((c, i) =>"
        " { const key = c.dataset.sort || ''; if (!skip.has(names[i]) && /^-?[0-9.]+(e[-+]?[0-9]+)?$/.test(key)"
        " && /[.e]/.test(key)) out.push(c.textContent); })); }); return out;"
    )
    assert len(cells) > 100
    wrong = [cell for cell in cells if not FLOAT_CELL[lang].match(cell)]
    assert wrong == []
    prose = reader.find_element("id", "findings").text
    assert re.findall(r"\d{5,}", prose) == []


@pytest.mark.real
def test_smollm2_page_size(reader, smollm2_page):
    """Under 1.5 MB, with its main parts shown before the folded parts are opened."""
    path, _ = smollm2_page
    assert path.stat().st_size < MAX_PAGE_BYTES
    for anchor in ("findings", "head-map", "viewer", "ablation"):
        assert reader.find_element("id", anchor).is_displayed(), anchor


@pytest.mark.real
def test_smollm2_page_screens(reader, smollm2_page):
    """At most 10 screens of 1400 x 900 px before the folded parts are opened."""
    height = reader.execute_script("return document.documentElement.scrollHeight")
    screens = height / reader.execute_script("return window.innerHeight")
    assert screens <= MAX_SCREENS, screens

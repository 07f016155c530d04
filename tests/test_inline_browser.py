"""Inline views in a real notebook page: executed in a kernel, saved, read back, exported with nbconvert, opened in
headless Chromium.

Four attention viewers share the exported page (two samples, one in Spanish and one of hostile text): clicking
a token in one colours its tokens with the clicked row of the embedded pattern, in its own language, and leaves
the others alone; nothing requests the network except nbconvert's own template (require.js and MathJax from a
CDN, the same with or without our outputs); hostile text shows literally and runs nothing. Without JavaScript
(an untrusted notebook, GitHub's preview) each viewer's static picture shows instead.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.browser import ALPHA_ATOL, NASTY_TEXT, no_alert, open_page, start_chromium
from tests.helpers.notebooks import execute

nbformat = pytest.importorskip("nbformat")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = [
    "import headlens\nfrom headlens.load.models import load_model\nloaded = load_model('tiny')",
    "headlens.show_attention(loaded, 'In the beginning God created the heaven and the earth.', repeat=True)",
    "from headlens.reports.inline import attention_sample, view\nview(attention_sample(loaded, 'abcabcabc'))",
    "headlens.show_attention(loaded, 'Y la tierra estaba desordenada y vacía.', lang='es')",
    f"headlens.show_attention(loaded, {NASTY_TEXT!r})",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, jupyter_path):
    """The notebook executed, saved, read back and exported: (page with outputs, page of the bare template)."""
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_notebook

    folder = tmp_path_factory.mktemp("inline_notebook")
    nb = new_notebook(cells=[new_code_cell(source) for source in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with pytest.MonkeyPatch.context() as monkeypatch:
        execute(nb, jupyter_path, folder, monkeypatch)
        nbformat.write(nb, folder / "saved.ipynb")
        saved = nbformat.read(folder / "saved.ipynb", as_version=4)
        page, _ = HTMLExporter().from_notebook_node(saved)
        bare = nbformat.v4.new_notebook(cells=[new_code_cell("1")])
        bare_page, _ = HTMLExporter().from_notebook_node(bare)
    (folder / "page.html").write_text(page, encoding="utf-8")
    (folder / "bare.html").write_text(bare_page, encoding="utf-8")
    return folder / "page.html", folder / "bare.html"


def template_urls(page: Path) -> set[str]:
    return set(re.findall(r'<script[^>]* src="([^"]+)"', page.read_text(encoding="utf-8")))


def viewers(html: str) -> list[tuple[str, dict, np.ndarray]]:
    """(id suffix, data, patterns [layer, head, q, k]) of each viewer embedded in the page, in page order."""
    found = []
    # nbconvert re-serialises the outputs (attribute order may change)
    for suffix, text in re.findall(r'<script[^>]* id="viewer-data(-hl[0-9a-f]+)"[^>]*>(.*?)</script>', html, re.S):
        data = json.loads(text)
        raw = np.frombuffer(base64.b64decode(data["patterns_b64"]), dtype=np.uint8)
        found.append((suffix, data, raw.reshape(data["n_layers"], data["n_heads"], data["pos"], data["pos"]) / 255))
    return found


def status_start(driver, suffix: str, query: int) -> str:
    """How the viewer's status line starts for a click on token `query`, in the viewer's language."""
    from headlens.reports.i18n import js_messages

    lang = driver.execute_script(f"return document.getElementById('headlens{suffix}').lang")
    return js_messages(lang)["status"].split("{query}")[0] + f"{query} "


def alphas(driver, suffix: str) -> list[float]:
    styles = driver.execute_script(
        f"return [...document.querySelectorAll('#viewer-tokens{suffix} .tok')].map(t => t.style.backgroundColor)"
    )
    numbers = [re.findall(r"[\d.]+", style) for style in styles]  # rgb(r, g, b) or rgba(r, g, b, a)
    return [float(n[3]) if len(n) == 4 else 1.0 for n in numbers]


def test_the_export_is_the_saved_notebook_with_every_viewer(exported):
    page, _ = exported
    found = viewers(page.read_text(encoding="utf-8"))
    assert len(found) == 4
    assert len({suffix for suffix, _, _ in found}) == 4


def test_viewers_load_offline_without_errors(driver, exported):
    page, bare = exported
    events = open_page(driver, page)
    allowed = template_urls(bare)  # nbconvert's template asks for these whatever the notebook holds
    assert template_urls(page) == allowed
    leaving = [u for u in events["urls"] if u != page.resolve().as_uri() and not u.startswith("data:")]
    assert set(leaving) <= allowed
    assert [e for e in events["errors"] if not any(url in e for url in allowed)] == []
    assert no_alert(driver)
    for suffix, data, _ in viewers(page.read_text(encoding="utf-8")):
        assert driver.find_element("id", f"viewer-app{suffix}").is_displayed()
        assert not driver.find_element("id", f"viewer-static{suffix}").is_displayed()
        assert len(driver.find_elements("css selector", f"#viewer-tokens{suffix} .tok")) == data["pos"]
        assert (
            len(driver.find_elements("css selector", f"#viewer-grid{suffix} canvas"))
            == data["n_layers"] * data["n_heads"]
        )


def test_clicking_a_token_changes_that_viewer_only(driver, exported):
    page, _ = exported
    open_page(driver, page)
    found = viewers(page.read_text(encoding="utf-8"))
    for index, (suffix, data, patterns) in enumerate(found):
        others = {s: driver.find_element("id", f"viewer-status{s}").text for s, _, _ in found if s != suffix}
        layer, head = (
            int(x) for x in driver.find_element("id", f"viewer-head{suffix}").get_attribute("value").split(".")
        )
        query = data["pos"] // 2 + index  # a different row in each viewer
        token = driver.find_elements("css selector", f"#viewer-tokens{suffix} .tok")[query]
        driver.execute_script("arguments[0].scrollIntoView()", token)
        token.click()
        expected = np.where(np.arange(data["pos"]) <= query, patterns[layer, head, query], 0.0)
        assert np.allclose(alphas(driver, suffix), expected, atol=ALPHA_ATOL)
        assert driver.find_element("id", f"viewer-status{suffix}").text.startswith(status_start(driver, suffix, query))
        assert {s: driver.find_element("id", f"viewer-status{s}").text for s in others} == others
    assert no_alert(driver)
    assert driver.find_element("id", f"viewer-status{found[2][0]}").text.startswith("desde el token")


def test_hostile_text_shows_literally_and_runs_nothing(driver, exported):
    page, _ = exported
    open_page(driver, page)
    suffix = viewers(page.read_text(encoding="utf-8"))[-1][0]
    text = "".join(
        t.get_attribute("textContent") for t in driver.find_elements("css selector", f"#viewer-tokens{suffix} .tok")
    )
    assert "<script>alert(1)</script>" in text and '"><img src=x onerror=alert(1)>' in text
    assert driver.execute_script("return document.querySelectorAll('[onerror]').length") == 0
    driver.find_elements("css selector", f"#viewer-tokens{suffix} .tok")[5].click()
    assert no_alert(driver)


def test_without_javascript_the_static_pictures_show(exported):
    page, _ = exported
    browser = start_chromium(javascript=False)
    try:
        browser.get(page.resolve().as_uri())
        for suffix, _, _ in viewers(page.read_text(encoding="utf-8")):
            still = browser.find_element("css selector", f"#viewer-static{suffix} img")
            assert still.is_displayed() and browser.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth > 0", still
            )
            assert not browser.find_element("id", f"viewer-app{suffix}").is_displayed()
        assert browser.find_elements("css selector", ".tok") == []
    finally:
        browser.quit()

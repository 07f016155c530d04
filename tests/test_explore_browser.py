"""`headlens explore` in real Chromium (selenium, as tests/test_browser.py drives the report), served on
127.0.0.1 on `tiny`: what the page shows, read from the DOM, against the model's own attention and against
`headlens ablate`; hostile text; two browsers at once; an oversized text; where the server listens."""

from __future__ import annotations

import json
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner
from selenium.webdriver.common.by import By

from headlens.classify.kinds import BY_LABEL
from headlens.classify.labels import label_list
from headlens.cli.main import cli
from headlens.reports.explore import Explorer, create_app
from headlens.reports.explore.serve import BackgroundServer
from headlens.reports.i18n import percent, quantity, t
from tests.helpers.browser import NASTY_TEXT, no_alert, page_events, start_chromium
from tests.helpers.explore_setup import OTHER, REPEATED, hf_patterns, tiny_setup

pytestmark = pytest.mark.browser

WAIT_S = 120.0
# data-weight holds 4 decimals of the float the server sent (itself 4 decimals of the float32 weight).
WEIGHT_ATOL = 1e-4 + 1e-6


TOKEN = secrets.token_urlsafe(32)  # the module's server's token: the first visit of each page carries it


@pytest.fixture(scope="module")
def server():
    loaded, frame, _ = tiny_setup()
    with BackgroundServer(create_app(Explorer(loaded, frame), token=TOKEN)) as url:
        yield url


@pytest.fixture(scope="module")
def driver():
    browser = start_chromium()
    yield browser
    browser.quit()


def wait_for(driver, script: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {script}")


IDLE = "return document.body.className === ''"
LOADED = (
    "var c = document.querySelectorAll('canvas.thumb-canvas');"
    "return c.length > 0 && document.querySelectorAll('canvas[data-loaded]').length === c.length"
    " && document.body.className === ''"
)


def submit(driver, url: str, text: str) -> None:
    driver.get(f"{url}?token={TOKEN}")  # the address printed at start; the server redirects to `url`
    box = driver.find_element(By.ID, "text")
    driver.execute_script("arguments[0].value = arguments[1];", box, text)  # send_keys would be slow
    driver.find_element(By.ID, "submit").click()


def test_a_clicked_head_and_token_show_the_models_attention(driver, server):
    loaded = tiny_setup()[0]
    submit(driver, server, REPEATED)
    wait_for(driver, LOADED)
    events = page_events(driver)
    assert events["errors"] == []
    assert all(u.startswith(server) or u.startswith("data:") for u in events["urls"]), events["urls"]
    truth = hf_patterns(loaded, REPEATED).numpy()  # [layer, head, q, k]
    query = truth.shape[-1] - 4  # on the second copy
    driver.find_element(By.CSS_SELECTOR, '.cell[data-head="1.2"] canvas').click()
    wait_for(driver, "return document.getElementById('head-canvas') && document.body.className === ''")
    driver.find_element(By.CSS_SELECTOR, f'#tokens .tok[data-pos="{query}"]').click()
    wait_for(
        driver,
        f"return document.querySelector('#tokens .tok.query[data-pos=\"{query}\"]') && "
        "document.querySelectorAll('#row-panel .strip').length === 4",
    )
    shown = [float(s.get_attribute("data-weight")) for s in driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")]
    expected = np.concatenate([truth[1, 2, query, : query + 1], np.zeros(truth.shape[-1] - query - 1)])
    np.testing.assert_allclose(shown, expected, atol=WEIGHT_ATOL)
    assert max(shown) > 0.2  # the head attends somewhere in particular: not a comparison of zeros


@pytest.fixture(scope="module")
def spanish_server():
    loaded, frame, _ = tiny_setup()
    with BackgroundServer(create_app(Explorer(loaded, frame), lang="es", token=TOKEN)) as url:
        yield url


def test_the_spanish_explorer_writes_numbers_and_a_heads_stability_as_the_report_does(driver, spanish_server):
    """The Spanish page's numbers are the report's (headlens.reports.i18n.quantity and percent, the Python
    formatters), to the character: the head's scores and intervals, each label's stability with its ranking
    score's interval (a borderline label marked), and the status line's weight; none with a decimal point."""
    frame = tiny_setup()[1]
    row = frame[(frame["layer"] == 1) & (frame["head"] == 2)].iloc[0]
    labels = [label for label in label_list(row["labels"]) if np.isfinite(row.get(f"{label}_stability", np.nan))]
    assert labels  # tiny's 1.2 carries a role whose stability the classification measured
    submit(driver, spanish_server, REPEATED)
    wait_for(driver, LOADED)
    driver.find_element(By.CSS_SELECTOR, '.cell[data-head="1.2"] canvas').click()
    wait_for(driver, "return document.getElementById('head-canvas') && document.body.className === ''")
    scores = driver.execute_script(
        "return [...document.querySelectorAll('#head-scores tbody tr')].map(r => [r.cells[0].textContent,"
        " r.cells[1].textContent])"
    )
    assert scores
    for name, shown in scores:
        value = quantity(row[name], "es")
        low, high = row.get(f"{name}_lo", np.nan), row.get(f"{name}_hi", np.nan)
        interval = f" [{quantity(low, 'es')}, {quantity(high, 'es')}]" if np.isfinite(low) else ""
        assert shown == value + interval, (name, shown)
    lines = driver.execute_script(
        "return [...document.querySelectorAll('#head-figure ul.stability li')].map(li => [li.dataset.label,"
        " li.textContent, li.className])"
    )
    assert [label for label, _, _ in lines] == labels
    weak = label_list(row["borderline"])
    for label, text, kind in lines:
        column = BY_LABEL[label].score
        expected = t("js.x_stability", "es", label=label, share=percent(row[f"{label}_stability"], "es"))
        expected += t(
            "js.x_interval",
            "es",
            score=column,
            value=quantity(row[column], "es"),
            low=quantity(row[f"{column}_lo"], "es"),
            high=quantity(row[f"{column}_hi"], "es"),
        )
        expected += t("js.x_borderline", "es") if label in weak else ""
        assert text == expected and (kind == "borderline") == (label in weak)
    query = len(driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")) - 4  # on the second copy
    driver.find_element(By.CSS_SELECTOR, f'#tokens .tok[data-pos="{query}"]').click()
    wait_for(driver, "return document.querySelectorAll('#row-panel .strip').length === 4 && " + IDLE[7:])
    weights = [float(s.get_attribute("data-weight")) for s in driver.find_elements(By.CSS_SELECTOR, "#tokens .tok")]
    found = re.search(r"\((\d+(,\d+)?)\)$", driver.find_element(By.ID, "status").text)
    assert found and float(found.group(1).replace(",", ".")) == pytest.approx(max(weights), abs=0.005)
    text = driver.execute_script("return document.getElementById('main').innerText")
    points = [
        match.group()
        for match in re.finditer(r"(?<![\w.])(\d+)\.(\d+)(?![\w.])", text)
        if not (int(match.group(1)) < 2 and len(match.group(2)) == 1 and int(match.group(2)) < 4)  # head L.H
    ]
    assert points == [] and re.search(r"\d,\d", text)


def test_the_ablation_panel_equals_headlens_ablate(driver, server, tmp_path):
    submit(driver, server, REPEATED)
    wait_for(driver, LOADED)
    for head in ("1.0", "1.2"):
        driver.find_element(By.CSS_SELECTOR, f'input.tick[data-head="{head}"]').click()
    driver.find_element(By.CSS_SELECTOR, "input[name=method][value=mean]").click()
    driver.find_element(By.ID, "ablate-go").click()
    wait_for(driver, "return document.getElementById('ablate-summary').getAttribute('data-loss')")
    summary = driver.find_element(By.ID, "ablate-summary")
    text_file = tmp_path / "text.txt"
    text_file.write_text(REPEATED, encoding="utf-8")
    args = ["ablate", "tiny", "--heads", "1.0,1.2", "--method", "mean", "--text", str(text_file), "--format", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    truth = json.loads(result.stdout)
    assert float(summary.get_attribute("data-loss")) == pytest.approx(truth["loss"], rel=1e-9)
    assert float(summary.get_attribute("data-loss-ablated")) == pytest.approx(truth["loss_ablated"], rel=1e-9)
    assert quantity(truth["loss"]) in summary.text and quantity(truth["loss_ablated"]) in summary.text  # one style
    tokens = driver.find_elements(By.CSS_SELECTOR, "#ablate-tokens .tok")
    assert len(tokens) == truth["n_tokens"]
    after = np.mean([float(t.get_attribute("data-after")) for t in tokens])
    assert after == pytest.approx(truth["loss_ablated"], rel=1e-6)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#top-before tr")) == 5


def test_hostile_text_is_shown_literally_and_runs_nothing(driver, server):
    loaded = tiny_setup()[0]
    submit(driver, server, NASTY_TEXT)
    wait_for(driver, LOADED)
    assert no_alert(driver)
    assert driver.find_elements(By.CSS_SELECTOR, "#tokens img, #tokens script") == []
    shown = driver.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('#tokens .tok'), function (s) {"
        " return s.textContent; }).join('')"
    )
    ids = loaded.tokenizer(NASTY_TEXT, add_special_tokens=False)["input_ids"]
    expected = loaded.tokenizer.decode([loaded.bos_token_id]) + "".join(loaded.tokenizer.decode([i]) for i in ids)
    assert shown == expected.replace("\n", "\u21b5").replace("\t", "\u2192")
    assert page_events(driver)["errors"] == []


def test_two_browsers_at_once_get_their_own_answers(driver, server):
    loaded = tiny_setup()[0]
    other = start_chromium()
    try:
        drivers, texts, found = [driver, other], [REPEATED, OTHER], {}

        def use(index: int) -> None:
            d = drivers[index]
            submit(d, server, texts[index])
            wait_for(d, LOADED)
            d.find_element(By.CSS_SELECTOR, '.cell[data-head="1.1"] canvas').click()
            wait_for(d, "return document.getElementById('head-canvas') && document.body.className === ''")
            d.find_element(By.CSS_SELECTOR, '#tokens .tok[data-pos="9"]').click()
            wait_for(
                d,
                "return document.querySelector('#tokens .tok.query[data-pos=\"9\"]') && "
                "document.querySelectorAll('#row-panel .strip').length === 4 && document.body.className === ''",
            )
            tokens = d.find_elements(By.CSS_SELECTOR, "#tokens .tok")
            found[index] = ([t.text for t in tokens], [float(t.get_attribute("data-weight")) for t in tokens])

        threads = [threading.Thread(target=use, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        other.quit()
    for index, text in enumerate(texts):
        tokens, weights = found[index]
        assert len(tokens) == len(loaded.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
        truth = hf_patterns(loaded, text).numpy()[1, 1, 9]  # [k]
        np.testing.assert_allclose(weights, truth, atol=WEIGHT_ATOL)


def test_an_oversized_text_is_refused_with_a_clear_message(driver, server):
    submit(driver, server, "a" * 300)  # tiny: 300 tokens, over its cap of 255
    status = wait_for(
        driver, "var s = document.getElementById('status'); return s.className === 'note' && s.textContent"
    )
    assert "300 tokens" in status and "255" in status
    assert driver.find_element(By.ID, "main").get_attribute("hidden") is not None  # nothing drawn


def _other_address() -> str | None:
    """A non-loopback IPv4 address of this machine, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # a documentation address: nothing is sent by a UDP connect
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_the_cli_serves_on_loopback_only_and_warns_for_another_host(tmp_path):
    from headlens.cli.commands_classify import _json

    labels = tmp_path / "heads.json"
    labels.write_text(_json(tiny_setup()[1]))
    command = [sys.executable, "-m", "headlens.cli.main", "explore", "tiny", "--port", "0", "--labels", str(labels)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "http://" not in line:
            line = process.stderr.readline()
            assert line or process.poll() is None, "the server exited"
        url, token = re.search(r"(http://\S+/)\?token=(\S+)", line).groups()
        assert url.startswith("http://127.0.0.1:")
        request = urllib.request.Request(url + "api/model", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["name"] == "tiny"
        other = _other_address()
        if other is not None:
            port = int(url.rstrip("/").rsplit(":", 1)[1])
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"http://{other}:{port}/api/model", timeout=5)
    finally:
        process.terminate()
        assert process.wait(timeout=30) is not None
    warned = subprocess.Popen([*command, "--host", "0.0.0.0"], stderr=subprocess.PIPE, text=True)
    try:
        line = warned.stderr.readline()
        while line and "warning" not in line and "http://" not in line:
            line = warned.stderr.readline()
        assert "warning" in line and "0.0.0.0" in line
    finally:
        warned.terminate()
        warned.wait(timeout=30)


def test_a_server_error_is_shown_as_its_message(driver):
    """The last-resort JSON 500 reaches the page as its one line, not as a JSON parse error of the reply."""
    loaded, frame, _ = tiny_setup()
    explorer = Explorer(loaded, frame)
    explorer.start_run = lambda text: 1 / 0
    with BackgroundServer(create_app(explorer, token=TOKEN)) as url:
        submit(driver, url, "anything")
        status = wait_for(
            driver, "var s = document.getElementById('status'); return s.className === 'note' && s.textContent"
        )
    assert "internal error (ZeroDivisionError)" in status and "Unexpected token" not in status

"""A headless Chromium for the browser tests (the `driver` fixture in conftest.py starts one per module), what
they read back from a page (console errors, requests, pixels, the viewer's data) and the induction check of a
page's viewer sample, computed from the model's own eager attention."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from headlens.heads import Head

CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1280,1600",
    "--disable-dev-shm-usage",
]  # containers often have a tiny /dev/shm


# A figure region counts as drawn if its pixels vary: a blank region has std 0 (a flat colour).
MIN_PIXEL_STD = 10.0


# The viewer stores weights to 1/255 and the CSS alpha is printed with 3 decimals.
ALPHA_ATOL = 1 / 255 + 1e-3


# The viewer's sample shows induction when each labelled induction head's mean attention on the induction
# target is this many times what uniform attention over the visible keys would put there.
UNIFORM_FACTOR = 5.0


NASTY_TEXT = (
    'Hello <script>alert(1)</script> and "><img src=x onerror=alert(1)> then </script> '
    "with {{ 7*7 }} and ${7*7} and `${x}` & done.\n"
)


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name) or (name if os.path.isfile(name) else None)
        if found:
            return found
    return None


def start_chromium(javascript: bool = True):
    chromium = _find("chromium", "chromium-browser", "google-chrome")
    chromedriver = _find("chromedriver", "/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        chromium = None
    if not (chromium and chromedriver):
        message = "chromium, chromium-driver and selenium are needed (apt-get install -y chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(options=options, service=Service(chromedriver))


def open_page(driver, path: Path) -> dict:
    """Load a file:// page; return its console errors and the URLs it requested (CDP events)."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get_log("performance")
    driver.get(path.resolve().as_uri())
    return page_events(driver)


def page_events(driver) -> dict:
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
        elif (
            message["method"] in ("Runtime.exceptionThrown", "Log.entryAdded")
            and message["params"].get("entry", {}).get("level", "error") == "error"
        ):
            errors.append(str(message["params"])[:300])
    return {"errors": errors, "urls": urls}


def leaving_requests(urls: list[str], page: Path) -> list[str]:
    """Requests other than the page itself and inline data: URIs."""
    own = page.resolve().as_uri()
    return [url for url in urls if url != own and not url.startswith("data:")]


def pixel_std(png: bytes) -> float:
    from PIL import Image

    return float(np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=float).std())


def no_alert(driver) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        _ = driver.switch_to.alert.text
    except NoAlertPresentException:
        return True
    return False


def token_alphas(driver) -> list[float]:
    styles = driver.execute_script(
        "return [...document.querySelectorAll('#viewer-tokens .tok')].map(t => t.style.backgroundColor)"
    )
    numbers = [re.findall(r"[\d.]+", style) for style in styles]  # rgb(r, g, b) or rgba(r, g, b, a)
    return [float(n[3]) if len(n) == 4 else 1.0 for n in numbers]


def embedded_patterns(html: str) -> tuple[dict, np.ndarray]:
    match = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', html, re.S)
    data = json.loads(match.group(1))
    raw = np.frombuffer(base64.b64decode(data["patterns_b64"]), dtype=np.uint8)
    return data, raw.reshape(data["n_layers"], data["n_heads"], data["pos"], data["pos"]) / 255  # [L, H, q, k]


def induction_target_attention(attentions, ids: list[int], heads) -> dict:
    """Per head, the mean attention on induction targets (key k with ids[k-1] == ids[q], k - 1 < q) over the
    queries that have one, and what uniform attention over keys 0..q would put there. Computed from the
    model's own output_attentions (a tuple of [1, head, q, k] per layer), independently of headlens."""
    pos = len(ids)
    targets = [[k for k in range(1, q + 1) if ids[k - 1] == ids[q]] for q in range(pos)]
    queries = [q for q in range(pos) if targets[q]]
    uniform = sum(len(targets[q]) / (q + 1) for q in queries) / len(queries)
    out = {}
    for head in heads:
        pattern = attentions[head.layer][0, head.head].double()  # [q, k]
        out[head] = sum(float(pattern[q, targets[q]].sum()) for q in queries) / len(queries)
    return {"attention": out, "uniform": uniform, "n_queries": len(queries)}


def viewer_data(html: str) -> dict:
    match = re.search(r'<script type="application/json" id="viewer-data">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def check_viewer_shows_induction(html: str, model) -> dict:
    """The page's viewer sample (its token ids) through a transformers model directly (eager attention,
    output_attentions; no headlens hook): each head the page labels induction attends to the induction target
    more than UNIFORM_FACTOR x uniform."""
    data = viewer_data(html)
    heads = [
        Head(*map(int, key.split("."))) for key, names in data["labels"].items() if "induction" in names.split(", ")
    ]
    assert heads, "the page labels no induction head"
    assert len(data["ids"]) == data["pos"] == len(data["tokens"])
    with torch.no_grad():
        attentions = model(torch.tensor([data["ids"]]), output_attentions=True).attentions
    measured = induction_target_attention(attentions, data["ids"], heads)
    for head, value in measured["attention"].items():
        assert value > UNIFORM_FACTOR * measured["uniform"], (str(head), value, measured["uniform"])
    return measured

"""The README's screenshot of `headlens explore`: the page in headless Chromium, driven as a newcomer would.

    python scripts/explore_screenshot.py smollm2 --out docs/explore.png

Serves the explorer on 127.0.0.1 (a free port, a worker thread) and opens its address with the token, as
the printed one is opened; types a sentence with a repeated phrase,
opens the strongest induction head, clicks a token of the second copy, removes the induction heads, asks
who wrote the prediction there, and saves the page from the opened head down as a PNG quantised to 256
colours (small enough for the repository). Needs chromium,
chromium-driver and selenium (`make browser`).
"""

from __future__ import annotations

import argparse
import io
import shutil
import time

from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from headlens.classify.cache import cached_classification
from headlens.load.models import load_model
from headlens.reports.explore import Explorer, create_app
from headlens.reports.explore.serve import BackgroundServer

# Made-up names can only be predicted on their second copy by copying the first: what induction heads do.
TEXT = (
    "Zorblax Quintavius met Merriweather Fenwick at the Pemberton gallery. "
    "Zorblax Quintavius met Merriweather Fenwick at the Pemberton gallery."
)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1000"]


# The part of the page shown: the opened head, where the clicked token attends, the removal panel and the
# direct effects (the grid above them runs to one row per layer).
CROP = (
    "var a = document.getElementById('head-section').getBoundingClientRect();"
    "var b = document.getElementById('direct-section').getBoundingClientRect();"
    "return [a.top + window.scrollY - 8, b.bottom + window.scrollY + 8];"
)


def wait_for(driver, script: str, timeout: float = 120.0):
    """The value of `script` (JavaScript returning a value) once truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(script)


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for flag in FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def strongest_induction_head(frame) -> tuple[int, int] | None:
    rows = frame[[("induction" in labels) for labels in frame["labels"]]]
    if rows.empty:
        return None
    best = rows.sort_values("prefix_matching_score", ascending=False).iloc[0]
    return int(best["layer"]), int(best["head"])


def drive(driver, url: str, text: str, head: tuple[int, int] | None, query: int) -> None:
    """Type, submit, open `head`, click token `query`, remove the induction heads, show the direct effects."""
    driver.get(url)
    driver.find_element(By.ID, "text").send_keys(text)
    driver.find_element(By.ID, "submit").click()
    wait_for(
        driver,
        "return document.querySelectorAll('canvas[data-loaded]').length === "
        "document.querySelectorAll('canvas.thumb-canvas').length && document.body.className === ''",
    )
    if head is not None:
        driver.find_element(By.CSS_SELECTOR, f'.cell[data-head="{head[0]}.{head[1]}"] canvas').click()
        wait_for(driver, "return document.getElementById('head-canvas')")
    driver.find_element(By.CSS_SELECTOR, f'#tokens .tok[data-pos="{query}"]').click()
    wait_for(driver, "return document.querySelectorAll('#row-panel .strip').length")
    if head is not None:
        driver.execute_script("var s = document.getElementById('ablate-role'); s.value = 'induction';")
    driver.find_element(By.ID, "ablate-go").click()
    wait_for(driver, "return document.getElementById('ablate-summary').textContent")
    wait_for(driver, "return document.body.className === ''")
    driver.find_element(By.ID, "direct-go").click()
    wait_for(driver, "return document.querySelector('#direct-map td') && document.body.className === ''")
    driver.execute_script("window.scrollTo(0, 0);")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--out", default="docs/explore.png")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--lang", default="en")
    args = parser.parse_args()
    loaded = load_model(args.model)
    frame = cached_classification(loaded)
    explorer = Explorer(loaded, frame)
    n_tokens = len(loaded.tokenizer(args.text, add_special_tokens=False)["input_ids"])
    query = n_tokens - 3  # a token late in the second copy (BOS is position 0)
    driver = browser()
    try:
        app = create_app(explorer, args.lang)
        with BackgroundServer(app) as url:
            drive(driver, f"{url}?token={app.token}", args.text, strongest_induction_head(frame), query)
            height = driver.execute_script("return document.body.scrollHeight")
            driver.set_window_size(1200, min(int(height) + 400, 8000))  # the window outgrows its viewport
            png = driver.get_screenshot_as_png()
            top, bottom = driver.execute_script(CROP)
    finally:
        driver.quit()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    scale = image.width / 1200  # device pixels per CSS pixel
    image = image.crop((0, int(top * scale), image.width, int(bottom * scale))).quantize(colors=256)
    image.save(args.out, optimize=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

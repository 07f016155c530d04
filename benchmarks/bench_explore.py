"""`headlens explore` response times on a real model (default SmolLM2-135M), against the page's targets:
a 100-token text's first layer of thumbnails within 2 s of submitting, a head opened within 200 ms, an
ablation of up to 10 heads within 2 s.

The explorer is served by uvicorn on 127.0.0.1 from a worker thread (reports.explore.serve.BackgroundServer)
and timed over real HTTP (urllib): submit = POST /api/run (tokenize, one forward pass capturing every
pattern) + GET /api/layer?layer=0; open a head = GET /api/head; ablate = POST /api/ablate with 10 heads
(the induction heads first, then the lowest-numbered others), each method. With `--browser` the same
submit is also timed in headless Chromium, from the click to the first layer's thumbnails drawn.
Each figure is the median of `--repeat` runs (after one warm-up), wall seconds and (`_cpu`) the CPU seconds
of this process during the calls (server threads included; on a loaded machine wall >> CPU / cores); the
load average is printed before and after.

    .venv/bin/python benchmarks/bench_explore.py smollm2 --browser
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import time
import urllib.request

from headlens.classify.cache import cached_classification
from headlens.load.models import load_model
from headlens.probes.inputs import default_text
from headlens.reports.explore import Explorer, create_app
from headlens.reports.explore.serve import BackgroundServer

TARGETS = {"submit": 2.0, "open_head": 0.2, "ablate": 2.0}  # seconds


def text_of(loaded, n_tokens: int) -> str:
    """The held-out text's start cut to `n_tokens` tokens, its first half repeated (an induction-friendly text)."""
    ids = loaded.tokenizer(default_text(), add_special_tokens=False)["input_ids"][: n_tokens // 2]
    half = loaded.tokenizer.decode(ids)
    text = half + half
    while len(loaded.tokenizer(text, add_special_tokens=False)["input_ids"]) > n_tokens:
        text = text[:-1]
    return text


CPU_SECONDS: list[float] = []  # CPU seconds of this process (server threads included) per timed call
TOKEN = secrets.token_urlsafe(32)  # the served app's token: HTTP calls send it, the browser opens the address with it


def call(url: str, body: dict | None = None) -> tuple[float, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"token {TOKEN}"}
    request = urllib.request.Request(url, data=data, headers=headers)
    start, cpu = time.perf_counter(), time.process_time()
    with urllib.request.urlopen(request, timeout=600) as response:
        out = json.loads(response.read())
    CPU_SECONDS.append(time.process_time() - cpu)
    return time.perf_counter() - start, out


def ten_heads(frame) -> list[str]:
    induction = [f"{r.layer}.{r.head}" for r in frame.itertuples() if "induction" in r.labels]
    others = [f"{r.layer}.{r.head}" for r in frame.itertuples() if f"{r.layer}.{r.head}" not in induction]
    return (induction + others)[:10]


def median(f, repeat: int) -> float:
    f()  # warm-up
    return statistics.median(f() for _ in range(repeat))


def median_cpu(f, repeat: int) -> tuple[float, float]:
    """Median wall seconds of f() and median CPU seconds of the calls it made (all threads of this process)."""
    f()  # warm-up
    walls, cpus = [], []
    for _ in range(repeat):
        CPU_SECONDS.clear()
        walls.append(f())
        cpus.append(sum(CPU_SECONDS))
    return statistics.median(walls), statistics.median(cpus)


def http_figures(url: str, text: str, heads: list[str], repeat: int) -> dict:
    def submit() -> float:
        first, run = call(url + "api/run", {"text": text})
        second, _ = call(url + f"api/layer?run={run['run']}&layer=0")
        return first + second

    _, run = call(url + "api/run", {"text": text})
    at = len(run["tokens"]) - 2
    figures = {"n_tokens": len(run["tokens"]) - 1}
    figures["submit"], figures["submit_cpu"] = median_cpu(submit, repeat)
    head = f"api/head?run={run['run']}&layer=5&head=1"
    figures["open_head"], figures["open_head_cpu"] = median_cpu(lambda: call(url + head)[0], repeat)
    for method in ("zero", "mean", "resample"):
        body = {"run": run["run"], "heads": heads, "method": method, "position": at}
        wall, cpu = median_cpu(lambda body=body: call(url + "api/ablate", body)[0], repeat)
        figures[f"ablate_{method}"], figures[f"ablate_{method}_cpu"] = wall, cpu
    return figures


def browser_submit(url: str, text: str, n_heads: int, repeat: int) -> float:
    """Seconds from clicking submit to the first layer's thumbnails drawn, in headless Chromium (polled
    every 10 ms from the page's own clock)."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    drawn = f"return document.querySelectorAll('.cell[data-head^=\"0.\"] canvas[data-loaded]').length === {n_heads}"

    def once() -> float:
        driver.get(f"{url}?token={TOKEN}")
        driver.execute_script("document.getElementById('text').value = arguments[0];", text)
        driver.execute_script("window.t0 = performance.now(); document.getElementById('submit').click();")
        while not driver.execute_script(drawn):
            time.sleep(0.01)
        return driver.execute_script("return performance.now() - window.t0;") / 1000

    try:
        return median(once, repeat)
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--browser", action="store_true")
    args = parser.parse_args()
    print("load:", os.getloadavg())
    loaded = load_model(args.model)
    frame = cached_classification(loaded)
    text = text_of(loaded, args.tokens)
    with BackgroundServer(create_app(Explorer(loaded, frame), token=TOKEN)) as url:
        figures = http_figures(url, text, ten_heads(frame), args.repeat)
        if args.browser:
            figures["browser_submit"] = browser_submit(url, text, loaded.spec.n_heads, args.repeat)
    print("load:", os.getloadavg())
    for key, value in figures.items():
        name = "ablate" if key.startswith("ablate") else "submit" if key.endswith("submit") else key
        target = None if key.endswith("_cpu") else TARGETS.get(name)
        verdict = "" if target is None else f"  target <= {target} s: {'met' if value <= target else 'MISSED'}"
        print(f"{key:>20}: {value:.3f}{verdict}")


if __name__ == "__main__":
    main()

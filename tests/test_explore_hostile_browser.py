"""A web page on another origin cannot drive `headlens explore`, in real Chromium: the browser first opens the
explorer's printed address (so it holds the explorer's cookie, the worst case), then visits a hostile page
served by a second local server on another port. That page tries what a malicious site would: fetch() POSTs
to /api/run as text/plain (no-cors, a "simple request") and as JSON (credentials included), a GET of the
model's facts, and a form POST into a frame. The explorer records every request it answers: each attempt
arrived, was refused (403/415), ran no model call, and the page read no result."""

from __future__ import annotations

import json
import time

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from headlens.reports.explore import Explorer, create_app
from headlens.reports.explore.serve import BackgroundServer
from tests.helpers.browser import start_chromium
from tests.helpers.explore_setup import tiny_setup

pytestmark = pytest.mark.browser

WAIT_S = 60.0
ATTEMPTS = ("plain", "json", "cors_plain", "model")  # the page's fetch() calls, by name

HOSTILE = """<!DOCTYPE html>
<html><body>
<form id="form" method="POST" action="TARGETapi/run" enctype="text/plain" target="sink">
<input name='{"text": "form' value='"}'></form>
<iframe name="sink"></iframe>
<script>
window.results = {};
function record(name, promise) {
  promise.then(function (r) {
    return r.text().then(function (t) { window.results[name] = "read " + r.status + " " + t; });
  }, function (e) { window.results[name] = "blocked " + e; });
}
var body = JSON.stringify({ text: "hostile" });
record("plain", fetch("TARGETapi/run", { method: "POST", mode: "no-cors", credentials: "include",
  headers: { "Content-Type": "text/plain" }, body: body }));
record("json", fetch("TARGETapi/run", { method: "POST", credentials: "include",
  headers: { "Content-Type": "application/json" }, body: body }));
record("cors_plain", fetch("TARGETapi/run", { method: "POST", credentials: "include",
  headers: { "Content-Type": "text/plain" }, body: body }));
record("model", fetch("TARGETapi/model", { credentials: "include" }));
document.getElementById("form").submit();
</script>
</body></html>
"""


class Recorder:
    """An ASGI app, recording (method, path, status) of every response it sends."""

    def __init__(self, app):
        self.app, self.seen = app, []
        if hasattr(app, "token"):
            self.token = app.token

    async def __call__(self, scope, receive, send):
        async def watch(message):
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, watch)


@pytest.fixture(scope="module")
def driver():
    browser = start_chromium()
    yield browser
    browser.quit()


def _wait(check, what: str):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def attack(driver, hostile_host: str, gated: bool = True) -> tuple[list, list, dict]:
    """The user opens the explorer (gated: its printed address, so the browser holds its cookie), then the
    hostile page served on `hostile_host`, another port: (texts the model ran, the explorer's responses to
    the hostile page, what the page's fetch() calls could read)."""
    loaded, frame, _ = tiny_setup()
    explorer = Explorer(loaded, frame)
    runs: list[str] = []
    real_start = explorer.start_run
    explorer.start_run = lambda text: runs.append(text) or real_start(text)
    app = create_app(explorer)
    recorder = Recorder(app if gated else app.app)
    with BackgroundServer(recorder) as target:
        page = HOSTILE.replace("TARGET", target)
        hostile = Starlette(routes=[Route("/", lambda request: HTMLResponse(page))])
        with BackgroundServer(hostile) as evil:
            driver.get(f"{target}?token={app.token}" if gated else target)
            assert driver.execute_script("return document.title").startswith("headlens")
            recorder.seen.clear()
            driver.get(evil.replace("127.0.0.1", hostile_host))
            results = _wait(
                lambda: (
                    len(driver.execute_script("return window.results") or {}) == len(ATTEMPTS)
                    and driver.execute_script("return window.results")
                ),
                "the hostile page's attempts",
            )
            _wait(lambda: len([s for s in recorder.seen if s[1] == "/api/run"]) >= 4, "the attempts to reach it")
    return runs, recorder.seen, results


@pytest.mark.parametrize("hostile_host", ["127.0.0.1", "localhost"])  # same site (cookie sent), cross-site
def test_a_page_on_another_origin_cannot_drive_the_explorer(driver, hostile_host):
    runs, seen, results = attack(driver, hostile_host)
    assert runs == []  # the model ran nothing
    assert all(status in (403, 415) for _, _, status in seen), seen
    methods = sorted(method for method, path, _ in seen if path == "/api/run")
    assert methods.count("POST") == 3  # the two text/plain fetches and the form (the JSON one stops at its preflight)
    assert methods.count("OPTIONS") == 1  # the JSON fetch's preflight, refused: that POST never left the browser
    for name in ATTEMPTS:
        shown = results[name]
        assert shown.startswith("blocked") or shown == "read 0 ", (name, shown)  # refused, or opaque and empty
    assert "hostile" not in json.dumps(results) and "tiny" not in json.dumps(results)


def test_the_same_page_drives_an_explorer_without_its_gate(driver):
    """The control: the attack is real. Without the gate the text/plain POSTs and the form reach the model."""
    runs, seen, _ = attack(driver, "127.0.0.1", gated=False)
    assert runs.count("hostile") == 2 and len(runs) == 3, runs  # no-cors and cors text/plain fetches, and the form

"""`headlens explore`'s gate, each defence tested with the attack it stops, through Starlette's TestClient on
`tiny`: a missing or wrong token, another port's cookie, a DNS-rebound Host, a cross-origin or non-JSON POST,
a call a browser marks as cross-site, an oversized body (counted as it is read over ASGI). The app counts the
calls that reach the model (tests/helpers/explore_attacks.py: Spy), so "refused" means "ran nothing".
Property-based tests (hypothesis) send arbitrary Host and Origin headers. The page in Chromium against a
hostile page: tests/test_explore_hostile_browser.py; bad inputs: tests/test_explore_inputs.py."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from headlens.reports.explore import create_app, guard
from tests.helpers import explore_attacks
from tests.helpers.explore_attacks import OWN_HOST, SETTINGS, ran, refused
from tests.helpers.explore_setup import BASE, explore_client

# the shared fixtures (tests/helpers/explore_attacks.py), as names of this module so pytest finds them
app, client, run_id, spy = explore_attacks.app, explore_attacks.client, explore_attacks.run_id, explore_attacks.spy


# -- the token --------------------------------------------------------------------------------------------
def test_no_token_no_page_no_api_no_static(app, spy):
    stranger = TestClient(app, base_url=BASE)
    before = dict(spy.calls)
    for path in ("/", "/static/explore.js", "/static/report.css", "/api/model", "/api/layer?run=x&layer=0"):
        assert "token" in refused(stranger.get(path), 403)
    assert "token" in refused(stranger.post("/api/run", json={"text": "stolen"}), 403)
    wrong = TestClient(app, base_url=BASE, cookies={"headlens-explore-8765": "guess"})
    refused(wrong.get("/api/model"), 403)
    refused(wrong.get("/?token=guess"), 403)
    refused(TestClient(app, base_url=BASE, headers={"Authorization": "token guess"}).get("/api/model"), 403)
    assert dict(spy.calls) == before


def test_the_printed_address_sets_a_strict_httponly_cookie_and_drops_the_token(app):
    visitor = TestClient(app, base_url=BASE, follow_redirects=False)
    first = visitor.get(f"/?token={app.token}")
    assert first.status_code == 303 and first.headers["location"] == "/"
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"headlens-explore-8765={app.token};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert visitor.get("/").status_code == 200 and visitor.get("/static/explore.js").status_code == 200
    other = visitor.get(f"/api/model?a=1&token={app.token}&b=2")
    assert other.status_code == 303 and other.headers["location"] == "/api/model?a=1&b=2"
    header = TestClient(app, base_url=BASE, headers={"Authorization": f"token {app.token}"})
    assert header.get("/api/model").status_code == 200
    # cookies do not tell ports apart: the cookie of the explorer on 8765 opens nothing on 8766
    elsewhere = TestClient(app, base_url="http://127.0.0.1:8766", cookies={"headlens-explore-8765": app.token})
    refused(elsewhere.get("/api/model"), 403)


def test_tokens_are_random_long_and_compared_in_constant_time(spy, monkeypatch):
    tokens = {create_app(spy.explorer).token for _ in range(3)}
    assert len(tokens) == 3 and all(len(t) >= 43 and re.fullmatch(r"[A-Za-z0-9_-]+", t) for t in tokens)
    compared = []
    monkeypatch.setattr(guard.hmac, "compare_digest", lambda a, b: compared.append((a, b)) or a == b)
    assert guard.token_matches("abc", "abc") and not guard.token_matches("abd", "abc")
    assert compared == [(b"abc", b"abc"), (b"abd", b"abc")]
    assert not guard.token_matches("\ud800", "abc")  # a lone surrogate is compared, not raised on


def test_a_websocket_is_refused_even_with_the_token(client, app):
    from starlette.websockets import WebSocketDisconnect

    with pytest.raises(WebSocketDisconnect) as refusal:
        with client.websocket_connect(f"/?token={app.token}"):
            pass
    assert refusal.value.code == 1008


# -- Host: DNS rebinding ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8765", "127.0.0.1.evil.example", "localhost.evil.example", "0x7f000001",
     "", "[::1", "[::1]x", "localhost:http", "127.0.0.1:8765@evil.example", "10.0.0.1", "[::ffff:7f00:1]x"],
)  # fmt: skip
def test_a_rebound_host_is_refused(client, spy, run_id, host):
    before = dict(spy.calls)
    assert "Host" in refused(client.get("/", headers={"host": host}), 403)
    refused(client.get(f"/api/head?run={run_id}&layer=0&head=0", headers={"host": host}), 403)
    refused(client.post("/api/run", json={"text": "rebound"}, headers={"host": host}), 403)
    assert dict(spy.calls) == before


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8765", "127.0.0.1", "127.8.9.10:80", "[::1]", "[::1]:8765"])
def test_loopback_hosts_are_served(client, host):
    assert client.get("/api/model", headers={"host": host}).status_code == 200


def test_the_chosen_host_is_served_too(spy):
    chosen = explore_client(create_app(spy.explorer, hosts=("mybox.lan",)), base_url="http://mybox.lan:8765")
    assert chosen.get("/api/model").status_code == 200
    refused(chosen.get("/api/model", headers={"host": "otherbox.lan"}), 403)


# -- Origin and Content-Type: cross-site requests -------------------------------------------------------------
@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:9999"},  # same site (cookies are sent), another origin
        {"Origin": "https://127.0.0.1:8765"},
        {"Referer": "http://evil.example/page.html"},
        {"Referer": "http://[::1/"},  # unreadable (urlsplit raises): refused, not an error inside
    ],
)
def test_a_cross_origin_post_is_refused(client, spy, capfd, headers):
    before = dict(spy.calls)
    assert "origin" in refused(client.post("/api/run", json={"text": "cross"}, headers=headers), 403)
    assert dict(spy.calls) == before
    assert "internal error" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]
)
def test_a_post_that_is_not_json_is_refused(client, spy, content_type):
    before = dict(spy.calls)
    headers = {"Origin": f"http://{OWN_HOST}"} | ({"Content-Type": content_type} if content_type else {})
    body = json.dumps({"text": "simple request"})  # what a cross-site text/plain fetch or form can send
    assert "application/json" in refused(client.post("/api/run", content=body, headers=headers), 415)
    assert dict(spy.calls) == before


def test_a_same_origin_json_post_runs(client, spy):
    before = ran(spy)
    for headers in (
        {"Origin": f"http://{OWN_HOST}", "Content-Type": "application/json; charset=utf-8"},
        {"Referer": f"http://{OWN_HOST}/", "Content-Type": "application/json"},
    ):
        response = client.post("/api/run", content=json.dumps({"text": "ok"}), headers=headers)
        assert response.status_code == 200, response.text
    assert ran(spy) == before + 2


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
def test_an_api_call_a_browser_marks_as_from_another_site_is_refused(client, spy, site):
    before = dict(spy.calls)
    refused(client.get("/api/model", headers={"Sec-Fetch-Site": site}), 403)
    assert dict(spy.calls) == before
    assert client.get("/api/model", headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200


# -- the body cap: reading stops there ------------------------------------------------------------------------
def _asgi_post(app, headers: list[tuple[bytes, bytes]], chunks) -> tuple[int, int]:
    """POST /api/run straight through ASGI with the body as `chunks` (an iterator): (status, chunks read)."""
    read, status = 0, []
    scope = {
        "type": "http", "method": "POST", "path": "/api/run", "raw_path": b"/api/run", "query_string": b"",
        "server": ("127.0.0.1", 8765), "scheme": "http", "http_version": "1.1", "root_path": "",
        "headers": [(b"host", OWN_HOST.encode()), (b"content-type", b"application/json"),
                    (b"authorization", f"token {app.token}".encode()), *headers],
    }  # fmt: skip

    async def receive():
        nonlocal read
        chunk = next(chunks, None)
        read += chunk is not None
        return {"type": "http.request", "body": chunk or b"", "more_body": chunk is not None}

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])

    asyncio.run(app(scope, receive, send))
    return status[0], read


def test_an_oversized_body_is_refused_without_reading_it(app, spy):
    mb = 1 << 20
    before = ran(spy)
    endless = iter(lambda: b"a" * mb, None)  # as many 1 MB pieces as are asked for
    status, read = _asgi_post(app, [], endless)  # no Content-Length: counted as read
    assert status == 413 and read == 1
    status, read = _asgi_post(app, [(b"content-length", str(100 * mb).encode())], endless)
    assert status == 413 and read == 0  # announced: refused before any byte
    small = (piece for piece in [b'{"text": "', b"a" * 100 * 1024, b"a" * 100 * 1024, b'"}'])
    status, read = _asgi_post(app, [(b"content-length", b"x" * 8)], small)
    assert status == 413 and read == 0  # a length that is not a number is not trusted either
    assert ran(spy) == before
    status, read = _asgi_post(app, [], iter([b'{"text": "under ', b'the cap"}']))
    assert status == 200 and read == 2 and ran(spy) == before + 1


LOOPBACK = re.compile(r"(localhost|127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}|\[::1\])(:[0-9]{1,5})?", re.IGNORECASE)


@SETTINGS
@given(host=st.text(st.characters(codec="ascii", exclude_characters="\r\n\x00"), max_size=30))
def test_arbitrary_hosts_are_refused_unless_loopback(client, spy, host):
    before = dict(spy.calls)
    response = client.get("/api/model", headers={"host": host})
    name = LOOPBACK.fullmatch(host)
    if name and (not name.group(1)[0].isdigit() or all(int(p) < 256 for p in name.group(1).split("."))):
        assert response.status_code == 200
    else:
        refused(response, 403)
        assert dict(spy.calls) == before


@SETTINGS
@given(
    name=st.sampled_from(["localhost", "127.0.0.1", "127.1.2.3", "[::1]", "LocalHost"]),
    port=st.none() | st.integers(0, 65535),
)
def test_every_loopback_form_is_served(client, name, port):
    host = name if port is None else f"{name}:{port}"
    assert client.get("/api/model", headers={"host": host}).status_code == 200


@SETTINGS
@given(
    origin=st.text(st.characters(codec="ascii", exclude_characters="\r\n\x00"), max_size=40)
    | st.builds("http://{}".format, st.text(st.characters(codec="ascii", exclude_characters="\r\n\x00"), max_size=20)),
    header=st.sampled_from(["Origin", "Referer"]),
)
def test_arbitrary_origins_are_refused_unless_our_own(client, spy, capfd, origin, header):
    before = dict(spy.calls)
    response = client.post("/api/direct", json={"run": "none", "position": 0}, headers={header: origin})
    assert "internal error" not in capfd.readouterr().err
    own = f"http://{OWN_HOST}"
    same_page = re.match(re.escape(own) + r"([/?#]|$)", origin, re.IGNORECASE)  # a Referer of our own origin
    if origin.lower() == own or (header == "Referer" and same_page):
        assert response.status_code == 422  # through the gate: the unknown run is the app's answer
    else:
        assert "origin" in refused(response, 403)
        assert dict(spy.calls) == before

"""The explorer's tries of benchmarks/hostile_battery.py: one `headlens explore tiny` server, then requests a hostile
page or client could send (another Host, another Origin, no token, a form or text/plain POST, a 100 MB body, bodies
and queries that used to raise). Each must be refused with a 4xx JSON line while the server keeps running; at the
end its stderr holds no traceback and its peak memory stays under the battery's bound."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
JSON = {"Content-Type": "application/json"}


@dataclass
class Request:
    name: str
    method: str
    path: str
    body: bytes | None = None
    headers: dict = field(default_factory=dict)  # {HOST}/{PORT}/{COOKIE} filled in; None drops a default
    big: int = 0  # announce and send this many body bytes (stopping when the server closes)
    plain: bool = False  # refused by the HTTP server itself (a 4xx that is not headlens's JSON line)


def requests() -> list[Request]:
    own = {"Cookie": "{COOKIE}"}
    post = {**own, **JSON, "Origin": "http://127.0.0.1:{PORT}"}
    tries = [
        Request("no token", "GET", "/api/model", headers={"Cookie": None}),
        Request("wrong token", "GET", "/?token=wrong", headers={"Cookie": None}),
        Request("wrong cookie", "GET", "/api/model", headers={"Cookie": "x=y; headlens=wrong"}),
    ]
    for host in (
        "evil.example",
        "evil.example:{PORT}",
        "127.0.0.1.evil.example:{PORT}",
        "localhost.evil.example",
        "",
        "127.0.0.1:{PORT}@evil.example",
        "[::1]evil",
        "127.0.0.1.nip.io:{PORT}",
    ):
        tries.append(Request(f"Host {host!r} (DNS rebinding)", "GET", "/api/model", headers={**own, "Host": host}))
    for origin in (
        "http://evil.example",
        "null",
        "http://127.0.0.1:1",
        "https://127.0.0.1:{PORT}",
        "http://localhost.evil.example:{PORT}",
        "http://[::1]:{PORT}",
    ):
        tries.append(
            Request(
                f"POST from Origin {origin!r}", "POST", "/api/run", b'{"text": "hostile"}', {**post, "Origin": origin}
            )
        )
    tries.append(
        Request(
            "POST with a foreign Referer",
            "POST",
            "/api/run",
            b'{"text": "hostile"}',
            {**post, "Origin": None, "Referer": "http://evil.example/page"},
        )
    )
    tries.append(
        Request(
            "POST with an unreadable Referer",
            "POST",
            "/api/run",
            b'{"text": "x"}',
            {**post, "Origin": None, "Referer": "http://["},
        )
    )
    for fetch in ("cross-site", "same-site"):
        tries.append(
            Request(f"Sec-Fetch-Site {fetch}", "POST", "/api/run", b'{"text": "x"}', {**post, "Sec-Fetch-Site": fetch})
        )
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        tries.append(
            Request(f"POST as {media}", "POST", "/api/run", b'{"text": "hostile"}', {**post, "Content-Type": media})
        )
    tries.append(Request("100 MB body", "POST", "/api/run", headers=post, big=100_000_000))
    tries.append(Request("Content-Length ²", "POST", "/api/run", b"{}", {**post, "Content-Length": "²"}, plain=True))
    bodies = {
        "lone surrogate": '{"text": "a\\ud800b"}',
        "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
        "5,000-digit position": '{"run": "x", "position": ' + "9" * 5000 + "}",
        "position 1e999": '{"run": "x", "position": 1e999}',
        "position NaN": '{"run": "x", "position": NaN}',
        "not UTF-8": b'{"text": "\xff"}',
        "a list": "[1]",
        "no text": "{}",
        "text a number": '{"text": 5}',
        "empty text": '{"text": ""}',
        "text of 200,000 characters": json.dumps({"text": "ab " * 66_000}),
    }
    for name, body in bodies.items():
        raw = body if isinstance(body, bytes) else body.encode()
        tries.append(Request(f"body: {name}", "POST", "/api/run" if "text" in name else "/api/direct", raw, post))
    for query in (
        "layer=²&head=0",
        "layer=٣&head=0",
        "layer=%2B1&head=0",
        "layer=-1&head=0",
        "layer=0&head=None",
        "layer=1" + "0" * 5000 + "&head=0",
        "layer=0",
        "layer=0&head=99",
        "run=../../x&layer=0&head=0",
    ):
        tries.append(Request(f"/api/head?{query[:30]}", "GET", f"/api/head?{quote(query, safe='=&%')}", headers=own))
    tries += [
        Request("DELETE /api/run", "DELETE", "/api/run", headers=own),
        Request("GET /api/run", "GET", "/api/run", headers=own),
        Request("/static/../../etc/passwd", "GET", "/static/%2e%2e%2f%2e%2e%2fetc%2fpasswd", headers=own),
        Request("/static/guard.py", "GET", "/static/guard.py", headers=own),
        Request(
            "ablate an unknown run",
            "POST",
            "/api/ablate",
            b'{"run": "nope", "heads": "0.0", "method": "zero", "position": 1}',
            post,
        ),
        Request(
            "ablate head 2.None",
            "POST",
            "/api/ablate",
            b'{"run": "nope", "heads": "2.None", "method": "zero", "position": 1}',
            post,
        ),
    ]
    return tries


def start(env: dict) -> tuple[subprocess.Popen, int, str, list[str]]:
    """`headlens explore tiny --port 0`: (process, port, token, stderr lines read so far)."""
    argv = [sys.executable, "-m", "headlens.cli.main", "explore", "tiny", "--port", "0", "--no-progress"]
    server = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    lines = []
    while True:
        line = server.stderr.readline()
        if not line:
            raise RuntimeError(f"explore stopped before serving: {lines}")
        lines.append(line.rstrip("\n"))
        found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", line)
        if found:
            return server, int(found.group(1)), found.group(2), lines


def cookie(port: int, token: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", f"/?token={token}")
    response = connection.getresponse()
    set_cookie = response.getheader("Set-Cookie", "")
    connection.close()
    return set_cookie.split(";", 1)[0]


def send(port: int, request: Request, fills: dict) -> tuple[int, bytes]:
    """(status, body) of one raw request; the Host and Cookie headers as the request says."""
    headers = {"Host": "127.0.0.1:{PORT}", "Cookie": "{COOKIE}", **request.headers}
    headers = {k: v.format(**fills) for k, v in headers.items() if v is not None}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    connection.putrequest(request.method, request.path, skip_host=True, skip_accept_encoding=True)
    for key, value in headers.items():
        connection.putheader(key, value)
    body = request.body or b""
    if request.big:
        connection.putheader("Content-Length", str(request.big))
    elif "Content-Length" not in headers and request.method in ("POST", "DELETE"):
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders()
    try:
        if request.big:
            chunk = b" " * (1 << 20)
            for _ in range(request.big >> 20):
                connection.send(chunk)
        elif body:
            connection.send(body)
    except OSError:
        pass  # the server closed the connection after refusing: what a refusal without reading looks like
    response = connection.getresponse()
    status, data = response.status, response.read()
    connection.close()
    return status, data


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_explorer(env: dict, limit_mb: float) -> list[tuple[str, bool, str]]:
    """(name, held, why) per request, then the server's own checks (alive, stderr, memory, Ctrl-C)."""
    server, port, token, _ = start(env)
    fills = {"PORT": port, "COOKIE": cookie(port, token)}
    results = []
    for request in requests():
        start_time = time.perf_counter()
        try:
            status, data = send(port, request, fills)
            text = data.decode("utf-8", "replace")
            one_line = "\n" not in text.strip() and "error" in json.loads(text) if text.startswith("{") else False
            why = "" if 400 <= status < 500 and (one_line or request.plain) else f"status {status}: {text[:120]!r}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if server.poll() is not None:
            why = f"the server stopped (exit {server.returncode})"
        results.append((f"explorer: {request.name}", not why, why or f"{time.perf_counter() - start_time:.1f} s"))
    peak = peak_mb(server.pid)
    server.send_signal(signal.SIGINT)
    err = server.communicate(timeout=60)[1]
    results.append(("explorer: Ctrl-C exits 0", server.returncode == 0, f"exit {server.returncode}"))
    bad = [line for line in err.splitlines() if "Traceback" in line or "internal error" in line]
    results.append(("explorer: no traceback or internal error on the server", not bad, "; ".join(bad)[:200]))
    results.append((f"explorer: server peak {peak:.0f} MB", peak <= limit_mb, f"limit {limit_mb:.0f} MB"))
    return results

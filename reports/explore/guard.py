"""The explorer's gate (an ASGI middleware around the app): every request passes it before the app sees it,
so a web page the user merely visits cannot drive the explorer.

In order, a request is refused when:
- its `Host` is not a loopback name or address (localhost, 127.0.0.0/8, [::1], any port) nor the `--host`
  the user chose (403): a DNS-rebound name pointing at 127.0.0.1 is refused;
- it is an /api/ call that a browser marks as coming from another origin (`Sec-Fetch-Site`) (403);
- it does not carry the server's token (403): in the query (`?token=`, the address printed at start; a GET
  is then redirected to the same address without it, with the token kept in an HttpOnly, SameSite=Strict
  cookie named after the port), in that cookie, or as `Authorization: token ...`; compared in constant time;
- it changes state (any method but GET and HEAD) and its `Origin` (or, without one, its `Referer`) is
  present and not this server's own origin (403);
- it changes state and is not `Content-Type: application/json` (415): a form or a text/plain "simple request"
  from another site never reaches the app;
- it announces a body (`Content-Length`) over MAX_BODY bytes (413); a body without a length is counted as
  it is read (app.py) and refused at the same cap;
- it is a WebSocket (none is served): closed before the handshake.

It also catches what the app did not: an unexpected exception becomes a JSON 500 and one line on stderr
(`HEADLENS_DEBUG=1` prints the traceback), never uvicorn's traceback.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import sys
import traceback
from urllib.parse import urlencode, urlsplit

from starlette.datastructures import Headers, QueryParams
from starlette.responses import JSONResponse, RedirectResponse

from headlens.bounds import printable

MAX_BODY = 256 * 1024  # bytes of a request body at most (a 512-token text is far smaller)
LOOPBACK_NAMES = ("localhost",)
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",  # app.py widens it for its page
}
SAFE_METHODS = ("GET", "HEAD")
SAME_ORIGIN_FETCH = ("same-origin", "none")  # Sec-Fetch-Site values of the page's own calls, or typed URLs
PORT = re.compile(r"[0-9]{1,5}")
DIGITS = re.compile(r"[0-9]{1,7}")  # a Content-Length worth reading: at most 7 digits
WS_POLICY_VIOLATION = 1008  # the WebSocket close code of a refused connection (RFC 6455, 7.4.1)
ECHO = 100  # characters of a refused value repeated in the message


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The name in a `Host` header (`name`, `name:port`, `[v6]`, `[v6]:port`), lower-cased; None if malformed."""
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket:
            return None
    else:
        name, colon, port = header.partition(":")
        rest = colon + port
    if rest and not (rest.startswith(":") and PORT.fullmatch(rest[1:])):
        return None
    return name.lower() or None


def allowed_host(header: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether a `Host` header names a loopback host or one of `extra` (the --host the user chose)."""
    name = host_name(header)
    return name is not None and (is_loopback(name) or name in extra)


def token_matches(given: str | None, token: str) -> bool:
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


def cookie_name(scope) -> str:
    """The token's cookie, one per port: cookies do not tell ports apart, explorers on two ports must not clash."""
    server = scope.get("server") or ("", 0)
    return f"headlens-explore-{server[1]}"


def error(message: str, status: int) -> JSONResponse:
    """`{"error": message}` on one line, with `status`; after an oversized body the connection is closed, so the
    server stops receiving the rest."""
    headers = {**HEADERS, "Connection": "close"} if status == 413 else HEADERS
    line = " ".join(str(message).split()).encode("utf-8", "backslashreplace").decode("utf-8")  # no lone surrogate
    return JSONResponse({"error": line}, status_code=status, headers=headers)


def _cut(text: str) -> str:
    return text if len(text) <= ECHO else text[:ECHO] + "..."


class Guard:
    """`app` behind the checks above, for the server's `token` and the extra allowed host names."""

    def __init__(self, app, token: str, hosts: tuple[str, ...] = ()):
        self.app, self.token, self.hosts = app, token, tuple(h.lower() for h in hosts)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":  # none served: refused before the handshake
            await receive()
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.call_app(scope, receive, send)

    def refusal(self, scope):
        """The response refusing this request, a redirect that stores the token, or None to let it through."""
        headers, query = Headers(scope=scope), QueryParams(scope.get("query_string", b""))
        host = headers.get("host", "")
        if not allowed_host(host, self.hosts):
            return error(f"this server answers only on localhost or 127.0.0.1, not Host {_cut(host)!r}", 403)
        if scope["path"].startswith("/api/") and headers.get("sec-fetch-site", "same-origin") not in SAME_ORIGIN_FETCH:
            return error("a call from another site is refused", 403)
        method = scope["method"]
        if "token" in query:
            if not token_matches(query["token"], self.token):
                return error("wrong token: open the address headlens explore printed", 403)
            if method in SAFE_METHODS:
                return self.store_token(scope, query)
        elif not self.authorised(scope, headers):
            return error("no token: open the address headlens explore printed (it ends in ?token=...)", 403)
        if method in SAFE_METHODS:
            return None
        return self.state_change_refusal(headers, host)

    def authorised(self, scope, headers: Headers) -> bool:
        cookies = {}
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            cookies.setdefault(name, value)
        scheme, _, given = headers.get("authorization", "").partition(" ")
        return token_matches(cookies.get(cookie_name(scope)), self.token) or (
            scheme.lower() == "token" and token_matches(given.strip(), self.token)
        )

    def store_token(self, scope, query: QueryParams):
        """Redirect to the same address without the token, the token kept in an HttpOnly, SameSite=Strict cookie."""
        rest = urlencode([(k, v) for k, v in query.multi_items() if k != "token"])
        response = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), status_code=303, headers=HEADERS)
        response.set_cookie(cookie_name(scope), self.token, httponly=True, samesite="strict", path="/")
        return response

    def state_change_refusal(self, headers: Headers, host: str):
        own = f"http://{host}".lower()
        origin = headers.get("origin")
        if origin is None and headers.get("referer") is not None:
            try:
                parts = urlsplit(headers["referer"])
            except ValueError:  # e.g. "http://[" (an unclosed IPv6 address)
                referer = _cut(headers["referer"])
                return error(f"a request from an unreadable origin (Referer {referer!r}) is refused", 403)
            origin = f"{parts.scheme}://{parts.netloc}"
        if origin is not None and origin.lower() != own:
            return error(f"a request from another origin ({_cut(origin)!r}) is refused", 403)
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return error("requests that change anything must be Content-Type: application/json", 415)
        length = headers.get("content-length")
        if length is not None and not (DIGITS.fullmatch(length) and int(length) <= MAX_BODY):
            return error(f"request body over {MAX_BODY} bytes", 413)
        return None

    async def call_app(self, scope, receive, send) -> None:
        started = False

        async def tracked(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            response = self.refusal(scope)
            await (response or self.app)(scope, receive, tracked)
        except Exception as exc:  # the last guard: the checks and the app's handlers answer every known cause
            detail = printable(_cut(f"{type(exc).__name__} in {scope['method']} {scope['path']}"))
            print(f"headlens explore: internal error: {detail} (HEADLENS_DEBUG=1 shows the traceback)", file=sys.stderr)
            if os.environ.get("HEADLENS_DEBUG"):
                traceback.print_exc()
            if not started:
                await error(f"internal error ({type(exc).__name__}); the server keeps running", 500)(
                    scope, receive, send
                )

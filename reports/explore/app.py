"""The explorer's web app (Starlette): one page, its static script and style, and JSON endpoints.

Every response carries a Content-Security-Policy that allows only this origin's own script, style and
fetches (no CDN, no external request, no inline script) and forbids framing. Requests are checked at
the edge: a malformed one (not JSON, a missing or mistyped field, an unknown run, a text over the cap)
gets a 4xx status and one line, {"error": "..."}. Model work runs in a worker thread (Starlette's
threadpool), serialised by the Explorer's lock.
"""

from __future__ import annotations

import json
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from headlens.errors import HeadlensError
from headlens.reports.explore.page import page_html
from headlens.reports.explore.session import Explorer, TooLong

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)
# Static files served, each from the package it ships in, with its content type.
STATIC = {
    "viewer_core.js": ("headlens.reports", "text/javascript"),
    "report.css": ("headlens.reports", "text/css"),
    "explore.js": ("headlens.reports.explore", "text/javascript"),
    "explore.css": ("headlens.reports.explore", "text/css"),
}
MAX_BODY = 256 * 1024  # bytes of a request body at most (a 512-token text is far smaller)
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class BadRequest(Exception):
    """A malformed request: its status and one line."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split())}, status_code=status, headers=HEADERS)


async def _body(request: Request) -> dict:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise BadRequest(f"request body over {MAX_BODY} bytes", 413)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _field(data, name: str, kind, optional: bool = False):
    """data[name] checked to be of type `kind` (bool is not an int here)."""
    value = data.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {name!r} must be a {getattr(kind, '__name__', 'value')}")
    return value


def _query_int(request: Request, name: str) -> int:
    value = request.query_params.get(name, "")
    if not value.lstrip("-").isdigit() or len(value) > 9:
        raise BadRequest(f"query parameter {name!r} must be an integer")
    return int(value)


def create_app(explorer: Explorer, lang: str = "en") -> Starlette:
    """The app serving `explorer` with its page in `lang`."""
    page = page_html(explorer.model_info(), lang)

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers=HEADERS)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return _error("not found", 404)
        package, media = STATIC[name]
        text = (resources.files(package) / name).read_text(encoding="utf-8")
        return Response(text, media_type=media, headers=HEADERS)

    def endpoint(compute):
        async def handle(request: Request) -> Response:
            try:
                data = await _body(request) if request.method == "POST" else None
                result = await run_in_threadpool(compute, request, data)
            except BadRequest as exc:
                return _error(str(exc), exc.status)
            except TooLong as exc:
                return _error(str(exc), 413)
            except HeadlensError as exc:
                return _error(str(exc), 422)
            return JSONResponse(result, headers=HEADERS)

        return handle

    def model(request, data):
        return explorer.model_info()

    def run(request, data):
        return explorer.start_run(_field(data, "text", str))

    def layer(request, data):
        return explorer.layer_thumbs(request.query_params.get("run", ""), _query_int(request, "layer"))

    def head(request, data):
        run_id = request.query_params.get("run", "")
        return explorer.head_pattern(run_id, _query_int(request, "layer"), _query_int(request, "head"))

    def row(request, data):
        return explorer.query_row(
            request.query_params.get("run", ""), _query_int(request, "layer"), _query_int(request, "q")
        )

    def ablate(request, data):
        heads = data.get("heads")
        if not (isinstance(heads, str) or (isinstance(heads, list) and all(isinstance(h, str) for h in heads))):
            raise BadRequest("field 'heads' must be a role name or a list of heads like \"1.2\"")
        return explorer.ablate(
            _field(data, "run", str), heads, _field(data, "method", str), _field(data, "position", int)
        )

    def direct(request, data):
        return explorer.direct(
            _field(data, "run", str),
            _field(data, "position", int),
            _field(data, "target", str, optional=True),
            _field(data, "foil", str, optional=True),
        )

    routes = [
        Route("/", index),
        Route("/static/{name}", static),
        Route("/api/model", endpoint(model)),
        Route("/api/run", endpoint(run), methods=["POST"]),
        Route("/api/layer", endpoint(layer)),
        Route("/api/head", endpoint(head)),
        Route("/api/row", endpoint(row)),
        Route("/api/ablate", endpoint(ablate), methods=["POST"]),
        Route("/api/direct", endpoint(direct), methods=["POST"]),
    ]

    async def not_found(request, exc):
        return _error(getattr(exc, "detail", "not found"), getattr(exc, "status_code", 404))

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})

"""The explorer's web app (Starlette): one page, its static script and style, and JSON endpoints, behind
the gate of guard.py (loopback Host, a token, same-origin JSON for anything that changes state).

Every response carries a Content-Security-Policy that allows only this origin's own script, style and
fetches (no CDN, no external request, no inline script) and forbids framing. Requests are checked at
the edge: a malformed one (not JSON, nested too deep, a number too long or not finite, a lone surrogate,
a missing or mistyped field, an index out of the model's range, an unknown run, a text over the cap)
gets a 4xx status and one line, {"error": "..."}. A body is read in pieces and refused as soon as it
passes MAX_BODY bytes. Model work runs in a worker thread (Starlette's threadpool), serialised by the
Explorer's lock.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from headlens.classify.kinds import LABELS
from headlens.errors import HeadlensError
from headlens.reports.explore import guard
from headlens.reports.explore.guard import MAX_BODY, Guard
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
HEADERS = {**guard.HEADERS, "Content-Security-Policy": CSP}
INDEX = re.compile(r"[0-9]{1,9}")  # a layer, head or position: ASCII digits only (str.isdigit takes "²")
HEAD = re.compile(r"[0-9]{1,9}\.[0-9]{1,9}")  # "layer.head" as the page sends it
MAX_DIGITS = 20  # digits of a JSON integer at most (positions are far smaller)


class BadRequest(Exception):
    """A malformed request: its status and one line."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _error(message: str, status: int) -> JSONResponse:
    response = guard.error(message, status)
    response.headers["Content-Security-Policy"] = CSP
    return response


def _refuse_constant(name: str):
    raise BadRequest(f"the request body holds {name}: give finite numbers")


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise BadRequest(f"the request body holds a number of {len(digits)} digits: at most {MAX_DIGITS}")
    return int(digits)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadRequest(f"the request body holds a number out of range ({text[:20]}...)")
    return value


async def _body(request: Request) -> dict:
    """The JSON object of the body, read in pieces and refused (413) once past MAX_BODY bytes."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(f"request body over {MAX_BODY} bytes", 413)
        chunks.append(chunk)
    try:
        data = json.loads(
            b"".join(chunks).decode("utf-8"), parse_int=_int, parse_float=_float, parse_constant=_refuse_constant
        )
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # a lone surrogate ("\ud800") fails here
    except RecursionError:
        raise BadRequest("the request body is nested too deeply") from None
    except UnicodeEncodeError:
        raise BadRequest("the request body holds a lone surrogate (\\ud800-\\udfff): send valid Unicode") from None
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


KINDS = {str: "a text", int: "a whole number"}


def _field(data, name: str, kind, optional: bool = False):
    """data[name] checked to be of type `kind` (bool is not an int here)."""
    value = data.get(name)
    if value is None and optional:
        return None
    if value is None:
        raise BadRequest(f"field {name!r} is missing")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"field {name!r} must be {KINDS[kind]}")
    return value


def _position(data) -> int:
    value = _field(data, "position", int)
    if value < 0:
        raise BadRequest(f"field 'position' must be a whole number from 0, not {value}")
    return value


def _heads(data) -> str | list[str]:
    """Field `heads`: a role's name, or a list of heads "L.H" (ASCII digits; the range is the Explorer's check)."""
    heads = data.get("heads")
    if isinstance(heads, str) and heads in LABELS:
        return heads
    if isinstance(heads, list) and all(isinstance(h, str) and HEAD.fullmatch(h) for h in heads):
        return heads
    raise BadRequest(f"field 'heads' must be a role ({', '.join(LABELS)}) or a list of heads like \"1.2\"")


def _query_index(request: Request, name: str, bound: int | None = None) -> int:
    """Query parameter `name` as a whole number (ASCII digits), below `bound` when given."""
    value = request.query_params.get(name)
    if value is None:
        raise BadRequest(f"query parameter {name!r} is missing")
    if not INDEX.fullmatch(value) or (bound is not None and int(value) >= bound):
        whole = "a whole number" if bound is None else f"a whole number from 0 to {bound - 1}"
        raise BadRequest(f"{name} must be {whole}, not {value[:20]!r}")
    return int(value)


def create_app(explorer: Explorer, lang: str = "en", token: str | None = None, hosts: tuple[str, ...] = ()) -> Guard:
    """The app serving `explorer` with its page in `lang`, behind guard.Guard: `token` (None: a fresh random
    one) is what a request must carry, read back as the returned app's `.token`; `hosts` are names allowed in
    `Host` besides the loopback ones (the --host the user chose)."""
    page = page_html(explorer.model_info(), lang)
    n_layers, n_heads = explorer.loaded.spec.n_layers, explorer.loaded.spec.n_heads

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
        return explorer.layer_thumbs(request.query_params.get("run", ""), _query_index(request, "layer", n_layers))

    def head(request, data):
        run_id = request.query_params.get("run", "")
        return explorer.head_pattern(
            run_id, _query_index(request, "layer", n_layers), _query_index(request, "head", n_heads)
        )

    def row(request, data):
        return explorer.query_row(
            request.query_params.get("run", ""), _query_index(request, "layer", n_layers), _query_index(request, "q")
        )

    def ablate(request, data):
        return explorer.ablate(_field(data, "run", str), _heads(data), _field(data, "method", str), _position(data))

    def direct(request, data):
        return explorer.direct(
            _field(data, "run", str),
            _position(data),
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

    async def internal(request, exc):  # guard.Guard prints the one line; this is the answer the page reads
        return _error(f"internal error ({type(exc).__name__}); the server keeps running", 500)

    handlers = {404: not_found, 405: not_found, Exception: internal}
    app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
    return Guard(app, token or secrets.token_urlsafe(32), hosts)

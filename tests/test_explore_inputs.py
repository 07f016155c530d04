"""`headlens explore` on bad input, through Starlette's TestClient on `tiny`: the inputs that used to raise inside
the app (a lone surrogate, JSON nested 100,000 deep, a 5,000-digit number, NaN, `layer=²`, missing or None
fields, a 5,000-digit head), each refused at its cause and tested against the app without its catch-all;
the catch-all's JSON 500 and one stderr line; a hostile model name on the terminal; a taken port; Ctrl-C.
Property-based tests (hypothesis): arbitrary JSON bodies and query strings never get a 5xx."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from headlens.cli.main import cli
from headlens.reports.explore import create_app
from tests.helpers import explore_attacks
from tests.helpers.explore_attacks import SETTINGS, refused
from tests.helpers.explore_setup import explore_client, tiny_setup

# the shared fixtures (tests/helpers/explore_attacks.py), as names of this module so pytest finds them
app, client, inner, run_id, spy = (
    explore_attacks.app,
    explore_attacks.client,
    explore_attacks.inner,
    explore_attacks.run_id,
    explore_attacks.spy,
)


# -- inputs that used to raise inside the app: each refused at its cause (no catch-all: the inner app) --------
@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('{"text": "a\\ud800b"}', "lone surrogate"),
        ('{"text": "\\udfff"}', "lone surrogate"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a":' * 40_000 + "1" + "}" * 40_000, "nested too deeply"),  # 240 KB: under the body cap
        ('{"run": "x", "position": ' + "9" * 5000 + "}", "digits"),
        ('{"run": "x", "position": 1e999}', "out of range"),
        ('{"run": "x", "position": NaN}', "finite"),
        ('{"run": "x", "position": -Infinity}', "finite"),
        (b'{"text": "\xff"}', "not JSON"),
    ],
)
def test_bodies_that_used_to_raise_are_one_line_400s(inner, client, capfd, body, words):
    for path in ("/api/run", "/api/direct"):
        for the_client in (inner, client):
            response = the_client.post(path, content=body, headers={"Content-Type": "application/json"})
            assert words in refused(response, 400)
    assert "Traceback" not in capfd.readouterr().err


def _query_message(spy) -> dict:
    last_layer, last_head = spy.spec.n_layers - 1, spy.spec.n_heads - 1
    return {
        "layer=²&head=0": f"layer must be a whole number from 0 to {last_layer}, not '²'",
        "layer=٣&head=0": f"layer must be a whole number from 0 to {last_layer}, not '٣'",
        "layer=%2B1&head=0": f"layer must be a whole number from 0 to {last_layer}, not '+1'",
        "layer=%201&head=0": f"layer must be a whole number from 0 to {last_layer}, not ' 1'",
        f"layer={last_layer + 1}&head=0": f"layer must be a whole number from 0 to {last_layer}",
        "layer=1" + "0" * 5000 + "&head=0": f"layer must be a whole number from 0 to {last_layer}",
        "layer=0&head=-1": f"head must be a whole number from 0 to {last_head}, not '-1'",
        "layer=0&head=": f"head must be a whole number from 0 to {last_head}, not ''",
        "layer=0": "query parameter 'head' is missing",
    }


def test_bad_indices_name_the_range_not_none_or_negative(inner, client, spy, run_id):
    for query, message in _query_message(spy).items():
        for the_client in (inner, client):
            shown = refused(the_client.get(f"/api/head?run={run_id}&{query}"), 400)
            assert shown.startswith(message) and "None" not in shown and "no head" not in shown, shown
    assert refused(inner.get(f"/api/row?run={run_id}&layer=0&q=²"), 400) == "q must be a whole number, not '²'"
    assert refused(inner.get(f"/api/layer?run={run_id}"), 400) == "query parameter 'layer' is missing"
    with pytest.raises(ValueError, match=f"layer must be a whole number from 0 to {spy.spec.n_layers - 1}, not -1"):
        spy.explorer.layer_thumbs(run_id, -1)  # the library says the same to its own callers
    with pytest.raises(ValueError, match=f"head must be a whole number from 0 to {spy.spec.n_heads - 1}, not 99"):
        spy.explorer.head_pattern(run_id, 0, 99)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/api/run", {}, "field 'text' is missing"),
        ("/api/run", {"text": None}, "field 'text' is missing"),
        ("/api/run", {"text": ["a"]}, "field 'text' must be a text"),
        ("/api/direct", {"run": "x"}, "field 'position' is missing"),
        ("/api/direct", {"run": "x", "position": None}, "field 'position' is missing"),
        ("/api/direct", {"run": "x", "position": True}, "field 'position' must be a whole number"),
        ("/api/direct", {"run": "x", "position": 1.5}, "field 'position' must be a whole number"),
        ("/api/direct", {"run": "x", "position": -1}, "field 'position' must be a whole number from 0, not -1"),
        ("/api/ablate", {"run": "x", "heads": ["0.0"], "method": "zero"}, "field 'position' is missing"),
        ("/api/ablate", {"run": "x", "heads": ["0.0"], "position": 1}, "field 'method' is missing"),
        ("/api/ablate", {"run": "x", "heads": None, "method": "zero", "position": 1}, "field 'heads' must be"),
        ("/api/ablate", {"run": "x", "heads": ["1" * 5000 + ".0"], "method": "zero", "position": 1}, "field 'heads'"),
        ("/api/ablate", {"run": "x", "heads": ["².1"], "method": "zero", "position": 1}, "field 'heads' must be"),
        ("/api/ablate", {"run": "x", "heads": ["0.-1"], "method": "zero", "position": 1}, "field 'heads' must be"),
        ("/api/ablate", {"run": "x", "heads": "nonsense", "method": "zero", "position": 1}, "field 'heads' must be"),
    ],
)
def test_missing_or_mistyped_fields_are_named(inner, path, body, message):
    assert refused(inner.post(path, json=body), 400).startswith(message)


def test_routes_and_methods_that_do_not_exist_answer_json(client):
    refused(client.get("/api/run"), 405)
    refused(client.get("/nothing"), 404)
    refused(client.get("/static/../../etc/passwd"), 404)


def test_an_unexpected_exception_is_a_json_500_and_one_stderr_line(spy, capfd, monkeypatch):
    app = create_app(spy.explorer)
    user = explore_client(app)
    monkeypatch.setattr(spy.explorer, "model_info", lambda: 1 / 0)
    capfd.readouterr()
    shown = refused(user.get("/api/model"), 500)
    assert "ZeroDivisionError" in shown
    err = capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and "ZeroDivisionError in GET /api/model" in err
    monkeypatch.setenv("HEADLENS_DEBUG", "1")
    refused(user.get("/api/model"), 500)
    assert "Traceback" in capfd.readouterr().err


# -- the terminal, the port, Ctrl-C -------------------------------------------------------------------------
def test_a_hostile_model_name_reaches_the_terminal_escaped(tmp_path, monkeypatch):
    from headlens.load.models import SHIPPED_MODELS, shipped_path
    from headlens.reports.explore import serve

    folder = tmp_path / "evil\x1b[2J\x07\u202eledom"
    shutil.copytree(shipped_path(SHIPPED_MODELS["tiny"]), folder)
    monkeypatch.setenv("HEADLENS_CACHE", tiny_setup()[2])  # the copy has tiny's weights: classified already
    monkeypatch.setattr(serve, "serve", lambda app, sock: None)
    result = CliRunner().invoke(cli, ["explore", str(folder), "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output and "\u202e" not in result.output
    assert "evil\\x1b[2J\\x07\\u202eledom" in result.output


def test_a_taken_port_is_one_line_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["explore", "tiny", "--port", str(port)])
    assert result.exit_code == 2
    assert result.output == f"headlens: error: port {port} is in use on 127.0.0.1; choose another with --port\n"


def test_ctrl_c_stops_cleanly_with_exit_0(tmp_path):
    from headlens.cli.commands_classify import _json

    labels = tmp_path / "heads.json"
    labels.write_text(_json(tiny_setup()[1]))
    command = [sys.executable, "-m", "headlens.cli.main", "explore", "tiny", "--port", "0", "--labels", str(labels)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    line = ""
    while "http://" not in line:
        line = process.stderr.readline()
        assert line or process.poll() is None, "the server exited"
    url, token = re.search(r"(http://127\.0\.0\.1:[0-9]+/)\?token=([A-Za-z0-9_-]{43,}) ", line).groups()
    request = urllib.request.Request(url + "api/model", headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:  # serving: Ctrl-C now stops the server
        assert response.status == 200
    process.send_signal(signal.SIGINT)
    rest = process.stderr.read()
    assert process.wait(timeout=60) == 0
    assert rest.strip().splitlines() == ["headlens explore: stopped"], rest


def test_ctrl_c_before_serving_is_one_line_and_exit_130(monkeypatch):
    from headlens.load import models

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_model", interrupted)
    result = CliRunner().invoke(cli, ["explore", "tiny", "--port", "0"])
    assert result.exit_code == 130 and result.output == "headlens explore: interrupted\n"
    assert "Aborted" not in result.output


# -- properties: arbitrary requests never get a 5xx; only loopback hosts and the own origin get through -------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        name: JSON | st.text(max_size=30) | st.integers(-3, 300)
        for name in ("text", "run", "heads", "method", "position", "target", "foil")
    }
    | {"heads": st.lists(st.from_regex(r"-?[0-9²]{1,6}\.[0-9²-]{1,3}", fullmatch=True), max_size=3) | JSON},
)


@SETTINGS
@given(path=st.sampled_from(["/api/run", "/api/ablate", "/api/direct"]), body=FIELDS | JSON, raw=st.binary(max_size=64))
def test_arbitrary_bodies_never_get_a_5xx(inner, path, body, raw):
    for content in (json.dumps(body), raw):
        response = inner.post(path, content=content, headers={"Content-Type": "application/json"})
        assert response.status_code < 500, (content, response.text)
        assert "error" in response.json() or response.status_code == 200


@SETTINGS
@given(
    path=st.sampled_from(["/api/layer", "/api/head", "/api/row", "/api/model", "/", "/static/explore.js"]),
    query=st.lists(st.tuples(st.sampled_from(["run", "layer", "head", "q", "token", "x"]), st.text(max_size=12))),
)
def test_arbitrary_query_strings_never_get_a_5xx(client, run_id, path, query):
    from urllib.parse import urlencode

    response = client.get(f"{path}?{urlencode([('run', run_id), *query])}", follow_redirects=False)
    assert response.status_code < 500, response.text

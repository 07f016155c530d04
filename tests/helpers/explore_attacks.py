"""The explorer under attack, shared by tests/test_explore_security.py and tests/test_explore_inputs.py: an
Explorer on tiny whose model-facing calls are counted (`Spy`: "refused" means "ran nothing"), its app, a
client that opened the printed address, the app without its gate and catch-all (`inner`: an exception
inside fails the test), and the check of a refusal's JSON line."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from starlette.testclient import TestClient

from headlens.reports.explore import Explorer, create_app
from tests.helpers.explore_setup import BASE, explore_client, tiny_setup

OWN_HOST = "127.0.0.1:8765"
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
METHODS = ("model_info", "start_run", "layer_thumbs", "head_pattern", "query_row", "ablate", "direct")


class Spy:
    """An Explorer on tiny whose every model-facing call is counted in `.calls`."""

    def __init__(self):
        loaded, frame, _ = tiny_setup()
        self.explorer = Explorer(loaded, frame)
        self.spec = loaded.spec
        self.calls: Counter = Counter()
        for name in METHODS:
            method = getattr(self.explorer, name)
            setattr(self.explorer, name, self._counted(name, method))

    def _counted(self, name, method):
        def call(*args, **kwargs):
            self.calls[name] += 1
            return method(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def spy():
    return Spy()


@pytest.fixture(scope="module")
def app(spy):
    return create_app(spy.explorer)


@pytest.fixture(scope="module")
def client(app):
    return explore_client(app)


@pytest.fixture(scope="module")
def run_id(client):
    return client.post("/api/run", json={"text": "ab ab ab"}).json()["run"]


@pytest.fixture(scope="module")
def inner(app):
    """The app without the gate and its last-resort handler: an exception fails the test."""
    return TestClient(app.app, base_url=BASE, raise_server_exceptions=True)


def ran(spy, method="start_run") -> int:
    return spy.calls[method]


def refused(response, status: int) -> str:
    """The one-line message of a refusal with `status`, checked to be JSON {"error": ...}."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and "\n" not in body["error"] and body["error"]
    return body["error"]

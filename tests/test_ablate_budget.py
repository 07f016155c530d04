"""The evaluation set as one value (EvalSpec), the token budget, the cached clean run and a role's own metric,
on the shipped tiny model: the budgeted result against every token and against hooks on full forward passes."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from headlens.ablation.ablate import ablate_heads
from headlens.cli.main import cli
from headlens.heads import Head
from headlens.intervene.clean import KIND
from headlens.intervene.evalspec import DEFAULT_TOKENS, EvalSpec, spaced_rows, within_budget
from headlens.intervene.sums import ablated_sums

pytestmark = pytest.mark.usefixtures("one_thread")  # fixture in conftest.py

HEADS = [Head(1, 0), Head(1, 3)]


@pytest.fixture(scope="module")
def tiny():
    from headlens.load.models import load_model

    return load_model("tiny")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADLENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_spaced_rows_fit_the_budget_evenly():
    assert spaced_rows([10] * 8, 40) == [0, 2, 4, 6]
    assert spaced_rows([10] * 8, 5) == [0]  # one sequence at least
    assert spaced_rows([10] * 3, 30) == [0, 1, 2]


def test_default_budget_agrees_with_every_token_within_its_ci(tiny):
    """The shipped text gives tiny 32 windows of 256 tokens (8,192): the default budget reads 16 of them.
    The change measured on half the windows lies within the CI of the change on every window, and the
    other way round; the bootstrap resamples the 16 windows used."""
    budget = ablate_heads(tiny, HEADS).meta
    every = ablate_heads(tiny, HEADS, tokens="all").meta
    assert budget["tokens"] == DEFAULT_TOKENS and budget["tokens_read"] <= DEFAULT_TOKENS
    assert every["tokens"] == "all" and every["tokens_read"] > 1.9 * DEFAULT_TOKENS
    assert budget["resampled"] == "16 sequences" and every["resampled"] == "32 sequences"
    low, high = budget["ci95"]
    assert low <= every["delta"] <= high
    low, high = every["ci95"]
    assert low <= budget["delta"] <= high
    assert high - low < budget["ci95"][1] - budget["ci95"][0]  # fewer tokens, a wider interval


def test_every_token_equals_hooks_on_full_forward_passes(tiny):
    """At tokens="all" the sets run from the clean residual at their first ablated layer; the same
    sums come from hooks on whole forward passes of the plain model (sweep.ablated_sums)."""
    evaluation = EvalSpec(tokens=None)
    result = ablate_heads(tiny, HEADS, "zero", evaluation).meta
    evalset = evaluation.build(tiny)
    reps = [None] * tiny.spec.n_layers
    base, ablated = (ablated_sums(tiny.model, evalset, heads, reps, batch_size=4) for heads in ([], HEADS))
    n = evalset.n_tokens
    assert result["n"] == n
    assert result["clean"] == pytest.approx(float(base.sum() / n), abs=1e-5)
    assert result["delta"] == pytest.approx(float((ablated - base).sum() / n), abs=1e-5)


def test_clean_run_cached_and_keyed_by_weights(tiny, own_cache):
    first = ablate_heads(tiny, HEADS, tokens=1024).meta
    files = list((own_cache / KIND).glob("*/data"))
    assert len(files) == 1
    again = ablate_heads(tiny, HEADS, tokens=1024).meta
    assert again == first  # the cached clean run gives the same numbers
    files[0].write_bytes(b"not a tensor file")  # a damaged entry: the clean run again, the same numbers
    assert ablate_heads(tiny, HEADS, tokens=1024).meta == first
    digest = tiny.digest()
    weight = tiny.model.get_input_embeddings().weight
    with torch.no_grad():
        weight[0, 0] += 1.0
        try:
            assert tiny.digest() != digest  # an edited model gets its own clean run
        finally:
            weight[0, 0] -= 1.0


def test_budget_description_and_units(tiny):
    evalset = EvalSpec(tokens=1024).build(tiny)
    assert evalset.input_ids.shape[0] == 4 and int(evalset.mask.sum()) <= 1024
    assert "4 of 32 sequences, evenly spaced" in evalset.description and "1,024-token budget" in evalset.description
    assert within_budget(evalset, None) is evalset


def test_role_gets_its_own_metric_and_an_explicit_one_is_noted(tiny):
    induction = ablate_heads(tiny, "induction").meta
    assert induction["metric"] == "repeat" and "induction role's own metric" in induction["metric_why"]
    asked = ablate_heads(tiny, "induction", metric="loss", tokens=512).meta
    assert asked["metric"] == "loss" and asked["metric_why"].startswith("note: metric loss as asked")
    with pytest.raises(Exception, match="not both"):
        ablate_heads(tiny, HEADS, evaluation=EvalSpec(), metric="loss")


def test_cli_checks_spec_and_budget_before_loading(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("headlens.load.models.load_model", no_load)
    for args, message in ((["--heads", "3.x"], "malformed head"), (["--heads", "1.0", "--tokens", "lots"], "--tokens")):
        result = CliRunner().invoke(cli, ["ablate", "tiny", *args, "--no-progress"])
        assert result.exit_code == 2 and message in result.output, result.output

"""`headlens classify` recovers the roles the shipped models' cards claim (headlens/data/<name>/README.md,
lines `previous_token: L.H,...`, `induction: L.H,...`, `retrieval: L.H,...` or `none`), and loads each
model by name, offline. The cards come from measurements of the training runs; the labels here come
from classify's published-definition thresholds."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from headlens.cli.main import cli

from headlens.heads import parse_heads
from headlens.models import load_model, shipped_path

pytestmark = pytest.mark.slow

ROLES = ["previous_token", "induction", "retrieval"]
# tiny-gqa is a LlamaForCausalLM: load_model and classify need the Llama architecture adapter.
NEEDS_LLAMA_ADAPTER = pytest.mark.xfail(strict=False, reason="needs the llama adapter")
MODELS = ["tiny", pytest.param("tiny-gqa", marks=NEEDS_LLAMA_ADAPTER)]


def _card_heads(name: str, role: str, n_layers: int, n_heads: int):
    """The heads the card claims for `role` (`role: L.H,...`), or [] for `role: none`."""
    card = (shipped_path(name) / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"^{role}: (.+)$", card, re.M)
    assert match, f"model card of {name} has no '{role}:' line"
    value = match.group(1).strip()
    return [] if value.lower() == "none" else parse_heads(value, n_layers, n_heads)


@pytest.fixture(scope="module")
def classified():
    """name -> {(layer, head): classify's JSON row}, one classify run per model."""
    cache = {}

    def run(name: str):
        if name not in cache:
            result = CliRunner().invoke(cli, ["classify", name, "--format", "json", "--no-progress"])
            assert result.exit_code == 0, result.output
            cache[name] = {(obj["layer"], obj["head"]): obj for obj in json.loads(result.stdout)}
        return cache[name]

    return run


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("role", ROLES)
def test_card_roles_are_recovered(classified, name, role):
    """Every head the card claims gets the label; a role the card says is absent (`none`) is
    given to no head."""
    spec = load_model(name).spec
    heads = classified(name)
    claimed = {(head.layer, head.head) for head in _card_heads(name, role, spec.n_layers, spec.n_heads)}
    labelled = {key for key, obj in heads.items() if role in obj["labels"]}
    assert claimed <= labelled, {"claimed": sorted(claimed), "labelled": sorted(labelled)}
    if not claimed:
        assert not labelled, f"the card says no {role} head formed, classify labels {sorted(labelled)}"


@pytest.mark.parametrize("name", MODELS)
def test_needle_probe_retrieves_the_tests_the_card_states(classified, name):
    """classify's needle probe (headlens.scores.retrieval) retrieves `needles_retrieved: k/n` of the card."""
    card = (shipped_path(name) / "README.md").read_text(encoding="utf-8")
    retrieved, total = re.search(r"^needles_retrieved: (\d+)/(\d+)$", card, re.M).groups()
    heads = classified(name)
    row = next(iter(heads.values()))
    assert row["n_needle_tests"] == int(retrieved), row

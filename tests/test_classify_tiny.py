"""`headlens classify tiny` recovers the roles its model card claims (headlens/data/tiny/README.md,
lines `previous_token: L.H,...` and `induction: L.H,...` or `none`). The card comes from the training run's own
measurements; the labels here come from classify's published-definition thresholds."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from headlens.cli.main import cli

from headlens.heads import parse_heads
from headlens.models import load_model, shipped_path

pytestmark = pytest.mark.slow


def _card_heads(role: str, n_layers: int, n_heads: int):
    """The heads the card claims for `role` (`role: L.H,...`), or [] for `role: none`."""
    card = (shipped_path("tiny") / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"^{role}: (.+)$", card, re.M)
    assert match, f"model card has no '{role}:' line"
    value = match.group(1).strip()
    return [] if value.lower() == "none" else parse_heads(value, n_layers, n_heads)


@pytest.fixture(scope="module")
def tiny_heads():
    result = CliRunner().invoke(cli, ["classify", "tiny", "--format", "json", "--no-progress"])
    assert result.exit_code == 0, result.output
    return {(obj["layer"], obj["head"]): obj for obj in json.loads(result.stdout)}


@pytest.mark.parametrize("role", ["previous_token", "induction"])
def test_card_roles_are_recovered(tiny_heads, role):
    """Every head the card claims gets the label; a role the card says is absent (`none`) is
    given to no head."""
    spec = load_model("tiny").spec
    claimed = {(head.layer, head.head) for head in _card_heads(role, spec.n_layers, spec.n_heads)}
    labelled = {key for key, obj in tiny_heads.items() if role in obj["labels"]}
    assert claimed <= labelled, {"claimed": sorted(claimed), "labelled": sorted(labelled)}
    if not claimed:
        assert not labelled, f"the card says no {role} head formed, classify labels {sorted(labelled)}"

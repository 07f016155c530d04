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
from headlens.models import SHIPPED_MODELS, load_model, shipped_path

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


# Short texts on every shipped model --------------------------------------------------------------

SHORT_SENTENCE = "The cat sat on the mat while the dog slept by the door."


def _text_of(loaded, n_tokens: int) -> str:
    """A text that is exactly `n_tokens` tokens for this model's tokenizer."""
    ids = loaded.tokenizer(SHORT_SENTENCE, add_special_tokens=False)["input_ids"][:n_tokens]
    text = loaded.tokenizer.decode(ids)
    assert len(loaded.tokenizer(text, add_special_tokens=False)["input_ids"]) == n_tokens
    return text


@pytest.mark.parametrize("model", sorted(SHIPPED_MODELS))
@pytest.mark.parametrize("n_tokens", [2, 7])
def test_a_short_text_classifies_and_names_each_probe_input(model, n_tokens, tmp_path):
    path = tmp_path / "short.txt"
    path.write_text(_text_of(load_model(model), n_tokens), encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["classify", model, "--text", str(path), "--n-seq", "2", "--format", "json",
                                      "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    for obj in json.loads(result.stdout):
        assert obj["n_positions"] >= 1 and obj["prev_token_score"] is not None
        assert (obj["text_source"], obj["repeats_source"], obj["needles_source"]) == (
            "given_text", "random_tokens", "default_text")  # too short for a haystack: the shipped text
        assert obj["n_needle_tests"] > 0 and 0 <= obj["n_needle_retrieved"] <= obj["n_needle_tests"]
    header = (out / "heads.csv").read_text().splitlines()[0].split(",")
    assert {"text_source", "repeats_source", "needles_source", "n_needle_retrieved"} <= set(header)

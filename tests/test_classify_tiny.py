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
from headlens.files import shipped_path
from headlens.heads import parse_heads
from headlens.load.models import SHIPPED_MODELS, load_model

pytestmark = pytest.mark.slow

ROLES = ["previous_token", "induction", "retrieval"]
MODELS = sorted(SHIPPED_MODELS)


def _card_heads(name: str, role: str, n_layers: int, n_heads: int):
    """The heads the card claims for `role` (`role: L.H,...`), or [] for `role: none`."""
    card = (shipped_path(name) / "README.md").read_text(encoding="utf-8")
    match = re.search(rf"^{role}: (.+)$", card, re.M)
    assert match, f"model card of {name} has no '{role}:' line"
    value = match.group(1).strip()
    return [] if value.lower() == "none" else parse_heads(value, n_layers, n_heads)


@pytest.fixture(scope="module")
def classified(classify_cli):
    """name -> {(layer, head): classify's JSON row}, from the session's one classify run per model."""

    def rows(name: str):
        result = classify_cli(name)
        assert result.exit_code == 0, result.output
        return {(obj["layer"], obj["head"]): obj for obj in json.loads(result.stdout)}

    return rows


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
    assert (row["n_needle_retrieved"], row["n_needle_tests"]) == (int(retrieved), int(total)), row


def test_needle_depths_sets_how_many_needle_tests_run(classified):
    """`--needle-depths N` runs N depths per test length: twice the default's 5 depths is twice its tests."""
    default = next(iter(classified("tiny").values()))["n_needle_tests"]
    args = ["classify", "tiny", "--needle-depths", "10", "--n-seq", "2", "--format", "json", "--no-progress"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert {row["n_needle_tests"] for row in json.loads(result.stdout)} == {2 * default}
    refused = CliRunner().invoke(cli, ["classify", "tiny", "--needle-depths", "0"])
    assert refused.exit_code == 2 and "--needle-depths" in refused.output


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
    result = CliRunner().invoke(
        cli,
        [
            "classify",
            model,
            "--text",
            str(path),
            "--n-seq",
            "2",
            "--format",
            "json",
            "--out-dir",
            str(out),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    for obj in json.loads(result.stdout):
        assert obj["n_positions"] >= 1 and obj["prev_token_score"] is not None
        assert (obj["text_source"], obj["repeats_source"], obj["needles_source"]) == (
            "given_text",
            "random_tokens",
            "default_text",
        )  # too short for a haystack: the shipped text
        assert obj["n_needle_tests"] > 0 and 0 <= obj["n_needle_retrieved"] <= obj["n_needle_tests"]
    header = (out / "heads.csv").read_text().splitlines()[0].split(",")
    assert {"text_source", "repeats_source", "needles_source", "n_needle_retrieved"} <= set(header)

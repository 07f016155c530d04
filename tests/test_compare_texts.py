"""Labels across texts (headlens.classify.compare): two texts built so that exactly one planted head loses its
label on one of them, and `compare_labels` names that head and no other."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import torch

from headlens.classify import ClassifyConfig
from headlens.classify.compare import classify_texts, compare_labels, shipped_texts
from tests.helpers.planted import PLANTED_TEXT, SUB, _positions, build_planted

CONFIG = ClassifyConfig(n_seq=2, seed=0, needles=False, resamples=0)
GATE = " purple"  # the token that turns the planted previous-token head to an absolute position
GATE_WEIGHT = 2.0  # its query's pull to that position, in units of the planted peak score: beats offset -1
GATE_POSITION = 5


def _gated_planted(seed: int):
    """The planted model whose previous-token head, at a query holding GATE, attends absolute position
    GATE_POSITION instead: GATE's embedding is a unit vector of the JUNK subspace (orthogonal to every other
    token's and position's), and the head's query reads that direction into p_GATE_POSITION."""
    planted = build_planted(seed)
    model, spaces = planted.loaded.model, planted.subspaces
    (gate,) = planted.loaded.tokenizer(GATE, add_special_tokens=False)["input_ids"]
    direction = spaces["junk"][:, -1]  # [d_model]
    layer, head = planted.positions["previous_token"]
    d_head = model.config.n_embd // model.config.n_head
    pull = GATE_WEIGHT * spaces["gain"] * torch.outer(direction, _positions()[GATE_POSITION])  # [d_model, SUB]
    with torch.no_grad():
        model.transformer.wte.weight[gate] = direction.to(model.transformer.wte.weight.dtype)
        model.transformer.h[layer].attn.c_attn.weight[:, head * d_head : head * d_head + SUB] += pull.float()
    return planted


def _gated_text(every: int = 3) -> str:
    """PLANTED_TEXT with every `every`-th word replaced by GATE."""
    words = PLANTED_TEXT.split()
    return " ".join(GATE.strip() if i % every == every - 1 else word for i, word in enumerate(words))


@pytest.mark.slow
def test_the_one_head_built_to_flip_is_the_only_flip():
    planted = _gated_planted(0)
    head = "{}.{}".format(*planted.positions["previous_token"])
    table = compare_labels(classify_texts(planted.loaded, {"plain": PLANTED_TEXT, "gated": _gated_text()}, CONFIG))
    by_role = table.set_index("role")
    assert by_role.loc["previous_token", "heads_plain"] == [head]
    assert by_role.loc["previous_token", "heads_gated"] == []
    flipped = {role: flips for role, flips in zip(table["role"], table["flips"], strict=True) if flips}
    assert flipped["previous_token"] == flipped["positional"] == [head]
    # that head alone flips (on the gated text it may earn another label, rare_word, from where it now looks)
    assert {h for flips in flipped.values() for h in flips} == {head}
    assert by_role.loc["previous_token", "jaccard"] == 0.0


def test_the_shipped_texts_exist_and_differ():
    texts = {name: path.read_text(encoding="utf-8") for name, path in shipped_texts().items()}
    assert set(texts) == {"english", "spanish", "code"}
    assert "def wrap(" in texts["code"] and "Jonás" in texts["spanish"] and "Naomi" in texts["english"]
    assert all(10_000 < len(text.encode()) < 120_000 for text in texts.values())


def test_compare_texts_needs_the_flag_and_two_texts(tmp_path):
    one = tmp_path / "one.txt"
    one.write_text("The ship sailed at dawn.", encoding="utf-8")
    run = [sys.executable, "-m", "headlens.cli.main", "classify", "tiny"]
    stray = subprocess.run([*run, str(one)], capture_output=True, text=True, timeout=300)
    assert stray.returncode == 2 and "--compare-texts" in stray.stderr
    alone = subprocess.run([*run, "--compare-texts", str(one)], capture_output=True, text=True, timeout=300)
    assert alone.returncode == 2 and "at least two texts" in alone.stderr and "Traceback" not in alone.stderr


def test_the_printed_comparison_fits_the_width_and_names_every_head():
    """A role with 138 heads on one text (SmolLM2's first_token) prints in lines no wider than asked, and
    every head of every text, every flip and every flip score is on the page."""
    from headlens.cli.compare_lines import compare_lines

    many = [f"{layer}.{head}" for layer in range(30) for head in range(9)][:138]
    table = pd.DataFrame(
        [
            {
                "role": "first_token",
                "heads_english": many,
                "heads_spanish": many[:-2],
                "jaccard": 136 / 138,
                "flips": many[-2:],
                "flip_scores": [f"{h} 0.310/0.290 (cut-off 0.3)" for h in many[-2:]],
            },
            {"role": "induction", "heads_english": ["1.0"], "heads_spanish": ["1.0"], "jaccard": 1.0}
            | {"flips": [], "flip_scores": []},
        ]
    )
    for width in (60, 80, 120):
        lines = compare_lines(table, ["english", "spanish"], width=width)
        assert max(len(line) for block in lines for line in block.split("\n")) <= width
        page = " ".join(lines)
        words = {word.strip(",;") for word in page.split()}
        assert set(many) <= words
        assert all(score.split()[1] in page for score in table["flip_scores"][0])
        assert "first_token: Jaccard 0.99; flips: " + ", ".join(many[-2:]) in page
        assert "induction: Jaccard 1.00; flips: none" in page


def test_compare_texts_is_one_result_of_the_comparison_and_each_texts_labels():
    """compare_texts: the table compare_labels gives for the same runs, each text's classification kept."""
    from headlens.classify import compare_texts

    loaded = build_planted(0).loaded
    texts = {"plain": PLANTED_TEXT, "gated": _gated_text()}
    result = compare_texts(loaded, texts, CONFIG)
    again = classify_texts(loaded, texts, CONFIG)
    assert result.kind == "agreement" and result.meta["texts"] == ["plain", "gated"]
    pd.testing.assert_frame_equal(result.frame, compare_labels(again))
    for name in texts:
        pd.testing.assert_frame_equal(result.tables[name], again[name].frame)

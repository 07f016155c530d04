"""Property-based tries (hypothesis, bounded): the head-spec parser and every JSON reader take any input to
either a valid answer or a HeadlensError with one short line, never another exception."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headlens.ablation import store
from headlens.circuits.backups import read_backups
from headlens.circuits.graph import ModelGraph
from headlens.circuits.interchange import read_graph
from headlens.classify import roles
from headlens.classify.cache import read_classification
from headlens.errors import HeadlensError, InvalidHeadError
from headlens.files import csv_text, parse_json, read_json
from headlens.heads import Head, parse_heads
from headlens.intervene.evalset import read_prompts
from headlens.load import hub, ollama
from headlens.probes.corpus import Corpus
from headlens.scores.rare_word import SENTENCE, sentence_spans

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FILE_SETTINGS = settings(SETTINGS, max_examples=60)  # each example writes and reads a file
N_LAYERS, N_HEADS = 3, 5

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
# head-spec pieces: digits of any script, separators, words, white space
SPEC = st.lists(st.sampled_from(list("0123456789.,: -²٣١\t\n") + ["layer:", "all", "ALL", "layer"]), max_size=12).map(
    "".join
)


def one_line(exc: Exception) -> None:
    message = str(exc)
    assert message and "\n" not in message and len(message) <= 300, message


def hostile_bytes():
    """Arbitrary bytes, JSON of any shape, and the two values the parser cannot take (deep, 5000 digits)."""
    deep = st.integers(1, 5).map(lambda k: ("[" * (k * 20_000)).encode())
    digits = st.integers(4301, 6000).map(lambda n: ("1" * n).encode())
    return st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()) | deep | digits


@SETTINGS
@given(spec=SPEC | st.text(max_size=40))
def test_head_spec_parser(spec):
    try:
        heads = parse_heads(spec, N_LAYERS, N_HEADS)
    except InvalidHeadError as exc:
        one_line(exc)
        return
    assert heads == sorted(set(heads)) and heads
    assert all(type(h) is Head and 0 <= h.layer < N_LAYERS and 0 <= h.head < N_HEADS for h in heads)


@SETTINGS
@given(raw=hostile_bytes())
def test_parse_json(raw):
    try:
        value = parse_json(raw, "input")
    except HeadlensError as exc:
        one_line(exc)
        return
    assert value == json.loads(raw)


READERS = {
    "read_json": ("input.json", lambda path: read_json(path, "--x")),
    "labels": ("heads.json", roles.read_labels),
    "prompts": ("prompts.jsonl", read_prompts),
    "classification": ("heads.json", read_classification),
    "jsonl-text": ("docs.jsonl", lambda path: list(Corpus(path))),
    "ollama-manifest": ("latest", ollama._model_digest),
    "config-json": ("config.json", lambda path: hub.check_local_dir(path.parent)),
    "explore-backups": ("backups.json", read_backups),
    "eap-ig-graph": ("circuit.json", lambda path: read_graph(path, ModelGraph(N_LAYERS, N_HEADS))),
}


@pytest.mark.parametrize("name", list(READERS))
def test_json_file_readers(tmp_path, name):
    file_name, reader = READERS[name]
    path = tmp_path / file_name

    @FILE_SETTINGS
    @given(raw=hostile_bytes() | JSON.map(lambda v: json.dumps([v]).encode()))
    def check(raw):
        path.write_bytes(raw)
        try:
            reader(path)
        except HeadlensError as exc:
            one_line(exc)

    check()


@SETTINGS
@given(
    raw=hostile_bytes()
    | JSON.map(lambda v: json.dumps({"layer": 0, "head": 0, "n": 1, "clean": 0.0, "ablated": 0.0, "delta": v}).encode())
)
def test_rows_file_lines(raw):
    row = store._row(raw, (N_LAYERS, N_HEADS))
    if row is not None:
        assert math.isfinite(row["delta"]) and type(row["delta"]) in (int, float)
        assert 0 <= row["layer"] < N_LAYERS and 0 <= row["head"] < N_HEADS


@SETTINGS
@given(text=st.text(alphabet=st.sampled_from(list("ab .!?\n")), max_size=60))
def test_sentence_spans_are_the_sentence_pattern_s_matches(text):
    assert list(sentence_spans(text)) == [m.group() for m in SENTENCE.finditer(text)]


@SETTINGS
@given(
    cells=st.lists(
        st.text(st.characters(exclude_characters="\r\n", exclude_categories=("Cs",)), max_size=12),
        min_size=1,
        max_size=6,
    ),
    numbers=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=6),
)
def test_csv_cells_never_start_a_formula(cells, numbers):
    frame = pd.DataFrame(
        {"text": cells[: len(numbers)] + [""] * (len(numbers) - len(cells[: len(numbers)])), "number": numbers}
    )
    back = pd.read_csv(io.StringIO(csv_text(frame)), keep_default_na=False, dtype={"text": str})
    assert back["number"].tolist() == pytest.approx(numbers)  # numbers stay numbers, negative ones too
    for cell in back["text"]:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")) or _plain_number(cell)


def _plain_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True

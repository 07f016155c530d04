"""Head specs: parsing, formatting and every malformed input."""

from __future__ import annotations

import pytest

from headlens.errors import HeadlensError, InvalidHeadError
from headlens.heads import Head, all_heads, format_heads, parse_heads


def test_head_is_written_layer_dot_head():
    assert str(Head(5, 1)) == "5.1"
    assert Head(5, 1) == (5, 1)


def test_all_heads_in_order():
    heads = all_heads(2, 3)
    assert heads == [Head(0, 0), Head(0, 1), Head(0, 2), Head(1, 0), Head(1, 1), Head(1, 2)]


def test_parse_list_sorted_with_spaces():
    assert parse_heads(" 5.1, 3.4 ", 12, 12) == [Head(3, 4), Head(5, 1)]


def test_parse_layer_and_all():
    assert parse_heads("layer:1", 2, 3) == [Head(1, 0), Head(1, 1), Head(1, 2)]
    assert parse_heads("ALL", 2, 3) == all_heads(2, 3)
    assert parse_heads("layer:0,1.2", 2, 3) == [Head(0, 0), Head(0, 1), Head(0, 2), Head(1, 2)]


def test_format_inverts_parse():
    heads = parse_heads("0.1,0.10,3.0", 12, 12)
    assert format_heads(heads) == "0.1,0.10,3.0"
    assert parse_heads(format_heads(heads), 12, 12) == heads


# Errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["", "   ", None])
def test_empty_spec(spec):
    with pytest.raises(InvalidHeadError, match="empty head spec"):
        parse_heads(spec, 12, 12)


@pytest.mark.parametrize("spec", ["3.4,,5.1", "3.4,"])
def test_empty_entry(spec):
    with pytest.raises(InvalidHeadError, match="empty entry"):
        parse_heads(spec, 12, 12)


@pytest.mark.parametrize("spec", ["3", "3.4.5", "a.b", "-1.2", "3.-1", "3;4", "layer:x", "1.5e0"])
def test_malformed(spec):
    with pytest.raises(InvalidHeadError, match="malformed head"):
        parse_heads(spec, 12, 12)


@pytest.mark.parametrize("spec, bad", [("5.12", "head 5.12"), ("12.0", "head 12.0"), ("layer:12", "layer 12")])
def test_out_of_range_names_the_model_range(spec, bad):
    with pytest.raises(InvalidHeadError) as info:
        parse_heads(spec, 12, 12)
    message = str(info.value)
    assert bad in message and "12 layers x 12 heads" in message and "0-11" in message


def test_range_follows_the_model_not_gpt2_small():
    with pytest.raises(InvalidHeadError, match="2 layers x 4 heads"):
        parse_heads("1.4", 2, 4)
    assert parse_heads("1.3", 2, 4) == [Head(1, 3)]


@pytest.mark.parametrize("spec", ["3.4,3.4", "3.4, 3.04", "layer:3,3.1"])
def test_duplicates(spec):
    with pytest.raises(InvalidHeadError, match="more than once"):
        parse_heads(spec, 12, 12)


def test_errors_are_headlens_and_value_errors():
    with pytest.raises(HeadlensError):
        parse_heads("x", 12, 12)
    with pytest.raises(ValueError):
        parse_heads("x", 12, 12)

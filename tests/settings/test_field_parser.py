"""A field's own text parser (``Field.parser``), and ``num_machines`` read through it."""

from __future__ import annotations

import pytest

from accelerando.core.settings import Sourced, resolve
from accelerando.core.settings.fields import Field, get_field, machine_range, parse_num_machines
from accelerando.core.settings.resolve import parse_value


def _even(text: str) -> int | str:
    if text.strip() == "any":
        return "any"
    number = int(text)  # ValueError with int's own message for non-numbers
    if number % 2:
        raise ValueError("odd numbers are not allowed")
    return number


EVEN = Field("even", "int", None, minimum=2, maximum=10, parser=_even, parser_accepts="'any'")


def test_text_goes_through_the_parser_and_typed_values_through_the_kind():
    assert parse_value(EVEN, "4") == 4
    assert parse_value(EVEN, " any ") == "any"
    assert parse_value(EVEN, 3) == 3  # a typed value is read by the kind: the parser never sees it
    assert parse_value(EVEN, None) is None


def test_a_parser_refusal_names_the_setting_source_reason_and_fix():
    with pytest.raises(ValueError) as err:
        parse_value(EVEN, "5", "env:ACCELERANDO_EVEN")
    text = str(err.value)
    assert "'5'" in text and "'even'" in text and "env:ACCELERANDO_EVEN" in text
    assert "odd numbers are not allowed; expected an integer from 2 to 10 or 'any'" in text
    assert "unset that variable" in text


def test_numbers_the_parser_returns_are_held_to_the_bounds():
    with pytest.raises(ValueError, match=r"'12'.*from 2 to 10"):
        parse_value(EVEN, "12")


def test_parser_accepts_needs_a_parser():
    with pytest.raises(ValueError, match="give the parser too"):
        Field("x", "int", parser_accepts="'MIN:MAX'")


def test_num_machines_reads_a_count_or_a_range_through_its_parser():
    field = get_field("num_machines")
    assert field.parser is parse_num_machines
    assert field.choices is None
    assert field.describe_allowed() == "an integer >= 1 or 'MIN:MAX'"
    assert parse_num_machines(" 2 : 4 ") == "2 : 4" and machine_range("2 : 4") == (2, 4)
    assert parse_num_machines("3") == 3
    with pytest.raises(ValueError, match="two whole numbers joined by one colon"):
        parse_num_machines("1:2:3")
    with pytest.raises(ValueError, match="not a whole number"):
        parse_num_machines("two")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("0", r"'0'.*expected an integer >= 1 or 'MIN:MAX'"), ("x", r"'x'.*not a whole number; expected")],
)
def test_num_machines_refusals_name_the_flag(raw, expected):
    with pytest.raises(ValueError, match=expected) as err:
        resolve([{"num_machines": Sourced(raw, "cli:--num_machines")}], warn_sources=())
    assert "cli:--num_machines" in str(err.value)

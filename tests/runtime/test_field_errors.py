"""The value checks below every transport: lone surrogates, how deep a parsed value
nests, cutting text to a bound, and echoing what a client sent as strict JSON."""

import json

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from reactor_serve.runtime.field_errors import (
    MAX_DEPTH,
    clipped,
    command_error,
    describe_value,
    field_problems,
    has_lone_surrogate,
    safe_text,
    value_depth,
)


@pytest.mark.parametrize(
    "text, lone",
    [
        ("", False),
        ("plain ascii", False),
        ("猫 and é", False),
        ("\U0001f600", False),  # one code point, not a pair of surrogates
        ("\ud800", True),
        ("a\udfffb", True),
        ("\ud83d\ude00", True),  # a pair as two code points is no character: UTF-8 refuses it
        ("\udc00\ud800", True),
    ],
)
def test_has_lone_surrogate(text, lone):
    assert has_lone_surrogate(text) is lone


@pytest.mark.parametrize(
    "value, depth",
    [
        (1, 0),
        ("[[[", 0),  # a string's brackets are text
        (None, 0),
        ([], 1),
        ({}, 1),
        ((1, (2,)), 2),  # tuples count, as Python callers hand them over
        ({"a": [{"b": []}]}, 4),
        ([[], [[[]]], []], 4),
    ],
)
def test_value_depth_counts_containers(value, depth):
    assert value_depth(value) == depth


def test_value_depth_stops_past_its_limit_even_for_a_cyclic_value():
    deep: list = []
    for _ in range(1000):
        deep = [deep]
    assert value_depth(deep) == 1001
    assert value_depth(deep, limit=1001) == 1001
    assert value_depth(deep, limit=1000) == 1001
    assert value_depth(deep, limit=10) == 11
    cyclic: dict = {}
    cyclic["self"] = cyclic
    assert value_depth(cyclic, limit=50) == 51


@pytest.mark.parametrize(
    "text, limit, cut",
    [
        ("abcdef", 6, "abcdef"),
        ("abcdefg", 6, "abc..."),
        ("", 3, ""),
    ],
)
def test_clipped_cuts_to_the_limit_and_says_so(text, limit, cut):
    assert clipped(text, limit) == cut
    assert len(clipped(text, limit)) <= limit


def test_safe_text_escapes_lone_surrogates_and_cuts():
    assert safe_text("a\ud800b") == "a\\ud800b"
    assert safe_text("x" * 100, 10) == "xxxxxxx..."
    assert safe_text(12) == "12"


def test_an_echoed_value_at_the_depth_limit_is_kept_and_one_past_is_described():
    at_limit: list = [1]
    for _ in range(MAX_DEPTH - 1):
        at_limit = [at_limit]
    assert describe_value(at_limit) == at_limit
    assert describe_value([at_limit]) == f"<nested {MAX_DEPTH + 1} deep>"


@pytest.mark.parametrize(
    "value, echoed",
    [
        (float("nan"), "<NaN>"),
        (float("inf"), "<Infinity>"),
        (float("-inf"), "<-Infinity>"),
        ({"a": [float("nan"), True, 1]}, {"a": ["<NaN>", True, 1]}),
        ({"\ud800": "\udc00"}, {"<string with a lone surrogate>": "<string with a lone surrogate>"}),
        (True, True),
        (2**63, 2**63),
        (2**63 + 1, "<integer of 19 digits>"),
    ],
)
def test_describe_value_echoes_only_strict_json(value, echoed):
    described = describe_value(value)
    assert described == echoed
    json.dumps(described, allow_nan=False).encode("utf-8")


def test_a_command_error_serialises_as_strict_json_whatever_it_carries():
    error = command_error(
        "set_\ud800",
        "bad \udfff " + "!" * 5000,
        [{"field": "x", "rule": "finite", "value": float("inf")},
         {"field": ["not", "a", "name"], "rule": None, "value": {"k": float("nan")}}],
    )
    text = json.dumps(error, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    assert error["command"] == "<string with a lone surrogate>"
    assert [entry["value"] for entry in error["errors"]] == ["<Infinity>", {"k": "<NaN>"}]
    assert len(error["message"]) <= 2048


def test_field_problems_name_the_field_under_a_prefix():
    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid")
        rate: int

    with pytest.raises(ValidationError) as invalid:
        Section.model_validate({"speed": 1})
    assert field_problems(invalid.value, prefix="pacing") == [
        "field 'pacing.rate': required field is missing",
        "field 'pacing.speed': unknown field",
    ]

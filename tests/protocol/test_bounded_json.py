"""Bounded JSON on its own: the raw-text depth scan, the bounded parse and its number
hooks, the HTTP body parser's wording, and the walk both the HTTP bodies and the data
channel use to find what a parsed value cannot send back."""

import json
import random

import pytest

from reactor_serve.protocol.bounded_json import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_INT_DIGITS,
    JSONBodyError,
    RefusedJSON,
    Unsendable,
    bracket_depth,
    describe,
    first_unsendable,
    json_type,
    loads_bounded,
    number_hooks,
    parse_json_object,
)
from reactor_serve.runtime.field_errors import Unrepresentable, value_depth


def nested(levels: int, inner: str = "1") -> str:
    """`levels` arrays around `inner`, alternating with objects so both brackets count."""
    text = inner
    for level in range(levels):
        text = f"[{text}]" if level % 2 else f'{{"k":{text}}}'
    return text


# --- bracket_depth: nesting read from raw text --------------------------------------------


@pytest.mark.parametrize(
    "raw, depth",
    [
        ("", 0),
        ("1", 0),
        ('"[[[{{{"', 0),  # brackets inside a string do not nest
        ("[]", 1),
        ("{}", 1),
        ("[[],[]]", 2),
        ('[{"a":[1]}]', 3),
        (r'["\"[[[", [1]]', 2),  # an escaped quote does not end the string
        ('["unclosed [[[[', 1),  # an unclosed string runs to the end
        ("[[[", 3),  # not JSON, still measured: the scan runs before the parser
    ],
)
def test_bracket_depth_counts_brackets_outside_strings(raw, depth):
    assert bracket_depth(raw) == depth
    assert bracket_depth(raw.encode()) == depth


def test_bracket_depth_reads_text_with_lone_surrogates_and_non_ascii():
    # Refusing them is the parser's job; the scan must not trip over them first.
    assert bracket_depth('[["\ud800", "猫]"]]') == 2


def test_bracket_depth_of_text_and_value_depth_of_the_parsed_value_agree():
    rng = random.Random(19)

    def tree(level: int):
        roll = rng.random()
        if level > 6 or roll < 0.3:
            return rng.choice([1, "x[", "]}", None, True, 2.5, ""])
        if roll < 0.65:
            return [tree(level + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}{{": tree(level + 1) for i in range(rng.randint(0, 3))}

    for _ in range(300):
        value = tree(0)
        assert bracket_depth(json.dumps(value)) == value_depth(value)


# --- loads_bounded: the depth limit and its edge --------------------------------------------


HOOKS = number_hooks(DEFAULT_MAX_INT_DIGITS, lambda problem, text: f"<{problem}:{text}>")


def test_loads_bounded_parses_at_the_depth_limit_and_refuses_one_past_it():
    at_limit = nested(10)
    assert bracket_depth(at_limit) == 10
    assert value_depth(loads_bounded(at_limit, max_depth=10, hooks=HOOKS)) == 10
    with pytest.raises(RefusedJSON) as refused:
        loads_bounded(nested(11), max_depth=10, hooks=HOOKS)
    assert (refused.value.problem, refused.value.detail) == ("depth", "11")


def test_loads_bounded_refuses_a_hostile_depth_before_the_parser_recurses():
    with pytest.raises(RefusedJSON) as refused:
        loads_bounded("[" * 200_000 + "]" * 200_000, max_depth=32, hooks=HOOKS)
    assert (refused.value.problem, refused.value.detail) == ("depth", "200000")


def test_many_brackets_side_by_side_are_not_depth():
    wide = "[" + ",".join(["[]"] * 100) + "]"
    assert loads_bounded(wide, max_depth=2, hooks=HOOKS) == [[]] * 100


@pytest.mark.parametrize(
    "raw, problem",
    [(b"\xff{}", "encoding"), ("{", "syntax"), ('{"a":1,}', "syntax")],
)
def test_loads_bounded_names_each_refusal(raw, problem):
    with pytest.raises(RefusedJSON) as refused:
        loads_bounded(raw, max_depth=32, hooks=HOOKS)
    assert refused.value.problem == problem


# --- number_hooks: what strict JSON cannot carry ------------------------------------------


@pytest.mark.parametrize(
    "raw, parsed",
    [
        ("NaN", "<constant:NaN>"),
        ("Infinity", "<constant:Infinity>"),
        ("-Infinity", "<constant:-Infinity>"),
        ("1e309", "<float:1e309>"),
        ("-1e309", "<float:-1e309>"),
        ("1e308", 1e308),
        ("9" * 40, int("9" * 40)),
        ("-" + "9" * 40, -int("9" * 40)),
        ("9" * 41, "<int:" + "9" * 41 + ">"),
        ("[true, 1, 1.0]", [True, 1, 1.0]),
    ],
)
def test_number_hooks_hand_over_what_strict_json_cannot_carry(raw, parsed):
    assert loads_bounded(raw, max_depth=32, hooks=HOOKS) == parsed


def test_number_hooks_bound_integers_either_side_of_zero():
    hooks = number_hooks(40, lambda problem, text: problem, max_int=100)
    assert json.loads("[100, -100, 101, -101]", **hooks) == [100, -100, "int", "int"]


def test_a_hook_that_raises_refuses_the_whole_text():
    def refuse(problem, text):
        raise RefusedJSON("number", f"no {text}")

    with pytest.raises(RefusedJSON) as refused:
        loads_bounded('{"a": [NaN]}', max_depth=32, hooks=number_hooks(40, refuse))
    assert (refused.value.problem, refused.value.detail) == ("number", "no NaN")


# --- parse_json_object: the HTTP wording --------------------------------------------------


def test_an_empty_body_is_none_and_an_object_parses():
    assert parse_json_object(b"") is None
    assert parse_json_object(b" \n\t") is None
    assert parse_json_object(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


def test_a_body_at_the_depth_limit_parses_and_one_past_is_refused():
    at_limit = f'{{"k":{nested(DEFAULT_MAX_DEPTH - 1)}}}'
    assert value_depth(parse_json_object(at_limit.encode())) == DEFAULT_MAX_DEPTH
    with pytest.raises(JSONBodyError, match="^request body nests deeper than 32 levels$"):
        parse_json_object(f'{{"k":{nested(DEFAULT_MAX_DEPTH)}}}'.encode())


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'{"a": NaN}', "request body has NaN, which is not JSON"),
        (b'{"a": Infinity}', "request body has Infinity, which is not JSON"),
        (b'{"a": -Infinity}', "request body has -Infinity, which is not JSON"),
        (b'{"a": 1e999}', "request body has a number out of range: 1e999"),
        (b'{"a": ' + b"1" * 41 + b"}", "request body has an integer longer than 40 digits"),
        (b"\xfe{}", "request body is not valid UTF-8"),
        (b"[1]", "request body must be a JSON object, got an array"),
        (b"null", "request body must be a JSON object, got null"),
        (b"true", "request body must be a JSON object, got a boolean"),
        (b'"x"', "request body must be a JSON object, got a string"),
        (b"1", "request body must be a JSON object, got a number"),
    ],
)
def test_a_body_json_cannot_carry_is_refused_naming_why(raw, message):
    with pytest.raises(JSONBodyError) as refused:
        parse_json_object(raw)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "raw, where",
    [
        (rb'{"a": "\ud800"}', "a"),
        (rb'{"a": {"b": "x\udfffy"}}', "a.b"),
        (rb'{"a": [1, ["ok", "\udc00"]]}', "a[1][1]"),
        (rb'{"\ud800": 1}', "request body (a key)"),
        (rb'{"a": {"\udbff": 1}}', "a (a key)"),
        (rb'{"a": [{"\udbff": 1}]}', "a[0] (a key)"),
        (rb'{"a": "ok", "b": "\ud800", "c": "\ud801"}', "b"),  # the first in order
        # An object's keys are looked at before its values.
        (rb'{"a": "\ud800", "\udc00": 1}', "request body (a key)"),
        (b'{"' + b"k" * 50 + rb'": "\ud800"}', "k" * 37 + "..."),
    ],
)
def test_a_lone_surrogate_is_refused_naming_where(raw, where):
    with pytest.raises(JSONBodyError) as refused:
        parse_json_object(raw)
    assert str(refused.value) == f"{where}: contains a lone UTF-16 surrogate"


def test_an_escaped_surrogate_pair_is_one_character_and_fine():
    assert parse_json_object(rb'{"face": "\ud83d\ude00"}') == {"face": "\U0001f600"}


# --- json_type and describe -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value, name",
    [
        (True, "boolean"),
        (False, "boolean"),  # bool is an int subclass: it must not read "number"
        (0, "number"),
        (1.5, "number"),
        (float("nan"), "number"),
        (None, "null"),
        ("", "string"),
        ([], "array"),
        ({}, "object"),
        ((1, 2), "tuple"),  # not JSON: named by its Python type
    ],
)
def test_json_type_names_the_json_type(value, name):
    assert json_type(value) == name


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (1, "1"),
        (None, "null"),
        ("hi", "string 'hi'"),
        ("x" * 50, "string '" + "x" * 37 + "...'"),
        (10**50, "1" + "0" * 36 + "..."),
        ([1, 2], "an array"),
        ({"a": 1}, "an object"),
    ],
)
def test_describe_never_echoes_more_than_a_short_text(value, text):
    assert describe(value) == text


# --- first_unsendable: the walk HTTP bodies and the data channel share ---------------------


def test_plain_json_data_has_nothing_unsendable():
    assert first_unsendable({"a": [1, 2.5, True, None, "猫", {"b": "\U0001f600"}]}) is None
    assert first_unsendable("x") is None
    assert first_unsendable([]) is None


@pytest.mark.parametrize(
    "value, found",
    [
        ("\ud800", Unsendable("lone_surrogate", ())),
        ({"a": "\ud800"}, Unsendable("lone_surrogate", ("a",))),
        ({"\ud800": 1}, Unsendable("lone_surrogate_key", ())),
        ({"a": [0, {"\udc00": "ok"}]}, Unsendable("lone_surrogate_key", ("a", 1))),
        ([[], ["x", ["\udfff"]]], Unsendable("lone_surrogate", (1, 1, 0))),
        ({"a": "\ud800", "\udc00": 1}, Unsendable("lone_surrogate_key", ())),
        ([["\ud800"], "\udc00"], Unsendable("lone_surrogate", (0, 0))),
    ],
)
def test_lone_surrogates_are_found_in_keys_values_and_nested_lists(value, found):
    assert first_unsendable(value) == found


def test_a_placeholder_is_found_and_handed_back():
    nan = Unrepresentable("<NaN>", "finite")
    found = first_unsendable({"a": [1, nan]})
    assert found == Unsendable("placeholder", ("a", 1), nan)
    # The first in document order, whatever its kind.
    assert first_unsendable([nan, "\ud800"]).problem == "placeholder"
    assert first_unsendable(["\ud800", nan]).problem == "lone_surrogate"


def test_depth_at_the_limit_passes_and_one_past_is_found_where_it_starts():
    assert first_unsendable(json.loads(nested(8)), max_depth=8) is None
    found = first_unsendable(json.loads(nested(9)), max_depth=8)
    assert found is not None and found.problem == "depth"
    assert len(found.path) == 8  # the container that opens the ninth level
    # Without a limit, depth is not a problem.
    assert first_unsendable(json.loads(nested(500))) is None


def test_a_bad_key_is_found_before_the_depth_of_its_object():
    assert first_unsendable([{"\ud800": 1}], max_depth=1).problem == "lone_surrogate_key"


def test_the_walk_is_iterative_whatever_the_depth():
    deep: list = ["\ud800"]
    for _ in range(50_000):
        deep = [deep]
    found = first_unsendable(deep)
    assert found.problem == "lone_surrogate" and found.path == (0,) * 50_001

"""JSON request bodies parsed within bounds, every problem a `JSONBodyError` naming it.

`json.loads` alone accepts things a server must not: nesting deep enough to exhaust
the recursion limit (checked here by a linear pre-scan of the bytes, before the
parser recurses), integers of thousands of digits (CPython refuses past 4300 with a
ValueError, and slower below that), `NaN`/`Infinity` (not JSON; they break any
client that parses our echo), and `\\ud800`-style escapes that decode to lone
surrogates (a str that cannot be encoded back to UTF-8, which fails much later, far
from the request that carried it).

The data-channel codec (`channel_codec`) parses its frames with the same bounded parse
and number hooks (`loads_bounded`, `number_hooks`) under its own policy: where this
module refuses a body with a 400, it parses a placeholder to describe in a
`commandError`, and its limits differ. Both then look for what cannot go back out as
strict JSON with the same walk (`first_unsendable`), and word what it finds their own
way.

Two depths, measured two ways: `bracket_depth` reads raw text before it is parsed
(the parser must not recurse into a hostile depth), `value_depth`
(runtime/field_errors.py) walks a value already parsed.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal, TypeAlias

from reactor_serve.runtime.field_errors import Unrepresentable, clipped, has_lone_surrogate

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_INT_DIGITS",
    "JSONBodyError",
    "NumberProblem",
    "ParseProblem",
    "RefusedJSON",
    "Unsendable",
    "UnsendableProblem",
    "bracket_depth",
    "describe",
    "first_unsendable",
    "json_type",
    "loads_bounded",
    "number_hooks",
    "parse_json_object",
]

DEFAULT_MAX_DEPTH = 32
# Any id, index, seed or count fits in 40 digits (2**128 has 39).
DEFAULT_MAX_INT_DIGITS = 40

# A JSON string, closed or running to the end of the data. Possessive quantifiers keep
# this linear: a failed attempt never backtracks through a long string.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DELTA = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
# A key in a request body's error path is cut here: the path names, it does not echo.
_MAX_PATH_KEY_CHARS = 40


class JSONBodyError(ValueError):
    """A request body that is not a bounded JSON object; the message names why."""


class RefusedJSON(ValueError):
    """Text `loads_bounded` would not parse. `problem` is which check refused it;
    `detail` what it found: the depth, the parser's message, an exception's type
    name, or (for "number") the whole message a number hook gave."""

    def __init__(self, problem: ParseProblem, detail: str) -> None:
        super().__init__(f"{problem}: {detail}")
        self.problem = problem
        self.detail = detail


# What strict JSON cannot carry, as `number_hooks` reports it: "constant" (NaN,
# Infinity, -Infinity; text is the name), "float" (a literal that overflows to
# infinity), "int" (an integer literal longer than the digit limit or past the
# magnitude limit).
NumberProblem = Literal["constant", "float", "int"]
# Why `loads_bounded` refused: see RefusedJSON.
ParseProblem = Literal["depth", "encoding", "syntax", "number", "other"]


def bracket_depth(raw: str | bytes) -> int:
    """The deepest bracket nesting in the text `raw`, brackets inside strings not
    counted; for valid JSON, its nesting depth. An unclosed string runs to the end.
    (For a value already parsed, `value_depth` of runtime/field_errors.py.)

    Linear in `len(raw)` and cheap: strings are cut out by one regex pass, the rest
    reduced to its brackets, and the running depth summed in C.
    """
    if isinstance(raw, str):
        # Quotes, backslashes and brackets are ASCII, and UTF-8 never puts an ASCII
        # byte inside a multi-byte character: the bytes nest as the text does.
        # surrogatepass: a lone surrogate is the parser's (or caller's) to refuse.
        raw = raw.encode("utf-8", "surrogatepass")
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    opening = brackets.count(b"[") + brackets.count(b"{")
    if opening <= 1:
        return opening
    return max(itertools.accumulate(map(_DELTA.__getitem__, brackets)))


def parse_json_object(
    raw: bytes,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_int_digits: int = DEFAULT_MAX_INT_DIGITS,
) -> dict[str, Any] | None:
    """The JSON object in `raw`; None for an empty (or all-whitespace) body.

    Raises JSONBodyError for anything else: invalid UTF-8 or JSON, nesting deeper than
    `max_depth`, an integer longer than `max_int_digits`, a non-finite number, a lone
    surrogate (naming where), or a value that is not an object.
    """
    if not raw.strip():
        return None

    def refuse(problem: NumberProblem, text: str) -> Any:
        if problem == "int":
            message = f"request body has an integer longer than {max_int_digits} digits"
        elif problem == "float":
            message = f"request body has a number out of range: {text[:40]}"
        else:
            message = f"request body has {text}, which is not JSON"
        raise RefusedJSON("number", message)

    try:
        data = loads_bounded(
            raw, max_depth=max_depth, hooks=number_hooks(max_int_digits, refuse)
        )
    except RefusedJSON as exc:
        raise JSONBodyError(_body_problem(exc, max_depth)) from None
    if not isinstance(data, dict):
        raise JSONBodyError(
            f"request body must be a JSON object, got {_articled_json_type(data)}"
        )
    # No depth to check (the parse bounded it) and no placeholders (the hooks refused
    # them): what is left to find is a lone surrogate.
    found = first_unsendable(data)
    if found is not None:
        where = _body_path(found.path) or "request body"
        if found.problem == "lone_surrogate_key":
            where = f"{where} (a key)"
        raise JSONBodyError(f"{where}: contains a lone UTF-16 surrogate")
    return data


def loads_bounded(
    raw: str | bytes, *, max_depth: int, hooks: dict[str, Callable[[str], Any]]
) -> Any:
    """`json.loads(raw, **hooks)` for untrusted text: nesting deeper than `max_depth`
    is refused before the parser recurses, and every failure is a RefusedJSON (a
    hook refuses by raising one with problem "number").

    The caller words the refusal: the HTTP layer and the data channel say it
    differently (and raise different errors).
    """
    # Depth cannot exceed the number of opening brackets: most documents skip the scan.
    if _opening_brackets(raw) > max_depth:
        depth = bracket_depth(raw)
        if depth > max_depth:
            raise RefusedJSON("depth", str(depth))
    try:
        return json.loads(raw, **hooks)
    except RefusedJSON:
        raise
    except UnicodeDecodeError:
        raise RefusedJSON("encoding", "not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise RefusedJSON("syntax", str(exc)) from None
    except (ValueError, RecursionError) as exc:
        # Belt and braces: the pre-scan and the number hooks should make these
        # unreachable, whatever the interpreter's limits are.
        raise RefusedJSON("other", type(exc).__name__) from None


def number_hooks(
    max_int_digits: int,
    refuse: Callable[[NumberProblem, str], Any],
    *,
    max_int: int | None = None,
) -> dict[str, Callable[[str], Any]]:
    """`json.loads` keyword arguments (`parse_int`, `parse_float`, `parse_constant`)
    that hand what strict JSON cannot carry to `refuse(problem, text)`: it raises, or
    returns the value to parse in its place. An integer longer than `max_int_digits`,
    or (when given) past `max_int` either side of zero, is an "int" problem.

    Integers are measured before converting: converting a 60000-digit literal is
    quadratic, and past 4300 digits CPython raises.
    """

    def parse_int(text: str) -> Any:
        # JSON forbids leading zeros and "+": the digits are the text less a "-".
        if len(text) - text.startswith("-") > max_int_digits:
            return refuse("int", text)
        value = int(text)
        if max_int is not None and not -max_int <= value <= max_int:
            return refuse("int", text)
        return value

    def parse_float(text: str) -> Any:
        value = float(text)  # never raises for a JSON number literal; no digit limit
        # A literal is never NaN; one too large is infinite.
        if math.isinf(value):
            return refuse("float", text)
        return value

    def parse_constant(name: str) -> Any:
        # Python's json takes NaN/Infinity; they are not JSON, and a browser's
        # JSON.parse refuses our echo of them.
        return refuse("constant", name)

    return {"parse_int": parse_int, "parse_float": parse_float, "parse_constant": parse_constant}


def describe(value: Any) -> str:
    """A short, safe description of a JSON value for an error message (never the
    whole value: it may be huge)."""
    if isinstance(value, str):
        return f"string {clipped(value, 40)!r}"
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return clipped(json.dumps(value), 40)
    return _articled_json_type(value)


def _opening_brackets(raw: str | bytes) -> int:
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{")
    return raw.count(b"[") + raw.count(b"{")


def _body_problem(refused: RefusedJSON, max_depth: int) -> str:
    """The HTTP wording of what `loads_bounded` refused."""
    if refused.problem == "depth":
        return f"request body nests deeper than {max_depth} levels"
    if refused.problem == "encoding":
        return "request body is not valid UTF-8"
    if refused.problem == "syntax":
        return f"request body is not valid JSON: {refused.detail}"
    if refused.problem == "number":
        return refused.detail
    return f"request body is not acceptable JSON: {refused.detail}"


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, bare ("null", "boolean", "number", "string",
    "array", "object"); any other Python value, its type name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


_ARTICLED = {"boolean": "a boolean", "number": "a number", "string": "a string",
             "array": "an array", "object": "an object"}


def _articled_json_type(value: Any) -> str:
    """`json_type` as HTTP error text reads it: "got an array", "got null"."""
    name = json_type(value)
    return _ARTICLED.get(name, name)


# What `first_unsendable` found: a `Unrepresentable` placeholder the number hooks left,
# a string or an object key holding a lone surrogate, or a container nested past the
# depth asked for.
UnsendableProblem = Literal["placeholder", "lone_surrogate", "lone_surrogate_key", "depth"]


@dataclass(frozen=True)
class Unsendable:
    """The first part of a parsed value that cannot go back out as strict JSON in
    UTF-8. `path` is the keys and indexes down to it (for a key, to the object that
    holds the key); `placeholder` is set for a "placeholder" problem."""

    problem: UnsendableProblem
    path: tuple[str | int, ...]
    placeholder: Unrepresentable | None = None


# Where a node sits in a value being walked: None for the top, else (the parent's link,
# the key or index under the parent). Linked, not a tuple of keys, so that each step
# costs the same at any depth; `_path_of` spells out the one path a finding needs.
_PathLink: TypeAlias = "tuple[_PathLink, str | int] | None"


def first_unsendable(value: Any, max_depth: int | None = None) -> Unsendable | None:
    """The first part of the parsed `value` that is not plain JSON data, or that nests
    deeper than `max_depth` (when given); None if all of it is.

    "First" in document order, except that an object's keys are looked at before its
    values and before its depth. Iterative: `value` may nest as deep as a parser let it.
    """
    stack: list[tuple[Any, int, _PathLink]] = [(value, 0, None)]
    pop, push = stack.pop, stack.extend
    while stack:
        node, depth, link = pop()
        if isinstance(node, str):
            if has_lone_surrogate(node):
                return Unsendable("lone_surrogate", _path_of(link))
        elif isinstance(node, dict):
            for key in node:
                if isinstance(key, str) and has_lone_surrogate(key):
                    return Unsendable("lone_surrogate_key", _path_of(link))
            if max_depth is not None and depth >= max_depth:
                return Unsendable("depth", _path_of(link))
            # Last child first: the stack pops last-in first, and the first problem in
            # document order is the one to name. Zipped rather than looped over, so a
            # wide value costs little more to walk than it did to parse.
            push(zip(reversed(node.values()), repeat(depth + 1), zip(repeat(link), reversed(node))))
        elif isinstance(node, list):
            if max_depth is not None and depth >= max_depth:
                return Unsendable("depth", _path_of(link))
            indexes = range(len(node) - 1, -1, -1)
            push(zip(reversed(node), repeat(depth + 1), zip(repeat(link), indexes)))
        elif isinstance(node, Unrepresentable):
            return Unsendable("placeholder", _path_of(link), node)
    return None


def _path_of(link: _PathLink) -> tuple[str | int, ...]:
    path: list[str | int] = []
    while link is not None:
        link, key = link
        path.append(key)
    return tuple(reversed(path))


def _body_path(path: tuple[str | int, ...]) -> str:
    """`path` as a client writes it: `extra_args.prompts[2]`; "" for the top."""
    text = ""
    for key in path:
        if isinstance(key, int):
            text = f"{text}[{key}]"
        else:
            name = clipped(key, _MAX_PATH_KEY_CHARS)
            text = f"{text}.{name}" if text else name
    return text

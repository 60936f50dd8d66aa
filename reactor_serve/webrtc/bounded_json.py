"""JSON request bodies parsed within bounds, every problem a `JSONBodyError` naming it.

`json.loads` alone accepts things a server must not: nesting deep enough to exhaust
the recursion limit (checked here by a linear pre-scan of the bytes, before the
parser recurses), integers of thousands of digits (CPython refuses past 4300 with a
ValueError, and slower below that), `NaN`/`Infinity` (not JSON; they break any
client that parses our echo), and `\\ud800`-style escapes that decode to lone
surrogates (a str that cannot be encoded back to UTF-8, which fails much later, far
from the request that carried it).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_INT_DIGITS",
    "JSONBodyError",
    "describe",
    "nesting_depth",
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
_SURROGATE = re.compile("[\ud800-\udfff]")


class JSONBodyError(ValueError):
    """A request body that is not a bounded JSON object; the message names why."""


def nesting_depth(raw: bytes) -> int:
    """The deepest bracket nesting in `raw`, brackets inside strings not counted.

    Linear in `len(raw)` and cheap: strings are cut out by one regex pass, the rest
    reduced to its brackets, and the running depth summed in C.
    """
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
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise JSONBodyError(f"request body nests deeper than {max_depth} levels")

    def parse_int(text: str) -> int:
        if len(text.lstrip("-")) > max_int_digits:
            raise JSONBodyError(f"request body has an integer longer than {max_int_digits} digits")
        return int(text)

    def parse_float(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise JSONBodyError(f"request body has a number out of range: {text[:40]}")
        return value

    def parse_constant(name: str) -> Any:
        raise JSONBodyError(f"request body has {name}, which is not JSON")

    try:
        data = json.loads(
            raw, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant
        )
    except JSONBodyError:
        raise
    except UnicodeDecodeError:
        raise JSONBodyError("request body is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise JSONBodyError(f"request body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        # Belt and braces: the pre-scan should make these unreachable.
        raise JSONBodyError(f"request body is not acceptable JSON: {type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise JSONBodyError(f"request body must be a JSON object, got {_json_type(data)}")
    where = _lone_surrogate(data, "")
    if where is not None:
        raise JSONBodyError(f"{where or 'request body'}: contains a lone UTF-16 surrogate")
    return data


def describe(value: Any) -> str:
    """A short, safe description of a JSON value for an error message (never the
    whole value: it may be huge)."""
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return _json_type(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string or key with a lone surrogate, or None.

    Recursive: only called on data whose depth the pre-scan has bounded.
    """
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                return f"{path or 'request body'} (a key)"
            name = key if len(key) <= 40 else key[:37] + "..."
            found = _lone_surrogate(item, f"{path}.{name}" if path else name)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None

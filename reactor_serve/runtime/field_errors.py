"""Pydantic validation errors as sentences that name the field, for config, manifest
and request-body errors alike; and the `commandError` a client gets back, with the
values it sent described wherever JSON cannot carry them."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from pydantic import ValidationError

__all__ = [
    "LONE_SURROGATE",
    "MAX_DEPTH",
    "MAX_INT",
    "MAX_VALUE_CHARS",
    "RULE_FINITE",
    "RULE_OUT_OF_RANGE",
    "RULE_SESSION_ENDING",
    "RULE_UNICODE",
    "Unrepresentable",
    "clipped",
    "command_error",
    "describe_value",
    "field_problems",
    "has_lone_surrogate",
    "safe_text",
    "validated_section",
    "value_depth",
]


def validated_section(
    model: type[Any], config: Any, key: str, error: type[Exception], source: str = "config"
) -> Any:
    """Section `key` of a model config validated into pydantic `model`; a missing or
    empty section gives the defaults. Bad values raise `error`, naming the field."""
    section = (config.get(key) if isinstance(config, dict) else None) or {}
    if not isinstance(section, dict):
        raise error(f"{source}: field '{key}' must be a mapping")
    try:
        return model.model_validate(section)
    except ValidationError as exc:
        raise error(f"{source}: {'; '.join(field_problems(exc, prefix=key))}") from None


def field_problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One "field 'a.b': what is wrong" line per error; `prefix` is prepended to the
    field path (for a section of a larger file)."""
    lines = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        field = f"{prefix}.{path}" if prefix and path else (prefix or path or "(body)")
        lines.append(f"field '{field}': {_problem(error)}")
    return lines


def _problem(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind in ("model_type", "dict_type"):
        return f"expected a mapping, got {type(error.get('input')).__name__}"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    return f"{error['msg']}, got {error.get('input')!r}"


# ---- values a client sent, made safe to echo back ---------------------------------------
#
# A `commandError` echoes the offending value so a client can see what it sent. Some
# values cannot be echoed: JSON has no NaN or Infinity (browsers' JSON.parse rejects
# them), a string with a lone surrogate cannot be encoded as UTF-8 at all, an integer
# of thousands of digits cannot even be printed by CPython (int max_str_digits), and a
# structure nested hundreds deep would make the echo as hostile as the input. Those are
# described instead ("<NaN>", "<integer of 5000 digits>"), so that the commandError
# itself always serialises as strict JSON.

# Rules named in `errors[].rule` for values the wire could not carry faithfully.
RULE_FINITE = "finite"
RULE_OUT_OF_RANGE = "out_of_range"
RULE_UNICODE = "unicode"
# A command that came as its session was ending, and was not applied.
RULE_SESSION_ENDING = "session_ending"

# How deep an echoed value (and a command argument, see protocol/channel_codec.py) may
# nest: deeper than any real control value, and shallow enough to walk without
# recursion worries.
MAX_DEPTH = 32
# Integers beyond a 64-bit range are described, not echoed: JS cannot hold them exactly,
# and past 4300 digits CPython refuses to print them.
MAX_INT = 2**63
# An echoed value larger than this (as JSON) is summarised, so a flood of bad commands
# cannot make us send back as many bytes as it sent.
MAX_VALUE_CHARS = 1024
# A commandError's message text is cut here, for the same reason.
MAX_MESSAGE_CHARS = 2048

LONE_SURROGATE = "<string with a lone surrogate>"


class Unrepresentable:
    """Stands, in a decoded frame, for a value that cannot be carried as strict JSON:
    `description` is what gets echoed, `rule` what it breaks."""

    __slots__ = ("description", "rule")

    def __init__(self, description: str, rule: str) -> None:
        self.description = description
        self.rule = rule

    def __repr__(self) -> str:
        return self.description

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Unrepresentable)
            and (self.description, self.rule) == (other.description, other.rule)
        )

    def __hash__(self) -> int:
        return hash((self.description, self.rule))


def has_lone_surrogate(text: str) -> bool:
    """True if `text` holds a surrogate code point that is not part of a pair (which
    no UTF-8 encoder, and so no data channel, can send)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def clipped(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending "..." where it was cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def value_depth(value: Any, limit: int = 100_000) -> int:
    """How deep lists, tuples and dicts nest in the parsed `value` (a scalar is 0, `[]`
    is 1); stops counting past `limit` (a cyclic value reports limit + 1).

    A walk over values: for the nesting of raw JSON text before it is parsed, see
    `reactor_serve.protocol.bounded_json.bracket_depth`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def describe_value(value: Any) -> Any:
    """`value` as strict-JSON-safe data: itself when JSON carries it faithfully and it
    is small, else with the parts JSON cannot carry described (see above)."""
    depth = value_depth(value, limit=10_000)
    if depth > MAX_DEPTH:
        return f"<nested {depth} deep>" if depth <= 10_000 else "<nested more than 10000 deep>"
    clean = _describe(value)  # recursion bounded by MAX_DEPTH, checked just above
    try:
        size = len(json.dumps(clean, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError):  # cannot happen for _describe's output; be total anyway
        return f"<{type(value).__name__}>"
    return clean if size <= MAX_VALUE_CHARS else _summary(value)


def safe_text(text: Any, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` as a str that encodes as UTF-8 (lone surrogates escaped), cut to `limit`."""
    if not isinstance(text, str):
        text = _safe_repr(text)
    if has_lone_surrogate(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return clipped(text, limit)


def command_error(command: Any, message: Any, errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The data of a `commandError` runtime message (docs/protocol.md): `{"command",
    "message", "errors": [{"field", "rule", "value"}]}`, every part safe to send as
    strict JSON whatever the client sent."""
    return {
        "command": _label(command),
        "message": safe_text(message),
        "errors": [
            {
                "field": _label(error.get("field")),
                "rule": safe_text(error.get("rule"), 200),
                "value": describe_value(error.get("value")),
            }
            for error in errors
        ],
    }


def _label(value: Any) -> Any:
    # A command or field name: as sent, so the client can match it, unless it cannot be
    # sent or is too long to be worth echoing.
    if value is None:
        return None
    if isinstance(value, str):
        if has_lone_surrogate(value):
            return LONE_SURROGATE
        return clipped(value, MAX_VALUE_CHARS)
    return safe_text(describe_value(value), 200)


def _describe(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Unrepresentable):
        return value.description
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else f"<integer of {_digits(value)} digits>"
    if isinstance(value, float):
        if math.isnan(value):
            return "<NaN>"
        if math.isinf(value):
            return "<Infinity>" if value > 0 else "<-Infinity>"
        return value
    if isinstance(value, str):
        return LONE_SURROGATE if has_lone_surrogate(value) else value
    if isinstance(value, (list, tuple)):
        return [_describe(item) for item in value]
    if isinstance(value, dict):
        return {_key(key): _describe(item) for key, item in value.items()}
    return safe_text(_safe_repr(value), 60)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return LONE_SURROGATE if has_lone_surrogate(key) else key
    return safe_text(_describe(key) if not isinstance(key, (list, dict)) else _safe_repr(key), 60)


def _digits(value: int) -> int:
    # Without str(): past sys.get_int_max_str_digits() CPython refuses to print it.
    # From the bit length the count is one of two values; powers of ten settle which.
    value = abs(value)
    digits = max(1, int((value.bit_length() - 1) * math.log10(2)) + 1)
    while digits > 1 and value < 10 ** (digits - 1):
        digits -= 1
    while value >= 10**digits:
        digits += 1
    return digits


def _summary(value: Any) -> str:
    if isinstance(value, str):
        return f"<string of {len(value)} characters>"
    if isinstance(value, (list, tuple)):
        return f"<array of {len(value)} items>"
    if isinstance(value, dict):
        return f"<object of {len(value)} keys>"
    return "<value too large to echo>"


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a repr that raises (or an int too long to print) is not our problem
        return f"<{type(value).__name__}>"
    return clipped(text, 60)

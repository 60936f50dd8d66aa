"""The data-channel codec of docs/protocol.md: JSON text frames on `"data"` and `"control"`.

`"data"` carries envelopes `{"scope": "application" | "runtime", "data": {"type",
"data"}}`; `"control"` (newer clients) carries requests, responses and notifications.
Decoding is strict and total: anything a client can send either decodes or raises
`ProtocolError` with a reason fit for a log line, so the transport can count a bad
frame as liveness, warn, and carry on (docs/protocol.md: never crash on a frame). No other
exception escapes `decode` or `decode_control`, whatever the bytes.

A decoded frame is plain JSON data that can be sent back: a JSON object at the top,
nested at most MAX_DEPTH deep below the envelope, numbers finite and integers within
64 bits, strings valid Unicode. NaN, Infinity, numbers that overflow (`1e309`), huge
integers and lone surrogates (`"\\ud800"`) are parsed into `Unrepresentable`
placeholders rather than raising mid-parse, so that when they sit in the arguments of
an otherwise readable command, `decode` raises `BadCommand` naming the command, the
field and the rule, with the value described, and the client gets a `commandError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from reactor_serve.protocol.bounded_json import (
    NumberProblem,
    RefusedJSON,
    first_unsendable,
    json_type,
    loads_bounded,
    number_hooks,
)
from reactor_serve.runtime.field_errors import (
    LONE_SURROGATE,
    MAX_DEPTH,
    MAX_INT,
    RULE_FINITE,
    RULE_OUT_OF_RANGE,
    RULE_UNICODE,
    Unrepresentable,
    clipped,
    describe_value,
    has_lone_surrogate,
)
from reactor_serve.runtime.input_latency import MAX_COMMAND_ID_LENGTH

__all__ = [
    "MAX_DEPTH",
    "MAX_MESSAGE_BYTES",
    "MAX_PARSE_DEPTH",
    "BadCommand",
    "Inbound",
    "ProtocolError",
    "RefusedFrame",
    "Scope",
    "application",
    "brief",
    "check_arguments",
    "command",
    "control_response",
    "decode",
    "decode_control",
    "encode",
    "runtime",
]

MAX_MESSAGE_BYTES = 64 * 1024
# Frames nested deeper than this are refused before parsing: the json module recurses
# once per level (64 KiB of "[" would hit RecursionError), and past it there is nothing
# useful to describe. Well under the interpreter's recursion limit of 1000, even when
# the frame arrives deep in aiortc's call stack. Between MAX_DEPTH and this, a frame is
# parsed so that a too-deep command argument can be named in a commandError.
MAX_PARSE_DEPTH = 256
# The envelope, its "data" and the arguments object sit above an argument's own value.
_ENVELOPE_LEVELS = 3
# A control message and its "data" sit above a value.
_CONTROL_LEVELS = 2
# Digits of MAX_INT: a longer integer literal is out of range without converting it
# (converting a 60000-digit literal is quadratic, and past 4300 digits raises).
_MAX_INT_DIGITS = len(str(MAX_INT))

RULE_MAX_BYTES = f"max_bytes={MAX_MESSAGE_BYTES}"
RULE_UTF8 = "utf8"

# Integer command ids stay within what a JavaScript number holds exactly.
_MAX_SAFE_ID = 2**53 - 1

Scope = Literal["application", "runtime"]
_SCOPES: frozenset[str] = frozenset(get_args(Scope))
_CONTROL_TYPES = ("request", "notification")


class ProtocolError(ValueError):
    """A frame that does not follow docs/protocol.md; the message says why."""


class BadCommand(ProtocolError):
    """An application envelope naming command `command` whose arguments cannot be
    accepted as sent; `errors` are `commandError` entries `{"field", "rule", "value"}`
    with every value already safe to send as strict JSON."""

    def __init__(
        self, command: str, message: str, errors: list[dict[str, Any]],
        command_id: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.command = command
        self.errors = errors
        # The envelope's "id", when it was a valid one: the error names it.
        self.command_id = command_id


class RefusedFrame(ProtocolError):
    """A frame refused whole, before (or instead of) parsing it: too big, not UTF-8,
    nested past MAX_PARSE_DEPTH, or naming its type with a lone surrogate. `rule` names
    the limit it broke; `salvage_command` finds which command it was, if it was one."""

    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class Inbound:
    """One decoded `"data"` frame: a command (application) or a runtime message."""

    scope: Scope
    type: str
    data: dict[str, Any]
    # A command's id (ours): the client's name for it, echoed in `inputFrame` and
    # `commandError`; None when it sent none.
    id: str | int | None = None


def decode(raw: str | bytes) -> Inbound:
    """Decode one `"data"` channel frame; raises ProtocolError naming the problem."""
    envelope = _load_object(raw, "envelope")
    scope = envelope.get("scope")
    if scope is None:
        raise ProtocolError('envelope has no "scope"')
    if not isinstance(scope, str) or scope not in _SCOPES:
        raise ProtocolError(
            f'unknown scope {_short(scope)}; expected "application" or "runtime"'
        )
    if "data" not in envelope:
        raise ProtocolError('envelope has no "data" (it holds the message type)')
    inner = envelope["data"]
    if not isinstance(inner, dict):
        raise ProtocolError(f'envelope "data" must be an object, got {_type_or_placeholder(inner)}')
    type_ = inner.get("type")
    if type_ is None:
        raise ProtocolError('message has no "type"')
    if not isinstance(type_, str):
        raise ProtocolError(f'message "type" must be a string, got {_type_or_placeholder(type_)}')
    if not type_:
        raise ProtocolError('message "type" is empty')
    if has_lone_surrogate(type_):
        raise RefusedFrame(
            'message "type" is not valid Unicode (it holds a lone surrogate)', RULE_UNICODE
        )
    where = f"{scope} {_short(type_)}"
    command_id = None
    if scope == "application":
        command_id = _command_id(envelope.get("id"), type_, where)
        try:
            _check_command(envelope, inner, type_, where)
        except BadCommand as exc:
            exc.command_id = command_id
            raise
    else:
        problem = _first_problem(envelope, MAX_DEPTH + _ENVELOPE_LEVELS)
        if problem is not None:
            raise ProtocolError(f"{where}: {problem[1]} breaks {problem[0]}")
    return Inbound(scope=scope, type=type_, data=_payload(inner, where), id=command_id)


# What `salvage_command` looks for in a frame it cannot parse. Bounded repeats: a
# failed match never backtracks far, so the search stays linear in the frame.
_SALVAGE_SCOPE = re.compile(r'"scope"\s{0,16}:\s{0,16}"application"')
_SALVAGE_TYPE = re.compile(r'"type"\s{0,16}:\s{0,16}("(?:[^"\\]|\\.){1,128}")')
_SALVAGE_ID = re.compile(r'"id"\s{0,16}:\s{0,16}("(?:[^"\\]|\\.){1,64}"|-?\d{1,16}\b)')


def salvage_command(raw: Any) -> tuple[str | None, str | int | None]:
    """(command name, command id) of a frame refused whole (`RefusedFrame`), found by
    searching its text, so that its commandError can name them; (None, None) where
    the frame is not visibly a command. Best effort: the frame was never parsed, so a
    name found is what the frame says at the first "type" key, at whatever depth."""
    if not isinstance(raw, str):
        return None, None
    text = raw[:MAX_MESSAGE_BYTES]
    if _SALVAGE_SCOPE.search(text) is None:
        return None, None
    found = _SALVAGE_TYPE.search(text)
    if found is None:
        return None, None
    try:
        name = json.loads(found.group(1))
    except ValueError:
        return None, None
    command_id: str | int | None = None
    found_id = _SALVAGE_ID.search(text)
    if found_id is not None:
        try:
            command_id = _command_id(json.loads(found_id.group(1)), name, "")
        except ValueError:  # not valid JSON, or an id the protocol refuses
            command_id = None
    return name, command_id


def _command_id(value: Any, name: str, where: str) -> str | int | None:
    """A command envelope's optional "id": a short string or a safe integer."""
    if value is None:
        return None
    if isinstance(value, str):
        if not 1 <= len(value) <= MAX_COMMAND_ID_LENGTH:
            rule = f"length 1..{MAX_COMMAND_ID_LENGTH}"
        elif has_lone_surrogate(value):
            rule = RULE_UNICODE
        else:
            return value
    elif isinstance(value, int) and not isinstance(value, bool):
        if abs(value) <= _MAX_SAFE_ID:
            return value
        rule = f"integer within ±{_MAX_SAFE_ID}"
    else:
        rule = "type=string|integer"
    raise BadCommand(
        name,
        f'{where}: "id" breaks {rule}',
        [{"field": "id", "rule": rule, "value": describe_value(value)}],
    )


def encode(scope: Scope, type_: str, data: Any) -> str:
    """One `"data"` channel frame. Raises ProtocolError for an unknown scope, a
    non-string type or data that is not JSON (NaN included: browsers' JSON.parse
    rejects it, so it must fail here, where the sender can see it)."""
    return _dumps(_envelope(scope, type_, data))


def command(name: str, data: dict[str, Any], command_id: str | int | None = None) -> str:
    """A client's command frame, with its id (ours) when it has one."""
    envelope = _envelope("application", name, data)
    if command_id is not None:
        envelope["id"] = command_id
    return _dumps(envelope)


def _envelope(scope: Any, type_: Any, data: Any) -> dict[str, Any]:
    if scope not in _SCOPES:
        raise ProtocolError(f'unknown scope {scope!r}; expected "application" or "runtime"')
    if not isinstance(type_, str) or not type_:
        raise ProtocolError(f"message type must be a non-empty string, got {type_!r}")
    return {"scope": scope, "data": {"type": type_, "data": data}}


def application(payload: dict[str, Any]) -> str:
    """An application-scope frame for a model message.

    `payload` is `{"type", "data"}` as `message_payload` builds it, or the dict a model
    passed to `send()`, which docs/protocol.md says goes out as given: so it is not
    reshaped, only checked to be a JSON object.
    """
    if not isinstance(payload, dict):
        raise ProtocolError(f"application payload must be a dict, got {type(payload).__name__}")
    return _dumps({"scope": "application", "data": payload})


def runtime(type_: str, data: dict[str, Any] | None = None) -> str:
    """A runtime-scope frame (`modelSchema`, `commandError`, `sessionEnded`, ...)."""
    return encode("runtime", type_, {} if data is None else data)


def decode_control(raw: str | bytes) -> dict[str, Any]:
    """Decode one `"control"` channel frame.

    Returns the message with `data` filled (`{}` when absent). Requests need a string
    `method` and a `request_id` (string or integer, echoed back verbatim);
    notifications need a string `event`. Raises ProtocolError otherwise.
    """
    message = _load_object(raw, "control message")
    problem = _first_problem(message, MAX_DEPTH + _CONTROL_LEVELS)
    if problem is not None:
        # Nothing on "control" is a command: such a message is dropped, not answered.
        raise ProtocolError(f"control message: {problem[1]} breaks {problem[0]}")
    kind = message.get("type")
    if kind not in _CONTROL_TYPES:
        raise ProtocolError(
            f'control message "type" must be "request" or "notification", got {_short(kind)}'
        )
    if kind == "request":
        method = message.get("method")
        if not isinstance(method, str) or not method:
            raise ProtocolError(f'control request needs a string "method", got {_short(method)}')
        request_id = message.get("request_id")
        # bool is an int subclass, but no client uses true as an id.
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
            raise ProtocolError(
                f'control request needs a "request_id" (string or integer), '
                f"got {_short(request_id)}"
            )
        where = f"control request {method!r}"
    else:
        name = message.get("event")
        if not isinstance(name, str) or not name:
            raise ProtocolError(
                f'control notification needs a string "event", got {_short(name)}'
            )
        where = f"control notification {name!r}"
    return {**message, "data": _payload(message, where)}


def control_response(
    request: dict[str, Any],
    data: dict[str, Any] | None = None,
    error: tuple[str, str] | None = None,
) -> str:
    """The `"control"` channel answer to `request` (as `decode_control` returned it).

    `data` is always present (`{}` by default) so a client reading it unconditionally
    does not trip over an error response; `error` adds `{"code", "message"}`.
    """
    response: dict[str, Any] = {
        "type": "response",
        "method": request.get("method"),
        "request_id": request.get("request_id"),
        "data": {} if data is None else data,
    }
    if error is not None:
        code, message = error
        response["error"] = {"code": str(code), "message": str(message)}
    return _dumps(response)


def _load_object(raw: Any, what: str) -> dict[str, Any]:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        # aiortc hands binary frames over as bytes: the protobuf "v1" protocol.
        raise ProtocolError(f"binary frame ({len(raw)} bytes); only JSON text frames are spoken")
    if not isinstance(raw, str):
        raise ProtocolError(f"expected a text frame, got {type(raw).__name__}")
    # A str has at least one UTF-8 byte per character: reject by character count
    # before encoding a huge frame.
    if len(raw) > MAX_MESSAGE_BYTES:
        raise RefusedFrame(
            f"frame of {len(raw)}+ bytes exceeds {MAX_MESSAGE_BYTES} bytes", RULE_MAX_BYTES
        )
    if not raw.isascii():
        try:
            size = len(raw.encode("utf-8"))
        except UnicodeEncodeError:
            # Lone surrogates in the frame itself: bytes that were not UTF-8 (see the
            # transport guard in rtc/sctp_guard.py), not a JSON "\ud800" escape.
            raise RefusedFrame("frame is not valid UTF-8 text", RULE_UTF8) from None
        if size > MAX_MESSAGE_BYTES:
            raise RefusedFrame(
                f"frame of {size} bytes exceeds {MAX_MESSAGE_BYTES} bytes", RULE_MAX_BYTES
            )
    try:
        value = loads_bounded(raw, max_depth=MAX_PARSE_DEPTH, hooks=_NUMBER_HOOKS)
    except RefusedJSON as exc:
        # The contract is "ProtocolError and nothing else", whatever the bytes.
        if exc.problem == "depth":
            # The rule a value breaks at MAX_DEPTH: the client hears the same rule for
            # 40 levels as for 10,000, only the depth in the message differs.
            raise RefusedFrame(
                f"invalid JSON: nested {exc.detail} deep, more than {MAX_PARSE_DEPTH} "
                f"(values may nest at most {MAX_DEPTH} deep)",
                f"max_depth={MAX_DEPTH}",
            ) from None
        raise ProtocolError(f"invalid JSON: {exc.detail}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {_type_or_placeholder(value)}")
    return value


# The json module's hooks (shared with the HTTP bodies' parser, which refuses where we
# do not) turn what strict JSON cannot carry into placeholders, so that parsing never
# raises on a number and the value can be named and described later.

def _unrepresentable(problem: NumberProblem, text: str) -> Unrepresentable:
    if problem == "constant":
        # NaN/Infinity: a browser never sends them, and letting them through would put
        # non-finite numbers past the range checks.
        return Unrepresentable(f"<{text}>", RULE_FINITE)
    if problem == "float":
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
        return Unrepresentable(f"<number too large: {shown}>", RULE_OUT_OF_RANGE)
    digits = len(text) - text.startswith("-")
    return Unrepresentable(f"<integer of {digits} digits>", RULE_OUT_OF_RANGE)


_NUMBER_HOOKS = number_hooks(_MAX_INT_DIGITS, _unrepresentable, max_int=MAX_INT)


def _first_problem(value: Any, max_depth: int) -> tuple[str, str] | None:
    """(rule, description) of the first part of `value` that is not plain JSON data
    (a placeholder, a string or key with a lone surrogate) or that nests deeper than
    `max_depth`; None if all is well. A depth is named by the rule a value breaks
    (MAX_DEPTH), whatever levels of envelope `max_depth` allows for above it."""
    found = first_unsendable(value, max_depth)
    if found is None:
        return None
    if found.placeholder is not None:
        return found.placeholder.rule, found.placeholder.description
    if found.problem == "lone_surrogate":
        return RULE_UNICODE, LONE_SURROGATE
    if found.problem == "lone_surrogate_key":
        return RULE_UNICODE, f"a key {LONE_SURROGATE}"
    return f"max_depth={MAX_DEPTH}", f"a value nested more than {MAX_DEPTH} deep"


def _check_command(envelope: dict[str, Any], inner: dict[str, Any], name: str, where: str) -> None:
    """Raise BadCommand if command `name`'s arguments (or the rest of its envelope) hold
    anything a decoded frame may not: so its sender hears which field broke which rule."""
    errors: list[dict[str, Any]] = []
    # The envelope around the arguments: extra keys are ignored, but not if hostile.
    rest = {**envelope, "data": {k: v for k, v in inner.items() if k != "data"}}
    problem = _first_problem(rest, _ENVELOPE_LEVELS)
    if problem is not None:
        errors.append({"field": None, "rule": problem[0], "value": problem[1]})
    _raise_for(name, where, errors + _argument_problems(inner.get("data")))


def check_arguments(name: str, args: Any, where: str) -> None:
    """Raise BadCommand if command `name`'s decoded arguments hold anything a command
    may not (a placeholder, a lone surrogate, nesting past MAX_DEPTH, not an object):
    the one rule for every wire a command arrives on."""
    _raise_for(name, where, _argument_problems(args))


def _argument_problems(args: Any) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    if args is not None and not isinstance(args, dict):
        errors.append({"field": None, "rule": "type=object", "value": describe_value(args),
                       "text": f'"data" must be an object, got {_type_or_placeholder(args)}'})
    else:
        for key, value in (args or {}).items():
            if has_lone_surrogate(key):
                rule: str | None = RULE_UNICODE
            else:
                found = _first_problem(value, MAX_DEPTH)
                rule = found[0] if found is not None else None
            if rule is not None:
                errors.append({"field": describe_value(key), "rule": rule,
                               "value": describe_value(value)})
    return errors


def _raise_for(name: str, where: str, errors: list[dict[str, Any]]) -> None:
    if errors:
        text = "; ".join(
            e.pop("text", None)
            or f"{e['field']}={json.dumps(e['value'], ensure_ascii=True)[:60]} breaks {e['rule']}"
            for e in errors
        )
        raise BadCommand(name, f"{where}: {text}", errors)


def _payload(container: dict[str, Any], where: str) -> dict[str, Any]:
    # JS omits undefined members, so a call without arguments arrives with no "data";
    # an explicit null is read the same way.
    data = container.get("data")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProtocolError(f'{where}: "data" must be an object, got {_type_or_placeholder(data)}')
    return data


def _dumps(value: Any) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"message is not JSON-encodable: {exc}") from None
    if has_lone_surrogate(text):
        # The data channel sends UTF-8, which cannot hold a lone surrogate (aiortc's
        # send would raise): escape it as JSON "\udXXX", which every parser reads.
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return text


def _type_or_placeholder(value: Any) -> str:
    # Bare names ("got array") as this codec's messages always read, unlike the HTTP
    # bodies' "got an array"; a placeholder is described, not typed.
    if isinstance(value, Unrepresentable):
        return value.description
    return json_type(value)


def brief(value: Any) -> str:
    """`value` in at most 40 ASCII characters, for log lines and error text: ASCII so
    that a lone surrogate cannot break a log handler; placeholders show their
    description."""
    if value is None:
        return "nothing"
    if isinstance(value, (str, int, float, bool)):
        text = json.dumps(value, ensure_ascii=True)
    else:
        text = json.dumps(describe_value(value), ensure_ascii=True)
    return clipped(text, 40)


_short = brief

"""The data-channel codec of PROTOCOL.md: JSON text frames on `"data"` and `"control"`.

`"data"` carries envelopes `{"scope": "application" | "runtime", "data": {"type",
"data"}}`; `"control"` (newer clients) carries requests, responses and notifications.
Decoding is strict and total: anything a client can send either decodes or raises
`ProtocolError` with a reason fit for a log line, so the transport can count a bad
frame as liveness, warn, and carry on (PROTOCOL.md: never crash on a frame).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Inbound",
    "ProtocolError",
    "Scope",
    "application",
    "control_response",
    "decode",
    "decode_control",
    "encode",
    "runtime",
]

MAX_MESSAGE_BYTES = 64 * 1024

Scope = Literal["application", "runtime"]
_SCOPES: frozenset[str] = frozenset(get_args(Scope))
_CONTROL_TYPES = ("request", "notification")


class ProtocolError(ValueError):
    """A frame that does not follow PROTOCOL.md; the message says why."""


@dataclass(frozen=True)
class Inbound:
    """One decoded `"data"` frame: a command (application) or a runtime message."""

    scope: Scope
    type: str
    data: dict[str, Any]


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
        raise ProtocolError(f'envelope "data" must be an object, got {_json_type(inner)}')
    type_ = inner.get("type")
    if type_ is None:
        raise ProtocolError('message has no "type"')
    if not isinstance(type_, str):
        raise ProtocolError(f'message "type" must be a string, got {_json_type(type_)}')
    if not type_:
        raise ProtocolError('message "type" is empty')
    return Inbound(scope=scope, type=type_, data=_payload(inner, f"{scope} {type_!r}"))


def encode(scope: Scope, type_: str, data: Any) -> str:
    """One `"data"` channel frame. Raises ProtocolError for an unknown scope, a
    non-string type or data that is not JSON (NaN included: browsers' JSON.parse
    rejects it, so it must fail here, where the sender can see it)."""
    if scope not in _SCOPES:
        raise ProtocolError(f'unknown scope {scope!r}; expected "application" or "runtime"')
    if not isinstance(type_, str) or not type_:
        raise ProtocolError(f"message type must be a non-empty string, got {type_!r}")
    return _dumps({"scope": scope, "data": {"type": type_, "data": data}})


def application(payload: dict[str, Any]) -> str:
    """An application-scope frame for a model message.

    `payload` is `{"type", "data"}` as `message_payload` builds it, or the dict a model
    passed to `send()`, which PROTOCOL.md says goes out as given: so it is not
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
    # A str has at most 4 UTF-8 bytes per character: skip the encode when it cannot
    # matter, and reject by character count before encoding a huge frame.
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"frame of {len(raw)}+ bytes exceeds {MAX_MESSAGE_BYTES} bytes")
    if len(raw) * 4 > MAX_MESSAGE_BYTES:
        size = len(raw.encode("utf-8", errors="surrogatepass"))
        if size > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"frame of {size} bytes exceeds {MAX_MESSAGE_BYTES} bytes")
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ProtocolError:
        raise
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"invalid JSON: {exc}") from None
    except RecursionError:
        # 64 KiB of "[" nests deeper than the json module's recursion can follow.
        raise ProtocolError("invalid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {_json_type(value)}")
    return value


def _reject_constant(name: str) -> Any:
    # Python's json takes NaN/Infinity; a browser never sends them, and letting them
    # through would put non-finite numbers past the range checks.
    raise ProtocolError(f"invalid JSON: {name} is not a JSON value")


def _payload(container: dict[str, Any], where: str) -> dict[str, Any]:
    # JS omits undefined members, so a call without arguments arrives with no "data";
    # an explicit null is read the same way.
    data = container.get("data")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProtocolError(f'{where}: "data" must be an object, got {_json_type(data)}')
    return data


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"message is not JSON-encodable: {exc}") from None


def _json_type(value: Any) -> str:
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


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr) if value is not None else "nothing"
    return text if len(text) <= 40 else text[:37] + "..."

"""Messages from the model to the client.

Subclass `ModelMessage` as a dataclass; the client receives it with `type` set to the
class name in snake_case (`CurrentPrompt` -> `current_prompt`) and `data` its fields.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelMessage", "message_payload", "snake_case"]


@dataclass
class ModelMessage:
    """Base class of structured messages a model sends to its client."""


_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(name: str) -> str:
    """`CurrentPrompt` -> `current_prompt`, `HTTPStatus` -> `http_status`."""
    return _CAMEL_BOUNDARY.sub("_", name).lower()


def message_payload(message: ModelMessage | dict[str, Any]) -> dict[str, Any]:
    """The `data` of an application-scope envelope for `message`.

    A `ModelMessage` becomes `{"type": snake_case(class), "data": fields}`; a dict is
    sent as given. Raises TypeError naming the problem when it is not JSON-encodable.
    """
    if isinstance(message, ModelMessage):
        if not dataclasses.is_dataclass(message):
            raise TypeError(f"{type(message).__name__} must be decorated with @dataclass")
        payload = {
            "type": snake_case(type(message).__name__),
            "data": dataclasses.asdict(message),
        }
    elif isinstance(message, dict):
        payload = message
    else:
        raise TypeError(
            f"send() takes a ModelMessage dataclass or a dict, got {type(message).__name__}"
        )
    try:
        # Round-trip so numpy scalars and tuples become plain JSON values, and so a
        # bad payload fails here, in the model's code, rather than in the transport.
        return json.loads(json.dumps(payload, default=_json_default, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"message is not JSON-encodable: {exc}") from None


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-encodable")

"""The documents docs/protocol.md describes a model with, built from its `ModelSpec` alone.

- `capabilities`: the `modelCapabilities` object (tracks, commands with a flat schema
  per parameter, emission fps) that the JS client validates and the React controller
  renders sliders, selects and checkboxes from.
- `model_schema`: the `modelSchema` OpenAPI 3.1 document: one operation per command,
  one webhook per model message.
- `session_descriptor`: the `start_session` response.

No model instance is needed: the ingress answers these without a replica slot.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import math
import sys
import types
import typing
from typing import Any, Literal, Sequence

from reactor_serve.interface.files import UploadedFile
from reactor_serve.interface.messages import ModelMessage, snake_case
from reactor_serve.interface.state import FieldSpec, annotation_contains
from reactor_serve.runtime.loading.model_spec import CommandSpec, ModelSpec

__all__ = [
    "PROTOCOL_VERSION",
    "UPLOAD_REFERENCE",
    "capabilities",
    "command_param_schema",
    "declares_files",
    "message_classes",
    "model_schema",
    "session_descriptor",
    "unwrap_annotation",
]

PROTOCOL_VERSION = "1.0"

# How a client names a file it uploaded to its session, wherever a command takes an
# `UploadedFile`: the OpenAPI component every such parameter refers to. The name and
# format are the official runtime's, so its clients recognise a file parameter.
UPLOAD_REFERENCE = "ReactorUploadReference"
_UPLOAD_REFERENCE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "format": "reactor-upload-reference",
    "description": "A file uploaded to this session: reserve it with POST "
                   "{base}/sessions/{session_id}/uploads, PUT its bytes to the URL that "
                   "returns, then name its upload_id here.",
    "properties": {
        "upload_id": {"type": "string", "format": "uuid"},
        "name": {"type": "string"},
        "mime_type": {"type": "string"},
        "size": {"type": "integer"},
    },
    "required": ["upload_id"],
}

_ARRAY_BASES: tuple[type, ...] = (list, tuple, set, frozenset, collections.abc.Sequence,
                                  collections.abc.Set)
_OBJECT_BASES: tuple[type, ...] = (dict, collections.abc.Mapping)


# --- capabilities ---------------------------------------------------------------------


def command_param_schema(spec: FieldSpec) -> dict[str, Any]:
    """The flat per-parameter schema of `modelCapabilities`.

    Flat on purpose: the React controller reads `type`, `minimum`, `maximum` and
    `enum` directly, so `Optional[X]` is X's type plus `"nullable": true` rather than
    an `anyOf`. `type` is omitted when the annotation says nothing JSON can express
    (Any, unknown classes, unions of unrelated types).
    """
    base, nullable = _analyse(spec.annotation, with_items=False)
    out: dict[str, Any] = dict(base)
    if nullable and out:
        out["nullable"] = True
    out.update(_bounds(spec))
    out.update(_lengths(spec, out.get("type"), json_schema=False))
    _apply_choices(out, spec, nullable)
    _common(out, spec)
    if spec.required:
        out["required"] = True
    return out


def capabilities(spec: ModelSpec) -> dict[str, Any]:
    """The capabilities object of the session descriptor and of `modelCapabilities`."""
    return {
        "protocol_version": PROTOCOL_VERSION,
        "tracks": _tracks(spec, {"out": "recvonly", "in": "sendonly"}),
        "commands": [
            {
                "name": command.name,
                # The JS client rejects the descriptor unless this is a string.
                "description": command.description or "",
                "schema": {p.name: command_param_schema(p) for p in command.params},
            }
            for command in spec.commands.values()
        ],
        "emission_fps": float(spec.fps),
    }


# --- OpenAPI --------------------------------------------------------------------------


def model_schema(
    spec: ModelSpec, messages: Sequence[type] | None = None
) -> dict[str, Any]:
    """The `modelSchema` OpenAPI 3.1 document.

    `messages` are the ModelMessage dataclasses to list as webhooks; by default the
    ones defined in the model class's module (a model sends messages from anywhere in
    its code, so the module is the best place a class alone can point at).
    """
    found = message_classes(spec.cls) if messages is None else list(messages)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": spec.name, "version": "1.0"},
        "x-reactor": {"tracks": _tracks(spec, {"out": "out", "in": "in"}), "fps": float(spec.fps)},
        "paths": {
            f"/events/{command.name}": {"post": _operation(command)}
            for command in spec.commands.values()
        },
        "webhooks": _webhooks(found),
    }
    if any(declares_files(p.annotation) for c in spec.commands.values() for p in c.params):
        document["components"] = {"schemas": {UPLOAD_REFERENCE: dict(_UPLOAD_REFERENCE_SCHEMA)}}
    return document


def declares_files(annotation: Any) -> bool:
    """Whether a value of this annotation may hold an `UploadedFile` (also inside
    `Optional`, a list, a dict...)."""
    return annotation_contains(annotation, lambda a: a is UploadedFile)


def message_classes(model_cls: type) -> list[type]:
    """The ModelMessage subclasses defined in `model_cls`'s module, in definition order."""
    module = sys.modules.get(model_cls.__module__)
    if module is None:
        return []
    found: list[type] = []
    for obj in vars(module).values():
        if (
            isinstance(obj, type)
            and issubclass(obj, ModelMessage)
            and obj is not ModelMessage
            and obj.__module__ == model_cls.__module__
            and obj not in found  # the same class bound under two names
        ):
            found.append(obj)
    return found


def _operation(command: CommandSpec) -> dict[str, Any]:
    if command.kind == "setter":
        summary = f"Set {command.target}"
    else:
        # A summary is one line; the full text stays in the description.
        summary = (command.description or "").strip().split("\n", 1)[0] or command.name
    return {
        "operationId": command.name,
        "summary": summary,
        "description": command.description or "",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": _object_schema(
                        command.params, [p.name for p in command.params if p.required]
                    )
                }
            },
        },
        "responses": {"202": {"description": "Accepted"}},
    }


def _webhooks(messages: Sequence[type]) -> dict[str, Any]:
    hooks: dict[str, Any] = {}
    for cls in messages:
        if not (isinstance(cls, type) and issubclass(cls, ModelMessage)):
            raise TypeError(f"messages must be ModelMessage subclasses, got {cls!r}")
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__qualname__} must be decorated with @dataclass")
        fields = _message_fields(cls)
        doc = _own_doc(cls)
        operation: dict[str, Any] = {
            "summary": cls.__name__,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        # message_payload sends dataclasses.asdict(): every field is
                        # always present, defaults or not.
                        "schema": _object_schema(fields, [f.name for f in fields])
                    }
                },
            },
            "responses": {"200": {"description": "Received"}},
        }
        if doc:
            operation["description"] = doc
        hooks[snake_case(cls.__name__)] = {"post": operation}
    return hooks


def _message_fields(cls: type) -> list[FieldSpec]:
    module = sys.modules.get(cls.__module__)
    globalns = dict(vars(module)) if module else {}
    try:
        hints = typing.get_type_hints(cls, globalns=globalns, include_extras=True)
    except Exception:
        hints = {}
    return [
        FieldSpec.from_default(f.name, hints.get(f.name, Any), f)
        for f in dataclasses.fields(cls)
    ]


def _own_doc(cls: type) -> str:
    # dataclass() writes a signature docstring when there is none; that is not a
    # description worth showing.
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def _object_schema(params: Sequence[FieldSpec], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {p.name: _property_schema(p) for p in params},
        "required": required,
        "additionalProperties": False,
    }


def _property_schema(spec: FieldSpec) -> dict[str, Any]:
    """A JSON Schema 2020-12 property: `Optional` as `anyOf` with null."""
    base, nullable = _analyse(spec.annotation, with_items=True)
    value: dict[str, Any] = dict(base)
    value.update(_bounds(spec))
    value.update(_lengths(spec, value.get("type"), json_schema=True))
    _apply_choices(value, spec, nullable)
    out: dict[str, Any] = {"title": spec.name.replace("_", " ").strip().title() or spec.name}
    if nullable and value:
        out["anyOf"] = [value, {"type": "null"}]
    else:
        # An unconstrained value already admits null.
        out.update(value)
    _common(out, spec)
    return out


# --- session descriptor ---------------------------------------------------------------


def session_descriptor(
    spec: ModelSpec,
    session_id: str,
    state: str,
    *,
    server_version: str,
    end_reason: str | None = None,
    end_message: str | None = None,
    generation: str = "streamed",
) -> dict[str, Any]:
    """The `start_session` response (also `GET {base}/session`).

    The JS client fails `connect()` unless the fields it checks have the right JSON
    types, so a non-string here is a caller bug: raise rather than send it. An ended
    session's descriptor also says why it ended (`end_reason`, `end_message`: the
    `sessionEnded` reason and message, null when unknown), so a client that missed
    the data-channel message can still tell.
    """
    for label, value in (
        ("session_id", session_id),
        ("state", state),
        ("server_version", server_version),
    ):
        if not isinstance(value, str):
            raise TypeError(f"{label} must be a str, got {type(value).__name__}")
    for label, value in (("end_reason", end_reason), ("end_message", end_message)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{label} must be a str or None, got {type(value).__name__}")
    descriptor: dict[str, Any] = {
        "session_id": session_id,
        "state": state,
        "cluster": "local",
        "server_info": {"server_version": server_version},
        "selected_transport": {"protocol": "webrtc", "version": "1.0"},
        "model": {"name": spec.name},
        "capabilities": capabilities(spec),
        "schema": model_schema(spec),
        # The official SDK checks this against the generation it asked for.
        "generation": generation,
        "step_results": {"enabled": generation == "stepped"},
    }
    if state == "ended":
        descriptor["end_reason"] = end_reason
        descriptor["end_message"] = end_message
    return descriptor


# --- helpers --------------------------------------------------------------------------


def _tracks(spec: ModelSpec, directions: dict[str, str]) -> list[dict[str, str]]:
    return [
        {"name": t.name, "kind": t.kind, "direction": directions["out"]} for t in spec.outputs
    ] + [{"name": t.name, "kind": t.kind, "direction": directions["in"]} for t in spec.inputs]


def _analyse(annotation: Any, *, with_items: bool) -> tuple[dict[str, Any], bool]:
    """(schema of the non-null part, whether null is allowed) for an annotation."""
    annotation = unwrap_annotation(annotation)
    origin = typing.get_origin(annotation)
    if annotation is None or annotation is type(None):
        return {}, True
    if origin is typing.Union or origin is types.UnionType:
        return _analyse_union(typing.get_args(annotation), with_items=with_items)
    if origin is Literal:
        values = [_json_value(v)[1] for v in typing.get_args(annotation)]
        nullable = None in values
        values = [v for v in values if v is not None]
        return _enum_schema(values), nullable
    base = origin or annotation
    if not isinstance(base, type):
        return {}, False  # Any, TypeVars, forward references we could not resolve
    if base is UploadedFile:
        # The OpenAPI document refers to its component; the flat capabilities say what
        # the value is (an object, named by its format).
        if with_items:
            return {"$ref": f"#/components/schemas/{UPLOAD_REFERENCE}"}, False
        return {"type": "object", "format": "reactor-upload-reference"}, False
    if issubclass(base, enum.Enum):
        return _enum_schema([_json_value(m.value)[1] for m in base]), False
    if issubclass(base, bool):
        return {"type": "boolean"}, False
    if issubclass(base, int):
        return {"type": "integer"}, False
    if issubclass(base, float):
        return {"type": "number"}, False
    if issubclass(base, (str, bytes)):
        return {"type": "string"}, False
    if issubclass(base, _OBJECT_BASES) or dataclasses.is_dataclass(base):
        return {"type": "object"}, False
    if issubclass(base, _ARRAY_BASES):
        out: dict[str, Any] = {"type": "array"}
        if with_items:
            items = _items_schema(annotation, base)
            if items:
                out["items"] = items
        return out, False
    if hasattr(base, "model_json_schema"):  # a pydantic model
        return {"type": "object"}, False
    return {}, False


def unwrap_annotation(annotation: Any) -> Any:
    """The type on the wire: without `Annotated[...]` (its metadata is already in the
    FieldSpec's rules), a NewType as its supertype."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif hasattr(annotation, "__supertype__"):
            annotation = annotation.__supertype__
        else:
            return annotation


def _analyse_union(args: Sequence[Any], *, with_items: bool) -> tuple[dict[str, Any], bool]:
    parts = [_analyse(a, with_items=with_items) for a in args if a is not type(None)]
    nullable = len(parts) < len(args) or any(n for _, n in parts)
    schemas = [s for s, _ in parts]
    if len(schemas) == 1:
        return schemas[0], nullable
    kinds = {s.get("type") for s in schemas}
    if not schemas or None in kinds:
        return {}, nullable
    if kinds == {"integer", "number"}:
        return {"type": "number"}, nullable
    if len(kinds) == 1:
        merged: dict[str, Any] = {"type": kinds.pop()}
        if all("enum" in s for s in schemas):
            merged["enum"] = _dedupe(v for s in schemas for v in s["enum"])
        return merged, nullable
    return {}, nullable


def _items_schema(annotation: Any, base: type) -> dict[str, Any]:
    args = typing.get_args(annotation)
    if issubclass(base, tuple):
        # Only the homogeneous form tuple[X, ...] has one item schema.
        if len(args) != 2 or args[1] is not Ellipsis:
            return {}
        args = args[:1]
    if len(args) != 1:
        return {}
    item, nullable = _analyse(args[0], with_items=True)
    if nullable and item:
        return {"anyOf": [item, {"type": "null"}]}
    return item


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kind = _type_of_values(values)
    if kind:
        out["type"] = kind
    out["enum"] = values
    return out


def _type_of_values(values: Sequence[Any]) -> str | None:
    kinds = set()
    for v in values:
        if isinstance(v, bool):
            kinds.add("boolean")
        elif isinstance(v, int):
            kinds.add("integer")
        elif isinstance(v, float):
            kinds.add("number")
        elif isinstance(v, str):
            kinds.add("string")
        elif v is not None:
            return None
    if kinds == {"integer", "number"}:
        return "number"
    return kinds.pop() if len(kinds) == 1 else None


def _bounds(spec: FieldSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr, key in (
        ("ge", "minimum"),
        ("le", "maximum"),
        ("gt", "exclusiveMinimum"),
        ("lt", "exclusiveMaximum"),
    ):
        ok, value = _json_value(getattr(spec, attr))
        if ok and value is not None:
            out[key] = value
    return out


def _lengths(spec: FieldSpec, kind: str | None, *, json_schema: bool) -> dict[str, Any]:
    # docs/protocol.md's capabilities shape says minLength/maxLength; in a real JSON Schema
    # those only constrain strings, so arrays and objects get their own keywords there.
    names = ("minLength", "maxLength")
    if json_schema and kind == "array":
        names = ("minItems", "maxItems")
    elif json_schema and kind == "object":
        names = ("minProperties", "maxProperties")
    out: dict[str, Any] = {}
    if spec.min_length is not None:
        out[names[0]] = int(spec.min_length)
    if spec.max_length is not None:
        out[names[1]] = int(spec.max_length)
    return out


def _apply_choices(out: dict[str, Any], spec: FieldSpec, nullable: bool) -> None:
    if spec.choices is None:
        return
    values = [_json_value(c)[1] for c in spec.choices]
    if nullable:
        # null is allowed beside the typed part, not as one of its values.
        values = [v for v in values if v is not None]
    out["enum"] = values
    if "type" not in out:
        # Mixed-type Literal choices leave the annotation as Any; the values may still
        # agree on a type (Literal[1, 2.5] is a number).
        kind = _type_of_values(values)
        if kind:
            out["type"] = kind


def _common(out: dict[str, Any], spec: FieldSpec) -> None:
    if not spec.required:
        ok, default = _json_value(spec.default_value())
        # A default JSON cannot carry is left out rather than misstated.
        if ok:
            out["default"] = default
    if spec.description:
        out["description"] = spec.description


def _json_value(value: Any) -> tuple[bool, Any]:
    """(True, the JSON form) or (False, a string stand-in) for a Python value."""
    if value is None or isinstance(value, (bool, int, str)):
        return True, value
    if isinstance(value, float):
        return (True, value) if math.isfinite(value) else (False, repr(value))
    if isinstance(value, enum.Enum):
        return _json_value(value.value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_json_value(v) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if isinstance(value, dict):
        entries = {str(k): _json_value(v) for k, v in value.items()}
        return all(ok for ok, _ in entries.values()), {k: v for k, (_, v) in entries.items()}
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return _json_value(item())  # a numpy scalar
    return False, repr(value)


def _dedupe(values: typing.Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if not any(v == o and type(v) is type(o) for o in out):
            out.append(v)
    return out

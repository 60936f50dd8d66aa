"""Upload references in command arguments, swapped for the files they name.

A client names an uploaded file by reference, `{"upload_id": ..., "name": ...,
"mime_type": ..., "size": ...}` (wire v1 carries a top-level one in `Command.uploads`,
which its codec puts back among the arguments). Wherever a command's parameter is
annotated `UploadedFile` (also inside `Optional`, `list`, `tuple`, `set` or
`dict[str, ...]`), `resolve_files` replaces the reference with the session's file,
so the model's own validation sees an `UploadedFile` there. Only the `upload_id` is
read from a reference: the name, type and size the model sees are what the upload was
reserved with, never what a command claims.

Nothing else in the arguments is touched: a reference where no file is declared is
just an object, and a value that is not a reference where a file is declared is left
for the model's validation to refuse, naming the field.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

from reactor_serve.interface.files import UploadedFile
from reactor_serve.interface.state import FieldSpec
from reactor_serve.protocol.channel_codec import BadCommand
from reactor_serve.protocol.model_documents import declares_files, unwrap_annotation

__all__ = ["FileLookup", "described", "resolve_files"]

# The file of an upload id in this session, or why there is none.
FileLookup = Callable[[str], "UploadedFile | str"]

_SEQUENCES = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Set)
_MAPPINGS = (dict, collections.abc.Mapping)


def resolve_files(
    command: str, params: Sequence[FieldSpec], args: dict[str, Any], lookup: FileLookup
) -> dict[str, Any]:
    """`args` with every upload reference at a file-typed place replaced by its file
    (the same dict when the command declares no file). Raises `BadCommand` naming the
    field for a reference to no complete upload of this session."""
    # A reference is an object, alone or inside a list or an object: any other value
    # is left as it is, so a command of numbers and strings (a slider's, on every
    # frame it moves) costs no walk of the annotations.
    file_params = [
        p for p in params
        if isinstance(args.get(p.name), (dict, list)) and declares_files(p.annotation)
    ]
    if not file_params:
        return args
    resolved = dict(args)
    for param in file_params:
        resolved[param.name] = _resolve(command, param.name, param.annotation,
                                        args[param.name], lookup)
    return resolved


def _resolve(command: str, path: str, annotation: Any, value: Any, lookup: FileLookup) -> Any:
    annotation = unwrap_annotation(annotation)
    if annotation is UploadedFile:
        return _file(command, path, value, lookup)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        if value is None:
            return None
        arms = [a for a in args if declares_files(a)]
        # A reference goes to the first arm that takes a file; anything else is left
        # for the other arms (and the model's validation).
        return _resolve(command, path, arms[0], value, lookup) if arms else value
    if origin is None or not isinstance(origin, type):
        return value
    if issubclass(origin, _MAPPINGS) and isinstance(value, dict) and len(args) == 2:
        return {k: _resolve(command, f"{path}.{k}", args[1], v, lookup) for k, v in value.items()}
    if issubclass(origin, _SEQUENCES) and isinstance(value, list) and args:
        if issubclass(origin, tuple) and not (len(args) == 2 and args[1] is Ellipsis):
            # A fixed tuple: one annotation per position.
            return [
                _resolve(command, f"{path}[{i}]", args[i], v, lookup) if i < len(args) else v
                for i, v in enumerate(value)
            ]
        return [_resolve(command, f"{path}[{i}]", args[0], v, lookup) for i, v in enumerate(value)]
    return value


def _file(command: str, path: str, value: Any, lookup: FileLookup) -> Any:
    if not isinstance(value, dict):
        return value  # not a reference: the model's validation names the field
    upload_id = value.get("upload_id")
    if not isinstance(upload_id, str) or not upload_id:
        raise _refused(command, path, "upload_reference",
                       "expected an upload reference with a string 'upload_id'", value)
    found = lookup(upload_id)
    if isinstance(found, str):
        raise _refused(command, path, "upload", found, value)
    return found


def _refused(command: str, path: str, rule: str, why: str, value: Any) -> BadCommand:
    shown = {k: value[k] for k in ("upload_id", "name") if isinstance(value.get(k), str)}
    return BadCommand(
        command, f"{path}: {why}",
        [{"field": path, "rule": rule, "value": shown or None}],
    )


def described(value: Any) -> Any:
    """`value` with each `UploadedFile` as `{"name", "mime_type", "size"}`: what a
    command log or a message shows of a file, never its bytes."""
    if isinstance(value, UploadedFile):
        return {"name": value.name, "mime_type": value.mime_type, "size": value.size}
    if isinstance(value, dict):
        return {k: described(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [described(v) for v in value]
    return value

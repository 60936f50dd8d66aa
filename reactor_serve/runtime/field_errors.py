"""Pydantic validation errors as sentences that name the field, for config, manifest
and request-body errors alike."""

from __future__ import annotations

from typing import Any, Mapping

from pydantic import ValidationError

__all__ = ["field_problems"]


def field_problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One "field 'a.b': what is wrong" line per error; `prefix` is prepended to the
    field path (for a section of a larger file)."""
    lines = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        field = f"{prefix}.{path}" if prefix and path else (prefix or path or "(body)")
        lines.append(f"field '{field}': {_describe(error)}")
    return lines


def _describe(error: Mapping[str, Any]) -> str:
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

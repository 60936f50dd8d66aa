"""A model setting that counts something (seats, ranks): one rule for all of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["count_setting"]


def count_setting(
    config: Mapping[str, Any] | None, key: str, model: str, given: int | None, maximum: int
) -> int:
    """`given` when set (a command line's or serve_config.yaml's), else the model
    config's `key`, else 1. Raises ValueError naming the field and the model when it is
    not a whole number from 1 to `maximum`."""
    value = given if given is not None else (config or {}).get(key, 1)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ValueError(
            f"model {model}: {key}: expected a whole number from 1 to {maximum}, got {value!r}"
        )
    return value
